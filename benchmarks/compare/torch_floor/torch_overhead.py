#!/usr/bin/python3
"""torch_overhead: what the corocoll backend adds to a torch.distributed call, beside what torch
itself costs. The same calls, on one rank, on two backends: "null" (null_backend.cpp: every
operation returns a Work that is already complete, so its time is torch's own: the Python
wrapper, the checks, the dispatcher, the Work handed to Python) and "corocoll" (the whole
backend: arguments checked, the Work made, the operation started on the group's reactor and
driven to its end; one rank, so no transport). One process per backend and round, the backends
alternating, each figure the fastest of its rounds (the others are the machine's noise).

    /usr/bin/python3 benchmarks/compare/torch_floor/torch_overhead.py --build BUILD
        [--rounds 5] [--iters 200000] [--python DIR] [--json FILE]

BUILD is a build with the torch backend (-Dbuildtype=release for figures): BUILD/python holds
corocoll_torch, BUILD/benchmarks/compare/torch_floor the null backend; --python DIR takes
corocoll_torch from DIR instead (another build's, to compare two). Prints a markdown table,
the machine above it.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

CALLS = ("dist.all_reduce", "dist.broadcast", "dist.all_gather", "dist.barrier",
         "pg.allreduce().wait()")


def child(backend, iters):
    """Runs in the child: one rank of `backend`, each call timed over `iters` iterations."""
    import torch
    import torch.distributed as dist
    import corocoll_torch  # noqa: F401  (registers "corocoll")
    import _null
    dist.Backend.register_backend("null", _null.create_process_group)
    store = dist.TCPStore("127.0.0.1", 0, 1, True)
    dist.init_process_group(backend, store=store, rank=0, world_size=1)
    pg = dist.distributed_c10d._get_default_group()
    t = torch.zeros(1)
    parts = [torch.zeros(1)]
    one = [t]
    opts = dist.AllreduceOptions()
    bodies = {
        "dist.all_reduce": lambda: dist.all_reduce(t),
        "dist.broadcast": lambda: dist.broadcast(t, 0),
        "dist.all_gather": lambda: dist.all_gather(parts, t),
        "dist.barrier": lambda: dist.barrier(),
        "pg.allreduce().wait()": lambda: pg.allreduce(one, opts).wait(),
    }
    out = {}
    for name in CALLS:
        f = bodies[name]
        n = iters // 10 if name == "dist.barrier" else iters
        for _ in range(min(n, 2000)):
            f()
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        out[name] = (time.perf_counter() - t0) / n * 1e6
    dist.destroy_process_group()
    print(json.dumps(out))


def machine():
    model = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    caches = []
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for idx in sorted(base.glob("index*")):
        try:
            level = (idx / "level").read_text().strip()
            kind = (idx / "type").read_text().strip()
            size = (idx / "size").read_text().strip()
        except OSError:
            continue
        if kind != "Instruction":
            caches.append(f"L{level}{'d' if kind == 'Data' else ''} {size}")
    import torch
    return (f"{model}, {os.cpu_count()} CPUs, caches per cpu0: {', '.join(caches)}; "
            f"Linux {platform.release()}; torch {torch.__version__}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", type=Path, required=True)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iters", type=int, default=200000)
    p.add_argument("--python", type=Path, help="where corocoll_torch is (default BUILD/python)")
    p.add_argument("--json", type=Path)
    p.add_argument("--child", choices=("null", "corocoll"))
    a = p.parse_args()
    if a.child:
        child(a.child, a.iters)
        return
    build = a.build.resolve()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str((a.python or build / "python").resolve()), str(build / "benchmarks/compare/torch_floor")] +
        ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    best = {"null": {}, "corocoll": {}}
    for _ in range(a.rounds):
        for backend in ("null", "corocoll"):
            r = subprocess.run([sys.executable, __file__, "--build", str(build), "--child",
                                backend, "--iters", str(a.iters)],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, timeout=600)
            if r.returncode != 0:
                raise SystemExit(f"{backend}: exit {r.returncode}\n{r.stderr[-2000:]}")
            got = json.loads(r.stdout.strip().splitlines()[-1])
            for name in CALLS:
                best[backend][name] = min(best[backend].get(name, float("inf")), got[name])
    print(f"Machine: {machine()}.")
    print(f"One rank; fastest of {a.rounds} rounds of {a.iters} calls (barrier: {a.iters // 10}).")
    print()
    print("| call | torch alone (null backend) µs | torch + corocoll µs | corocoll adds µs |")
    print("|---|---:|---:|---:|")
    rows = []
    for name in CALLS:
        floor, ours = best["null"][name], best["corocoll"][name]
        rows.append({"call": name, "null_us": floor, "corocoll_us": ours,
                     "added_us": ours - floor})
        print(f"| `{name}` | {floor:.2f} | {ours:.2f} | {ours - floor:.2f} |")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
