#!/usr/bin/python3
"""run_compare: corocoll beside torch.distributed (Gloo), Gloo C++, Open MPI and MPICH.

    python3 benchmarks/compare/run_compare.py [--ranks 2,4,8] [--ops OP,...] [--systems SYS,...]
        [-b 4] [-e 64M] [-f 4] [--time-per-size SECONDS | --iters N] [--out-dir docs]
        [--build-dir DIR] [--coll-perf PATH] [--corocollrun PATH] [--python PATH]
        [--timeout SECONDS] [--quick] [--section NAME]

Every system runs the same ops at the same sizes with the same iterations (a cell that ran
for less than a quarter of its time runs again with more: LENGTHEN_BELOW), timed the way
corocoll's coll_perf times them (barrier, warm-up, barrier, timed loop, mean per iteration,
largest over the ranks) and checked once per size (-c 1): coll_perf for corocoll, and for the
others the programs beside this file (torch_perf.py, gloo_perf.cpp, mpi_perf.c), which print
coll_perf's JSON rows. Systems run one at a time, each invocation under a time limit; one that
fails is reported in the tables, and the others go on. corocoll runs twice: corocoll_shm and
corocoll_tcp are coll_perf with COROCOLL_TRANSPORT=shm and =tcp (--systems corocoll means both).
An op that a system cannot do (its program prints "<program>: n/a: <why>" on stderr, and exits
with 77) shows as n/a and is not a failure.

Writes, under --out-dir: performance.md (only between <!-- compare:begin --> and
<!-- compare:end -->; the rest of the file is kept), perf/<op>_<N>ranks.png (latency and busbw
against size), perf/heat_<system>_<N>ranks.png (sweep_summary.py's heat maps) and
perf/results.json (every row, with its system and iterations). With --section NAME, the
markers are <!-- compare:NAME:begin --> and <!-- compare:NAME:end --> and the files go to
perf/NAME/, so that a sweep keeps its own section beside the others. The section opens with
sweep_summary.py's view: each corocoll system's time over the best peer's at every cell, with
cells over 1.25x and cliffs (a size over 2x as slow as the next) flagged, and a paragraph on
placement: line_crossing.c (built here with gcc) times a cache line's crossing between the
first two CPUs before and after each system's run of each op, and the runs that saw over 1.5x
the cheapest crossing are named (on a VM the processors can move apart for minutes, and a
comparison of two runs minutes apart then compares two machines). Plots need
matplotlib (Debian's python3-matplotlib, for /usr/bin/python3).

The whole space (issue 32's sweep; hours on 2 cores, so not part of any test):

    python3 benchmarks/compare/run_compare.py --section sweep --ranks 2,3,4,8 -b 4 -e 64M -f 2
"""

import argparse
import datetime
import importlib.util
import json
import os
import platform
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field

sys.dont_write_bytecode = True  # no __pycache__ beside the sources for the import below
import sweep_summary  # noqa: E402 (beside this file)
from fractions import Fraction
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

OPS = ("ping_pong", "all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "gather",
       "scatter", "all_to_all")

# The ops whose size is split over the ranks (each moves whole elements per rank).
SPLIT_OPS = ("all_gather", "reduce_scatter", "gather", "scatter", "all_to_all")

# What each system is, as the markdown names it.
SYSTEMS = {
    "corocoll_shm": "corocoll's coll_perf, COROCOLL_TRANSPORT=shm: corocoll's shared-memory "
                    "channel (the default between ranks of one host), io_uring reactor",
    "corocoll_tcp": "corocoll's coll_perf, COROCOLL_TRANSPORT=tcp: TCP on loopback, io_uring "
                    "reactor",
    "torch_gloo": "torch.distributed, Gloo backend (torch_perf.py): TCP on loopback",
    "gloo": "Gloo C++ (gloo_perf.cpp): TCP on loopback",
    "ompi_tcp": "Open MPI, pml ob1, btl tcp,self (mpi_perf.c): TCP on loopback",
    "ompi_vader": "Open MPI, pml ob1, btl vader,self (mpi_perf.c): shared memory",
    "mpich": "MPICH, ch4:ucx (mpi_perf.c): UCX's shared memory; network devices limited to lo",
}

# The corocoll systems: coll_perf with this COROCOLL_TRANSPORT.
COROCOLL = {"corocoll_shm": "shm", "corocoll_tcp": "tcp"}
# Names --systems accepts for several systems.
ALIASES = {"corocoll": list(COROCOLL)}
# The ratio columns divide by the first of these that ran: corocoll_shm, the default on one host.
REFERENCES = list(COROCOLL)

# What a program does when it cannot do an op: a line "<program>: n/a: <why>" on stderr (read
# through launchers, which need not pass the exit code on) and exit code 77.
NOT_AVAILABLE = re.compile(r"^\s*[\w.-]+: n/a: (.+)$", re.MULTILINE)

BEGIN_MARK = "<!-- compare:begin -->"
END_MARK = "<!-- compare:end -->"

