#!/usr/bin/env bash
# CMake consumers: a project that takes corocoll with add_subdirectory, and one that finds an
# installed corocoll with find_package(corocoll 0.1 REQUIRED), each build
# tests/packaging/vendor_prog.cpp against corocoll::corocoll and run it; a third takes
# add_subdirectory's corocoll::compiled (separate compilation) and checks that its program's
# own object holds none of corocoll's coroutine bodies.
#
# usage: cmake_test.sh <meson> <corocoll source dir> <build dir> <prefix>
# env:   CXX  the compiler command (default g++)
set -euo pipefail

meson=$1
srcdir=$2
builddir=$3
prefix=$4
cxx=${CXX:-g++}
# CMake wants the compiler alone: the first word of CXX ("ccache g++" keeps g++).
compiler=$(command -v "${cxx##* }")

if ! command -v cmake >/dev/null; then
    echo "cmake test: SKIP: no cmake"
    exit 77
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/corocoll-cmake.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() {
    echo "cmake test: FAIL: $*" >&2
    exit 1
}

consumer() {  # <dir> <how to get corocoll> [target]
    mkdir -p "$1"
    cp "$srcdir/tests/packaging/vendor_prog.cpp" "$1/"
    cat >"$1/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.16)
project(consumer LANGUAGES CXX)
$2
add_executable(prog vendor_prog.cpp)
target_link_libraries(prog PRIVATE ${3:-corocoll::corocoll})
CMAKE
}

build_and_run() {  # <dir> <extra cmake args...>
    local dir=$1
    shift
    cmake -S "$dir" -B "$dir/build" -DCMAKE_CXX_COMPILER="$compiler" "$@" >"$dir/configure.log" 2>&1 ||
        { cat "$dir/configure.log" >&2; fail "cmake configure of $dir"; }
    cmake --build "$dir/build" >"$dir/build.log" 2>&1 ||
        { cat "$dir/build.log" >&2; fail "cmake build of $dir"; }
    "$dir/build/prog" || fail "$dir/build/prog failed"
}

echo "== add_subdirectory"
consumer "$tmp/sub" "add_subdirectory(\"$srcdir\" corocoll)"
build_and_run "$tmp/sub"

echo "== add_subdirectory, corocoll::compiled"
consumer "$tmp/compiled" "add_subdirectory(\"$srcdir\" corocoll)" corocoll::compiled
build_and_run "$tmp/compiled"
obj=$(find "$tmp/compiled/build/CMakeFiles/prog.dir" -name 'vendor_prog.cpp.o')
lib=$(find "$tmp/compiled/build" -name 'libcorocoll_compiled.a')
[[ -f $obj && -f $lib ]] || fail "corocoll::compiled: no program object ('$obj') or library ('$lib')"
# The library holds the bodies (file_store::set is one); the program's object does not.
# (nm's output goes to a file: grep -q closing the pipe early would fail it under pipefail.)
nm -C --defined-only "$lib" >"$tmp/lib.nm" 2>/dev/null
nm -C --defined-only "$obj" >"$tmp/obj.nm"
grep -q 'file_store::set' "$tmp/lib.nm" || fail "libcorocoll_compiled.a lacks file_store::set"
if grep -q 'file_store::set' "$tmp/obj.nm"; then
    fail "the program's object defines file_store::set: its TU compiled corocoll's bodies"
fi

echo "== find_package from a meson install"
dest=$tmp/dest
"$meson" install -C "$builddir" --destdir "$dest" --no-rebuild >"$tmp/install.log" 2>&1 ||
    { cat "$tmp/install.log" >&2; fail "meson install failed"; }
config=$(find "$dest" -name corocollConfig.cmake)
[[ $config == *"$prefix/lib/cmake/corocoll/corocollConfig.cmake" ]] ||
    fail "corocollConfig.cmake installed as '$config'"
[[ -f $(dirname "$config")/corocollConfigVersion.cmake ]] || fail "no corocollConfigVersion.cmake"
consumer "$tmp/found" "find_package(corocoll 0.1 REQUIRED)
message(STATUS \"corocoll \${corocoll_VERSION} from \${corocoll_DIR}\")"
build_and_run "$tmp/found" -DCMAKE_PREFIX_PATH="$dest$prefix"
grep -q "corocoll 0.1.0 from $dest$prefix/lib/cmake/corocoll" "$tmp/found/configure.log" ||
    fail "find_package did not report version 0.1.0 from the install"
# The version file (written by Meson, without CMake): the same minor version, at least the
# one asked for; a range, inside it. Configuring alone says whether find_package accepts.
accepts() {  # accepts NAME "VERSION ARGS": 0 when find_package(corocoll ARGS REQUIRED) does
    consumer "$tmp/$1" "find_package(corocoll $2 REQUIRED)"
    cmake -S "$tmp/$1" -B "$tmp/$1/build" -DCMAKE_PREFIX_PATH="$dest$prefix" \
        >"$tmp/$1.log" 2>&1
}
accepts v010_exact "0.1.0 EXACT" || fail "find_package(corocoll 0.1.0 EXACT) refused 0.1.0"
accepts v01_range "0.1...0.2" || fail "find_package(corocoll 0.1...0.2) refused 0.1.0"
! accepts v02 "0.2" || fail "find_package(corocoll 0.2) accepted 0.1.0"
! accepts v011 "0.1.1" || fail "find_package(corocoll 0.1.1) accepted 0.1.0"
! accepts v00 "0.0" || fail "find_package(corocoll 0.0) accepted 0.1.0 (another minor version)"
! accepts v02_range "0.2...0.3" || fail "find_package(corocoll 0.2...0.3) accepted 0.1.0"
echo "cmake test: OK"
