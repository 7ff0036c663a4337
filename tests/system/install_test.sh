#!/bin/sh
# The installed tree works on its own, as embedders use it: install to a fresh prefix, then
#  - bin/ holds the tools alone (no examples, tests or benchmarks), each saying its version;
#  - the programs in libexec/backplane/ find their libraries, and one trains on two ranks;
#  - build examples/embed.c with nothing but pkg-config (no rpath or LD_LIBRARY_PATH of ours), and run
#    it on two ranks with the installed launcher (plugin from the prefix);
#  - build it (and a program on the LibTorch frontend, if installed) with nothing but find_package;
#  - run the Python module from the prefix, finding libbackplane.so beside itself;
#  - move the prefix and delete its gloo plugin: the library must say so, naming every folder it
#    searched, and never load the build tree's plugin instead.
# Usage: install_test.sh <build dir> <source dir> <the project's Python>
set -eu
build_dir=$1
source_dir=$2
python=$3
prefix=$(mktemp -d /tmp/bpl-install-XXXXXX)
work=$(mktemp -d /tmp/bpl-consumer-XXXXXX)
trap 'rm -rf "$prefix" "$work"' EXIT
cmake --install "$build_dir" --prefix "$prefix" > /dev/null
unset BPL_PLUGIN_PATH BPL_BACKEND BPL_LIBRARY PYTHONPATH
# Where the build's Python searches the prefix: a virtual environment's site-packages (Debian's own
# python3 would have dist-packages).
python_dir=lib/python$("$python" -c "import sys; print('%d.%d' % sys.version_info[:2])")/site-packages
version=$(sed -n 's/^Version: //p' "$prefix/lib/pkgconfig/backplane.pc")

for path in lib/libbackplane.so include/backplane/backplane.h include/backplane/plugin.h \
            lib/backplane/plugins/libbackplane-gloo.so lib/backplane/plugins/libbpl-cpu-kernels.so \
            lib/backplane/plugins/libbpl-torch-store.so bin/bpl-run bin/bpl-info \
            lib/cmake/backplane/backplaneConfig.cmake lib/cmake/backplane/backplaneConfigVersion.cmake \
            lib/cmake/backplane/backplaneTargets.cmake lib/pkgconfig/backplane.pc \
            "$python_dir/backplane/__init__.py"; do
  [ -e "$prefix/$path" ] || { echo "install is missing $path"; exit 1; }
done
# bin/ holds the tools, as a Debian package's would: no examples, tests or benchmarks.
tools=$(ls "$prefix/bin" | tr '\n' ' ')
[ "$tools" = "bpl-bench-compare bpl-bench-torch bpl-cache bpl-info bpl-run bpl-trace " ] \
  || { echo "bin/ holds more than the tools: $tools"; exit 1; }
