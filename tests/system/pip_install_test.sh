#!/bin/sh
# pip install of the checkout as a user does it: a fresh virtual environment with the user's torch (the
# oldest of the supported range: the newest is the build's own), then `pip install <checkout>` (pip's
# isolated build, which builds against the torch of the environment it installs into). Then, with
# nothing set by hand (no PYTHONPATH, no LD_LIBRARY_PATH):
#   - pip list names backplane; backplane.__version__ and backplane_torch.__version__ are the project's,
#     and backplane_torch was built for that torch;
#   - torchrun runs a script that never imports backplane_torch (torch's entry points register it), the
#     CPU-mode MLP of the README, checked against the unsharded one, and test_process_group.py;
#   - a C program built with pkg-config against the installed package runs on 2 ranks under bpl-run, a
#     C++ one built with find_package against backplane::parallel runs, and a consumer whose Python has
#     another torch (the project's) is refused at configure;
#   - a backplane_torch built for another torch refuses to import, naming both versions and the rebuild;
#   - pip uninstall removes every file it installed, the commands too.
# torchrun writes both ranks' lines to one stream, where they can meet on a line: results are counted
# with grep -o.
# Usage: pip_install_test.sh <source dir> <the project's Python> <torch version>
set -eu
source_dir=$(realpath "$1")
base_python=$("$2" -c "import sys; print(sys._base_executable)")
torch_version=$3
top=$(mktemp -d /tmp/bpl-pip-XXXXXX)
trap 'rm -rf "$top"' EXIT
unset PYTHONPATH BPL_PLUGIN_PATH BPL_LIBRARY BPL_BACKEND BPL_TORCH_DIR VIRTUAL_ENV
fail() { echo "FAILED: $*"; exit 1; }

"$base_python" -m venv "$top/env"
env_python=$top/env/bin/python
echo "--- the user's torch $torch_version"
"$env_python" -m pip install --disable-pip-version-check --progress-bar off -q "torch==$torch_version" numpy
echo "--- pip install $source_dir"
started=$(date +%s)
"$env_python" -m pip install --disable-pip-version-check "$source_dir" > "$top/pip.log" 2>&1 \
  || { tail -40 "$top/pip.log"; fail "pip install of the checkout failed"; }
echo "built and installed in $(( $(date +%s) - started )) s"
"$env_python" -m pip list 2>/dev/null | grep -E "^backplane +[0-9]" || fail "pip list does not name backplane"

cd "$top"
version=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$source_dir/python/backplane/_version.py")
facts=$("$env_python" -c "import backplane, backplane_torch
print(backplane.__version__, backplane_torch.__version__, backplane_torch.TORCH_VERSION, '%d.%d' % backplane.abi_version())")
abi=$(echo "$version" | cut -d. -f1,2)
[ "$facts" = "$version $version $torch_version $abi" ] \
  || fail "versions (the ctypes module loads the package's library): $facts, expected $version $version $torch_version $abi"

export NXD_CPU_MODE=1 PYTHONWARNINGS=ignore
echo "--- torchrun, without an import"
out=$("$top/env/bin/torchrun" --nproc-per-node 2 "$source_dir/tests/system/pip_entry_point.py" 2>&1) \
  || { echo "$out"; fail "the backend without an import"; }
[ "$(echo "$out" | grep -o 'without an import: allreduce 3 ok' | wc -l)" -eq 2 ] || { echo "$out"; fail "two ranks"; }
echo "--- torchrun, the CPU-mode MLP"
out=$("$top/env/bin/torchrun" --nproc-per-node 2 "$source_dir/examples/python/cpu_mode_mlp.py" --check 2>&1) \
  || { echo "$out"; fail "cpu_mode_mlp.py --check"; }
[ "$(echo "$out" | grep -o 'unsharded output sum is [^:]*: match' | wc -l)" -eq 2 ] || { echo "$out"; fail "the MLP did not match"; }

echo "--- torchrun, torch.distributed on the backend"
out=$("$top/env/bin/torchrun" --nproc-per-node 2 "$source_dir/tests/torch_backend/test_process_group.py" 2>&1) \
  || { echo "$out"; fail "test_process_group.py"; }
[ "$(echo "$out" | grep -o 'rank [01]: OK' | wc -l)" -eq 2 ] || { echo "$out"; fail "test_process_group.py on two ranks"; }

echo "--- a C program built with pkg-config"
export PKG_CONFIG_PATH
PKG_CONFIG_PATH=$("$env_python" -m backplane --pkgconfigdir)
cc -std=c99 -Wall -Werror "$source_dir/examples/embed.c" -o embed $(pkg-config --cflags --libs backplane)
[ "$("$top/env/bin/bpl-run" --nproc-per-node 2 ./embed | grep -c '  ok$')" -eq 2 ] || fail "embed on 2 ranks"

echo "--- a C++ program built with find_package against the frontend, and one whose torch differs"
prefix=$("$env_python" -m backplane --prefix)
cmake -S "$source_dir/tests/system/install" -B consumer -DCMAKE_PREFIX_PATH="$prefix" -DBPL_PYTHON="$env_python" \
      -DEMBED_SOURCE="$source_dir/examples/embed.c" -DWITH_PARALLEL=ON > consumer.log 2>&1 \
  && cmake --build consumer -j2 >> consumer.log 2>&1 || { cat consumer.log; fail "find_package(backplane COMPONENTS parallel)"; }
[ "$(./consumer/parallel_from_package)" = "cpu_mode=1" ] || fail "the program built against backplane::parallel"
status=0
out=$(cmake -S "$source_dir/tests/system/install" -B consumer-other -DCMAKE_PREFIX_PATH="$prefix" -DBPL_PYTHON="$2" \
        -DEMBED_SOURCE="$source_dir/examples/embed.c" -DWITH_PARALLEL=ON 2>&1) || status=$?
[ $status -ne 0 ] && echo "$out" | tr '\n' ' ' | grep -q "was built for torch $torch_version, and .* has *torch" \
  || { echo "$out"; fail "a consumer whose Python has another torch was not refused"; }

echo "--- built for another torch"
build_info=$("$env_python" -c "import backplane_torch._build as b; print(b.__file__)")
cp "$build_info" "$top/build_info.py"
sed -i 's/^TORCH_VERSION = .*/TORCH_VERSION = "2.0.1"/' "$build_info"
status=0
out=$("$env_python" -c "import backplane_torch" 2>&1) || status=$?
cp "$top/build_info.py" "$build_info"
[ $status -ne 0 ] && echo "$out" | grep -q "ImportError: backplane_torch $version was built for torch 2.0.1, and this Python .* has torch $torch_version .*pip install --force-reinstall" \
  || { echo "$out"; fail "a module built for another torch did not say so"; }

echo "--- pip uninstall"
site=$("$env_python" -c "import sysconfig; print(sysconfig.get_path('platlib'))")
"$env_python" -m pip uninstall -y -q backplane
left=$(ls -d "$site"/backplane* "$top"/env/bin/bpl-* 2>/dev/null || true)
[ -z "$left" ] || fail "pip uninstall left $left"
echo "pip install OK"
