#!/usr/bin/env bash
# Meson consumers through a wrap-git file, as the README shows: a project whose
# subprojects/corocoll.wrap points at a git repository of corocoll builds
# tests/packaging/vendor_prog.cpp with dependency('corocoll') and runs it.
#
# The repository is a bare clone of this source tree, made here, so nothing leaves the machine.
#   - revision = this tree's commit (what is being tested);
#   - revision = v<version> with depth = 1 (the README's form), when this clone has that tag.
#
# usage: wrap_test.sh <meson> <corocoll source dir> <version>
# env:   CXX  the compiler command (default g++)
set -euo pipefail

meson=$1
srcdir=$2
version=$3
export CXX=${CXX:-g++}

if ! command -v git >/dev/null; then
    echo "wrap test: SKIP: no git"
    exit 77
fi
if ! commit=$(git -C "$srcdir" rev-parse --verify -q HEAD 2>/dev/null); then
    echo "wrap test: SKIP: $srcdir is not a git checkout (a release tarball has no history to wrap)"
    exit 77
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/corocoll-wrap.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() {
    echo "wrap test: FAIL: $*" >&2
    exit 1
}

git clone --quiet --bare "$srcdir" "$tmp/corocoll.git"
# A tree with uncommitted changes is tested at its last commit: say so.
if [[ -n $(git -C "$srcdir" status --porcelain --untracked-files=no 2>/dev/null) ]]; then
    echo "note: $srcdir has uncommitted changes; the wrap builds commit $commit"
fi

consumer() {  # <dir> <wrap body> <revision whose vendor_prog.cpp to build> <commit expected>
    local dir=$1
    mkdir -p "$dir/subprojects"
    git -C "$srcdir" show "$3:tests/packaging/vendor_prog.cpp" >"$dir/vendor_prog.cpp"
    cat >"$dir/meson.build" <<'MESON'
project('consumer', 'cpp', default_options: ['cpp_std=c++20', 'buildtype=release'])
corocoll_dep = dependency('corocoll')
executable('prog', 'vendor_prog.cpp', dependencies: corocoll_dep)
MESON
    printf '%s\n' "$2" >"$dir/subprojects/corocoll.wrap"
    echo "--- $dir/subprojects/corocoll.wrap"
    cat "$dir/subprojects/corocoll.wrap"
    # --force-fallback-for: an installed corocoll on this machine must not stand in for the wrap.
    "$meson" setup "$dir/build" "$dir" --force-fallback-for=corocoll >"$dir/setup.log" 2>&1 ||
        { cat "$dir/setup.log" >&2; fail "meson setup of $dir"; }
    grep -q 'Executing subproject corocoll' "$dir/setup.log" ||
        { cat "$dir/setup.log" >&2; fail "$dir did not take corocoll from the wrap"; }
    "$meson" compile -C "$dir/build" >"$dir/build.log" 2>&1 ||
        { cat "$dir/build.log" >&2; fail "build of $dir"; }
    out=$("$dir/build/prog") || fail "$dir/build/prog exited $?: $out"
    echo "$out"
    [[ $out == *"loopback send/recv ok"* ]] || fail "$dir/build/prog printed: $out"
    # The checkout is the commit the wrap named.
    got=$(git -C "$dir/subprojects/corocoll" rev-parse HEAD)
    echo "subprojects/corocoll is at $got"
    [[ $got == "$4" ]] || fail "the subproject is at $got, the wrap named $4"
}

echo "== wrap-git at this tree's commit"
consumer "$tmp/at_commit" "[wrap-git]
url = $tmp/corocoll.git
revision = $commit

[provide]
corocoll = corocoll_dep" "$commit" "$commit"

tag=v$version
if tag_commit=$(git -C "$srcdir" rev-parse --verify -q "refs/tags/$tag^{commit}"); then
    echo "== wrap-git at tag $tag, depth 1 (the README's form)"
    consumer "$tmp/at_tag" "[wrap-git]
url = $tmp/corocoll.git
revision = $tag
depth = 1

[provide]
corocoll = corocoll_dep" "$tag" "$tag_commit"
else
    echo "== no tag $tag in this clone: the README's tag form was not tried"
fi
echo "wrap test: ok"