# Iterations per size come from this model of one operation's time, so that a size costs about
# --time-per-size on a system that keeps to it: a fixed cost per peer and 1 GB/s. It is kept
# simple and the same for every system, so that every system runs the same iterations. With
# more ranks than CPUs the fixed cost grows by ranks / CPUs, as the ranks take turns on the
# cores (without it, 8 ranks on 2 CPUs ran 2000 iterations of MPICH's small all_reduce at
# 40-60 ms each, past the time limit of an invocation).
LATENCY_PER_PEER_US = 20.0
# ... and where every system of the run is a shared-memory one (SHARED_MEMORY) and every rank
# has a CPU, 1 µs, and up to SHARED_MEMORY_MAX_ITERS: with the 20 µs above, a 2-rank cell of
# 4 B ran 2,000 calls, 0.3 ms at 0.15 µs a call, and one pause of the machine decided its
# ratio (a sweep's rechecks of one cell: 0.12, 1.04 and 1.27 µs). Crowded runs keep the 20 µs:
# MPICH's calls take milliseconds there (above; 4 ranks on 2 CPUs, 10,000 all_reduces of
# 4 B-2 KiB outlasted the 600 s limit).
SHARED_MEMORY = ("corocoll_shm", "ompi_vader", "mpich")
SHARED_MEMORY_LATENCY_PER_PEER_US = 1.0
SHARED_MEMORY_MAX_ITERS = 100000
BYTES_PER_US = 1e3
MIN_ITERS = 5
# Warm-up iterations at least: the first calls of a fresh group run slower while its ranks settle
# (4 ranks on 2 CPUs: 20 scatters of 512 KiB after 5 warm-ups took 130-200 us each, after 10
# or more 20-32).
MIN_WARMUP = 10
MAX_ITERS = 10000
# Iterations are rounded down to 1, 2, 5 times a power of ten, so that neighbouring sizes share
# a count and one invocation covers them (torch and mpirun take a second or more to start).
NICE_ITERS = sorted({m * 10**e for e in range(6) for m in (1, 2, 5)} | {MAX_ITERS})
# The model cannot fit every system: with 4 ranks on 2 CPUs, MPICH's small calls take
# milliseconds (it polls without yielding) and corocoll's and vader's 3-5 µs, so the 500 calls
# that keep MPICH's cell within its time ran corocoll's and vader's for 2 ms, and a cell's runs
# spread 2-3x (all_to_all of 128 B: 2.65-6.24 µs over 8 runs). A cell that ran for less than
# LENGTHEN_BELOW of --time-per-size is run again with as many calls as fill it (at most
# LENGTHENED_MAX_ITERS; only where that is at least twice as many as before), and keeps that
# run: every cell runs for about --time-per-size on every system, or as long as the model's
# count made it.
LENGTHEN_BELOW = 0.25
LENGTHENED_MAX_ITERS = 100000
# A longer run may take LENGTHENED_SLACK times its sizes' --time-per-size, and 10 s to start,
# before it is stopped and its sizes keep their first runs: a call's time can change 1000-fold
# from run to run (MPICH's ping_pong of 4 KiB on 4 ranks and 2 CPUs: 500 calls in 4.6 s, 0.3 s
# the next time, and the 50,000 that the quick run asked for took 427 s).
LENGTHENED_SLACK = 10
LENGTHENED_START_S = 10
# How a run stopped at its time limit is reported (wait_all): a longer run stopped so keeps the
# first runs of its sizes, where any other failure fails the cell.
TIMED_OUT = "timed out"


def parse_size(text):
    """A size in bytes with an optional K, M or G suffix (powers of 1024, as coll_perf reads);
    a fraction must come out a whole number of bytes (1.5M, not 1.3M), as coll_perf requires."""
    m = re.fullmatch(r"(\d+\.?\d*|\.\d+)([kKmMgG]?)", text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text}: expected a size in bytes (K, M, G allowed)")
    value = Fraction(m[1]) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m[2].lower()]
    if value.denominator != 1:
        raise argparse.ArgumentTypeError(f"{text}: not a whole number of bytes")
    return max(1, int(value))


def parse_list(known, aliases=None):
    """A comma-separated list of `known` names; an alias stands for its names. Each name once,
    in the order given."""
    aliases = aliases or {}

    def parse(text):
        items = [x for x in text.split(",") if x]
        unknown = [x for x in items if x not in known and x not in aliases]
        if unknown or not items:
            raise argparse.ArgumentTypeError(
                f"{text}: expected a comma-separated list of {', '.join([*known, *aliases])}")
        out = []
        for x in items:
            for name in aliases.get(x, [x]):
                if name not in out:
                    out.append(name)
        return out
    return parse


def parse_ranks(text):
    try:
        ranks = [int(x) for x in text.split(",") if x]
    except ValueError:
        ranks = []
    if not ranks or min(ranks) < 2:
        raise argparse.ArgumentTypeError(f"{text}: expected rank counts of 2 or more, e.g. 2,4")
    return ranks


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=parse_ranks, default=[2, 4])
    p.add_argument("--ops", type=parse_list(OPS), default=list(OPS))
    p.add_argument("--systems", type=parse_list(list(SYSTEMS), ALIASES), default=list(SYSTEMS),
                   help="corocoll stands for corocoll_shm,corocoll_tcp")
    p.add_argument("-b", dest="min_bytes", type=parse_size, default=4)
    p.add_argument("-e", dest="max_bytes", type=parse_size, default=64 << 20)
    p.add_argument("-f", dest="factor", type=float, default=4)
    p.add_argument("--time-per-size", type=float, default=0.1,
                   help="seconds one size should take on a system that keeps to the model")
    p.add_argument("--iters", type=int,
                   help="the same timed iterations at every size, instead of --time-per-size")
    p.add_argument("--out-dir", type=Path, default=REPO / "docs")
    p.add_argument("--build-dir", type=Path, default=Path("/tmp/corocoll-compare"))
    p.add_argument("--coll-perf", type=Path, default=REPO / "build-release/benchmarks/coll_perf")
    p.add_argument("--corocollrun", type=Path,
                   default=REPO / "build-release/tools/corocollrun")
    p.add_argument("--python", default="/usr/bin/python3",
                   help="the Python that has torch, for torch_perf.py")
    p.add_argument("--timeout", type=float, default=600,
                   help="seconds one invocation (one system, op, rank count) may take")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: 2 ranks, 4 B to 64 KiB, 20 iterations")
    p.add_argument("--section", default="",
                   help="a section of its own in performance.md, and perf/NAME/ for its files")
    p.add_argument("--recheck", type=int, default=2,
                   help="times each flagged cell (over 1.25x the best peer, or a cliff) is "
                        "measured again, its corocoll system and every peer alone at that "
                        "size; the cell then keeps the median of all its runs (0: none)")
    a = p.parse_args()
    if a.quick:
        a.ranks, a.min_bytes, a.max_bytes, a.factor, a.iters = [2], 4, 64 << 10, 4, 20
        a.timeout = min(a.timeout, 60)
        a.recheck = 0
    if a.factor <= 1 or a.max_bytes < a.min_bytes:
        p.error("-f must be above 1 and -e not below -b")
    if a.iters is not None and a.iters < 1:
        p.error("--iters must be 1 or more")
    return a


