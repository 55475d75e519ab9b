"""torch_perf: coll_perf's measurements (benchmarks/coll_perf.cpp) made through torch.distributed
with the Gloo backend, or corocoll's (corocoll_torch), so that run_compare.py and
torch_users.py can set torch beside corocoll.

    corocollrun --nproc_per_node=N python3 torch_perf.py [--backend gloo|corocoll]
        [--coll COLL] [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP] [-c 0|1]

  --backend  gloo (default), or corocoll: `import corocoll_torch` (PYTHONPATH=<build>/python
          for a build tree) and dist.init_process_group("corocoll"), nothing else changed

  --coll  ping_pong (one-way time = round trip / 2, between ranks 0 and 1, dist.send/recv),
          all_reduce (sum, in place), broadcast (root 0, in place), reduce (sum to root 0, in
          place), all_gather (into views of one flat tensor: torch 1.13's Gloo backend has no
          all_gather_into_tensor), reduce_scatter (sum, out of place, from views of one flat
          tensor), gather (to root 0, into views of one flat tensor), scatter (from root 0, from
          views of one flat tensor) or all_to_all (dist.all_to_all_single, out of place)
  -b, -e, -f, -n, -w, -c  as coll_perf's; the type is float32

A size is coll_perf's (nccl-tests'): the buffer of ping_pong, all_reduce, broadcast and reduce;
the whole gathered buffer of all_gather and gather; the whole input of reduce_scatter, scatter
and all_to_all (each rank keeps size / n of reduce_scatter's and scatter's, and sends size / n of
all_to_all's to each rank).

An op the backend cannot do (torch 1.13's Gloo has no reduce_scatter) prints one line
"torch_perf: n/a: <why>" on stderr and exits with 77; run_compare.py shows it as n/a.

Joins with init_method env:// (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE from the launcher:
corocollrun, torchrun, or run_compare.py itself). Gloo's sockets stay on loopback
(GLOO_SOCKET_IFNAME=lo unless set). Sizes, element counts, timing (barrier, warm-up, barrier,
timed loop, mean per iteration, largest over the ranks), checked values and the JSON rows on rank
0's stdout are coll_perf's with -d float -o sum -F json.
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

sys.dont_write_bytecode = True  # no __pycache__ beside the sources for the import below
from run_compare import parse_size  # noqa: E402 (the runner's, beside this file: sizes read alike)

OPS = ("ping_pong", "all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "gather",
       "scatter", "all_to_all")
# The ops whose size is split over the ranks (count elements per rank), as coll_perf splits them.
SPLIT = ("all_gather", "reduce_scatter", "gather", "scatter", "all_to_all")
ROOTED = ("broadcast", "reduce", "gather", "scatter")
NOT_AVAILABLE_EXIT = 77  # what run_compare.py reads as n/a (with the "n/a:" line)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=("gloo", "corocoll"), default="gloo")
    p.add_argument("--coll", dest="op", choices=OPS, default="all_reduce")
    p.add_argument("-b", dest="min_bytes", type=parse_size, default=32)
    p.add_argument("-e", dest="max_bytes", type=parse_size, default=32 << 20)
    p.add_argument("-f", dest="factor", type=float, default=2)
    p.add_argument("-n", dest="iters", type=int, default=20)
    p.add_argument("-w", dest="warmup", type=int, default=5)
    p.add_argument("-c", dest="check", type=int, default=0)
    a = p.parse_args()
    if a.factor <= 1:
        p.error("-f must be above 1")
    if a.iters < 1 or a.warmup < 0:
        p.error("-n must be 1 or more and -w 0 or more")
    a.min_bytes = max(a.min_bytes, 1)
    if a.max_bytes < a.min_bytes:
        p.error("-e is below -b")
    return a


def values(rank, count):
    """What rank `rank` holds at elements 0..count-1: small integers, so sums are exact."""
    return ((torch.arange(count) + rank) % 4 + 1).to(torch.float32)


class Bench:
    """One op at one size, with its tensors (made once, as coll_perf's bench makes them)."""

    def __init__(self, op, count):
        self.op = op
        self.count = count
        self.rank = dist.get_rank()
        self.n = dist.get_world_size()
        whole = op in ("reduce_scatter", "scatter", "all_to_all")
        self.a = torch.zeros(count * (self.n if whole else 1), dtype=torch.float32)
        self.b = None
        if op in ("all_gather", "gather", "all_to_all"):
            self.b = torch.zeros(count * self.n, dtype=torch.float32)
        elif op in ("reduce_scatter", "scatter"):
            self.b = torch.zeros(count, dtype=torch.float32)
        if op in ("all_gather", "gather"):
            self.parts = list(self.b.chunk(self.n))
        elif op in ("reduce_scatter", "scatter"):
            self.parts = list(self.a.chunk(self.n))
        if op in ("gather", "scatter") and self.rank != 0:
            self.parts = None  # the root's alone
        self.run_once = getattr(self, op)

    def ping_pong(self):
        if self.rank == 0:
            dist.send(self.a, 1)
            dist.recv(self.a, 1)
        elif self.rank == 1:
            dist.recv(self.a, 0)
            dist.send(self.a, 0)

    def all_reduce(self):
        dist.all_reduce(self.a)

    def broadcast(self):
        dist.broadcast(self.a, 0)

    def reduce(self):
        dist.reduce(self.a, 0)

    def all_gather(self):
        dist.all_gather(self.parts, self.a)

    def gather(self):
        dist.gather(self.a, self.parts, dst=0)

    def scatter(self):
        dist.scatter(self.b, self.parts, src=0)

    def reduce_scatter(self):
        dist.reduce_scatter(self.b, self.parts)

    def all_to_all(self):
        dist.all_to_all_single(self.b, self.a)

    def time(self, iters, warmup):
        """Mean time per operation on this rank, in microseconds."""
        dist.barrier()  # as coll_perf does, before the warm-up too
        for _ in range(warmup):
            self.run_once()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            self.run_once()
        per = (time.perf_counter() - t0) / iters * 1e6
        return per / 2 if self.op == "ping_pong" else per

    def check(self):
        """Fills the inputs, runs once, and counts this rank's elements that are wrong."""
        n, c = self.n, self.count
        if self.op == "all_to_all":
            # The part for rank d holds values(rank + 2d): sender and receiver both show.
            self.a.copy_(torch.cat([values(self.rank + 2 * d, c) for d in range(n)]))
        elif self.op in ("broadcast", "ping_pong") and self.rank != 0:
            self.a.zero_()
        else:
            self.a.copy_(values(self.rank, self.a.numel()))
        if self.b is not None:
            self.b.zero_()
        self.run_once()
        if self.op == "ping_pong" and self.rank > 1:
            return 0  # not part of it
        if self.op in ("reduce", "gather") and self.rank != 0:
            return 0  # the root's result alone
        if self.op in ("all_reduce", "reduce"):
            want = sum(values(r, c) for r in range(n))
            got = self.a
        elif self.op == "reduce_scatter":
            want = sum(values(r, c * n) for r in range(n))[self.rank * c:(self.rank + 1) * c]
            got = self.b
        elif self.op in ("all_gather", "gather"):
            want = torch.cat([values(r, c) for r in range(n)])
            got = self.b
        elif self.op == "scatter":
            want = values(0, c * n)[self.rank * c:(self.rank + 1) * c]
            got = self.b
        elif self.op == "all_to_all":
            want = torch.cat([values(s + 2 * self.rank, c) for s in range(n)])
            got = self.b
        else:
            want = values(0, self.count)
            got = self.a
        return int((got != want).sum())


def bus_factor(op, n):
    """nccl-tests' (benchmarks/common/bandwidth.hpp)."""
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in SPLIT:
        return (n - 1) / n
    return 1


def json_row(op, n, size, count, time_us, wrong):
    """One row as coll_perf -F json prints it."""
    algbw = size / time_us / 1e3 if time_us > 0 else 0
    return ('{"op": "%s", "ranks": %d, "size": %d, "count": %d, "type": "float", "redop": "%s", '
            '"root": %d, "placement": "%s", "time_us": %.3f, "algbw_gbs": %.4f, '
            '"busbw_gbs": %.4f, "wrong": %d}'
            % (op, n, size, count,
               "sum" if op in ("all_reduce", "reduce", "reduce_scatter") else "none",
               0 if op in ROOTED else -1,
               "in-place" if op in ("all_reduce", "broadcast", "reduce") else "out-of-place",
               time_us, algbw, algbw * bus_factor(op, n), wrong))


def all_reduce_one(number, dtype, op):
    """One number reduced over every rank, through torch's own all_reduce."""
    t = torch.tensor([number], dtype=dtype)
    dist.all_reduce(t, op=op)
    return t.item()


def not_available(op):
    """Why the backend cannot do `op`, or None: it runs once on one element per rank. torch's
    Gloo refuses what it lacks before it sends anything, so every rank learns it alike (the
    corocoll backend has every op)."""
    try:
        Bench(op, 1).run_once()
    except RuntimeError as e:
        if "does not support" in str(e):
            return str(e).splitlines()[0]
        raise
    return None


def main():
    a = parse_args()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if a.backend == "corocoll":
        import corocoll_torch  # noqa: F401 (registers the backend)
    dist.init_process_group(a.backend, init_method="env://")
    rank, n = dist.get_rank(), dist.get_world_size()
    if a.op == "ping_pong" and n < 2:
        sys.exit("torch_perf: ping_pong needs 2 ranks or more")
    why = not_available(a.op) if a.op in ("reduce_scatter", "all_to_all") else None
    if why:
        print(f"torch_perf: n/a: {why} (torch {torch.__version__})", file=sys.stderr)
        dist.destroy_process_group()
        sys.exit(NOT_AVAILABLE_EXIT)
    rows = 0
    wrong_total = 0
    if rank == 0:
        print("[", end="", flush=True)
    bytes_ = a.min_bytes
    while bytes_ <= a.max_bytes:
        nxt = int(bytes_ * a.factor)
        parts = n if a.op in SPLIT else 1
        count = bytes_ // 4 // parts
        if count > 0:
            bench = Bench(a.op, count)
            time_us = all_reduce_one(bench.time(a.iters, a.warmup), torch.float64,
                                     dist.ReduceOp.MAX)
            wrong = -1
            if a.check:
                wrong = int(all_reduce_one(bench.check(), torch.int64, dist.ReduceOp.SUM))
                wrong_total += wrong
            moved = count * 4 * parts  # the bytes actually moved, as coll_perf reports them
            if rank == 0:
                row = json_row(a.op, n, moved, count, time_us, wrong)
                print(("," if rows else "") + "\n  " + row, end="", flush=True)
            rows += 1
        if nxt <= bytes_:
            break
        bytes_ = nxt
    if rank == 0:
        print("\n]" if rows else "]", flush=True)
    dist.destroy_process_group()
    sys.exit(1 if wrong_total > 0 else 0)


if __name__ == "__main__":
    main()
