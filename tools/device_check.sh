#!/usr/bin/env bash
# The device check (issue 36): builds corocoll's GPU layer against a real CUDA runtime and NCCL
# on a machine with an NVIDIA GPU, runs its tests, its benchmark and its overlap example, and
# writes a short report with the raw logs. That machine has CUDA (nvcc), python3 with torch and
# the nvidia-nccl wheel, meson, ninja and pybind11, but no package registry and no liburing or
# doctest: those come as Debian packages fetched here beforehand and unpacked into a prefix
# there (never into /).
#
#   tools/device_check.sh --fetch            here, with apt: the .deb files into .device/debs
#                                            (ignored by git, .gitignore), to be carried along
#                                            with the checkout
#   tools/device_check.sh [--sim] [--out DIR] [--jobs N] [--build DIR]
#       --sim    a dry run without a GPU: against the simulator (tests/gpu/sim) and the CUDA
#                and NCCL headers under /usr/local/cuda, with the same prefix of unpacked
#                packages as on the device machine
#       --out    where the report and the logs go (default $OUT, else ./device-check-out)
#       --jobs   build jobs (default: every processor)
#
# Files under --out (at most 8, for the tool that brings them back): report.txt (what ran and
# its outcome, the figures), env.log, configure.log, build.log, tests.log, perf.log,
# overlap.log. Exit status 0 when every step passed; the report says which did not.
# The torch backend is not built here: it is written against torch 1.13's ProcessGroup, and
# torch 2.x needs its c10d::Backend port (issue 36, item 2); the report gives torch's version.

set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD

sim=0
fetch=0
out=${OUT:-$root/device-check-out}
jobs=$(nproc)
build=/tmp/corocoll-device-build
while (($#)); do
    case $1 in
        --sim) sim=1 ;;
        --fetch) fetch=1 ;;
        --out) out=$2; shift ;;
        --jobs) jobs=$2; shift ;;
        --build) build=$2; shift ;;
        -h|--help) sed -n '2,25p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) echo "device_check.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done

debs=$root/.device/debs
packages=(liburing2 liburing-dev doctest-dev pkgconf pkgconf-bin libpkgconf3)

if ((fetch)); then
    mkdir -p "$debs"
    (cd "$debs" && apt-get download "${packages[@]}") || exit 1
    ls -l "$debs"
    echo "carry .device along (run's carry: [\".device\"]) and run tools/device_check.sh there"
    exit 0
fi

