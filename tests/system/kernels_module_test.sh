#!/bin/sh
# A CPU plugin whose kernels module is missing or broken still starts, and a kernel then fails with
# UNSUPPORTED naming the module and the folder it was looked for in (tests/system/lean_plugins.c).
# Usage: kernels_module_test.sh <plugin .so> <lean_plugins binary>
set -eu
plugin=$1
probe=$2
dir=$(mktemp -d /tmp/bpl-kernels-module-XXXXXX)
trap 'rm -rf "$dir"' EXIT
cp "$plugin" "$dir/"
BPL_BACKEND="$dir/$(basename "$plugin")" "$probe" --module=absent "$dir"
echo "not a shared object" > "$dir/libbpl-cpu-kernels.so"
BPL_BACKEND="$dir/$(basename "$plugin")" "$probe" --module=broken "$dir"
