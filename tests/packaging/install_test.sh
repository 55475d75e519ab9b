#!/usr/bin/env bash
# Install check: `meson install` into a scratch DESTDIR, then build a program the way a user of
# an installed corocoll does — with nothing but the flags `pkg-config corocoll` prints.
#
# usage: install_test.sh <meson> <corocoll source dir> <build dir> <prefix>
# env:   CXX  the compiler command (default g++); Meson passes the compiler it was set up with.
set -euo pipefail

if [[ $# -ne 4 ]]; then
    echo "usage: $0 <meson> <source dir> <build dir> <prefix>" >&2
    exit 2
fi
meson=$1
srcdir=$2
builddir=$3
prefix=$4
cxx=${CXX:-g++}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/corocoll-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
dest=$tmp/dest

fail() {
    echo "install test: FAIL: $*" >&2
    exit 1
}

# Nothing is compiled for the install (header-only), and meson test has already built the
# tree, so no rebuild: a second ninja must not run while tests are running.
echo "install: $meson install -C $builddir --destdir $dest --no-rebuild"
"$meson" install -C "$builddir" --destdir "$dest" --no-rebuild >"$tmp/install.log" 2>&1 ||
    { cat "$tmp/install.log" >&2; fail "meson install failed"; }
echo "installed:"
(cd "$dest" && find . -type f | sort | sed 's/^\./  /')

# The launcher goes to bindir (when tools are built) and runs from there.
launcher=$(find "$dest" -type f -name corocollrun)
if [[ -n $launcher ]]; then
    [[ $launcher == *"$prefix/bin/corocollrun" ]] || fail "corocollrun installed as $launcher"
    "$launcher" --nproc_per_node=2 --no_prefix echo launched >"$tmp/launch.out" 2>&1 ||
        { cat "$tmp/launch.out" >&2; fail "the installed corocollrun cannot launch echo"; }
    [[ $(grep -c '^launched$' "$tmp/launch.out") -eq 2 ]] || fail "corocollrun printed: $(cat "$tmp/launch.out")"
    echo "installed corocollrun: ${launcher#"$dest"} launches 2 workers"
fi

pc=$(find "$dest" -name corocoll.pc)
[[ -n $pc && $(wc -l <<<"$pc") -eq 1 ]] || fail "expected exactly one corocoll.pc under $dest"
echo "pkg-config file: ${pc#"$dest"}"
echo "----"
cat "$pc"
echo "----"

# As installed (prefix as configured). pkgconf drops -I/usr/include, so that check is skipped
# for prefix=/usr.
flags=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --cflags --libs corocoll)
echo "pkg-config --cflags --libs corocoll (as installed): $flags"
if [[ $prefix != /usr ]]; then
    [[ " $flags " == *" -I$prefix/include "* ]] || fail "no -I$prefix/include in: $flags"
fi
[[ " $flags " == *" -luring "* ]] || fail "no -luring in: $flags"
[[ " $flags " == *" -pthread "* ]] || fail "no -pthread in: $flags"

# Relocated into the DESTDIR: every .pc file installed (corocoll's, and liburing's when it was
# built from the wrap) gets prefix=<DESTDIR><prefix>.
mkdir "$tmp/pc"
while IFS= read -r f; do
    sed "s|^prefix=.*|prefix=$dest$prefix|" "$f" >"$tmp/pc/$(basename "$f")"
done < <(find "$dest" -name '*.pc')
cflags=$(PKG_CONFIG_PATH=$tmp/pc pkg-config --cflags corocoll)
libs=$(PKG_CONFIG_PATH=$tmp/pc pkg-config --libs corocoll)
echo "pkg-config --cflags corocoll (relocated): $cflags"
echo "pkg-config --libs corocoll (relocated):   $libs"
[[ " $cflags " == *" -I$dest$prefix/include "* ]] || fail "no -I$dest$prefix/include in: $cflags"

# Every header of the source tree is installed, unchanged; the GPU layer's (include-gpu/)
# beside them, in <corocoll/gpu/...>.
diff -r -x gpu -x gpu.hpp "$srcdir/include/corocoll" "$dest$prefix/include/corocoll" ||
    fail "installed headers differ from include/corocoll"
diff -r "$srcdir/include-gpu/corocoll/gpu" "$dest$prefix/include/corocoll/gpu" ||
    fail "installed GPU headers differ from include-gpu/corocoll/gpu"
cmp "$srcdir/include-gpu/corocoll/gpu.hpp" "$dest$prefix/include/corocoll/gpu.hpp" ||
    fail "installed corocoll/gpu.hpp differs from include-gpu/corocoll/gpu.hpp"
echo "headers: installed tree matches include/corocoll and include-gpu/corocoll"

# The C++ standard is the consumer's choice (the .pc file does not force one); corocoll needs
# C++20 or later. Word splitting of $cxx, $cflags and $libs is wanted.
# shellcheck disable=SC2206
cmd=($cxx -std=c++20 $cflags "$srcdir/tests/packaging/vendor_prog.cpp" -o "$tmp/prog" $libs)
echo "compile: ${cmd[*]}"
"${cmd[@]}"

echo "run: $tmp/prog"
"$tmp/prog"
echo "install test: OK"
