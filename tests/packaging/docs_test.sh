#!/bin/sh
# The API reference builds from the Doxyfile with no doxygen warning, so no public name is
# undocumented; skipped where doxygen is not installed.   usage: docs_test.sh SOURCE_ROOT OUT
set -eu
src=$1 out=$2
doxygen=$(command -v doxygen) || { echo "doxygen not found: skipped"; exit 77; }
rm -rf "$out"
"$src/tools/docs.sh" "$doxygen" "$src" "$out"
# A page per public class, and the ones a user starts from.
for page in classcorocoll_1_1process__group.html structcorocoll_1_1init__options.html; do
    [ -f "$out/html/$page" ] || { echo "missing $out/html/$page"; exit 1; }
done
