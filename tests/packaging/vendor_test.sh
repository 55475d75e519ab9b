#!/usr/bin/env bash
# Vendoring check: a user who copies include/ into their tree builds a corocoll program with
# one compiler command line and nothing else (no Meson, no generated headers, no config step).
#
# usage: vendor_test.sh <corocoll source dir>
# env:   CXX  the compiler command (default g++); Meson passes the compiler it was set up with.
set -euo pipefail

if [[ $# -ne 1 ]]; then
    echo "usage: $0 <corocoll source dir>" >&2
    exit 2
fi
srcdir=$1
cxx=${CXX:-g++}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/corocoll-vendor.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# Word splitting of $cxx is wanted: CXX may be a command with arguments ("ccache g++").
# shellcheck disable=SC2206
cmd=($cxx -std=c++20 -I "$srcdir/include" "$srcdir/tests/packaging/vendor_prog.cpp"
     -o "$tmp/prog" -luring)
echo "compile: ${cmd[*]}"
"${cmd[@]}"

echo "run: $tmp/prog"
"$tmp/prog"
echo "vendor test: OK"