mkdir -p "$out"
rm -f "$out"/*.log
report=$out/report.txt
: > "$report"
say() { echo "$*" | tee -a "$report"; }
failed=0
step() {  # step NAME LOG COMMAND...: runs it, logs it, notes the outcome and the time
    local name=$1 log=$2
    shift 2
    local t0=$SECONDS
    "$@" >> "$log" 2>&1
    local rc=$?
    local outcome=ok
    if ((rc == 77)); then
        outcome="skipped (77)"
    elif ((rc != 0)); then
        outcome="FAILED (exit $rc)"
        failed=1
    fi
    say "$(printf '%-34s %-18s %4ds' "$name" "$outcome" $((SECONDS - t0)))"
    return $rc
}

say "corocoll device check, $(git -C "$root" log -1 --format='%h %s' 2>/dev/null | cut -c1-72)"
say "mode: $( ((sim)) && echo 'dry run against the simulator' || echo 'real GPU')"

# ---- what the machine is ----
{
    echo "== uname"; uname -a
    echo "== CPU"; grep -m1 'model name' /proc/cpuinfo; nproc
    echo "== nvidia-smi"; nvidia-smi 2>&1 || true
    echo "== nvcc"; nvcc --version 2>&1 || true
    echo "== python3 / torch"
    python3 -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.is_available())' 2>&1 || true
    echo "== meson / ninja"; meson --version 2>&1; ninja --version 2>&1
} > "$out/env.log" 2>&1
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n1)
say "GPU: ${gpu:-none seen by nvidia-smi}"
say "CUDA (nvcc): $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' || echo 'not found')"
say "torch: $(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null || echo 'not found')"

# ---- the prefix of unpacked packages: liburing, doctest, pkg-config ----
prefix=/tmp/corocoll-device-prefix
rm -rf "$prefix"
mkdir -p "$prefix"
if compgen -G "$debs/*.deb" > /dev/null; then
    for d in "$debs"/*.deb; do dpkg -x "$d" "$prefix" || exit 1; done
    # The .pc files name /usr: point them into the prefix, as system headers (-isystem: the
    # build's -Wpedantic -Werror must not reach liburing's own headers, as under /usr).
    for pc in "$prefix"/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc; do
        [[ -f $pc ]] && sed -i -E -e "s#^(prefix|libdir|includedir)=/usr#\1=$prefix/usr#" \
            -e 's#^Cflags: -I#Cflags: -isystem #' "$pc"
    done
    # Debian's doctest-dev has no .pc file: one for the header, so that pkg-config finds it.
    version=$(ls "$debs" | sed -n 's/^doctest-dev_\([0-9.]*\).*/\1/p')
    printf 'Name: doctest\nDescription: doctest (unpacked)\nVersion: %s\nCflags: -isystem %s/usr/include\n' \
        "${version:-2.4.9}" "$prefix" > "$prefix/usr/lib/x86_64-linux-gnu/pkgconfig/doctest.pc"
    say "packages: $(cd "$debs" && ls *.deb | sed 's/_[a-z0-9]*.deb$//' | tr '\n' ' ')"
else
    say "packages: none in .device/debs (run tools/device_check.sh --fetch here first); using the system's"
fi
export PATH=$prefix/usr/bin:$PATH
export LD_LIBRARY_PATH=$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PKG_CONFIG_PATH=$prefix/usr/lib/x86_64-linux-gnu/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}

# ---- CUDA and NCCL under one root, as -Dnccl_cuda_root wants them ----
if ((sim)); then
    cuda_root=/usr/local/cuda
    say "NCCL: headers of $(grep -m1 -o 'NCCL_VERSION_CODE [0-9]*' $cuda_root/include/nccl.h) (the simulator stands in)"