def sizes(a):
    """The sizes every program's loop visits, computed as they compute them."""
    out, b = [], a.min_bytes
    while b <= a.max_bytes:
        out.append(b)
        nxt = int(b * a.factor)
        if nxt <= b:
            break
        b = nxt
    return out


def crowding(ranks):
    """How many ranks take turns on each CPU (1 when there are enough CPUs)."""
    return max(1.0, ranks / (os.cpu_count() or 1))


def iterations(a, size, ranks):
    """(timed, warm-up) iterations at one size: the same for every system."""
    if a.iters is not None:
        n = a.iters
    else:
        shm = all(s in SHARED_MEMORY for s in a.systems) and crowding(ranks) <= 1
        latency = SHARED_MEMORY_LATENCY_PER_PEER_US if shm else LATENCY_PER_PEER_US
        estimate_us = latency * (ranks - 1) * crowding(ranks) + size / BYTES_PER_US
        most = SHARED_MEMORY_MAX_ITERS if shm else MAX_ITERS
        raw = min(max(a.time_per_size * 1e6 / estimate_us, MIN_ITERS), most)
        n = max(x for x in NICE_ITERS if x <= raw)
    return n, warmup_for(n)


def segments(a, ranks, counts=None):
    """Runs of neighbouring sizes that share their iterations: (first, last, iters, warmup).
    `counts`: {size: iterations} for the sizes to run (others left out), instead of the
    model's."""
    out, last = [], None
    for s in sizes(a):
        if counts is not None and s not in counts:
            last = None
            continue
        n, w = iterations(a, s, ranks) if counts is None else (counts[s], warmup_for(counts[s]))
        if out and last == out[-1][1] and out[-1][2:] == (n, w):
            out[-1] = (out[-1][0], s, n, w)
        else:
            out.append((s, s, n, w))
        last = s
    return out


