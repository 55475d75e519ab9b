#!/usr/bin/python3
"""cost_model: an alpha-beta model of corocoll's collectives, fitted on this machine, checked
against measurements, used to predict 1,024 and 8,192 ranks and to check what `select` picks.

    benchmarks/compare/cost_model.py [--ranks 2,4,8] [--out-dir docs] [--coll-perf PATH]
        [--select-table PATH] [--iters 20]

1. Fit. A message of s bytes between two ranks costs alpha + beta * s: coll_perf's ping_pong
   (half a round trip) on 2 ranks over TCP (loopback) and through shared memory, 8 B-16 MiB;
   alpha is the median of the sizes up to 64 B, beta the least-squares slope of what is left
   over the sizes from 64 KiB.
2. Algorithms (L = ceil(log2 n); s: the buffer, all_gather's whole gathered buffer):
     all_reduce ring             2 (n - 1) (alpha + beta s / n)
     all_reduce recursive_doubl. L (alpha + beta s), 2 more exchanges where n is no power of 2
     broadcast binomial          L (alpha + beta s)
     broadcast chain             (n - 2 + k) (alpha + beta s / k), k = ceil(s / 1 MiB) pieces
     all_gather ring             (n - 1) (alpha + beta s / n)
     all_gather bruck            L alpha + beta s (n - 1) / n
     reduce_scatter ring         (n - 1) (alpha + beta s / n)          (s: the whole input)
     reduce_scatter recursive_d. as all_reduce's: a whole all_reduce, each rank keeps its block
   and the hierarchical ones across H hosts of p ranks: within a host by shared memory
   (binomial reduce, binomial broadcast, a gather to the leader), between the H leaders over
   TCP by the algorithm select picks for H ranks (reduce_scatter: flat only, it has no
   hierarchical algorithm). No term for the reductions' arithmetic.
3. Checked against coll_perf over TCP with each algorithm forced, at --ranks (on this
   machine's CPUs: more ranks than CPUs share them, which the model does not know).
4. Predicted at 1,024 ranks (128 hosts of 8) and 8,192 (1,024 hosts of 8), the hosts joined as
   this machine's loopback is (the only network measured here).
5. select_table prints what select picks for a group over TCP at 2-8,192 ranks; set beside the
   model's best, with what the pick costs over the best where they differ.

Written between <!-- cost:begin --> and <!-- cost:end --> in performance.md under --out-dir,
with docs/perf/cost_model.png (measured against predicted; predicted time against ranks).
"""

import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

from run_compare import REPO, machine, write_markdown

BEGIN_MARK = "<!-- cost:begin -->"
END_MARK = "<!-- cost:end -->"
CHUNK = 1 << 20  # collectives::context::chunk_bytes
ALGOS = {"all_reduce": ["ring", "recursive_doubling"], "broadcast": ["binomial", "chain"],
         "all_gather": ["ring", "bruck"], "reduce_scatter": ["ring", "recursive_doubling"]}
HIERARCHICAL = ("all_reduce", "broadcast", "all_gather")


def rows(argv, env):
    r = subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True,
                       timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)}: exit {r.returncode}: {r.stderr[-300:]}")
    return json.loads(r.stdout)


def fit(points):
    """(alpha us, beta us per byte) from [(bytes, us)]."""
    alpha = statistics.median(t for s, t in points if s <= 64)
    big = [(s, t - alpha) for s, t in points if s >= 64 << 10]
    beta = sum(s * t for s, t in big) / sum(s * s for s, _ in big)
    return alpha, beta


def log2up(n):
    return max(1, math.ceil(math.log2(n)))


def flat(kind, algo, n, s, a, b):
    """Model time (us) of `algo` for `kind` on n ranks, s bytes, links (a, b)."""
    if n == 1:
        return 0.0
    L = log2up(n)
    if kind == "all_reduce" and algo == "ring":
        return 2 * (n - 1) * (a + b * s / n)
    if kind in ("all_reduce", "reduce_scatter") and algo == "recursive_doubling":
        extra = 0 if n & (n - 1) == 0 else 2
        return (L + extra) * (a + b * s)
    if kind == "broadcast" and algo == "binomial":
        return L * (a + b * s)
    if kind == "broadcast" and algo == "chain":
        k = max(1, math.ceil(s / CHUNK))
        return (n - 2 + k) * (a + b * s / k)
    if kind in ("all_gather", "reduce_scatter") and algo == "ring":
        return (n - 1) * (a + b * s / n)
    if kind == "all_gather" and algo == "bruck":
        return L * a + b * s * (n - 1) / n
    raise ValueError((kind, algo))


def best(kind, n, s, a, b):
    return min(ALGOS[kind], key=lambda x: flat(kind, x, n, s, a, b))