else
    cuda_home=$(dirname "$(dirname "$(command -v nvcc)")")
    # The wheel's layout differs between releases (nvidia/nccl/..., nvidia/cu13/...): look.
    nvidia_dir=$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null)
    nccl_h=$(find "${nvidia_dir:-/nonexistent}" -name nccl.h 2>/dev/null | head -n1)
    nccl_so=$(find "${nvidia_dir:-/nonexistent}" -name 'libnccl.so*' 2>/dev/null | head -n1)
    cuda_root=/tmp/corocoll-device-cuda
    rm -rf "$cuda_root"
    mkdir -p "$cuda_root/include" "$cuda_root/lib64" "$cuda_root/bin"
    ln -s "$cuda_home"/include/* "$cuda_root/include/" 2>/dev/null
    ln -s "$cuda_home"/bin/* "$cuda_root/bin/" 2>/dev/null
    for l in "$cuda_home"/lib64/libcudart*; do ln -sf "$l" "$cuda_root/lib64/"; done
    # nvcc finds its compiler passes (nvvm/bin/cicc) and nvcc.profile beside its own path: the
    # rest of the toolkit's tree goes under the root too.
    for e in "$cuda_home"/*; do
        [[ -e $cuda_root/$(basename "$e") ]] || ln -s "$e" "$cuda_root/"
    done
    if [[ -n $nccl_h && -n $nccl_so ]]; then
        ln -sf "$(dirname "$nccl_h")"/nccl*.h "$cuda_root/include/"
        ln -sf "$nccl_so" "$cuda_root/lib64/libnccl.so"
        ln -sf "$nccl_so" "$cuda_root/lib64/$(basename "$nccl_so")"
        say "NCCL: $(grep -m1 -o 'NCCL_VERSION_CODE [0-9]*' "$nccl_h") ($nccl_h, $nccl_so)"
    else
        say "NCCL: no nccl.h and libnccl.so* under python3's nvidia packages (${nvidia_dir:-none})"
    fi
    export LD_LIBRARY_PATH=$cuda_root/lib64:$LD_LIBRARY_PATH
fi

# ---- configure and build what the check runs ----
rm -rf "$build"
options=(--buildtype=release -Dnccl=enabled -Dnccl_cuda_root="$cuda_root" -Dtorch=disabled
         -Dtests=enabled -Dbenchmarks=enabled -Dexamples=enabled -Dtools=disabled)
((sim)) && options+=(-Dgpu_sim=true)
step "configure" "$out/configure.log" meson setup "$build" "${options[@]}" || {
    say "configure failed: see configure.log"
    exit 1
}
targets=(tests/gpu_api_test tests/gpu_device_test benchmarks/gpu_coll_perf examples/gpu_overlap
         tests/store_tool examples/p2p_blocking)
((sim)) && targets+=(tests/gpu_sim_test tests/nccl_group_test)
step "build (${#targets[@]} targets, $jobs jobs)" "$out/build.log" ninja -C "$build" -j "$jobs" "${targets[@]}" || {
    say "build failed: see build.log"
    exit 1
}

# ---- run ----
step "gpu_api_test" "$out/tests.log" timeout 120 "$build/tests/gpu_api_test"
step "gpu_device_test" "$out/tests.log" timeout 300 "$build/tests/gpu_device_test"
if ((sim)); then
    step "gpu_device_test (1 device)" "$out/tests.log" env COROCOLL_SIM_DEVICES=1 timeout 300 "$build/tests/gpu_device_test"
    step "gpu_sim_test" "$out/tests.log" timeout 120 "$build/tests/gpu_sim_test"
    step "nccl_group_test" "$out/tests.log" timeout 300 "$build/tests/nccl_group_test"
fi
# torch's TCPStore (the machine's torch, 2.x) against corocoll's store server and client, both
# ways, and with torch's libuv and legacy servers where torch has both (issue 36, item 3).
step "torch_interop_test (torch $(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null))" \
    "$out/tests.log" timeout 120 python3 tests/rendezvous/torch_interop_test.py "$build/tests/store_tool"
# A torchrun job of the machine's torch whose ranks (p2p_blocking, 4 ranks) rendezvous on the
# agent's store (TORCHELASTIC_USE_AGENT_STORE; a libuv TCPStore from torch 2.4 on).
step "torchrun --no_python p2p_blocking" "$out/tests.log" timeout 150 \
    python3 tests/process_group/launchers_test.py "$build/examples/p2p_blocking" torchrun
# The awaitable layer beside plain NCCL, world of one: the last two columns are the difference
# per op and the ratio.
for coll in all_reduce broadcast all_gather reduce_scatter; do
    step "gpu_coll_perf --coll $coll" "$out/perf.log" timeout 120 "$build/benchmarks/gpu_coll_perf" \
        --coll "$coll" -b 8 -e 64M -f 8 -n 50 -w 5 -c 1
done
if ((sim)); then
    step "gpu_overlap" "$out/overlap.log" timeout 120 "$build/examples/gpu_overlap" --mib 4
else
    step "gpu_overlap --check" "$out/overlap.log" timeout 120 "$build/examples/gpu_overlap" --check
fi

say ""
say "== gpu_coll_perf (size, corocoll and NCCL time, difference, ratio: see perf.log's header)"
grep -E '^# gpu_coll_perf|^ *[0-9]' "$out/perf.log" | head -n 48 >> "$report"
say "== gpu_overlap"
grep -vE '^(pid|corocoll\[)' "$out/overlap.log" | tail -n 8 >> "$report"
say ""
say "result: $( ((failed)) && echo 'some steps FAILED' || echo 'every step passed')"
exit $failed