def warmup_for(n):
    """Warm-up iterations before `n` timed ones."""
    return max(MIN_WARMUP, n // 10)


def asked_sizes(a, op, ranks, size):
    """The sizes asked for that move `size` bytes (a split op moves whole elements per rank:
    a row's size can be below the size asked)."""
    parts = ranks if op in SPLIT_OPS else 1
    return [s for s in sizes(a) if s // 4 // parts * 4 * parts == size]


def lengthened(a, op, ranks, rows):
    """{asked size: iterations} for the rows of one invocation that ran for less than
    LENGTHEN_BELOW of --time-per-size: as many calls as fill it, rounded down as the model's
    are, at most LENGTHENED_MAX_ITERS, and only where that is at least twice what ran. Empty
    where --iters fixed the count."""
    if a.iters is not None:
        return {}
    budget_us = a.time_per_size * 1e6
    out = {}
    for r in rows:
        ran_us = r["time_us"] * r["iters"]
        if r["wrong"] > 0 or r["time_us"] <= 0 or ran_us >= LENGTHEN_BELOW * budget_us:
            continue
        raw = min(budget_us / r["time_us"], LENGTHENED_MAX_ITERS)
        n = max(x for x in NICE_ITERS if x <= max(raw, 1))
        want = asked_sizes(a, op, ranks, r["size"])
        if n >= 2 * r["iters"] and want:
            out[want[0]] = n
    return out


# ---- building the comparison programs ----

def build(a, systems):
    """Compiles the programs the systems need, one at a time. Returns {system: error}."""
    a.build_dir.mkdir(parents=True, exist_ok=True)
    c_flags = ["-O2", "-std=c11", "-D_POSIX_C_SOURCE=200809L", "-Wall", "-Wextra"]
    targets = {
        "mpi_perf_openmpi": (["mpicc.openmpi", *c_flags], "mpi_perf.c", [],
                             {"ompi_tcp", "ompi_vader"}),
        "mpi_perf_mpich": (["mpicc.mpich", *c_flags], "mpi_perf.c", [], {"mpich"}),
        # -Werror as for the project's own code (Gloo's headers are system headers); the MPI
        # programs' headers come through -I from mpicc, so a new MPI's warnings stay warnings.
        "gloo_perf": (["g++", "-O2", "-std=c++17", "-Wall", "-Wextra", "-Wpedantic", "-Werror"],
                      "gloo_perf.cpp", ["-lgloo", "-pthread"], {"gloo"}),
    }
    errors = {}
    for name, (compiler, source, libs, users) in targets.items():
        if not users & set(systems):
            continue
        out, src = a.build_dir / name, HERE / source
        # gloo_perf.cpp includes benchmarks/common/, so a change there rebuilds it too.
        common = list((HERE.parent / "common").glob("*.hpp")) if source.endswith(".cpp") else []
        inputs = [src, *common]
        if out.exists() and out.stat().st_mtime >= max(p.stat().st_mtime for p in inputs):
            continue
        argv = [*compiler, "-o", str(out), str(src), *libs]
        print(f"build: {shlex.join(argv)}", file=sys.stderr)
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
            if r.returncode != 0:
                errors.update((s, f"build failed: {reason(r.stderr)}") for s in users)
        except (OSError, subprocess.TimeoutExpired) as e:
            errors.update((s, f"build failed: {e}") for s in users)
    return errors


def reason(text):
    """The line of a failure's stderr most likely to say why: the first that names an error,
    else the last; corocollrun's own report only when the program said nothing (it names the
    rank, not the cause)."""
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    lines = [x for x in lines if not x.startswith("corocollrun:")] or lines[:1]
    named = [x for x in lines if "error" in x.lower()]
    line = named[0] if named else lines[-1] if lines else "(no output)"
    return line[:160]


# ---- launching ----

def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launches(a, system, ranks, perf_args, scratch):
    """The processes that run `system` on `ranks` ranks: a list of (argv, extra environment)."""
    n = str(ranks)
    if system in COROCOLL:
        return [([str(a.coll_perf), "--nproc", n, "-d", "float", "-o", "sum", "-F", "json",
                  *perf_args], {"COROCOLL_TRANSPORT": COROCOLL[system]})]
    if system == "torch_gloo":
        torch_perf = [a.python, str(HERE / "torch_perf.py"), *perf_args]
        if a.corocollrun.exists():
            # corocollrun gives torchrun's environment and serves a torch-compatible TCPStore.
            return [([str(a.corocollrun), f"--nproc_per_node={n}", "--no_prefix", *torch_perf],
                     {})]
        port = str(free_port())
        return [(torch_perf, {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "RANK": str(r),
                              "LOCAL_RANK": str(r), "WORLD_SIZE": n}) for r in range(ranks)]
    if system == "gloo":
        gloo_perf = [str(a.build_dir / "gloo_perf"), *perf_args]
        return [(gloo_perf, {"RANK": str(r), "WORLD_SIZE": n, "GLOO_PERF_STORE": scratch})
                for r in range(ranks)]
    if system in ("ompi_tcp", "ompi_vader"):
        btl = "tcp,self" if system == "ompi_tcp" else "vader,self"
        # pml ob1: Debian's Open MPI would otherwise pick pml ucx, which ignores the btl list.
        return [(["mpirun.openmpi", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
                  "-np", n, "--mca", "pml", "ob1", "--mca", "btl", btl,
                  "--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo",
                  str(a.build_dir / "mpi_perf_openmpi"), *perf_args], {})]
    if system == "mpich":
        return [(["mpirun.mpich", "-np", n, "-iface", "lo", "-genv", "UCX_NET_DEVICES", "lo",
                  str(a.build_dir / "mpi_perf_mpich"), *perf_args], {})]
    raise ValueError(system)


def describe(commands):
    """One line a reader can paste (the per-rank environment shown for rank 0 only)."""
    argv, env = commands[0]
    prefix = " ".join(f"{k}={v}" for k, v in env.items())
    line = (prefix + " " if prefix else "") + shlex.join(argv)
    return line if len(commands) == 1 else f"{len(commands)} processes like: {line}"


def stop(procs):
    """SIGTERM to each still-running process's group (launchers stop their workers on it),
    SIGKILL after a grace period; every process is reaped."""
    for p in procs:
        if p.poll() is None:
            with_group(p, signal.SIGTERM)
    deadline = time.monotonic() + 10
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with_group(p, signal.SIGKILL)
            p.wait()


def with_group(p, sig):
    try:
        os.killpg(p.pid, sig)  # each process leads its own session, hence its own group
    except ProcessLookupError:
        pass


def wait_all(procs, timeout):
    """Waits until every process has ended well, one has failed (the others would wait for it
    until their own timeouts) or the time is up. Returns None or (index, what happened)."""
    deadline = time.monotonic() + timeout
    while True:
        codes = [p.poll() for p in procs]
        for i, c in enumerate(codes):
            if c not in (None, 0):
                return i, f"exit {c}" if c > 0 else f"signal {-c}"
        if all(c == 0 for c in codes):
            return None
        if time.monotonic() > deadline:
            return 0, f"{TIMED_OUT} after {timeout:.0f} s"
        time.sleep(0.02)


@dataclass
class Failure:
    """How a run of processes failed."""
    error: str                # what happened and the likely reason
    stderr: str               # the end of the failed process's stderr (rank 0's on a timeout)
    not_available: str = ""   # why the program cannot do the op, when it said so ("n/a: ...")


def run_processes(commands, timeout):
    """Runs the processes together. Returns rank 0's stdout, and None or a Failure."""
    with tempfile.TemporaryDirectory(prefix="run_compare.") as logs, ExitStack() as files:
        # Files, not pipes: a chatty rank can never block on a full pipe.
        outs, errs = ([files.enter_context(open(Path(logs) / f"{i}.{kind}", "w+"))
                       for i in range(len(commands))] for kind in ("out", "err"))
        procs = []
        try:
            for (argv, env), out, err in zip(commands, outs, errs):
                procs.append(subprocess.Popen(argv, env={**os.environ, **env},
                                              stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                              start_new_session=True))
            failure = wait_all(procs, timeout)
        except OSError as e:
            return "", Failure(f"could not start {e.filename}: {e.strerror}", "")
        finally:
            stop(procs)  # also on Ctrl-C: no rank outlives the runner
        outs[0].seek(0)
        if failure is None:
            return outs[0].read(), None
        i, what = failure
        errs[i].seek(0)
        stderr = errs[i].read()
        tail = "\n".join(stderr.splitlines()[-20:])
        na = NOT_AVAILABLE.search(stderr)
        return outs[0].read(), Failure(f"{what}: {reason(stderr)}", tail,
                                       na[1].strip() if na else "")


def json_rows(stdout):
    """The rows of a JSON array printed one row per line, also from a run cut short."""
    rows = []
    for line in stdout.splitlines():
        line = line.strip().rstrip(",")
        if line.startswith("{") and line.endswith("}"):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return rows


@dataclass
class Outcome:
    """What one system gave for one op on one rank count."""
    rows: list = field(default_factory=list)
    commands: list = field(default_factory=list)
    error: str = ""
    stderr: str = ""  # the end of the failed process's stderr
    not_available: str = ""  # why the system cannot do the op (shown as n/a; not an error)
    crossing_ns: list = field(default_factory=list)  # `placement` before and after the runs


PLACEMENT_FAR = 1.5  # a crossing this many times the sweep's cheapest: the processors moved


def placement(a):
    """How far apart the first two CPUs are now: a cache line's one-way crossing in ns
    (line_crossing.c, built here once), or None where it cannot be built or run (a failed
    build is told once, and not tried again)."""
    exe, src = a.build_dir / "line_crossing", HERE / "line_crossing.c"
    if getattr(a, "no_placement", False):
        return None
    if not exe.exists() or exe.stat().st_mtime < src.stat().st_mtime:
        argv = ["gcc", "-O2", "-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Werror",
                "-o", str(exe), str(src), "-pthread"]
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as e:
            r = subprocess.CompletedProcess(argv, 1, "", str(e))
        if r.returncode != 0:
            print(f"run_compare: no placement probe: {reason(r.stderr)}", file=sys.stderr)
            a.no_placement = True
            return None
    try:
        return json.loads(command_output([str(exe)]))["one_way_ns"]
    except (ValueError, KeyError, TypeError):
        return None


def placement_text(entries):
    """The report's paragraph on placement, from [(system, op, ranks, [ns before, ns after])]."""
    seen = [ns for *_, pair in entries for ns in pair if ns is not None]
    if not seen:
        return "Placement: not measured (line_crossing.c could not be built or run here)."
    least, most = min(seen), max(seen)
    text = (f"Placement: a cache line crossed between the first two CPUs in {least:.0f}-"
            f"{most:.0f} ns (benchmarks/compare/line_crossing.c, the cheapest of 15 batches, "
            "before and after each system's run of each op; results.json has each).")
    far = [f"{system} {op} {ranks} ranks ({', '.join(f'{ns:.0f}' for ns in pair)} ns)"
           for system, op, ranks, pair in entries
           if any(ns is not None and ns > PLACEMENT_FAR * least for ns in pair)]
    if not far:
        return text + f" No run saw more than {PLACEMENT_FAR}x the cheapest: one placement."
    shown = "; ".join(far[:12]) + (f"; and {len(far) - 12} more" if len(far) > 12 else "")
    return (text + f" The processors moved during the sweep: {len(far)} of {len(entries)} "
            f"runs began or ended over {PLACEMENT_FAR}x the cheapest, and compare with the "
            f"others across placements: {shown}.")


def measure(a, system, op, ranks, build_error):
    out = Outcome(error=build_error or "")
    if out.error:
        return out
    out.crossing_ns.append(placement(a))
    measure_runs(a, system, op, ranks, out)
    out.crossing_ns.append(placement(a))
    return out


def measure_runs(a, system, op, ranks, out):
    run_segments(a, system, op, ranks, segments(a, ranks), out)
    if out.error or out.not_available:
        return
    # Cells that ran too short for their time (LENGTHEN_BELOW), again with more calls, each
    # run on its own: one cut short (its sizes keep their first runs) stops no other.
    again = {}
    for run in segments(a, ranks, lengthened(a, op, ranks, out.rows)):
        longer = Outcome()
        run_segments(a, system, op, ranks, [run], longer, lengthened_timeout)
        out.commands += longer.commands
        again.update((r["size"], r) for r in longer.rows)
        if longer.error and not longer.error.startswith(TIMED_OUT):
            # A wrong result, a crash, an exit code: the cell's failure, as in a first run.
            out.error, out.stderr = longer.error, longer.stderr
            break
        if longer.error:
            print(f"  {system:>12} {op} {ranks} ranks: a longer run {longer.error}; the sizes "
                  "it did not finish keep their first runs", file=sys.stderr)
    out.rows = [again.get(r["size"], r) for r in out.rows]


def lengthened_timeout(a, first, last):
    """Seconds a longer run of the sizes first..last may take (LENGTHENED_SLACK)."""
    count = sum(1 for s in sizes(a) if first <= s <= last)
    return min(a.timeout, LENGTHENED_START_S + LENGTHENED_SLACK * a.time_per_size * count)


def run_segments(a, system, op, ranks, runs, out, timeout=None):
    """Runs `system`'s program for each (first, last, iters, warmup) of `runs`, adding its rows,
    its commands, and the first error or n/a to `out`; stops at the first of those. `timeout`:
    the seconds each run may take, from (a, first, last); a.timeout where None."""
    for first, last, n, w in runs:
        perf_args = ["--coll", op, "-b", str(first), "-e", str(last), "-f", repr(a.factor),
                     "-n", str(n), "-w", str(w), "-c", "1"]
        with tempfile.TemporaryDirectory(prefix=f"run_compare.{system}.") as scratch:
            commands = launches(a, system, ranks, perf_args, scratch)
            out.commands.append(describe(commands))
            started = time.monotonic()
            limit = a.timeout if timeout is None else timeout(a, first, last)
            stdout, failure = run_processes(commands, limit)
        rows = json_rows(stdout)
        for r in rows:
            r.update(system=system, iters=n, warmup=w)
        out.rows += rows
        wrong = [r for r in rows if r["wrong"] > 0]
        if wrong:
            out.error = f"{wrong[0]['wrong']} wrong element(s) at {wrong[0]['size']} B"
        elif failure and failure.not_available and not rows:
            out.not_available = failure.not_available
        elif failure:
            out.error, out.stderr = failure.error, failure.stderr
        print(f"  {system:>12} {op} {ranks} ranks, {first}..{last} B, n={n} w={w}: "
              f"{len(rows)} rows in {time.monotonic() - started:.1f} s"
              + (f", {out.error}" if out.error else "")
              + (f", n/a: {out.not_available}" if out.not_available else ""), file=sys.stderr)
        if out.error or out.not_available:
            break  # the larger sizes would likely fail the same way


def recheck_plan(a, rows):
    """The runs of a recheck, in order: [(system, op, ranks, size)]. Each flagged cell's
    systems (the corocoll system and every peer that ran the cell, not only the one that beat
    it), or each cliff's two sizes of one system, run one after the other, a.recheck times over
    (A B C A B C), each alone at that size. Not every corocoll run first and every peer's
    after: a VM's processors can be placed nearer or farther apart for minutes at a time (a
    2-vCPU AMD EPYC: a cache line crossed in 75-90 ns for a while, in 330 ns for another; Open
    MPI's 8 B ping-pong 0.13 µs, then 0.45), and the sides of one comparison must see the
    machine alike. Every peer, since the recheck may move a cell's best peer: a sweep's
    all_to_all of 16 MiB, flagged far against vader, was rechecked mostly near, where vader
    and corocoll both ran slower, and then stood flagged against MPICH's one far run."""
    groups = []
    cells = sweep_summary.by_cell(rows)
    for ref in sweep_summary.REFERENCE_SYSTEMS:
        peers = sweep_summary.peers_of(ref, a.systems)
        if ref not in a.systems or not peers:
            continue
        rat = sweep_summary.ratios(cells, ref, peers)
        for (op, ranks, size), (r, _) in sorted(rat.items()):
            if r > sweep_summary.FLAG_RATIO:
                ran = [p for p in peers if p in cells[(op, ranks, size)]]
                groups.append(tuple((s, op, ranks, size) for s in [ref, *ran]))
    for system, op, ranks, size, _, bigger, _ in sweep_summary.cliffs(rows):
        groups.append(((system, op, ranks, size), (system, op, ranks, bigger)))
    # A run that is in two groups (a flagged peer's cell that is also a cliff's size) runs in
    # both: each comparison keeps its own side by side.
    return [run for g in groups for run in list(g) * a.recheck]


def recheck(a, results):
    """Measures each flagged cell again (`recheck_plan`). A single run of a cell on a small
    shared machine can be slowed by anything (a run of reduce_scatter of 8 B once took 25 µs,
    and 1.3 µs in every run after); the cell keeps the median of its runs, and its row says how
    many (`runs`) and what they were (`samples_us`)."""
    if a.recheck <= 0:
        return 0
    samples = {}
    for system, op, ranks, size in recheck_plan(a, [r for o in results.values() for r in o.rows]):
        row = next((r for r in results[(system, op, ranks)].rows if r["size"] == size), None)
        want = asked_sizes(a, op, ranks, size)
        if row is None or not want:
            continue
        one = argparse.Namespace(**vars(a))
        one.min_bytes = one.max_bytes = want[0]
        again = measure(one, system, op, ranks, None)
        first = (row["time_us"], (results[(system, op, ranks)].crossing_ns or [None])[0])
        runs = samples.setdefault((system, op, ranks, size), (row, [first]))[1]
        runs += [(r["time_us"], again.crossing_ns[0]) for r in again.rows
                 if r["size"] == size and r["wrong"] <= 0]
    for row, runs in samples.values():
        runs.sort(key=lambda run: run[0])
        median = runs[len(runs) // 2][0]
        scale = row["time_us"] / median if median > 0 else 1
        row.update(time_us=median, algbw_gbs=row["algbw_gbs"] * scale,
                   busbw_gbs=row["busbw_gbs"] * scale, runs=len(runs),
                   samples_us=[t for t, _ in runs], samples_crossing_ns=[c for _, c in runs])
    return len(samples)


# ---- the report ----

def fmt_size(b):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= scale and b % scale == 0:
            return f"{b // scale} {unit}"
    return f"{b} B"


def fmt_time(us):
    return f"{us:.2f}" if us < 10 else f"{us:.1f}" if us < 1000 else f"{us:,.0f}"


def fmt_bw(gbs):
    return f"{gbs:.4f}" if gbs < 0.01 else f"{gbs:.3f}" if gbs < 1 else f"{gbs:.2f}"


def fmt_ratio(r):
    return f"{r:.2g}" if r < 1 else f"{r:.2f}" if r < 10 else f"{r:.0f}"


def reference(systems):
    """The system the ratio columns divide by (None: no corocoll system ran)."""
    return next((s for s in REFERENCES if s in systems), None)


def table(op, ranks, systems, outcomes):
    """The markdown table for one op and rank count."""
    by_size = {}
    for s in systems:
        for r in outcomes[s].rows:
            by_size.setdefault(r["size"], {})[s] = r
    ref = reference(systems)
    ratios = [s for s in systems if s != ref] if ref else []
    head = (["size"] + [f"time µs {s}" for s in systems] + [f"busbw GB/s {s}" for s in systems]
            + [f"{ref} ÷ {s} time" for s in ratios])
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]

    def status(s):
        o = outcomes[s]
        if o.not_available:
            return "n/a: " + o.not_available.replace("|", "/")
        if o.error:
            return "failed: " + o.error.replace("|", "/")
        if not o.rows:
            return "no rows"
        if any(r["wrong"] < 0 for r in o.rows):
            return "not checked"
        return f"wrong = {sum(r['wrong'] for r in o.rows)}"
    check = ["check"] + [status(s) for s in systems] + [""] * (len(systems) + len(ratios))
    lines.append("| " + " | ".join(check) + " |")
    def missing(s):
        return "n/a" if outcomes[s].not_available else "–"
    for size in sorted(by_size):
        got = by_size[size]
        cells = [fmt_size(size)]
        cells += [fmt_time(got[s]["time_us"]) if s in got else missing(s) for s in systems]
        cells += [fmt_bw(got[s]["busbw_gbs"]) if s in got else missing(s) for s in systems]
        for s in ratios:
            ok = s in got and ref in got and got[s]["time_us"] > 0
            cells.append(fmt_ratio(got[ref]["time_us"] / got[s]["time_us"]) if ok
                         else missing(s) if ref in got else "–")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(path, op, ranks, systems, outcomes):
    """Latency (log-log) and busbw (semilog-x) against size, one line per system."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (lat, bw) = plt.subplots(1, 2, figsize=(12, 5))
    for s in systems:
        rows = sorted(outcomes[s].rows, key=lambda r: r["size"])
        if not rows:
            continue
        x = [r["size"] for r in rows]
        # A system keeps its colour in every figure, whichever systems ran.
        style = dict(marker="o", markersize=3, color=f"C{list(SYSTEMS).index(s)}",
                     linewidth=2.2 if s in COROCOLL else 1.2,
                     linestyle="--" if s == "corocoll_tcp" else "-")
        lat.loglog(x, [r["time_us"] for r in rows], label=s, **style)
        bw.semilogx(x, [r["busbw_gbs"] for r in rows], label=s, **style)
    lat.set(title=f"{op}, {ranks} ranks: time per operation", xlabel="size (bytes)",
            ylabel="time (µs)")
    bw.set(title=f"{op}, {ranks} ranks: bus bandwidth", xlabel="size (bytes)",
           ylabel="busbw (GB/s)")
    if not_available := [s for s in systems if outcomes[s].not_available]:
        lat.text(0.02, 0.98, "n/a: " + ", ".join(not_available), transform=lat.transAxes,
                 va="top", fontsize=8)
    ticks = sorted({r["size"] for s in systems for r in outcomes[s].rows})
    ticks = ticks[::2] if len(ticks) > 13 else ticks  # room for each label
    for ax in (lat, bw):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [fmt_size(t) for t in ticks], rotation=45, fontsize=8)
        ax.minorticks_off()
        ax.grid(True, which="major", alpha=0.4)
    # One legend below both plots, where it hides no line.
    handles, labels = lat.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=9)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def command_output(argv):
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        return r.stdout.strip() if r.returncode == 0 else ""
    except (OSError, subprocess.TimeoutExpired):
        return ""


def machine():
    cpu = next((line.split(":", 1)[1].strip()
                for line in command_output(["lscpu"]).splitlines()
                if line.startswith("Model name:")), "unknown")
    packages = {}
    for pkg in ("libgloo0", "openmpi-bin", "mpich", "python3-torch", "liburing2"):
        packages[pkg] = command_output(["dpkg-query", "-W", "-f=${Version}", pkg]) or "not found"
    caches = []
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level, kind, size = ((index / f).read_text().strip() for f in ("level", "type", "size"))
        except OSError:
            continue
        if kind != "Instruction":
            caches.append(f"L{level}{'d' if kind == 'Data' else ''} {size}")
    if not caches:
        # Some virtual machines have no cache folder in sysfs: what the C library reports
        # (getconf: glibc asks CPUID), as corocoll's machine_cache_sizes does.
        for name, label in (("LEVEL1_DCACHE_SIZE", "L1d"), ("LEVEL2_CACHE_SIZE", "L2"),
                            ("LEVEL3_CACHE_SIZE", "L3")):
            size = command_output(["getconf", name])
            if size.isdigit() and int(size) > 0:
                caches.append(f"{label} {int(size) // 1024}K")
        if caches:
            caches[-1] += " (getconf)"
    # The model name alone can be vague in a virtual machine ("AMD EPYC"): family and model too.
    ids = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            ids.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    if "cpu family" in ids and "model" in ids:
        cpu += f" (family {ids['cpu family']}, model {ids['model']})"
    commit = command_output(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"])
    if commit and command_output(["git", "-C", str(REPO), "status", "--porcelain",
                                  "--untracked-files=no"]):
        commit += " with local changes"
    return {"cpu": cpu, "cpus": os.cpu_count(), "kernel": platform.release(),
            "caches": ", ".join(caches) or "unknown",
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "packages": packages, "corocoll_commit": commit or "unknown",
            "compiler": command_output(["g++", "--version"]).split("\n")[0]}


def reproduce(a):
    """The command that runs this comparison again, every setting spelled out."""
    argv = [sys.executable, str(Path(__file__).resolve().relative_to(REPO)),
            "--ranks", ",".join(map(str, a.ranks)), "--ops", ",".join(a.ops),
            "--systems", ",".join(a.systems), "-b", str(a.min_bytes), "-e", str(a.max_bytes),
            "-f", repr(a.factor)]
    argv += ["--iters", str(a.iters)] if a.iters else ["--time-per-size", repr(a.time_per_size)]
    if a.out_dir.resolve() != (REPO / "docs").resolve():
        argv += ["--out-dir", str(a.out_dir)]
    if a.section:
        argv += ["--section", a.section]
    if a.recheck != 2:
        argv += ["--recheck", str(a.recheck)]
    return shlex.join(argv)


def markers(a):
    """The markers around this run's section of performance.md."""
    if not a.section:
        return BEGIN_MARK, END_MARK
    return f"<!-- compare:{a.section}:begin -->", f"<!-- compare:{a.section}:end -->"


def section(a, m, results, plots, summary):
    if a.iters:
        warmup = max(MIN_WARMUP, a.iters // 10)
        policy = f"{a.iters} timed iterations at every size, {warmup} warm-up"
    else:
        policy = (f"at each size, n timed iterations: {a.time_per_size} s / estimate, clamped "
                  f"to [{MIN_ITERS}, {MAX_ITERS}] and rounded down to 1, 2 or 5 × 10^k, where "
                  f"the estimate is {LATENCY_PER_PEER_US:g} µs × (ranks − 1) × max(1, ranks / "
                  f"CPUs) + size at 1 GB/s (where every system is a shared-memory one and no "
                  f"rank shares a CPU: {SHARED_MEMORY_LATENCY_PER_PEER_US:g} µs, and up to "
                  f"{SHARED_MEMORY_MAX_ITERS:,}); max({MIN_WARMUP}, n / 10) warm-up iterations. "
                  f"A system's cell that ran for less than {LENGTHEN_BELOW:g} × "
                  f"{a.time_per_size} s runs again with as many calls as fill "
                  f"{a.time_per_size} s (rounded down the same way, at most "
                  f"{LENGTHENED_MAX_ITERS:,}), where that is at least twice n, and keeps that "
                  f"run; a longer run that outlasts {LENGTHENED_START_S} s + "
                  f"{LENGTHENED_SLACK} × its sizes' time is stopped, and the sizes it did not "
                  "finish keep their first runs (results.json gives each row's iterations)")
    ref = reference(a.systems)
    cpus = m["cpus"] or 0
    oversubscribed = " and ".join(f"{n} ranks" for n in a.ranks if n > cpus)
    begin, end = markers(a)
    title = "corocoll beside Gloo, torch.distributed, Open MPI and MPICH"
    out = [
        begin,
        "<!-- Written by benchmarks/compare/run_compare.py; edits here are overwritten. -->",
        "",
        f"## {title}" + (f": {a.section}" if a.section else ""),
        "",
        f"Machine: {m['cpu']}, {m['cpus']} CPUs, caches {m['caches']} (cpu0); Linux "
        f"{m['kernel']}; measured {m['date']}; "
        f"corocoll {m['corocoll_commit']}, {m['compiler']}.",
        "Packages: " + ", ".join(f"{k} {v}" for k, v in m["packages"].items()) + ".",
        "",
        "Reproduce from the repository root:",
        "",
        "```sh",
        reproduce(a),
        "```",
        "",
        "Every system runs the same sizes with the same iterations, timed as coll_perf times "
        "them: a barrier, warm-up iterations, a barrier, the timed iterations; the mean per "
        "iteration on each rank, then the largest over the ranks. float32. A size is nccl-tests': "
        "all_reduce sums in place and broadcast is from rank 0 in place, on a buffer of that "
        "size; all_gather's size is the whole gathered buffer; reduce_scatter's (a sum) and "
        "all_to_all's is the whole input of each rank, of which each rank keeps, or sends to "
        "each rank, size / n; reduce sums to rank 0 in place; gather's size is the whole "
        "buffer gathered on rank 0 and scatter's the whole buffer rank 0 scatters; "
        "ping_pong's time is half a round trip between ranks 0 and 1. "
        "All work out of place except all_reduce, broadcast, reduce and Gloo C++'s "
        "reduce_scatter (gloo::ReduceScatterHalvingDoubling, the only one it has, works in "
        "place). busbw is nccl-tests' (all_reduce 2(n−1)/n × algbw; all_gather, "
        "reduce_scatter, gather, scatter and all_to_all (n−1)/n; the others 1). Every size "
        "is checked once after timing (the check row gives "
        "the total of wrong elements); n/a marks an op the system does not have. "
        f"Iterations: {policy}." + (
            f" A cell over {sweep_summary.FLAG_RATIO}x the best peer, or either size of a "
            f"cliff, was measured {a.recheck} more times (the corocoll system and every peer "
            "that ran the cell, or the cliff's two sizes, each alone at that size and one "
            "after the other, A B C A B C: a VM's processors may sit nearer or farther apart "
            "for minutes) and keeps the median of its runs (results.json lists them)."
            if a.recheck > 0 else ""),
        "",
        (f"The machine has {cpus} CPUs, so the runs with {oversubscribed} are "
         "oversubscribed: ranks share cores, which costs most the systems that poll while "
         "they wait (the MPIs' shared memory; corocoll's reactor polls for a bounded time "
         "before it sleeps, and yields between polls when ranks outnumber CPUs)."
         if oversubscribed else
         f"The machine has {cpus} CPUs; no run here has more ranks than that (more would be "
         "oversubscribed: ranks would share cores)."),
        "",
        f"Columns \"{ref} ÷ X time\": below 1, {ref} takes less time than X at that size "
        f"(it is also X's busbw ÷ {ref}'s busbw)." if ref else
        "No corocoll system ran, so there are no ratio columns.",
        "",
        "| system | what | launched as (first invocation) |",
        "|---|---|---|",
    ]
    first = {}
    for (system, _, _), o in results.items():
        if o.commands:
            first.setdefault(system, o.commands[0])
    for s in a.systems:
        out.append(f"| {s} | {SYSTEMS[s]} | `{first.get(s, '(not run)')}` |")
    out += ["", placement_text([(*key, o.crossing_ns) for key, o in results.items()
                                if o.crossing_ns]), "", summary]
    for ranks in a.ranks:
        for op in a.ops:
            note = f" (oversubscribed: {ranks} ranks on {cpus} CPUs)" if ranks > cpus else ""
            out += ["", f"### {op}, {ranks} ranks{note}", ""]
            outcomes = {s: results[(s, op, ranks)] for s in a.systems}
            out.append(table(op, ranks, a.systems, outcomes))
            png = plots.get((op, ranks))
            if png:
                out += ["", f"![{op}, {ranks} ranks: time and busbw against size]({png})"]
    out += ["", end]
    return "\n".join(out)


def write_markdown(path, text, begin=BEGIN_MARK, end=END_MARK):
    """Puts `text` (which starts with `begin` and ends with `end`) between the markers, keeping
    the rest of the file; appends it when the markers are not there yet."""
    old = path.read_text() if path.exists() else "# Performance\n\n"
    if begin in old and end in old:
        head, rest = old.split(begin, 1)
        tail = rest.split(end, 1)[1]
        new = head + text + tail
    else:
        new = old.rstrip("\n") + "\n\n" + text + "\n"
    path.write_text(new)


def main():
    a = parse_args()
    # A plain SIGTERM would end Python without unwinding, leaving the ranks running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    # Asked before the runs, so that a missing matplotlib is told before minutes of measuring.
    can_plot = importlib.util.find_spec("matplotlib") is not None
    if not can_plot:
        print(f"run_compare: {sys.executable} has no matplotlib, so there will be no plots "
              "(Debian's python3-matplotlib is for /usr/bin/python3)", file=sys.stderr)
    build_errors = build(a, a.systems)
    for s in COROCOLL:
        if s in a.systems and not a.coll_perf.exists():
            build_errors[s] = (f"{a.coll_perf} not found (meson compile -C build-release, "
                               "or name it with --coll-perf)")
    results = {}
    for ranks in a.ranks:
        for op in a.ops:
            for system in a.systems:
                results[(system, op, ranks)] = measure(a, system, op, ranks,
                                                       build_errors.get(system))
    rechecked = recheck(a, results)
    if rechecked:
        print(f"run_compare: {rechecked} flagged cell(s) measured {a.recheck} more time(s)",
              file=sys.stderr)
    perf_dir = a.out_dir / "perf" / a.section if a.section else a.out_dir / "perf"
    link = f"perf/{a.section}/" if a.section else "perf/"
    perf_dir.mkdir(parents=True, exist_ok=True)
    plots = {}
    for ranks in a.ranks:
        for op in a.ops:
            outcomes = {s: results[(s, op, ranks)] for s in a.systems}
            if can_plot and any(o.rows for o in outcomes.values()):
                name = f"{op}_{ranks}ranks.png"
                plot(perf_dir / name, op, ranks, a.systems, outcomes)
                plots[(op, ranks)] = f"{link}{name}"
    m = machine()
    raw = {"machine": m, "command": reproduce(a),
           "rows": [r for o in results.values() for r in o.rows],
           "failures": [{"system": s, "op": op, "ranks": n, "error": o.error, "stderr": o.stderr}
                        for (s, op, n), o in results.items() if o.error],
           "not_available": [{"system": s, "op": op, "ranks": n, "why": o.not_available}
                             for (s, op, n), o in results.items() if o.not_available],
           "placement": [{"system": s, "op": op, "ranks": n, "crossing_ns": o.crossing_ns}
                         for (s, op, n), o in results.items() if o.crossing_ns]}
    (perf_dir / "results.json").write_text(json.dumps(raw, indent=1) + "\n")
    summary = sweep_summary.summary(raw["rows"], a.systems, a.ops,
                                    perf_dir if can_plot else None, link)
    text = section(a, m, results, plots, summary)
    write_markdown(a.out_dir / "performance.md", text, *markers(a))
    print(text)
    failed = raw["failures"]
    print(f"run_compare: wrote {a.out_dir / 'performance.md'}, {perf_dir}/; "
          f"{len(failed)} failure(s)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
