#!/bin/sh
# An installed tree that moves, with the build gone: `cmake --install` to a prefix, move the prefix, then,
# in a mount namespace of its own where the build tree and the build's Python environment are hidden
# (an empty folder mounted over each) and that environment appears at another path as the user's own
# (VIRTUAL_ENV, PATH), run every installed tool's --version and one real job each:
#   bpl-info --init lists the kernels only where LibTorch is found, and says how to point at one;
#   bpl-run runs a C program built with pkg-config on 2 ranks, and one built with find_package against
#   backplane::parallel; a kernel runs from Python (the kernels module finds the user's torch);
#   torch's own launcher runs a C program whose plugin loads the torch store module, and a torch program
#   on the backend "backplane"; bpl-trace merges a job's timelines; bpl-cache lists the cache;
#   bpl-bench-compare and bpl-bench-torch each run a tiny sweep.
# Nothing installed may name the build tree or the build's environment: with both hidden, any file that
# did fails here.
# Usage: moved_install_test.sh <build dir> <source dir> <the build's Python>   (as root: it mounts)
set -eu
build_dir=$(realpath "$1")
source_dir=$(realpath "$2")
python=$3
build_env=$("$python" -c "import sys; print(sys.prefix)")
[ "$build_env" != "$("$python" -c "import sys; print(sys.base_prefix)")" ] \
  || { echo "the build's Python is no virtual environment: nothing to hide"; exit 1; }

if [ "${BPL_MOVED_INSIDE:-}" != 1 ]; then
  [ "$(id -u)" -eq 0 ] || { echo "SKIPPED: hiding the build takes a mount namespace, which needs root"; exit 77; }
  top=$(mktemp -d /tmp/bpl-moved-XXXXXX)
  trap 'rm -rf "$top"' EXIT
  cmake --install "$build_dir" --prefix "$top/installed" > /dev/null
  mkdir "$top/moved" "$top/user-env" "$top/work"
  mv "$top/installed"/* "$top/moved/"
  # The namespace's mounts end with it, whatever happens inside.
  BPL_MOVED_INSIDE=1 BPL_MOVED_TOP="$top" unshare --mount --propagation private sh "$0" "$@"
  exit
fi

top=$BPL_MOVED_TOP
moved=$top/moved
work=$top/work
user_env=$top/user-env
mount --bind "$build_env" "$user_env"
mount -t tmpfs -o ro,size=1k hidden "$build_env"
mount -t tmpfs -o ro,size=1k hidden "$build_dir"
[ -z "$(ls -A "$build_dir")$(ls -A "$build_env")" ] || { echo "the build is still visible"; exit 1; }

unset BPL_PLUGIN_PATH BPL_BACKEND BPL_LIBRARY PYTHONPATH BPL_TORCH_DIR CONDA_PREFIX
export VIRTUAL_ENV="$user_env" PATH="$moved/bin:$user_env/bin:$PATH" NXD_CPU_MODE=1 PYTHONWARNINGS=ignore
user_python="$user_env/bin/python"
python_dir=$(ls -d "$moved"/lib/python3*/site-packages)
version=$(sed -n 's/^Version: //p' "$moved/lib/pkgconfig/backplane.pc")
cd "$work"

fail() { echo "FAILED: $*"; exit 1; }
# Runs "$@", which must exit 0 and print a line matching `pattern` (grep -E).
expect() {
  pattern=$1; shift
  out=$("$@" 2>&1) || { echo "$out"; fail "$* exited non-zero"; }
  echo "$out" | grep -Eq "$pattern" || { echo "$out"; fail "$* printed no line matching '$pattern'"; }
}

