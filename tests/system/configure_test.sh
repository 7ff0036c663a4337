#!/bin/sh
# Which Python the build takes, and what it does without torch (configure only, in scratch folders):
#   - an active virtual environment (VIRTUAL_ENV) is taken, and said, before the project's .venv;
#   - -DPython3_EXECUTABLE= is taken before VIRTUAL_ENV;
#   - a Python without torch: the configure succeeds and says, once, what it leaves out and why, and
#     backplane_torch's _build.py carries that reason (its import raises it); with -DBPL_WITH_TORCH=ON
#     the configure fails, naming what was asked for and why it cannot be built.
# Usage: configure_test.sh <source dir> <the project's Python>
set -eu
source_dir=$1
project_python=$2
top=$(mktemp -d /tmp/bpl-configure-XXXXXX)
trap 'rm -rf "$top"' EXIT
fail() { echo "FAILED: $*"; exit 1; }
base_python=$("$project_python" -c "import sys; print(sys._base_executable)")
"$base_python" -m venv "$top/bare"   # a user's environment without torch

echo "--- the active virtual environment"
out=$(env VIRTUAL_ENV="$top/bare" sh -c "cmake -S '$source_dir' -B '$top/build-venv' -DBPL_BUILD_TESTS=OFF 2>&1") \
  || { echo "$out"; fail "configure with a virtual environment without torch"; }
echo "$out" | grep -x -- "-- Python: $top/bare/bin/python (3\.[0-9]*; the active virtual environment, VIRTUAL_ENV)" \
  || { echo "$out"; fail "the active virtual environment was not taken, or not said"; }
[ "$(echo "$out" | grep -c "Not built: the kernels and torch store modules, the LibTorch frontend and the torch.distributed backend, because $top/bare/bin/python cannot import torch")" -eq 1 ] \
  || { echo "$out"; fail "what was left out, and why, was not said once"; }
grep -q "^NOT_BUILT = \"$top/bare/bin/python cannot import torch\"" "$top/build-venv/python/backplane_torch/_build.py" \
  || fail "backplane_torch's _build.py does not carry why: $(cat "$top/build-venv/python/backplane_torch/_build.py")"

echo "--- Python3_EXECUTABLE before VIRTUAL_ENV"
out=$(env VIRTUAL_ENV="$top/bare" sh -c "cmake -S '$source_dir' -B '$top/build-given' -DBPL_BUILD_TESTS=OFF \
        -DPython3_EXECUTABLE='$project_python' 2>&1") || { echo "$out"; fail "configure with Python3_EXECUTABLE"; }
echo "$out" | grep -q -- "-- Python: $project_python (.*Python3_EXECUTABLE)" || { echo "$out"; fail "Python3_EXECUTABLE was not taken"; }
echo "$out" | grep -q -- "-- LibTorch " || { echo "$out"; fail "its torch was not found"; }

echo "--- BPL_WITH_TORCH=ON without torch"
status=0
out=$(cmake -S "$source_dir" -B "$top/build-on" -DBPL_BUILD_TESTS=OFF -DBPL_PYTHON="$top/bare/bin/python" \
        -DBPL_WITH_TORCH=ON 2>&1) || status=$?
[ $status -ne 0 ] || { echo "$out"; fail "the configure succeeded though the torch parts were asked for"; }
echo "$out" | tr '\n' ' ' | grep -q "BPL_WITH_TORCH=ON asks for the kernels and torch store modules, .* but *$top/bare/bin/python *cannot *import *torch" \
  || { echo "$out"; fail "the failure does not say what was asked for and why it cannot be built"; }
echo "configure OK"
