#!/usr/bin/env python3
"""coll_perf --stats 1: every rank writes one line per collective and size to stderr with what
its reactor did in that size's timed loop; without the flag it writes none.

    coll_perf_stats_test.py COLL_PERF
"""
import os
import re
import subprocess
import sys

FIELDS = ("turns", "polls", "yields", "kernel_waits", "enters", "watched_sleeps",
          "futex_sleeps", "fenced_sleeps", "moves", "wakeups", "at_once")
LINE = re.compile(r"coll_perf stats: rank (\d+) (\w+) (\d+) B iters (\d+): (.*)$")


def run(coll_perf, *extra):
    argv = [coll_perf, "--nproc", "2", "--coll", "scatter,ping_pong", "-b", "4K", "-e", "8K",
            "-n", "30", "-w", "3", "-c", "0", "-F", "csv", *extra]
    env = dict(os.environ, COROCOLL_TRANSPORT="shm")
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        sys.exit(f"coll_perf failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done


def main():
    coll_perf = sys.argv[1]
    failures = []
    quiet = run(coll_perf)
    if "coll_perf stats:" in quiet.stderr:
        failures.append("stats lines without --stats:\n" + quiet.stderr)
    loud = run(coll_perf, "--stats", "1")
    seen = {}
    for text in loud.stderr.splitlines():
        if not text.startswith("coll_perf stats:"):
            continue
        m = LINE.match(text)
        if not m:
            failures.append(f"unreadable line: {text!r}")
            continue
        rank, op, size, iters, rest = m.groups()
        pairs = dict(re.findall(r"(\w+) (\d+)", rest))
        if tuple(pairs) != FIELDS:
            failures.append(f"fields {tuple(pairs)} in {text!r}, not {FIELDS}")
        if iters != "30":
            failures.append(f"iters {iters} in {text!r}, not 30")
        key = (int(rank), op, int(size))
        seen[key] = seen.get(key, 0) + 1
    want = {(r, op, s): 1 for r in (0, 1) for op in ("scatter", "ping_pong")
            for s in (4096, 8192)}
    if seen != want:
        failures.append(f"lines per rank, collective and size: {sorted(seen.items())}, "
                        f"not one for each of {sorted(want)}")
    # The rows on stdout are the same as without the flag: only stderr carries the counts.
    rows = [line.split(",")[:3] for line in loud.stdout.splitlines()[1:]]
    if rows != [line.split(",")[:3] for line in quiet.stdout.splitlines()[1:]] or len(rows) != 4:
        failures.append(f"stdout rows differ with --stats:\n{loud.stdout}")
    for f in failures:
        print("FAIL:", f)
    if failures:
        sys.exit(1)
    print(f"coll_perf --stats: {sum(seen.values())} lines, one per rank, collective and size")


if __name__ == "__main__":
    main()