def hierarchical(kind, hosts, per_host, s, shm, tcp, pick):
    """Model time across `hosts` hosts of `per_host` ranks; `pick(kind, H, s)` is the leaders'
    algorithm."""
    (sa, sb), (ta, tb) = shm, tcp
    inside = log2up(per_host) * (sa + sb * s) if per_host > 1 else 0.0
    if kind == "all_reduce":
        between = flat(kind, pick(kind, hosts, s), hosts, s, ta, tb)
        return inside + between + inside
    if kind == "broadcast":
        return flat(kind, pick(kind, hosts, s), hosts, s, ta, tb) + inside
    n = hosts * per_host
    gather = (per_host - 1) * (sa + sb * s / n)
    between = flat(kind, pick(kind, hosts, s), hosts, s, ta, tb)
    return gather + between + inside


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", default="2,4,8")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--out-dir", type=Path, default=REPO / "docs")
    p.add_argument("--coll-perf", default=str(REPO / "build-release/benchmarks/coll_perf"))
    p.add_argument("--select-table",
                   default=str(REPO / "build-release/benchmarks/select_table"))
    a = p.parse_args()
    counts = [int(x) for x in a.ranks.split(",")]
    it = ["-n", str(a.iters), "-w", "3", "-c", "1", "-d", "float", "-o", "sum", "-F", "json"]

    links = {}
    for transport in ("tcp", "shm"):
        pts = [(r["size"], r["time_us"]) for r in rows(
            [a.coll_perf, "--nproc", "2", "--coll", "ping_pong", "-b", "8", "-e", "16M", "-f",
             "4", *it], {"COROCOLL_TRANSPORT": transport})]
        links[transport] = fit(pts)
        al, be = links[transport]
        err = [abs(al + be * s - t) / t for s, t in pts]
        print(f"{transport}: alpha {al:.2f} us, beta {be * 1e3:.4f} us/KB "
              f"({1 / be / 1e3:.2f} GB/s); ping_pong fit error median "
              f"{statistics.median(err) * 100:.0f}%, max {max(err) * 100:.0f}%", flush=True)
    ta, tb = links["tcp"]

    checks = []  # (kind, algo, n, bytes, measured, predicted)
    for n in counts:
        for kind, algos in ALGOS.items():
            for algo in algos:
                for r in rows([a.coll_perf, "--nproc", str(n), "--coll", kind, "--algo", algo,
                               "-b", "8", "-e", "16M", "-f", "8", *it],
                              {"COROCOLL_TRANSPORT": "tcp"}):
                    checks.append((kind, algo, n, r["size"], r["time_us"],
                                   flat(kind, algo, n, r["size"], ta, tb)))
        errs = [abs(pr - m) / m for _, _, k, _, m, pr in checks if k == n]
        print(f"{n} ranks over TCP: model error median {statistics.median(errs) * 100:.0f}%, "
              f"largest {max(errs) * 100:.0f}% ({len(errs)} cells)", flush=True)

    table = subprocess.run([a.select_table], capture_output=True, text=True, check=True).stdout
    picks = {}
    for line in table.split("\n"):
        if line:
            kind, n, s, algo = line.split()
            picks[(kind, int(n), int(s))] = algo
    agree, differ = 0, []
    for (kind, n, s), algo in sorted(picks.items()):
        if algo not in ALGOS[kind]:
            continue
        want = best(kind, n, s, ta, tb)
        if want == algo:
            agree += 1
        else:
            cost = flat(kind, algo, n, s, ta, tb) / flat(kind, want, n, s, ta, tb)
            differ.append((kind, n, s, algo, want, cost))
    print(f"select agrees with the model in {agree} of {agree + len(differ)} cells", flush=True)

    def select_pick(kind, n, s):
        return picks.get((kind, n, 1 << max(3, min(28, round(math.log2(max(s, 8)))))),
                         best(kind, n, s, ta, tb))

    def model_pick(kind, n, s):
        return best(kind, n, s, ta, tb)

    scales = [(1024, 128, 8), (8192, 1024, 8)]
    sizes = [8, 64 << 10, 1 << 20, 64 << 20]
    preds = []
    for n, hosts, per in scales:
        for kind in HIERARCHICAL:
            for s in sizes:
                preds.append((n, hosts, per, kind, s,
                              hierarchical(kind, hosts, per, s, links["shm"], links["tcp"],
                                           select_pick),
                              hierarchical(kind, hosts, per, s, links["shm"], links["tcp"],
                                           model_pick),
                              min(flat(kind, x, n, s, ta, tb) for x in ALGOS[kind])))

    plot = a.out_dir / "perf" / "cost_model.png"
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 5))
        for n in counts:
            ms = [m for _, _, k, _, m, _ in checks if k == n]
            ps = [pr for _, _, k, _, _, pr in checks if k == n]
            ax1.loglog(ms, ps, ".", label=f"{n} ranks")
        lo = min(min(c[4], c[5]) for c in checks)
        hi = max(max(c[4], c[5]) for c in checks)
        ax1.loglog([lo, hi], [lo, hi], "k-", lw=0.5)
        ax1.set_xlabel("measured µs (coll_perf, TCP)")
        ax1.set_ylabel("model µs")
        ax1.set_title("alpha-beta model against measurements")
        ax1.legend()
        ns = [2 ** i for i in range(1, 14)]
        for kind in ALGOS:
            for s in (8, 1 << 20):
                ax2.loglog(ns, [min(flat(kind, x, n, s, ta, tb) for x in ALGOS[kind])
                                for n in ns], label=f"{kind} {s} B")
        ax2.set_xlabel("ranks (flat, TCP)")
        ax2.set_ylabel("model µs, best algorithm")
        ax2.set_title("predicted time against ranks")
        ax2.legend(fontsize=7)
        fig.tight_layout()
        plot.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(plot, dpi=90)
    except ImportError:
        plot = None

    mach = machine()
    out = [BEGIN_MARK, "<!-- Written by benchmarks/compare/cost_model.py; edits here are "
           "overwritten. -->", "", "### A cost model: alpha-beta, fitted here, 1,024 and 8,192 "
           "ranks predicted", "",
           f"Machine: {mach['cpu']}, {mach['cpus']} CPUs ({mach['caches']}), Linux "
           f"{mach['kernel']}; measured {mach['date']}; corocoll {mach['corocoll_commit']}.", "",
           "Reproduce from the repository root:", "", "```sh",
           shlex.join([sys.executable, "benchmarks/compare/cost_model.py", "--ranks", a.ranks,
                       "--iters", str(a.iters)]), "```", "",
           "The model and its fit are described at the top of benchmarks/compare/cost_model.py. "
           "Links fitted on 2 ranks' ping_pong:", ""]
    for transport, (al, be) in links.items():
        out.append(f"- {transport}: alpha {al:.2f} µs, beta {be * 1e3:.4f} µs per KB "
                   f"({1 / be / 1e3:.2f} GB/s)")
    out += ["", "Error of the model against coll_perf over TCP, each algorithm forced, 8 B-16 "
            "MiB (the ranks share this machine's CPUs beyond its count):", "",
            "| ranks | cells | median error | largest error |", "|---:|---:|---:|---:|"]
    for n in counts:
        errs = [abs(pr - m) / m for _, _, k, _, m, pr in checks if k == n]
        out.append(f"| {n} | {len(errs)} | {statistics.median(errs) * 100:.0f}% | "
                   f"{max(errs) * 100:.0f}% |")
    out += ["", f"What select picks over TCP, set beside the model's best: the same in {agree} "
            f"of {agree + len(differ)} cells (all_reduce, broadcast, all_gather, reduce_scatter; "
            "2-8,192 ranks; "
            "8 B-256 MiB). Where they differ, by rank count (the sizes, and the model's time "
            "of select's pick over the best's, largest):", "",
            "| collective | ranks | sizes where select differs | select picks | model's best "
            "| cost, largest |", "|---|---:|---|---|---|---:|"]
    grouped = {}
    for kind, n, s, algo, want, cost in differ:
        grouped.setdefault((kind, n, algo, want), []).append((s, cost))
    for (kind, n, algo, want), cells in sorted(grouped.items()):
        lo, hi = min(c[0] for c in cells), max(c[0] for c in cells)
        out.append(f"| {kind} | {n} | {lo:,}-{hi:,} B ({len(cells)}) | {algo} | {want} | "
                   f"{max(c[1] for c in cells):.2f}x |")
    out += ["", "Predicted, hierarchical (hosts of 8 ranks sharing memory, the leaders over "
            "links like this loopback's), with select's pick between the leaders and with the "
            "model's best, and flat over TCP (the best algorithm):", "",
            "| ranks | hosts | collective | size | hierarchical, select's pick | hierarchical, "
            "model's best | flat, best |", "|---:|---:|---|---:|---:|---:|---:|"]
    for n, hosts, per, kind, s, sel, mod, fl in preds:
        out.append(f"| {n:,} | {hosts:,} | {kind} | {s:,} B | {sel / 1e3:,.2f} ms | "
                   f"{mod / 1e3:,.2f} ms | {fl / 1e3:,.2f} ms |")
    if plot:
        out += ["", "![measured against predicted; predicted time against ranks]"
                "(perf/cost_model.png)"]
    out += ["", END_MARK]
    write_markdown(a.out_dir / "performance.md", "\n".join(out), BEGIN_MARK, END_MARK)
    print(f"cost_model: wrote {a.out_dir / 'performance.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
