#!/usr/bin/python3
"""connections: what a group opens and costs at 16-256 ranks, connections at set-up or on first use.

    benchmarks/compare/connections.py [--ranks 16,64,128,256] [--repeats 3] [--out-dir docs]
        [--transports tcp,shm] [--probe PATH]

For each transport, rank count, way of connecting (COROCOLL_CONNECT=eager: the full mesh at
set-up; lazy: the ring at set-up, the rest on first use) and first call (a ring all_reduce, a
binomial broadcast), startup_probe spawns the ranks (COROCOLL_TRANSPORT=tcp: every pair over
TCP; shm: every pair on this host through shared memory) and each rank reports, after that one
call, how many peers it is connected to, its resident memory and the shared memory it maps
(pair segments, arena). Reported: the connections per rank (min/median/max), the job's
connections in all, the median RSS and shared memory per rank, the job's shared memory in all
(each segment counted once), and the time from the launch to the last rank's first call done
(median of --repeats). An eager shm job whose segments would not fit in half of this machine's
available memory is not run (said so in the table). Written between
<!-- connections:begin --> and <!-- connections:end --> in performance.md under --out-dir, and
printed.
"""

import argparse
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from run_compare import REPO, machine, write_markdown

BEGIN_MARK = "<!-- connections:begin -->"
END_MARK = "<!-- connections:end -->"
DONE = re.compile(r"^startup_done (\d+) (\d+)$", re.M)
CONNECTIONS = re.compile(r"^connections (\d+) (\d+) (\d+) (\d+) (\d+)$", re.M)
# One pair's segment: two rings of engine_options::shm_ring_bytes (1 MiB) and a header page or so.
SEGMENT_MIB = 2.02


