#!/usr/bin/python3
"""sweep_summary_test: the summary flags what it must and nothing else, on made-up rows."""

import sys
from pathlib import Path

sys.dont_write_bytecode = True
sys.path.insert(0, str(Path(__file__).resolve().parent))
import sweep_summary  # noqa: E402


def row(system, op, size, time_us, ranks=2, wrong=0):
    return {"system": system, "op": op, "ranks": ranks, "size": size, "time_us": time_us,
            "wrong": wrong}


def main():
    rows = [
        # all_reduce: corocoll fastest at 4 B, 1.2x at 64 B (within), 1.5x at 1 KiB (flagged)
        row("corocoll_shm", "all_reduce", 4, 1.0), row("ompi_vader", "all_reduce", 4, 2.0),
        row("mpich", "all_reduce", 4, 1.5),
        row("corocoll_shm", "all_reduce", 64, 1.2), row("ompi_vader", "all_reduce", 64, 1.0),
        row("corocoll_shm", "all_reduce", 1024, 3.0), row("ompi_vader", "all_reduce", 1024, 2.0),
        # reduce: a cliff at 4 KiB in corocoll (9 µs, then 4 µs at 8 KiB), none in vader
        row("corocoll_shm", "reduce", 4096, 9.0), row("ompi_vader", "reduce", 4096, 8.0),
        row("corocoll_shm", "reduce", 8192, 4.0), row("ompi_vader", "reduce", 8192, 9.0),
        # a wrong row is no cell; a TCP peer is no peer of corocoll_tcp's but for TCP systems
        row("corocoll_shm", "gather", 64, 1.0), row("ompi_vader", "gather", 64, 0.5, wrong=3),
        row("corocoll_tcp", "broadcast", 64, 10.0), row("ompi_vader", "broadcast", 64, 1.0),
        row("ompi_tcp", "broadcast", 64, 9.0),
    ]
    failures = []

    def expect(what, got, want):
        if got != want:
            failures.append(f"{what}: got {got!r}, want {want!r}")

    cells = sweep_summary.by_cell(rows)
    expect("the wrong row is left out", cells[("gather", 2, 64)], {"corocoll_shm": 1.0})
    peers = sweep_summary.peers_of("corocoll_shm", ["corocoll_shm", "corocoll_tcp", "ompi_vader",
                                                    "mpich", "ompi_tcp"])
    expect("peers of shm", peers, ["ompi_vader", "mpich", "ompi_tcp"])
    expect("peers of tcp", sweep_summary.peers_of("corocoll_tcp", ["ompi_vader", "ompi_tcp"]),
           ["ompi_tcp"])
    rat = sweep_summary.ratios(cells, "corocoll_shm", peers)
    expect("ratio at 4 B", rat[("all_reduce", 2, 4)], (1.0 / 1.5, "mpich"))
    expect("ratio at 1 KiB", rat[("all_reduce", 2, 1024)], (1.5, "ompi_vader"))
    expect("no ratio without a peer", ("gather", 2, 64) in rat, False)
    tcp = sweep_summary.ratios(cells, "corocoll_tcp", ["ompi_tcp"])
    expect("tcp against tcp", tcp[("broadcast", 2, 64)], (10.0 / 9.0, "ompi_tcp"))
    expect("cliffs", [c[:4] for c in sweep_summary.cliffs(rows)],
           [("corocoll_shm", "reduce", 2, 4096)])
    text = sweep_summary.summary(rows, ["corocoll_shm", "ompi_vader", "mpich"],
                                 ["all_reduce", "reduce", "gather"])
    expect("counts", "5 cells: fastest in 2, within 1.25x of the best peer in 4, flagged 1."
           in text, True)
    expect("flagged cell in bold", "| all_reduce | 0.67 | 1.20 | **1.50** |" in text, True)
    expect("cliff marked", "| reduce | – | – | – | 1.12 ↯ | 0.44 |" in text, True)
    expect("flag list", "Flagged, slowest first: all_reduce 1K 1.50x (ompi_vader); reduce 4K "
           "1.12x" in text, False)
    expect("flag list", "Flagged, slowest first: all_reduce 1K 1.50x (ompi_vader)." in text, True)
    for f in failures:
        print("sweep_summary_test:", f, file=sys.stderr)
    if failures:
        print(text, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
