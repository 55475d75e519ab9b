#!/usr/bin/python3
"""sweep_summary: the whole comparison in one view, with its cliffs and its slow cells flagged.

    python3 benchmarks/compare/sweep_summary.py RESULTS.json [--plots DIR]

Reads the rows run_compare.py wrote (perf/results.json) and prints, for each corocoll system
and rank count, a heat map as a markdown table (one row per op, one column per size) of its time
divided by the best peer's at that cell, and flags two things:

- a cell slower than the best peer by more than 1.25x (FLAG_RATIO);
- a cliff: a size that takes more than 2x as long as the next larger size of the same sweep
  (CLIFF_FACTOR), in any system; more bytes should never cost less.

The peers of corocoll_shm are every system that is not corocoll; those of corocoll_tcp the
systems that talk over TCP (Gloo, torch's Gloo, Open MPI's tcp). run_compare.py puts this
summary at the top of its section; run alone, it reads a results.json again (to change the
flags' thresholds without measuring again). With --plots, a PNG heat map per system and rank
count (needs matplotlib).
"""

import argparse
import json
import math
import sys
from pathlib import Path

FLAG_RATIO = 1.25
CLIFF_FACTOR = 2.0
# Who each corocoll system is measured against.
TCP_PEERS = ("torch_gloo", "gloo", "ompi_tcp")
REFERENCE_SYSTEMS = ("corocoll_shm", "corocoll_tcp")


def peers_of(ref, systems):
    if ref == "corocoll_tcp":
        return [s for s in systems if s in TCP_PEERS]
    return [s for s in systems if s not in REFERENCE_SYSTEMS]


def by_cell(rows):
    """{(op, ranks, size): {system: time_us}} over the rows that were checked right."""
    cells = {}
    for r in rows:
        if r.get("wrong", 0) > 0 or r["time_us"] <= 0:
            continue
        cells.setdefault((r["op"], r["ranks"], r["size"]), {})[r["system"]] = r["time_us"]
    return cells


def ratios(cells, ref, peers):
    """{(op, ranks, size): (ratio to the best peer, that peer)} where both ran."""
    out = {}
    for key, times in cells.items():
        there = [(times[p], p) for p in peers if p in times]
        if ref in times and there:
            best, who = min(there)
            out[key] = (times[ref] / best, who)
    return out


def cliffs(rows):
    """[(system, op, ranks, size, time, next size, next time)]: a size slower than
    CLIFF_FACTOR times the next larger size of the same system, op and rank count."""
    series = {}
    for r in rows:
        if r["time_us"] > 0:
            series.setdefault((r["system"], r["op"], r["ranks"]), []).append(
                (r["size"], r["time_us"]))
    found = []
    for (system, op, ranks), points in series.items():
        points.sort()
        for (size, t), (bigger, t_next) in zip(points, points[1:]):
            if t > CLIFF_FACTOR * t_next:
                found.append((system, op, ranks, size, t, bigger, t_next))
    return sorted(found)


def fmt_size(b):
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= scale and b % scale == 0:
            return f"{b // scale}{unit}"
    return f"{b}"