def available_mib():
    """MemAvailable of this machine, MiB."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    return 0


def once(probe, ranks, transport, mode, first, timeout):
    """(seconds to the last rank's first call, per rank: (connections, RSS KiB, segment KiB,
    arena KiB))."""
    env = {**os.environ, "COROCOLL_TRANSPORT": transport, "COROCOLL_CONNECT": mode,
           "OMP_NUM_THREADS": "1"}
    argv = [probe, "--nproc", str(ranks), "--first", first]
    start = time.time_ns()
    r = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=timeout)
    done = {int(rank): int(ns) for rank, ns in DONE.findall(r.stdout)}
    seen = {int(m[0]): tuple(int(x) for x in m[1:]) for m in CONNECTIONS.findall(r.stdout)}
    if r.returncode != 0 or len(done) != ranks or len(seen) != ranks:
        tail = "\n".join((r.stderr or r.stdout).splitlines()[-5:])
        raise RuntimeError(f"{shlex.join(argv)} ({transport}, {mode}): exit {r.returncode}, "
                           f"{len(done)} of {ranks} ranks reported\n{tail}")
    return (max(done.values()) - start) / 1e9, [seen[k] for k in sorted(seen)]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", default="16,64,128,256")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out-dir", type=Path, default=REPO / "docs")
    p.add_argument("--probe", default=str(REPO / "build-release/benchmarks/startup_probe"))
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--transports", default="tcp,shm")
    a = p.parse_args()
    counts = [int(x) for x in a.ranks.split(",")]
    transports = a.transports.split(",")
    if any(n < 2 for n in counts) or a.repeats < 1 or not set(transports) <= {"tcp", "shm"}:
        p.error("--ranks must be at least 2 each, --repeats positive, --transports tcp and shm")

    rows = []
    for transport in transports:
        for n in counts:
            for first in ("ring", "broadcast"):
                for mode in ("eager", "lazy"):
                    need = n * (n - 1) / 2 * SEGMENT_MIB
                    if transport == "shm" and mode == "eager" and need > available_mib() / 2:
                        rows.append((transport, n, first, mode, None, need, None))
                        print(f"{transport}, {n} ranks, {first}, eager: not run ({need / 1024:.1f}"
                              f" GiB of segments)", flush=True)
                        continue
                    times, seen = [], None
                    for _ in range(a.repeats):
                        t, seen = once(a.probe, n, transport, mode, first, a.timeout)
                        times.append(t)
                    row = (transport, n, first, mode, statistics.median(times), need, seen)
                    rows.append(row)
                    conns = [x[0] for x in seen]
                    print(f"{transport}, {n} ranks, {first}, {mode}: connections per rank "
                          f"{min(conns)}/{statistics.median(conns):g}/{max(conns)}, "
                          f"{sum(conns) // 2} in all, RSS "
                          f"{statistics.median(x[1] for x in seen) / 1024:.1f} MiB, shm per rank "
                          f"{statistics.median(x[2] + x[3] for x in seen) / 1024:.1f} MiB, "
                          f"first call done in {row[4] * 1e3:.0f} ms", flush=True)

    m = machine()
    call = {"ring": "ring all_reduce", "broadcast": "binomial broadcast"}
    out = [BEGIN_MARK, "<!-- Written by benchmarks/compare/connections.py; edits here are "
           "overwritten. -->", "", "### Connections at set-up or on first use, 16-256 ranks", "",
           f"Machine: {m['cpu']}, {m['cpus']} CPUs ({m['caches']}), Linux {m['kernel']}; "
           f"measured {m['date']}; corocoll {m['corocoll_commit']}.", "",
           "Reproduce from the repository root:", "", "```sh",
           shlex.join([sys.executable, "benchmarks/compare/connections.py", "--ranks", a.ranks,
                       "--repeats", str(a.repeats), "--transports", a.transports]), "```", "",
           "startup_probe spawns the ranks as processes on this machine, every pair over TCP "
           "(COROCOLL_TRANSPORT=tcp) or through shared memory (shm), with COROCOLL_CONNECT=eager "
           "(the full mesh at set-up) or lazy (each rank's two ring neighbours at set-up, the rest "
           "when first used, a pair on one host handing its segment over then). Each rank makes "
           "one call and then reports the peers it has a connection to, its VmRSS and the shared "
           "memory it maps (/proc/self/maps: pair segments and the arena). Shared memory in the "
           "job counts each segment once. Time: from the launch to the last rank's call done, "
           f"median of {a.repeats} runs, the ranks oversubscribing the {m['cpus']} CPUs.", "",
           "| transport | ranks | first call | connect | connections per rank (min/median/max) | "
           "in the job | RSS per rank, median | shared memory per rank, median | "
           "shared memory in the job | launch to the call done |",
           "|---|---:|---|---|---|---:|---:|---:|---:|---:|"]
    for transport, n, first, mode, t, need, seen in rows:
        if seen is None:
            out.append(f"| {transport} | {n} | {call[first]} | {mode} | not run: "
                       f"{n * (n - 1) // 2} segments, {need / 1024:.1f} GiB, more than half of "
                       f"this machine's available memory | | | | | |")
            continue
        conns = [x[0] for x in seen]
        shm = [x[2] + x[3] for x in seen]
        job = (sum(x[2] for x in seen) / 2 + max(x[3] for x in seen)) / 1024
        out.append(f"| {transport} | {n} | {call[first]} | {mode} | {min(conns)}/"
                   f"{statistics.median(conns):g}/{max(conns)} | {sum(conns) // 2} | "
                   f"{statistics.median(x[1] for x in seen) / 1024:.1f} MiB | "
                   f"{statistics.median(shm) / 1024:.1f} MiB | "
                   f"{job:,.0f} MiB | {t * 1e3:.0f} ms |")
    out += ["", END_MARK]
    a.out_dir.mkdir(parents=True, exist_ok=True)
    write_markdown(a.out_dir / "performance.md", "\n".join(out), BEGIN_MARK, END_MARK)
    print(f"connections: wrote {a.out_dir / 'performance.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
