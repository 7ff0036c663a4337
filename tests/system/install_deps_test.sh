#!/bin/sh
# tools/install-deps never deletes a .venv it did not make: in a copy of the project's tools/ beside a
# .venv of the user's own (no copy of the requirements in it), it leaves that environment as it was and
# says so. (The Debian packages are installed already where this runs: the script only checks them.)
# Usage: install_deps_test.sh <source dir>
set -eu
top=$(mktemp -d /tmp/bpl-install-deps-XXXXXX)
trap 'rm -rf "$top"' EXIT
mkdir "$top/tools" "$top/.venv"
cp "$1/tools/install-deps" "$1/tools/python-requirements.txt" "$top/tools/"
echo "the user's" > "$top/.venv/pyvenv.cfg"
out=$(sh "$top/tools/install-deps" 2>&1) || { echo "$out"; echo "FAILED: install-deps exited non-zero"; exit 1; }
echo "$out"
[ "$(cat "$top/.venv/pyvenv.cfg")" = "the user's" ] && [ "$(ls -A "$top/.venv")" = "pyvenv.cfg" ] \
  || { echo "FAILED: install-deps changed a .venv it did not make"; exit 1; }
echo "$out" | grep -q "install-deps: .venv was not made by this script: left as it is" \
  || { echo "FAILED: install-deps did not say it left the .venv alone"; exit 1; }
echo "install-deps OK"
