#!/usr/bin/python3
"""run_compare_test: which cells the runner runs again with more calls, and how it groups them,
on made-up rows (no system is run)."""

import argparse
import importlib.util
import sys
from pathlib import Path

sys.dont_write_bytecode = True
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
spec = importlib.util.spec_from_file_location("run_compare", HERE / "run_compare.py")
run_compare = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run_compare)


def row(size, time_us, iters, wrong=0):
    return {"size": size, "time_us": time_us, "iters": iters, "wrong": wrong}


def main():
    failures = []

    def expect(what, got, want):
        if got != want:
            failures.append(f"{what}: got {got!r}, want {want!r}")

    a = argparse.Namespace(iters=None, time_per_size=0.1, min_bytes=4, max_bytes=64, factor=2,
                           timeout=600)
    rows = [
        row(4, 4.0, 500),       # 2 ms of 100: 25,000 calls fill it, rounded down to 20,000
        row(8, 4.0, 20000),     # 80 ms: long enough
        row(16, 0.3, 50000),    # 15 ms: 333,333 fill it, at most 100,000 (twice 50,000)
        row(32, 1000.0, 5),     # 5 ms: 100 calls
        row(64, 0.3, 60000),    # 18 ms, yet the most (100,000) is not twice 60,000
    ]
    expect("lengthened", run_compare.lengthened(a, "broadcast", 2, rows),
           {4: 20000, 16: 100000, 32: 100})
    expect("a wrong row is not run again",
           run_compare.lengthened(a, "broadcast", 2, [row(4, 4.0, 500, wrong=3)]), {})
    fixed = argparse.Namespace(**vars(a))
    fixed.iters = 20
    expect("--iters fixes every count", run_compare.lengthened(fixed, "broadcast", 2, rows), {})
    # all_gather on 4 ranks moves whole floats per rank: a row of 16 B was asked as 16 B, and
    # nothing asked moves 20 B.
    expect("split op's size", run_compare.lengthened(a, "all_gather", 4, [row(16, 4.0, 500)]),
           {16: 20000})
    expect("no size moves 20 B", run_compare.lengthened(a, "all_gather", 4, [row(20, 4.0, 500)]),
           {})
    expect("segments of the lengthened sizes",
           run_compare.segments(a, 2, {4: 20000, 16: 100000, 32: 100}),
           [(4, 4, 20000, 2000), (16, 16, 100000, 10000), (32, 32, 100, 10)])
    expect("neighbours with one count share a run",
           run_compare.segments(a, 2, {4: 100, 8: 100, 32: 100, 64: 100}),
           [(4, 8, 100, 10), (32, 64, 100, 10)])
    # A longer run of 4..16 B (3 sizes) may take 10 s to start and 10 x 0.1 s a size.
    expect("a longer run's time limit", run_compare.lengthened_timeout(a, 4, 16), 13.0)
    short = argparse.Namespace(**vars(a))
    short.timeout = 5
    expect("never past --timeout", run_compare.lengthened_timeout(short, 4, 16), 5)
    # A recheck runs every side of a comparison one after the other (A B C A B C), not every
    # corocoll run first: a VM's processors may sit nearer or farther apart for minutes. Every
    # peer that ran the cell, not only the one that beat it (gather: vader too).
    def cell(system, op, size, time_us):
        return {"system": system, "op": op, "ranks": 2, "size": size, "time_us": time_us}

    made_up = [cell("corocoll_shm", "ping_pong", 32, 0.6),
               cell("ompi_vader", "ping_pong", 32, 0.15),
               cell("corocoll_shm", "ping_pong", 64, 0.5), cell("ompi_vader", "ping_pong", 64, 0.5),
               cell("corocoll_shm", "gather", 16, 1.0), cell("mpich", "gather", 16, 0.5),
               cell("ompi_vader", "gather", 16, 0.9)]
    twice = argparse.Namespace(systems=["corocoll_shm", "ompi_vader", "mpich"], recheck=2)
    flagged = [("corocoll_shm", "gather", 2, 16), ("ompi_vader", "gather", 2, 16),
               ("mpich", "gather", 2, 16)] * 2 + [
        ("corocoll_shm", "ping_pong", 2, 32), ("ompi_vader", "ping_pong", 2, 32)] * 2
    # vader's 32 B (0.15) against its own 64 B (0.5) is no cliff; 0.5 against 0.15 at 32 B is
    # a size slower than twice the next larger one.
    cliff = [("ompi_vader", "ping_pong", 2, 64), ("ompi_vader", "ping_pong", 2, 128)]
    expect("recheck order", run_compare.recheck_plan(twice, made_up), flagged)
    made_up.append(cell("ompi_vader", "ping_pong", 128, 0.2))
    expect("recheck order with a cliff", run_compare.recheck_plan(twice, made_up),
           flagged + cliff * 2)
    # Placement: the crossings before and after each run; a run over 1.5x the cheapest is
    # named, one that did not measure (None) is not.
    near = [("corocoll_shm", "broadcast", 2, [80.0, 90.0]), ("mpich", "broadcast", 2, [85.0, None])]
    text = run_compare.placement_text(near)
    expect("one placement", ("80-90 ns" in text, "one placement" in text, "moved" in text),
           (True, True, False))
    moved = near + [("ompi_vader", "broadcast", 2, [88.0, 320.0])]
    text = run_compare.placement_text(moved)
    expect("a move named", ("80-320 ns" in text, "1 of 3 runs" in text,
                            "ompi_vader broadcast 2 ranks (88, 320 ns)" in text), (True,) * 3)
    expect("none measured", run_compare.placement_text([("mpich", "gather", 2, [None, None])]),
           "Placement: not measured (line_crossing.c could not be built or run here).")
    for f in failures:
        print("run_compare_test:", f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
