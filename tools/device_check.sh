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
#       --torch-only  only the torch backend and the torch programs that need nothing else
#                built (behaviour, tutorial, init_race, ddp, differential): a short rerun
#
# Files under --out: report.txt (what ran and its outcome, the figures), env.log,
# configure.log, build.log, torch_build.log, tests.log, torch.log, torch_suite.json, perf.log,
# overlap.log (more than the 8 files a device run brings back: pack them). Exit status 0 when
# every step passed; the report says which did not. The torch backend is built against
# python3's torch (2.x: the c10d::Backend glue) and runs the project's torch programs.

set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD

sim=0
fetch=0
torch_only=0
out=${OUT:-$root/device-check-out}
jobs=$(nproc)
build=/tmp/corocoll-device-build
while (($#)); do
    case $1 in
        --sim) sim=1 ;;
        --torch-only) torch_only=1 ;;
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
         -Dtests=enabled -Dbenchmarks=enabled -Dexamples=enabled -Dtools=enabled)
((sim)) && options+=(-Dgpu_sim=true)
step "configure" "$out/configure.log" meson setup "$build" "${options[@]}" || {
    say "configure failed: see configure.log"
    exit 1
}
targets=(tests/gpu_api_test tests/gpu_device_test benchmarks/gpu_coll_perf examples/gpu_overlap
         tests/store_tool examples/p2p_blocking tools/corocollrun)
((sim)) && targets+=(tests/gpu_sim_test tests/nccl_group_test)
# The torch backend (python/corocoll_torch) against the machine's torch, compiled beside the
# build (one translation unit): Meson's torch detection looks for Debian's libtorch, while this
# machine's torch lives in python3's site-packages, whose own paths are taken here.
torch_ext_dir=$build/python/corocoll_torch
build_torch_ext() {
    local flags
    flags=$(python3 - <<'PY'
import sysconfig, torch
from torch.utils import cpp_extension as c
print(" ".join("-isystem " + p for p in c.include_paths()),
      "-isystem", sysconfig.get_paths()["include"],
      f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}")
print(" ".join(f"-L{p} -Wl,-rpath,{p}" for p in c.library_paths()))
print(sysconfig.get_config_var("EXT_SUFFIX"))
PY
) || return 1
    local cflags ldflags suffix
    cflags=$(sed -n 1p <<< "$flags")
    ldflags=$(sed -n 2p <<< "$flags")
    suffix=$(sed -n 3p <<< "$flags")
    mkdir -p "$torch_ext_dir"
    cp python/corocoll_torch/__init__.py "$torch_ext_dir/"
    # shellcheck disable=SC2086  # the flags are words
    g++ -std=c++20 -O2 -fPIC -shared -Wall -Wno-unused-parameter -Iinclude $cflags \
        $(pkg-config --cflags liburing) \
        python/corocoll_torch/backend.cpp -o "$torch_ext_dir/_C$suffix" $ldflags \
        -ltorch_python -ltorch -ltorch_cpu -lc10 $(pkg-config --libs liburing) -lpthread
}
torch_version=$(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null)
if [[ -n $torch_version ]]; then
    # Beside ninja: it is one long translation unit.
    (build_torch_ext > "$out/torch_build.log" 2>&1; echo $? > "$out/torch_build.rc") &
    torch_build_pid=$!
fi
if ((!torch_only)); then
    step "build (${#targets[@]} targets, $jobs jobs)" "$out/build.log" ninja -C "$build" -j "$jobs" "${targets[@]}" || {
        say "build failed: see build.log"
        exit 1
    }
fi
if [[ -n $torch_version ]]; then
    t0=$SECONDS
    wait "$torch_build_pid"
    rc=$(cat "$out/torch_build.rc" 2>/dev/null || echo 1)
    if [[ $rc == 0 ]]; then
        say "$(printf '%-34s %-18s %4ds' "build torch backend ($torch_version)" ok $((SECONDS - t0)))"
    else
        say "$(printf '%-34s %-18s %4ds' "build torch backend ($torch_version)" "FAILED (exit $rc)" $((SECONDS - t0)))"
        failed=1
        torch_version=
    fi
fi

# ---- run ----
if ((torch_only)) && [[ -z $torch_version ]]; then
    say "result: no torch backend to run"
    exit 1
fi
# The GPU and store steps (not with --torch-only, which builds none of their programs).
if ((!torch_only)); then
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
fi

# The torch backend "corocoll" under the machine's torch: the project's torch programs, and a
# stable subset of torch's own distributed test suite (3 ranks; each test's outcome in
# torch_suite.json).
if [[ -n $torch_version ]]; then
    # torch 2.11 spawns 3 ranks per test in about 10 s: a dozen tests, picked over the kinds of
    # call (the whole list is tests/meson.build's torch_suite_subset).
    suite_subset=test_all_reduce_sum,test_all_gather,test_all_to_all_single_unequal_split,test_batch_isend_irecv_gloo,test_broadcast_group,test_get_future,test_irecv,test_reduce_sum,test_send_recv_any_source,test_sparse_all_reduce_sum,test_destroy_group,test_barrier_timeout_full_group
    torch_run() {  # torch_run NAME TIMEOUT ARGS...: a torch program with the backend on the path
        local name=$1 limit=$2
        shift 2
        echo "=== $name" >> "$out/torch.log"
        step "$name" "$out/torch.log" env PYTHONPATH="$build/python" OMP_NUM_THREADS=1 \
            timeout "$limit" python3 "$@"
    }
    torch_run "torch: behaviour" 150 tests/torch/behaviour.py
    torch_run "torch: tutorial (torchrun)" 150 tests/torch/tutorial.py --launch torchrun
    torch_run "torch: init race (fork, 5 runs)" 150 tests/torch/init_race.py --runs 5 --start fork
    torch_run "torch: init race, late (2 runs)" 150 tests/torch/init_race.py --runs 2 --start fork --late
    # grow needs corocollrun, which --torch-only does not build.
    ((torch_only)) ||
        torch_run "torch: grow (corocollrun)" 200 tests/torch/grow.py "$build/tools/corocollrun"
    torch_run "torch: ddp (spawn, 2 ranks)" 200 tests/torch/ddp.py --launch spawn --ranks 2 --steps 300
    torch_run "torch: differential (2, 3 ranks)" 200 tests/torch/differential.py 2 3
    # CPU tensors: with a GPU visible, torch 2.x's suite skips every test for want of one GPU
    # per rank ("Need at least 3 CUDA devices"). Not with --torch-only (a short run).
    if ((!torch_only)); then
        CUDA_VISIBLE_DEVICES= torch_run "torch: suite subset" 200 tests/torch/distributed_suite.py \
            --backend corocoll --only "$suite_subset" --skip-unknown --report "$out/torch_suite.json"
        grep -a '^{"backend"' "$out/torch.log" | tail -n 1 >> "$report"
    fi
fi
if ((!torch_only)); then
    say ""
    say "== gpu_coll_perf (size, corocoll and NCCL time, difference, ratio: see perf.log's header)"
    grep -E '^# gpu_coll_perf|^ *[0-9]' "$out/perf.log" | head -n 48 >> "$report"
    say "== gpu_overlap"
    grep -vE '^(pid|corocoll\[)' "$out/overlap.log" | tail -n 8 >> "$report"
fi
say ""
say "result: $( ((failed)) && echo 'some steps FAILED' || echo 'every step passed')"
exit $failed
