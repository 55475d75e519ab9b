#!/bin/sh
# Builds the API reference from the Doxyfile at the source root into OUT/html and fails on any
# doxygen warning (an undocumented public name is one). Meson's `docs` target and the docs test
# run it.   usage: docs.sh DOXYGEN SOURCE_ROOT OUT
set -eu
doxygen=$1 src=$2 out=$3
mkdir -p "$out"
log=$out/doxygen.log
cd "$src"
# The Doxyfile's own settings, with the output redirected; FAIL_ON_WARNINGS makes doxygen
# finish the run and then exit non-zero, so every warning is in the log.
status=0
{ cat Doxyfile; echo "OUTPUT_DIRECTORY = $out"; echo "WARN_LOGFILE = $log"; } |
    "$doxygen" - >"$out/doxygen.out" 2>&1 || status=$?
undocumented=$(grep -c 'is not documented' "$log" || true)
warnings=$(grep -c 'warning:' "$log" || true)
cat "$log"
echo "corocoll docs: $warnings warnings, $undocumented undocumented public names; reference in $out/html/index.html"
if [ "$status" -ne 0 ] || [ "$warnings" -ne 0 ]; then
    cat "$out/doxygen.out" >&2
    exit 1
fi