for tool in "$prefix"/bin/*; do
  "$tool" --version | grep -q "(backplane) $version" || { echo "$tool --version does not say $version"; exit 1; }
done

# libexec/backplane/ holds what other programs run (bpl-run's store, the benchmarks and their
# workloads): each finds backplane's libraries from there, and LibTorch, which this prefix (outside any
# Python environment) does not hold, where LD_LIBRARY_PATH names the torch of a Python (docs/install.md);
# the recovery benchmark's workload trains.
torch_lib=$("$python" -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))")
for program in "$prefix"/libexec/backplane/*; do
  missing=$(ldd "$program" | grep "not found" | grep -v -e "libtorch" -e "libc10" || true)
  [ -z "$missing" ] || { echo "$program does not find its libraries: $missing"; exit 1; }
  missing=$(LD_LIBRARY_PATH="$torch_lib" ldd "$program" | grep "not found" || true)
  [ -z "$missing" ] || { echo "$program does not find LibTorch through LD_LIBRARY_PATH: $missing"; exit 1; }
done
NXD_CPU_MODE=1 "$prefix/bin/bpl-run" --nproc-per-node 2 "$prefix/libexec/backplane/elastic_sgd" --steps 3 \
  | grep -q "rank 1: done: 3 steps" || { echo "the installed elastic_sgd did not train"; exit 1; }

info=$("$prefix/bin/bpl-info")
echo "$info"
echo "$info" | grep -q "gloo .*$prefix/lib/backplane/plugins/libbackplane-gloo.so" \
  || { echo "bpl-info did not find the installed gloo plugin"; exit 1; }

# Runs an embed binary on two ranks of CPU mode; both must print a correct result.
run_two_ranks() {
  out=$(NXD_CPU_MODE=1 "$prefix/bin/bpl-run" --nproc-per-node 2 "$@")
  echo "$out"
  [ "$(echo "$out" | grep -c '  ok$')" -eq 2 ] || { echo "$1 did not print two correct ranks"; exit 1; }
}

echo "--- pkg-config only"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
cc -std=c99 -Wall -Werror "$source_dir/examples/embed.c" -o "$work/embed_pkgconfig" \
   $(pkg-config --cflags --libs backplane)
run_two_ranks "$work/embed_pkgconfig"

echo "--- find_package only"
with_parallel=OFF
[ -e "$prefix/lib/cmake/backplane/backplaneParallelTargets.cmake" ] && with_parallel=ON
# The frontend links the torch of the consumer's Python: here, the build's (BPL_PYTHON).
cmake -S "$source_dir/tests/system/install" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$prefix" -DBPL_PYTHON="$python" \
      -DEMBED_SOURCE="$source_dir/examples/embed.c" -DWITH_PARALLEL=$with_parallel > /dev/null
cmake --build "$work/consumer" > /dev/null
run_two_ranks "$work/consumer/embed_from_package"
if [ $with_parallel = ON ]; then
  NXD_CPU_MODE=1 "$work/consumer/parallel_from_package" | grep -qx "cpu_mode=1" \
    || { echo "the program built against backplane::parallel did not run"; exit 1; }
fi

echo "--- Python from the prefix"
PYTHONPATH="$prefix/$python_dir" NXD_CPU_MODE=1 \
  "$prefix/bin/bpl-run" --nproc-per-node 2 "$python" "$source_dir/tests/python/test_backplane.py"
# The torch.distributed backend, where this build has it: imported from the prefix alone.
if ls "$prefix/$python_dir"/backplane_torch.*.so > /dev/null 2>&1; then
  echo "--- torch.distributed backend from the prefix"
  PYTHONPATH="$prefix/$python_dir" PYTHONWARNINGS=ignore \
    "$prefix/bin/bpl-run" --nproc-per-node 2 "$python" "$source_dir/tests/torch_backend/test_process_group.py"
fi
echo "--- moved, then a plugin deleted"
moved=$(mktemp -d /tmp/bpl-moved-XXXXXX)
trap 'rm -rf "$prefix" "$work" "$moved"' EXIT
mv "$prefix"/* "$moved/"
info=$(NXD_CPU_MODE=1 "$moved/bin/bpl-info")
echo "$info"
echo "$info" | grep -q "plugin       $moved/lib/backplane/plugins/libbackplane-gloo.so" \
  || { echo "the moved tree did not find its own plugin"; exit 1; }
rm "$moved/lib/backplane/plugins/libbackplane-gloo.so"
status=0
info=$(NXD_CPU_MODE=1 "$moved/bin/bpl-info" 2>&1) || status=$?
echo "$info"
[ $status -ne 0 ] || { echo "bpl-info succeeded without the gloo plugin"; exit 1; }
echo "$info" | grep -q "plugin       none: .*plugin for backend 'gloo' not found (tried: $moved/lib/backplane/plugins/libbackplane-gloo.so;" \
  || { echo "the error does not name the folder searched"; exit 1; }
echo "$info" | grep -A1 "^Plugin folders" | grep -qx "  $moved/lib/backplane/plugins" \
  || { echo "bpl-info does not print the folder searched"; exit 1; }
if echo "$info" | grep -q "$build_dir"; then
  echo "the installed library looked in the build tree ($build_dir)"; exit 1
fi
echo "installed tree OK"