for tool in "$moved"/bin/*; do
  expect "\(backplane\) $version" "$tool" --version
done

echo "--- bpl-info --init: kernels where LibTorch is found"
expect "kernels=$moved/lib/backplane/plugins/libbpl-cpu-kernels.so" bpl-info --init
out=$(env -u VIRTUAL_ENV bpl-info --init 2>&1) || { echo "$out"; fail "bpl-info --init without an environment"; }
echo "$out" | grep -q "kernels=none: .*could not be loaded: it links LibTorch.*set BPL_TORCH_DIR" \
  || { echo "$out"; fail "without a torch, bpl-info --init still lists the kernels, or does not say why"; }
expect "kernels=$moved" env -u VIRTUAL_ENV BPL_TORCH_DIR="$(ls -d "$user_env"/lib/python3*/site-packages/torch)" \
  bpl-info --init

echo "--- bpl-run: C programs built with pkg-config and with find_package"
export PKG_CONFIG_PATH="$moved/lib/pkgconfig"
cc -std=c99 -Wall -Werror "$source_dir/examples/embed.c" -o embed $(pkg-config --cflags --libs backplane)
[ "$(bpl-run --nproc-per-node 2 ./embed | grep -c '  ok$')" -eq 2 ] || fail "embed did not print two correct ranks"
cmake -S "$source_dir/tests/system/install" -B consumer -DCMAKE_PREFIX_PATH="$moved" \
      -DEMBED_SOURCE="$source_dir/examples/embed.c" -DWITH_PARALLEL=ON > /dev/null
cmake --build consumer -j2 > /dev/null
expect "^cpu_mode=1$" ./consumer/parallel_from_package

echo "--- a kernel from Python: the kernels module finds the user's torch"
expect "python rank 0: ok" env PYTHONPATH="$python_dir" bpl-run --nproc-per-node 2 "$user_python" \
  "$source_dir/tests/python/test_backplane.py"

# torchrun writes both ranks' lines to one stream, where they can meet on a line: counted with grep -o.
echo "--- torch's launcher: the torch store module, and the backend \"backplane\""
[ "$(env BPL_BACKEND=gloo "$user_python" -m torch.distributed.run --nproc-per-node 2 --no-python ./embed \
      | grep -o 'group ranks = [01]  ok' | wc -l)" -eq 2 ] || fail "embed under torchrun did not print two correct ranks"
expect "rank 1: OK" env PYTHONPATH="$python_dir" "$user_python" -m torch.distributed.run --nproc-per-node 2 \
  "$source_dir/tests/torch_backend/test_process_group.py"

echo "--- bpl-trace, bpl-cache"
BPL_TRACE="$work/trace" bpl-run --nproc-per-node 2 ./embed > /dev/null
expect "allreduce" bpl-trace "$work/trace"
[ -s "$work/trace/timeline.json" ] || fail "bpl-trace wrote no timeline"
expect "total" env BPL_CACHE_DIR="$work/cache" bpl-cache list

echo "--- the benchmarks"
expect "gloo" bpl-bench-compare --out bench --backends gloo -- --dtypes=f32 --max-bytes=64 --step-factor=16 \
  --repetitions=1 --max-iterations=5 --ops=allreduce
expect "gloo" env PYTHONPATH="$python_dir" "$user_python" "$moved/bin/bpl-bench-torch" --out bench --configs gloo \
  --max-bytes 64 --step 16 --repetitions 1 --min-seconds 0.001 --max-iterations 5 --ddp-widths 32

# Text files, and the run paths of the binaries (their debug information names the sources, which is
# only for debuggers).
if grep -rlIsF -e "$build_dir" -e "$build_env" "$moved"; then
  fail "the files above name the build tree or the build's environment"
fi
for binary in $(find "$moved" -type f \( -name '*.so*' -o -perm -u+x \)); do
  if readelf -d "$binary" 2>/dev/null | grep -E 'R(UN)?PATH' | grep -qF -e "$build_dir" -e "$build_env"; then
    fail "$binary's run path names the build: $(readelf -d "$binary" | grep -E 'R(UN)?PATH')"
  fi
done
echo "moved tree OK"
