#!/bin/sh
# The installed tree works on its own: install to a fresh prefix, then run the C embedder on two ranks
# with the installed launcher, and check that the plugin came from the prefix, not the build tree.
set -eu
build_dir=$1
prefix=$(mktemp -d /tmp/bpl-install-XXXXXX)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build_dir" --prefix "$prefix" > /dev/null

for path in lib/libbackplane.so include/backplane/backplane.h include/backplane/plugin.h \
            lib/backplane/plugins/libbackplane-gloo.so bin/bpl-run bin/bpl-info bin/embed; do
  [ -e "$prefix/$path" ] || { echo "install is missing $path"; exit 1; }
done

info=$(env -u BPL_PLUGIN_PATH -u BPL_BACKEND "$prefix/bin/bpl-info")
echo "$info"
echo "$info" | grep -q "gloo .*$prefix/lib/backplane/plugins/libbackplane-gloo.so" \
  || { echo "bpl-info did not find the installed gloo plugin"; exit 1; }

out=$(env -u BPL_PLUGIN_PATH NXD_CPU_MODE=1 "$prefix/bin/bpl-run" --nproc-per-node 2 "$prefix/bin/embed")
echo "$out"
[ "$(echo "$out" | grep -c '  ok$')" -eq 2 ] || { echo "the installed embed did not print two correct ranks"; exit 1; }
echo "installed tree OK"
