#!/usr/bin/python3
"""startup: from launching N ranks to the first all_reduce done, corocoll beside torch+Gloo.

    benchmarks/compare/startup.py [--ranks 4] [--repeats 7] [--out-dir docs]
        [--probe PATH] [--corocollrun PATH] [--python PATH]

Each way of starting runs --repeats times, one at a time. The clock starts just before the
launcher is started and stops when the last rank has finished its first all_reduce (each rank
prints the wall-clock time it was done: startup_probe for corocoll, startup_torch.py for
torch); "to exit" is when the launcher has returned, teardown included. Reported: the median
and the smallest of the repeats. Written between <!-- startup:begin --> and
<!-- startup:end --> in performance.md under --out-dir (the rest of the file is kept), and
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

HERE = Path(__file__).resolve().parent
BEGIN_MARK = "<!-- startup:begin -->"
END_MARK = "<!-- startup:end -->"
DONE = re.compile(r"^startup_done (\d+) (\d+)$", re.M)


def ways(a):
    """(name, argv) for each way of starting --ranks ranks."""
    n = str(a.ranks)
    torchrun = [a.python, str(REPO / "tests" / "process_group" / "torchrun_fixed.py")]
    torch_probe = [a.python, str(HERE / "startup_torch.py")]
    return [
        ("corocoll, corocollrun", [a.corocollrun, f"--nproc_per_node={n}", "--no_prefix", a.probe]),
        ("corocoll, spawned by the program", [a.probe, "--nproc", n]),
        ("torch+Gloo, torchrun", [*torchrun, "--standalone", f"--nproc_per_node={n}",
                                  *torch_probe[1:]]),
        ("torch+Gloo, corocollrun", [a.corocollrun, f"--nproc_per_node={n}", "--no_prefix",
                                     *torch_probe]),
    ]


def once(argv, ranks, timeout):
    """Seconds to the last rank's first all_reduce, and to the launcher's exit."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.time_ns()
    r = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=timeout)
    ended = time.time_ns()
    done = {int(rank): int(ns) for rank, ns in DONE.findall(r.stdout)}
    if r.returncode != 0 or len(done) != ranks:
        tail = "\n".join((r.stderr or r.stdout).splitlines()[-5:])
        raise RuntimeError(f"{shlex.join(argv)}: exit {r.returncode}, {len(done)} of {ranks} "
                           f"ranks reported\n{tail}")
    return (max(done.values()) - start) / 1e9, (ended - start) / 1e9


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--out-dir", type=Path, default=REPO / "docs")
    p.add_argument("--probe", default=str(REPO / "build-release/benchmarks/startup_probe"))
    p.add_argument("--corocollrun", default=str(REPO / "build-release/tools/corocollrun"))
    p.add_argument("--python", default="/usr/bin/python3")
    p.add_argument("--timeout", type=float, default=120)
    a = p.parse_args()
    if a.ranks < 1 or a.repeats < 1:
        p.error("--ranks and --repeats must be positive")

    rows = []
    for name, argv in ways(a):
        first, exits = [], []
        for _ in range(a.repeats):
            f, e = once(argv, a.ranks, a.timeout)
            first.append(f)
            exits.append(e)
        rows.append((name, argv, first, exits))
        print(f"{name}: first all_reduce {statistics.median(first) * 1e3:.0f} ms median, "
              f"{min(first) * 1e3:.0f} ms best; exit {statistics.median(exits) * 1e3:.0f} ms",
              flush=True)

    m = machine()
    base = statistics.median(rows[0][2])
    out = [BEGIN_MARK, "<!-- Written by benchmarks/compare/startup.py; edits here are "
           "overwritten. -->", "", f"### Start-up: {a.ranks} ranks to the first all_reduce", "",
           f"Machine: {m['cpu']}, {m['cpus']} CPUs, Linux {m['kernel']}; measured {m['date']}; "
           f"corocoll {m['corocoll_commit']}; python3-torch {m['packages']['python3-torch']}.",
           "", "Reproduce from the repository root:", "", "```sh",
           shlex.join([sys.executable, "benchmarks/compare/startup.py", "--ranks",
                       str(a.ranks), "--repeats", str(a.repeats)]), "```", "",
           "From just before the launcher starts until the last rank has finished its first "
           "all_reduce (each rank prints the wall-clock time), and until the launcher has "
           f"exited; median and best of {a.repeats} runs, one at a time.", "",
           "| started as | first all_reduce, median | best | launcher exit, median | "
           "÷ corocoll under corocollrun |",
           "|---|---:|---:|---:|---:|"]
    for name, argv, first, exits in rows:
        med = statistics.median(first)
        out.append(f"| {name} | {med * 1e3:.0f} ms | {min(first) * 1e3:.0f} ms | "
                   f"{statistics.median(exits) * 1e3:.0f} ms | {med / base:.1f} |")
    out += ["", "Commands:", ""]
    for name, argv, _, _ in rows:
        shown = [Path(x).name if os.path.isabs(x) and x != a.python else x for x in argv]
        out.append(f"- {name}: `{shlex.join(shown)}`")
    out += ["", END_MARK]
    a.out_dir.mkdir(parents=True, exist_ok=True)
    write_markdown(a.out_dir / "performance.md", "\n".join(out), BEGIN_MARK, END_MARK)
    print(f"startup: wrote {a.out_dir / 'performance.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
