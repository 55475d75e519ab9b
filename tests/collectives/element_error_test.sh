#!/usr/bin/env bash
# A collective on elements that are not trivially copyable (std::string) must fail to compile
# with one error that points to the object collectives, not pages of concept notes; the same
# program with a type corocoll carries (long long) must compile.
#
# usage: element_error_test.sh <corocoll source dir>
# env:   CXX  the compiler command (default g++)
set -euo pipefail

srcdir=$1
cxx=${CXX:-g++}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/corocoll-element.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

write_prog() {
    cat > "$tmp/prog.cpp" <<CPP
#include <corocoll/corocoll.hpp>
#include <string>
#include <vector>
corocoll::task<> body(corocoll::process_group& pg) {
    std::vector<$1> t(4);
    co_await pg.all_reduce(t);
}
CPP
}

# shellcheck disable=SC2206
cmd=($cxx -std=c++20 -fsyntax-only -I "$srcdir/include" "$tmp/prog.cpp")

write_prog "long long"
"${cmd[@]}"

write_prog "std::string"
if "${cmd[@]}" > "$tmp/out" 2>&1; then
    echo "FAIL: all_reduce of std::string compiled" >&2
    exit 1
fi
errors=$(grep -c 'error:' "$tmp/out" || true)
echo "errors: $errors"
grep 'error:' "$tmp/out"
if [[ $errors -ne 1 ]]; then
    echo "FAIL: expected one error, got $errors" >&2
    exit 1
fi
grep -q 'error:.*use the object collectives' "$tmp/out" || {
    echo "FAIL: the error does not point to the object collectives" >&2
    exit 1
}
echo "element error test: OK"
