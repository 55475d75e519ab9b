#!/usr/bin/python3
"""torch_users: what a torch user gains by switching from "gloo" to "corocoll": the same program
(torch_perf.py) with the two backends, side by side, in one run, and corocoll's own C++ path
(coll_perf) for the overhead the backend adds. Prints the markdown of docs/performance.md's
"torch users" section and writes the rows as JSON.

    /usr/bin/python3 benchmarks/compare/torch_users.py [--build build-release] [--ranks 2,4]
        [--ops all_reduce,broadcast,all_gather,all_to_all] [--json FILE]

Needs a release build with the torch backend (meson setup build-release -Dbuildtype=release;
meson compile -C build-release): its corocollrun launches every program (torch's env://,
corocoll's store), its python/ is the PYTHONPATH of corocoll_torch. Sizes 4 B to 64 MiB, x4.
The two backends run one after the other for each op and rank count, alternating, every row
checked (-c 1 after the timing: #wrong must be 0). Iterations per size range: 2000 up to
64 KiB, 50 up to 4 MiB, 5 above.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
RANGES = [(4, 64 << 10, 2000, 200), (256 << 10, 4 << 20, 50, 5), (16 << 20, 64 << 20, 5, 2)]


def run(cmd, env):
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=900)
    if p.returncode != 0:
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-2000:]}")
    text = p.stdout[p.stdout.index("["):]
    return json.loads(text)


def torch_rows(a, backend, ranks, op, env):
    rows = []
    for lo, hi, n, w in RANGES:
        cmd = [str(a.build / "tools/corocollrun"), f"--nproc_per_node={ranks}",
               "--no_prefix", "/usr/bin/python3", str(HERE / "torch_perf.py"), "--backend",
               backend, "--coll", op, "-b", str(lo), "-e", str(hi), "-f", "4", "-n", str(n),
               "-w", str(w), "-c", "1"]
        rows += run(cmd, env)
    return rows


def coll_perf_rows(a, ranks, op, lo, hi, n, w, env):
    cmd = [str(a.build / "tools/corocollrun"), f"--nproc_per_node={ranks}",
           "--no_prefix", str(a.build / "benchmarks/coll_perf"), "--coll", op, "-d", "float",
           "-o", "sum", "-b", str(lo), "-e", str(hi), "-f", "4", "-n", str(n), "-w", str(w),
           "-c", "1", "-F", "json"]
    return run(cmd, env)


def human(size):
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift:
            return f"{size >> shift} {unit}"
    return f"{size} B"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", type=Path, default=REPO / "build-release")
    p.add_argument("--ranks", default="2,4")
    p.add_argument("--ops", default="all_reduce,broadcast,all_gather,all_to_all")
    p.add_argument("--json", type=Path, default=Path("/tmp/torch_users.json"))
    a = p.parse_args()
    a.build = a.build.resolve()
    env = dict(os.environ, PYTHONPATH=str(a.build / "python"), OMP_NUM_THREADS="1",
               GLOO_SOCKET_IFNAME="lo")
    results = {}
    for ranks in [int(r) for r in a.ranks.split(",")]:
        for op in a.ops.split(","):
            for backend in ("gloo", "corocoll"):
                rows = torch_rows(a, backend, ranks, op, env)
                bad = [r for r in rows if r["wrong"] != 0]
                if bad:
                    raise SystemExit(f"{backend} {op} {ranks} ranks: wrong results: {bad}")
                results[(ranks, op, backend)] = {r["size"]: r for r in rows}
                print(f"measured {op} on {ranks} ranks through {backend}", file=sys.stderr)
    # corocoll's own C++ path at the smallest sizes, for the overhead of the backend.
    native = {}
    for ranks in [int(r) for r in a.ranks.split(",")]:
        rows = coll_perf_rows(a, ranks, "all_reduce", 4, 4, 20000, 2000, env)
        native[ranks] = rows[0]
    json.dump({"torch": [dict(r, backend=k[2]) for k, v in results.items() for r in v.values()],
               "coll_perf": list(native.values())},
              a.json.open("w"), indent=1)
    out = []
    for ranks in [int(r) for r in a.ranks.split(",")]:
        for op in a.ops.split(","):
            g, c = results[(ranks, op, "gloo")], results[(ranks, op, "corocoll")]
            out.append(f"\n**{op}, {ranks} ranks** (float32, sum where it reduces)\n")
            out.append("| size | gloo µs | corocoll µs | gloo ÷ corocoll | gloo busbw GB/s | "
                       "corocoll busbw GB/s |")
            out.append("|---:|---:|---:|---:|---:|---:|")
            for size in sorted(set(g) & set(c)):
                out.append(f"| {human(size)} | {g[size]['time_us']:.1f} | "
                           f"{c[size]['time_us']:.1f} | "
                           f"{g[size]['time_us'] / c[size]['time_us']:.1f}x | "
                           f"{g[size]['busbw_gbs']:.3f} | {c[size]['busbw_gbs']:.3f} |")
    out.append("\n**The same 4-byte all_reduce through corocoll's C++ API** (coll_perf, "
               "same build, same run):\n")
    out.append("| ranks | coll_perf µs | torch + corocoll µs | torch + gloo µs |")
    out.append("|---:|---:|---:|---:|")
    for ranks in [int(r) for r in a.ranks.split(",")]:
        t = results.get((ranks, "all_reduce", "corocoll"), {}).get(4, {}).get("time_us", 0)
        g = results.get((ranks, "all_reduce", "gloo"), {}).get(4, {}).get("time_us", 0)
        out.append(f"| {ranks} | {native[ranks]['time_us']:.2f} | {t:.2f} | {g:.2f} |")
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
