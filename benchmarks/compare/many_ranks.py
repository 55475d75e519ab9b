#!/usr/bin/python3
"""many_ranks: launch to the first all_reduce done, RSS and shared memory per rank at 16-256
ranks on one host, corocoll beside Open MPI and MPICH.

    benchmarks/compare/many_ranks.py [--ranks 16,64,128,256] [--repeats 3] [--out-dir docs]
        [--probe PATH] [--build-dir DIR] [--timeout SECONDS]

Each system starts N processes on this machine, which make one all_reduce of one float and
report when it was done, their VmRSS and the shared memory they map: corocoll's startup_probe
(spawning its ranks itself, pairs through shared memory, connections on first use, and with the
eager mesh where its segments fit in half of the available memory), and mpi_startup.c beside
this file built with mpicc.openmpi (mpirun.openmpi, btl vader) and mpicc.mpich (mpirun.mpich).
Time: from the launch to the last rank's all_reduce done, median of --repeats. Shared memory:
what each rank maps shared from a file (/proc/self/maps: corocoll's memfd segments and arena,
vader's and MPICH's segments), median over the ranks. Written between <!-- many:begin --> and
<!-- many:end --> in performance.md under --out-dir, and printed. The latency of all_reduce,
broadcast and all_gather at the same counts comes from run_compare.py (its section "many").
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

from connections import SEGMENT_MIB, available_mib
from run_compare import REPO, machine, write_markdown

HERE = Path(__file__).resolve().parent
BEGIN_MARK = "<!-- many:begin -->"
END_MARK = "<!-- many:end -->"
DONE = re.compile(r"^startup_done (\d+) (\d+)$", re.M)
COROCOLL_MEMORY = re.compile(r"^connections (\d+) \d+ (\d+) (\d+) (\d+)$", re.M)
MPI_MEMORY = re.compile(r"^memory (\d+) (\d+) (\d+)$", re.M)


def build(build_dir):
    """mpi_startup for each MPI; {name: path}."""
    build_dir.mkdir(parents=True, exist_ok=True)
    out = {}
    for mpi in ("openmpi", "mpich"):
        exe = build_dir / f"mpi_startup_{mpi}"
        src = HERE / "mpi_startup.c"
        if not exe.exists() or exe.stat().st_mtime < src.stat().st_mtime:
            subprocess.run([f"mpicc.{mpi}", "-O2", "-std=c11", "-D_POSIX_C_SOURCE=200809L",
                            "-Wall", "-Wextra", "-o", str(exe), str(src)], check=True)
        out[mpi] = exe
    return out


def command(system, n, probe, exes):
    """(argv, extra environment) of one start of `system` on `n` ranks."""
    if system == "corocoll, on first use":
        return [probe, "--nproc", str(n), "--first", "all_reduce"], {"COROCOLL_CONNECT": "lazy"}
    if system == "corocoll, eager":
        return [probe, "--nproc", str(n), "--first", "all_reduce"], {"COROCOLL_CONNECT": "eager"}
    if system == "Open MPI (vader)":
        return (["mpirun.openmpi", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
                 "-np", str(n), "--mca", "pml", "ob1", "--mca", "btl", "vader,self",
                 "--mca", "oob_tcp_if_include", "lo", str(exes["openmpi"])], {})
    return ["mpirun.mpich", "-np", str(n), "-iface", "lo", str(exes["mpich"])], {}


def once(system, n, probe, exes, timeout):
    """(seconds to the last rank's all_reduce done, [(rss KiB, shared KiB)] per rank)."""
    argv, extra = command(system, n, probe, exes)
    env = {**os.environ, "OMP_NUM_THREADS": "1", **extra}
    env.pop("COROCOLL_TRANSPORT", None)
    start = time.time_ns()
    r = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=timeout)
    done = {int(k): int(ns) for k, ns in DONE.findall(r.stdout)}
    if system.startswith("corocoll"):
        mem = {int(k): (int(rss), int(seg) + int(arena))
               for k, rss, seg, arena in COROCOLL_MEMORY.findall(r.stdout)}
    else:
        mem = {int(k): (int(rss), int(sh)) for k, rss, sh in MPI_MEMORY.findall(r.stdout)}
    if r.returncode != 0 or len(done) != n or len(mem) != n:
        tail = "\n".join((r.stderr or r.stdout).splitlines()[-3:])
        raise RuntimeError(f"{shlex.join(argv)}: exit {r.returncode}, {len(done)} of {n} ranks "
                           f"reported\n{tail}")
    return (max(done.values()) - start) / 1e9, [mem[k] for k in sorted(mem)]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", default="16,64,128,256")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out-dir", type=Path, default=REPO / "docs")
    p.add_argument("--probe", default=str(REPO / "build-release/benchmarks/startup_probe"))
    p.add_argument("--build-dir", type=Path, default=Path("/tmp/corocoll-compare"))
    p.add_argument("--timeout", type=float, default=300)
    a = p.parse_args()
    counts = [int(x) for x in a.ranks.split(",")]
    exes = build(a.build_dir)
    systems = ["corocoll, on first use", "corocoll, eager", "Open MPI (vader)", "MPICH"]
    rows = []
    for n in counts:
        for system in systems:
            need = n * (n - 1) / 2 * SEGMENT_MIB
            if system == "corocoll, eager" and need > available_mib() / 2:
                rows.append((n, system, f"not run: {n * (n - 1) // 2} segments, "
                             f"{need / 1024:.1f} GiB, over half the available memory"))
                print(f"{n} ranks, {system}: {rows[-1][2]}", flush=True)
                continue
            try:
                times, mem = [], None
                for _ in range(a.repeats):
                    t, mem = once(system, n, a.probe, exes, a.timeout)
                    times.append(t)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                rows.append((n, system, "failed: " + str(e).splitlines()[0][:120]))
                print(f"{n} ranks, {system}: {rows[-1][2]}", flush=True)
                continue
            rss = statistics.median(m[0] for m in mem) / 1024
            shared = [m[1] / 1024 for m in mem]
            rows.append((n, system, (statistics.median(times), rss, statistics.median(shared),
                                     max(shared))))
            print(f"{n} ranks, {system}: first all_reduce done {statistics.median(times) * 1e3:.0f}"
                  f" ms, RSS {rss:.1f} MiB, shared {statistics.median(shared):.1f} MiB (max "
                  f"{max(shared):.1f})", flush=True)

    m = machine()
    out = [BEGIN_MARK, "<!-- Written by benchmarks/compare/many_ranks.py; edits here are "
           "overwritten. -->", "", "### Many ranks on one host: start-up and memory beside "
           "Open MPI and MPICH", "",
           f"Machine: {m['cpu']}, {m['cpus']} CPUs ({m['caches']}), Linux {m['kernel']}; "
           f"measured {m['date']}; corocoll {m['corocoll_commit']}.", "",
           "Reproduce from the repository root:", "", "```sh",
           shlex.join([sys.executable, "benchmarks/compare/many_ranks.py", "--ranks", a.ranks,
                       "--repeats", str(a.repeats)]), "```", "",
           "Every system starts its ranks as processes on this machine (oversubscribing its "
           f"{m['cpus']} CPUs) and each rank makes one all_reduce of one float: corocoll's "
           "startup_probe (spawned by itself, pairs through shared memory; COROCOLL_CONNECT=lazy "
           "or eager), mpi_startup.c under mpirun.openmpi (btl vader,self) and mpirun.mpich. "
           f"Time: launch to the last rank's all_reduce done, median of {a.repeats} starts. "
           "RSS: VmRSS per rank, median. Shared memory: what a rank maps shared from a file "
           "(/proc/self/maps), median and largest over the ranks.", "",
           "| ranks | system | launch to the all_reduce done | RSS per rank | "
           "shared memory per rank, median (largest) |", "|---:|---|---:|---:|---:|"]
    for n, system, r in rows:
        if isinstance(r, str):
            out.append(f"| {n} | {system} | {r} | | |")
        else:
            out.append(f"| {n} | {system} | {r[0] * 1e3:,.0f} ms | {r[1]:.1f} MiB | "
                       f"{r[2]:.1f} MiB ({r[3]:.1f}) |")
    out += ["", END_MARK]
    a.out_dir.mkdir(parents=True, exist_ok=True)
    write_markdown(a.out_dir / "performance.md", "\n".join(out), BEGIN_MARK, END_MARK)
    print(f"many_ranks: wrote {a.out_dir / 'performance.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
