#!/usr/bin/env bash
# A program that includes corocoll in an older language mode (-std=c++17, even with
# -fcoroutines as g++'s own advice suggests) fails to compile with the message that corocoll
# needs -std=c++20 and no other error, not pages of errors from inside the headers. Every
# header is tried alone.
#
# usage: cxx20_guard_test.sh <corocoll source dir>
# env:   CXX  the compiler command (default g++)
set -euo pipefail

srcdir=$1
cxx=${CXX:-g++}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/corocoll-cxx20.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

failures=0
checked=0
flags=(-std=c++17)
# g++ accepts -fcoroutines in C++17 mode; clang does not know the flag.
if $cxx -fcoroutines -x c++ -std=c++17 -fsyntax-only /dev/null 2>/dev/null; then
    flags+=(-fcoroutines)
fi
for header in $(cd "$srcdir/include" && find corocoll -name '*.hpp' | sort); do
    printf '#include <%s>\nint main() {}\n' "$header" > "$tmp/prog.cpp"
    # shellcheck disable=SC2086
    if $cxx "${flags[@]}" -fsyntax-only -I "$srcdir/include" "$tmp/prog.cpp" \
        > "$tmp/out" 2>&1; then
        echo "FAIL: <$header> compiled with ${flags[*]}"
        failures=$((failures + 1))
        continue
    fi
    # The #error and the missing header that stops the compiler: nothing else.
    errors=$(grep -c 'error:' "$tmp/out" || true)
    if ! grep -q 'corocoll needs C++20: compile with -std=c++20' "$tmp/out" || ((errors > 2)); then
        echo "FAIL: <$header> with ${flags[*]}: $errors errors, or none says it needs C++20:"
        head -n 20 "$tmp/out"
        failures=$((failures + 1))
        continue
    fi
    checked=$((checked + 1))
done
echo "$checked headers stop at once with ${flags[*]}; $failures do not. What a program sees:"
printf '#include <corocoll/corocoll.hpp>\nint main() {}\n' > "$tmp/prog.cpp"
$cxx "${flags[@]}" -fsyntax-only -I "$srcdir/include" "$tmp/prog.cpp" 2>&1 || true
exit $((failures > 0))
