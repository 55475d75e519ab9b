#!/usr/bin/env python3
"""The store under many clients: corocoll's tcp_store_server beside torch's TCPStore server.

For each server and each client count, a fresh server is started (corocoll's through
`store_load serve`, torch's through torch.distributed.TCPStore with is_master=True), loaded by
`store_load load` (the same generator, the same bytes: torch 1.13's protocol), and measured:
the generator's line (connect time, requests per second, p50/p99/max of a round trip, errors)
and the growth of the server process's resident memory between before and after the load
(VmRSS; VmHWM for the peak). A third row per client count loads corocoll's server with a
MULTI_GET of --multi-get keys added to each loop (torch 1.13's server has no MULTI_GET). Each
row runs --rounds times, the servers taking turns; the table shows the round with the median
requests per second, and the range over the rounds. Prints a Markdown table, and the CPU it ran
on.

Usage: store_load.py --store-load PATH [--clients 100,1000,10000] [--procs 4] [--seconds 5]
                     [--servers corocoll,torch] [--multi-get 8] [--rounds 3]
"""

import argparse
import subprocess
import sys

sys.dont_write_bytecode = True  # no __pycache__ beside the sources for the import below
from run_compare import machine  # noqa: E402 (beside this file)

TORCH_SERVER = r"""
import datetime, resource, sys
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
import torch.distributed as dist
s = dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=300),
                  wait_for_workers=False)
print("PORT", s.port, flush=True)
sys.stdin.read()
"""


def memory_kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def start_server(kind, store_load):
    if kind == "corocoll":
        cmd = [store_load, "serve"]
    else:
        cmd = [sys.executable, "-c", TORCH_SERVER]
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if not line.startswith("PORT "):
        p.kill()
        p.wait()
        raise RuntimeError(f"{kind} server said {line!r}")
    return p, int(line.split()[1])


def run_one(kind, clients, args, multi_get=0):
    server, port = start_server(kind, args.store_load)
    try:
        before = memory_kib(server.pid, "VmRSS")
        cmd = [args.store_load, "load", "--port", str(port), "--clients", str(clients),
               "--procs", str(args.procs), "--seconds", str(args.seconds),
               "--multi-get", str(multi_get)]
        try:
            out = subprocess.run(cmd, capture_output=True, text=True,
                                 timeout=args.seconds + 300)
            fields = out.stdout.split()
            row = dict(zip(fields[::2], fields[1::2]))
            if out.returncode != 0:
                row["note"] = (out.stderr.strip().splitlines() or ["failed"])[-1][:120]
        except subprocess.TimeoutExpired:
            row = {"note": "the generator did not finish"}
        row["rss_growth_mib"] = (memory_kib(server.pid, "VmRSS") - before) / 1024
        row["peak_rss_mib"] = memory_kib(server.pid, "VmHWM") / 1024
        return row
    finally:
        server.stdin.close()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store-load", required=True)
    ap.add_argument("--clients", default="100,1000,10000")
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--servers", default="corocoll,torch")
    ap.add_argument("--multi-get", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    m = machine()
    print(f"Machine: {m['cpu']}, {m['cpus']} CPUs, caches {m['caches']} (cpu0), "
          f"Linux {m['kernel']}, corocoll {m['corocoll_commit']}")
    print(f"generator: {args.procs} processes, {args.seconds} s of closed-loop load per row, "
          f"median of {args.rounds} rounds\n")
    print("| server | clients | connect s | requests/s (range) | p50 µs | p99 µs | max µs | errors "
          "| server RSS growth MiB | server peak RSS MiB | note |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")

    def rate(r):
        return float(r.get("requests_per_s", 0))

    for clients in [int(c) for c in args.clients.split(",")]:
        runs = [(kind, 0) for kind in args.servers.split(",")]
        if "corocoll" in args.servers.split(",") and args.multi_get > 0:
            runs.append(("corocoll", args.multi_get))
        rows = {run: [] for run in runs}
        for _ in range(args.rounds):
            for kind, multi_get in runs:
                rows[(kind, multi_get)].append(run_one(kind, clients, args, multi_get))
        for (kind, multi_get), got in rows.items():
            got.sort(key=rate)
            r = got[len(got) // 2]
            spread = f"{rate(got[0]):.0f}-{rate(got[-1]):.0f}"
            errors = sum(int(g.get("errors", 0)) for g in got)
            notes = "; ".join(sorted({g["note"] for g in got if "note" in g}))
            name = kind if multi_get == 0 else f"{kind} + MULTI_GET of {multi_get}"
            print(f"| {name} | {clients} | {r.get('connect_s', '-')} | "
                  f"{r.get('requests_per_s', '-')} ({spread}) | {r.get('p50_us', '-')} | "
                  f"{r.get('p99_us', '-')} | {r.get('max_us', '-')} | {errors} | "
                  f"{r['rss_growth_mib']:.1f} | {r['peak_rss_mib']:.1f} | {notes} |", flush=True)


if __name__ == "__main__":
    main()
