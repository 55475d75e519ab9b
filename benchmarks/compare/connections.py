#!/usr/bin/python3
"""connections: what a group opens and costs at 16-256 ranks, connections at set-up or on first use.

    benchmarks/compare/connections.py [--ranks 16,64,128,256] [--repeats 3] [--out-dir docs]
        [--probe PATH]

For each rank count, each way of connecting (COROCOLL_CONNECT=eager: the full mesh at set-up;
lazy: the ring at set-up, the rest on first use) and each first call (a ring all_reduce, a
binomial broadcast), startup_probe spawns the ranks over TCP (COROCOLL_TRANSPORT=tcp: every pair
on one host would otherwise share memory) and each rank reports, after that one call, how many
peers it is connected to and its resident memory. Reported: the connections per rank
(min/median/max), the job's connections in all, the median RSS per rank, and the time from the
launch to the last rank's first call done (median of --repeats). Written between
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
CONNECTIONS = re.compile(r"^connections (\d+) (\d+) (\d+)$", re.M)


def once(probe, ranks, mode, first, timeout):
    """(seconds to the last rank's first call, connections per rank, RSS KiB per rank)."""
    env = {**os.environ, "COROCOLL_TRANSPORT": "tcp", "COROCOLL_CONNECT": mode,
           "OMP_NUM_THREADS": "1"}
    argv = [probe, "--nproc", str(ranks), "--first", first]
    start = time.time_ns()
    r = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=timeout)
    done = {int(rank): int(ns) for rank, ns in DONE.findall(r.stdout)}
    seen = {int(rank): (int(n), int(rss)) for rank, n, rss in CONNECTIONS.findall(r.stdout)}
    if r.returncode != 0 or len(done) != ranks or len(seen) != ranks:
        tail = "\n".join((r.stderr or r.stdout).splitlines()[-5:])
        raise RuntimeError(f"{shlex.join(argv)} ({mode}): exit {r.returncode}, {len(done)} of "
                           f"{ranks} ranks reported\n{tail}")
    return ((max(done.values()) - start) / 1e9, [seen[k][0] for k in sorted(seen)],
            [seen[k][1] for k in sorted(seen)])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", default="16,64,128,256")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out-dir", type=Path, default=REPO / "docs")
    p.add_argument("--probe", default=str(REPO / "build-release/benchmarks/startup_probe"))
    p.add_argument("--timeout", type=float, default=300)
    a = p.parse_args()
    counts = [int(x) for x in a.ranks.split(",")]
    if any(n < 2 for n in counts) or a.repeats < 1:
        p.error("--ranks must be at least 2 each, --repeats positive")

    rows = []
    for n in counts:
        for first in ("ring", "broadcast"):
            for mode in ("eager", "lazy"):
                times, conns, rss = [], None, None
                for _ in range(a.repeats):
                    t, c, m = once(a.probe, n, mode, first, a.timeout)
                    times.append(t)
                    conns, rss = c, m
                row = (n, first, mode, statistics.median(times), conns, statistics.median(rss))
                rows.append(row)
                print(f"{n} ranks, {first}, {mode}: connections per rank {min(conns)}/"
                      f"{statistics.median(conns):g}/{max(conns)}, {sum(conns) // 2} in all, "
                      f"RSS {row[5] / 1024:.1f} MiB, first call done in "
                      f"{row[3] * 1e3:.0f} ms", flush=True)

    m = machine()
    call = {"ring": "ring all_reduce", "broadcast": "binomial broadcast"}
    out = [BEGIN_MARK, "<!-- Written by benchmarks/compare/connections.py; edits here are "
           "overwritten. -->", "", "### Connections at set-up or on first use, 16-256 ranks", "",
           f"Machine: {m['cpu']}, {m['cpus']} CPUs ({m['caches']}), Linux {m['kernel']}; "
           f"measured {m['date']}; corocoll {m['corocoll_commit']}.", "",
           "Reproduce from the repository root:", "", "```sh",
           shlex.join([sys.executable, "benchmarks/compare/connections.py", "--ranks", a.ranks,
                       "--repeats", str(a.repeats)]), "```", "",
           "startup_probe spawns the ranks as processes on this machine, over TCP "
           "(COROCOLL_TRANSPORT=tcp), with COROCOLL_CONNECT=eager (the full mesh at set-up) or "
           "lazy (each rank's two ring neighbours at set-up, the rest when first used). Each rank "
           "makes one call and then reports the peers it has a connection to and its VmRSS. "
           "Time: from the launch to the last rank's call done, median of "
           f"{a.repeats} runs, the ranks oversubscribing the {m['cpus']} CPUs.", "",
           "| ranks | first call | connect | connections per rank (min/median/max) | "
           "in the job | RSS per rank, median | launch to the call done |",
           "|---:|---|---|---|---:|---:|---:|"]
    for n, first, mode, t, conns, rss in rows:
        out.append(f"| {n} | {call[first]} | {mode} | {min(conns)}/"
                   f"{statistics.median(conns):g}/{max(conns)} | {sum(conns) // 2} | "
                   f"{rss / 1024:.1f} MiB | {t * 1e3:.0f} ms |")
    out += ["", END_MARK]
    a.out_dir.mkdir(parents=True, exist_ok=True)
    write_markdown(a.out_dir / "performance.md", "\n".join(out), BEGIN_MARK, END_MARK)
    print(f"connections: wrote {a.out_dir / 'performance.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
