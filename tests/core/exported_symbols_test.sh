#!/bin/sh
# What the shared objects export (nm -D): libbackplane.so every function backplane.h declares (with the
# headers it includes) and nothing else; each plugin its entry symbol and nothing else (docs/abi.md,
# "Plugins").
# Usage: exported_symbols_test.sh <build lib dir> <backplane.h>
set -eu
lib_dir=$1
header=$2
fail=0

exported() { nm -D --defined-only "$1" | awk 'NF == 3 {print $3}' | sort; }

core=$(exported "$lib_dir/libbackplane.so")
headers="$header $(sed -n 's/^#include "\([a-z_]*\.h\)".*/\1/p' "$header" | sed "s|^|$(dirname "$header")/|")"
declared=$(cat $headers | sed -n 's/^BPL_API [^(]*[ *]\(bpl_[a-z0-9_]*\)(.*/\1/p' | sort)
extra=$(echo "$core" | grep -vx -F "$declared" || true)
missing=$(echo "$declared" | grep -vx -F "$core" || true)
[ -z "$extra" ] || { echo "libbackplane.so exports symbols backplane.h does not declare:"; echo "$extra"; fail=1; }
[ -z "$missing" ] || { echo "libbackplane.so does not export:"; echo "$missing"; fail=1; }
echo "libbackplane.so: $(echo "$core" | wc -l) symbols, each a function of backplane.h"

for plugin in "$lib_dir"/backplane/plugins/libbackplane-*.so; do
  symbols=$(exported "$plugin")
  if [ "$symbols" != "bpl_plugin_open_v1" ]; then
    echo "$plugin exports more than its entry symbol:"; echo "$symbols" | head -20; fail=1
  else
    echo "$(basename "$plugin"): bpl_plugin_open_v1 only"
  fi
done
exit $fail