def heat_table(ref, ranks, rat, cliff_cells, ops):
    """One markdown table: rows ops, columns sizes, cells ratio to the best peer."""
    sizes = sorted({size for (op, n, size) in rat if n == ranks})
    lines = ["| op | " + " | ".join(fmt_size(s) for s in sizes) + " |",
             "|---|" + "---:|" * len(sizes)]
    for op in ops:
        cells = []
        for s in sizes:
            got = rat.get((op, ranks, s))
            if got is None:
                cells.append("–")
                continue
            text = f"{got[0]:.2f}"
            if got[0] > FLAG_RATIO:
                text = f"**{text}**"
            if (ref, op, ranks, s) in cliff_cells:
                text += " ↯"
            cells.append(text)
        if any(c != "–" for c in cells):
            lines.append(f"| {op} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_heat(path, ref, ranks, rat, ops):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.colors as colors
    import matplotlib.pyplot as plt

    sizes = sorted({size for (op, n, size) in rat if n == ranks})
    ops = [op for op in ops if any((op, ranks, s) in rat for s in sizes)]
    if not sizes or not ops:
        return False
    grid = [[rat[(op, ranks, s)][0] if (op, ranks, s) in rat else math.nan for s in sizes]
            for op in ops]
    fig, ax = plt.subplots(figsize=(max(8, 0.55 * len(sizes)), 0.5 * len(ops) + 1.8))
    norm = colors.LogNorm(vmin=0.25, vmax=4)
    im = ax.imshow(grid, cmap="RdYlGn_r", norm=norm, aspect="auto")
    for i, row in enumerate(grid):
        for j, v in enumerate(row):
            if not math.isnan(v):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6,
                        fontweight="bold" if v > FLAG_RATIO else "normal")
    ax.set_xticks(range(len(sizes)), [fmt_size(s) for s in sizes], rotation=90, fontsize=7)
    ax.set_yticks(range(len(ops)), ops, fontsize=8)
    ax.set_title(f"{ref} time ÷ best peer's, {ranks} ranks (below 1: {ref} is faster)",
                 fontsize=9)
    bar = fig.colorbar(im, ax=ax, fraction=0.03)
    ticks = [0.25, 0.5, 1, FLAG_RATIO, 2, 4]
    bar.set_ticks(ticks, labels=[f"{t:g}" for t in ticks])
    bar.minorticks_off()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def summary(rows, systems, ops, plots_dir=None, link_prefix=""):
    """The markdown of the summary; with `plots_dir`, the heat maps as PNGs there too."""
    cliff_list = cliffs(rows)
    cliff_cells = {(s, op, n, size) for (s, op, n, size, *_) in cliff_list}
    cells = by_cell(rows)
    out = ["### The whole sweep: ratio to the best peer, cliffs flagged", "",
           f"Each cell is the corocoll system's time divided by the fastest peer's at that op, "
           f"rank count and size (below 1: corocoll is the fastest). **Bold**: more than "
           f"{FLAG_RATIO}x the best peer. ↯: a cliff, a size more than {CLIFF_FACTOR:g}x as "
           f"slow as the next larger size. Peers of corocoll_shm: every other system; of "
           f"corocoll_tcp: {', '.join(TCP_PEERS)}.", ""]
    for ref in REFERENCE_SYSTEMS:
        peers = peers_of(ref, systems)
        if ref not in systems or not peers:
            continue
        rat = ratios(cells, ref, peers)
        for ranks in sorted({n for (_, n, _) in rat}):
            mine = {k: v for k, v in rat.items() if k[1] == ranks}
            fastest = sum(1 for r, _ in mine.values() if r <= 1)
            within = sum(1 for r, _ in mine.values() if r <= FLAG_RATIO)
            out += [f"#### {ref}, {ranks} ranks, against {', '.join(peers)}", "",
                    f"{len(mine)} cells: fastest in {fastest}, within {FLAG_RATIO}x of the best "
                    f"peer in {within}, flagged {len(mine) - within}.", "",
                    heat_table(ref, ranks, rat, cliff_cells, ops)]
            if plots_dir is not None:
                name = f"heat_{ref}_{ranks}ranks.png"
                if plot_heat(Path(plots_dir) / name, ref, ranks, rat, ops):
                    out += ["", f"![{ref}, {ranks} ranks: ratio to the best peer]"
                                f"({link_prefix}{name})"]
            worst = sorted(((r, k, who) for k, (r, who) in mine.items() if r > FLAG_RATIO),
                           reverse=True)
            if worst:
                out += ["", "Flagged, slowest first: " + "; ".join(
                    f"{op} {fmt_size(size)} {r:.2f}x ({who})" for r, (op, _, size), who in worst)
                    + "."]
            out.append("")
    if cliff_list:
        out += ["Cliffs (any system): " + "; ".join(
            f"{s} {op} {n} ranks {fmt_size(size)} {t:.1f} µs against {t_next:.1f} at "
            f"{fmt_size(bigger)}" for s, op, n, size, t, bigger, t_next in cliff_list) + ".", ""]
    else:
        out += [f"Cliffs (any system): none (no size over {CLIFF_FACTOR:g}x the next).", ""]
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", type=Path)
    p.add_argument("--plots", type=Path)
    a = p.parse_args()
    raw = json.loads(a.results.read_text())
    rows = raw["rows"]
    systems = list(dict.fromkeys(r["system"] for r in rows))
    ops = list(dict.fromkeys(r["op"] for r in rows))
    print(summary(rows, systems, ops, a.plots))
    return 0


if __name__ == "__main__":
    sys.exit(main())
