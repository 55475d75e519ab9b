#!/usr/bin/python3
"""Differential test: the same collectives on "gloo" and "corocoll" give equal results, for every
op and every dtype corocoll reduces, on world sizes given on the command line (default 2 3 4 5).

  differential.py [WORLD_SIZE...]

Each world runs under torch.multiprocessing.spawn. The ranks meet on an explicit TCPStore that
the parent serves on a port of the kernel's choosing; the default group is Gloo's and
dist.new_group(backend="corocoll") makes a corocoll group of the same ranks, so every call is
made once on each backend with the same inputs. Inputs are small integers (sums, products and
averages are exact in every dtype, whatever order the backends add in), a deterministic
function of (rank, op, dtype, size), so every rank can also compute every other rank's input.
Where torch 1.13's Gloo lacks an op or a dtype (reduce_scatter, all_gather_into_tensor,
all_to_all with lists, AVG, bfloat16 for some ops), the corocoll result is compared with the
result computed from those inputs instead, and the run says how many such comparisons it made.
Every rank asserts; the parent fails if any rank did. Exit 77 (skip) without torch or
corocoll_torch.
"""

import os
import sys
import zlib
from datetime import timedelta

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    import corocoll_torch  # noqa: F401
except ImportError as e:
    print(f"skip: {e}")
    sys.exit(77)

DTYPES = [torch.int8, torch.uint8, torch.int32, torch.int64, torch.float16, torch.bfloat16,
          torch.float32, torch.float64]
# Dtypes corocoll only moves (no reductions): checked on the data-movement ops.
MOVED_ONLY = [torch.bool, torch.int16, torch.complex64]
INTEGER = {torch.int8, torch.uint8, torch.int32, torch.int64}
# 1 element, an odd small count, and one that goes through the chunked/ring algorithms.
COUNTS = [1, 7, 70001]
OPS = {
    "SUM": dist.ReduceOp.SUM, "PRODUCT": dist.ReduceOp.PRODUCT, "MIN": dist.ReduceOp.MIN,
    "MAX": dist.ReduceOp.MAX, "BAND": dist.ReduceOp.BAND, "BOR": dist.ReduceOp.BOR,
    "BXOR": dist.ReduceOp.BXOR,
}


def data(rank, salt, count, dtype, low=0, high=4):
    """Rank `rank`'s input for the call named `salt`: small integers as `dtype`."""
    # crc32, not hash(): Python salts string hashes per process.
    g = torch.Generator().manual_seed(zlib.crc32(f"{rank} {salt} {count} {dtype}".encode()))
    t = torch.randint(low, high, (count,), generator=g)
    if dtype == torch.bool:
        return t % 2 == 1
    if dtype == torch.complex64:
        return torch.complex(t.float(), (t + 1).float())
    return t.to(dtype)


def combine(name, tensors):
    """The reduction of `tensors` with op `name`, as the backends must compute it."""
    out = tensors[0].clone()
    for t in tensors[1:]:
        if name == "SUM" or name == "AVG":
            out = out + t
        elif name == "PRODUCT":
            out = out * t
        elif name == "MIN":
            out = torch.minimum(out, t)
        elif name == "MAX":
            out = torch.maximum(out, t)
        elif name == "BAND":
            out = out & t
        elif name == "BOR":
            out = out | t
        elif name == "BXOR":
            out = out ^ t
    if name == "AVG":
        out = out / len(tensors)
    return out.to(tensors[0].dtype)


class Checker:
    def __init__(self, rank, n, gloo, coro):
        self.rank, self.n, self.gloo, self.coro = rank, n, gloo, coro
        self.against_gloo = self.against_reference = 0

    def same(self, what, got, want):
        if isinstance(got, (list, tuple)):
            assert len(got) == len(want), what
            for i, (a, b) in enumerate(zip(got, want)):
                self.same(f"{what}[{i}]", a, b)
            return
        if not torch.equal(got, want):
            bad = (got != want).nonzero()[:5].flatten().tolist()
            raise AssertionError(f"rank {self.rank} of {self.n}: {what}: corocoll differs at "
                                 f"elements {bad}: {got.flatten()[:8].tolist()} against "
                                 f"{want.flatten()[:8].tolist()}")

    def compare(self, what, run, reference, gloo=True):
        """run(group) -> result (on fresh inputs); Gloo's result, else `reference()`."""
        got = run(self.coro)
        if not gloo:
            self.same(what, got, reference())
            self.against_reference += 1
            return
        try:
            want = run(self.gloo)
            self.against_gloo += 1
        except RuntimeError as e:
            text = str(e)
            if "does not support" not in text and "Unsupported" not in text \
                    and "not supported" not in text and "Cannot use" not in text \
                    and "no support" not in text and "Invalid scalar type" not in text:
                raise
            want = reference()
            self.against_reference += 1
        self.same(what, got, want)


def each_rank(salt, count, dtype, n, **kw):
    return [data(r, salt, count, dtype, **kw) for r in range(n)]


def check_reductions(c, dtype, count):
    rank, n = c.rank, c.n
    names = list(OPS) + ["AVG"]
    for name in names:
        if name in ("BAND", "BOR", "BXOR") and dtype not in INTEGER:
            continue
        if name == "AVG" and dtype in INTEGER:
            continue
        op = dist.ReduceOp.AVG if name == "AVG" else OPS[name]
        high = 3 if name == "PRODUCT" else 4
        low = 1 if name == "PRODUCT" else 0
        salt = f"all_reduce {name}"
        if name == "AVG":
            # Sums that n divides: each rank's value times n over n ranks... made exact by
            # giving every rank the same multiple of n.
            mine = (data(0, salt, count, dtype) * n).to(dtype)
            ref = lambda: mine.clone()  # noqa: E731
        else:
            mine = data(rank, salt, count, dtype, low, high)
            ref = lambda: combine(name, each_rank(salt, count, dtype, n, low=low, high=high))  # noqa: E731,B023

        def all_reduce(g, mine=mine, op=op):
            t = mine.clone()
            dist.all_reduce(t, op=op, group=g)
            return t
        c.compare(f"all_reduce {name} {dtype} x{count}", all_reduce, ref)

        if name in ("SUM", "MAX"):
            root = 1 % n

            def reduce(g, mine=mine, op=op, root=root):
                t = mine.clone()
                dist.reduce(t, dst=root, op=op, group=g)
                # Only the root's result is defined (Gloo leaves partial sums elsewhere;
                # corocoll leaves the other ranks' tensors as they were).
                return [t] if rank == root else []
            c.compare(f"reduce {name} {dtype} x{count}", reduce,
                      lambda: [ref()] if rank == root else [])

    # reduce_scatter (list) and reduce_scatter_tensor: Gloo 1.13 has neither.
    salt = "reduce_scatter"
    full = [data(r, salt, count * n, dtype) for r in range(n)]
    want = combine("SUM", full)[rank * count:(rank + 1) * count]

    def reduce_scatter(g):
        out = torch.zeros(count, dtype=dtype)
        dist.reduce_scatter(out, list(full[rank].chunk(n)), group=g)
        return out
    c.compare(f"reduce_scatter {dtype} x{count}", reduce_scatter, lambda: want)

    def reduce_scatter_tensor(g):
        out = torch.zeros(count, dtype=dtype)
        dist.reduce_scatter_tensor(out, full[rank].clone(), group=g)
        return out
    c.compare(f"reduce_scatter_tensor {dtype} x{count}", reduce_scatter_tensor, lambda: want)


def check_movement(c, dtype, count):
    rank, n = c.rank, c.n
    root = n - 1
    salt = "broadcast"
    mine = data(rank, salt, count, dtype)

    def broadcast(g):
        t = mine.clone()
        dist.broadcast(t, src=root, group=g)
        return t
    c.compare(f"broadcast {dtype} x{count}", broadcast, lambda: data(root, salt, count, dtype))

    salt = "all_gather"
    mine = data(rank, salt, count, dtype)
    everyone = each_rank(salt, count, dtype, n)

    def all_gather(g):
        out = [torch.zeros(count, dtype=dtype) for _ in range(n)]
        dist.all_gather(out, mine, group=g)
        return out
    c.compare(f"all_gather {dtype} x{count}", all_gather, lambda: everyone)

    def all_gather_into_tensor(g):
        out = torch.zeros(count * n, dtype=dtype)
        dist.all_gather_into_tensor(out, mine, group=g)
        return out
    c.compare(f"all_gather_into_tensor {dtype} x{count}", all_gather_into_tensor,
              lambda: torch.cat(everyone))

    def gather(g):
        out = [torch.zeros(count, dtype=dtype) for _ in range(n)] if rank == 0 else None
        dist.gather(mine, out, dst=0, group=g)
        return out if rank == 0 else []
    c.compare(f"gather {dtype} x{count}", gather, lambda: everyone if rank == 0 else [])

    salt = "scatter"
    parts = [data(root, f"{salt} {p}", count, dtype) for p in range(n)]

    def scatter(g):
        out = torch.zeros(count, dtype=dtype)
        dist.scatter(out, parts if rank == root else None, src=root, group=g)
        return out
    c.compare(f"scatter {dtype} x{count}", scatter, lambda: parts[rank])

    # all_to_all_single, even and uneven (rank r sends (r + p) % 3 + 1 rows to rank p).
    salt = "all_to_all"
    sent = [data(rank, f"{salt} {p}", count, dtype) for p in range(n)]
    recvd = [data(p, f"{salt} {rank}", count, dtype) for p in range(n)]

    def all_to_all_single(g):
        out = torch.zeros(count * n, dtype=dtype)
        dist.all_to_all_single(out, torch.cat(sent), group=g)
        return out
    c.compare(f"all_to_all_single {dtype} x{count}", all_to_all_single, lambda: torch.cat(recvd))

    rows = lambda a, b: (a + b) % 3 + 1  # noqa: E731
    width = 3
    sent_u = [data(rank, f"{salt}u {p}", rows(rank, p) * width, dtype).view(-1, width)
              for p in range(n)]
    recvd_u = [data(p, f"{salt}u {rank}", rows(p, rank) * width, dtype).view(-1, width)
               for p in range(n)]

    def all_to_all_uneven(g):
        out = torch.zeros(sum(rows(p, rank) for p in range(n)), width, dtype=dtype)
        dist.all_to_all_single(out, torch.cat(sent_u),
                               output_split_sizes=[rows(p, rank) for p in range(n)],
                               input_split_sizes=[rows(rank, p) for p in range(n)], group=g)
        return out
    c.compare(f"all_to_all_single uneven {dtype}", all_to_all_uneven, lambda: torch.cat(recvd_u))

    def all_to_all(g):
        out = [torch.zeros(count, dtype=dtype) for _ in range(n)]
        dist.all_to_all(out, sent, group=g)
        return out
    c.compare(f"all_to_all {dtype} x{count}", all_to_all, lambda: recvd)

    # A ring of send/recv (and isend/irecv), each rank to the next.
    salt = "p2p"
    nxt, prev = (rank + 1) % n, (rank - 1) % n

    def ring(g):
        out = torch.zeros(count, dtype=dtype)
        to, fr = nxt, prev  # both groups hold every rank, in order
        if rank % 2 == 0:
            dist.send(data(rank, salt, count, dtype), to, group=g)
            dist.recv(out, fr, group=g)
        else:
            req = dist.irecv(out, fr, group=g)
            dist.isend(data(rank, salt, count, dtype), to, group=g).wait()
            req.wait()
        return out
    c.compare(f"send/recv ring {dtype} x{count}", ring, lambda: data(prev, salt, count, dtype))


def check_odd_shapes(c):
    """Non-contiguous tensors: handled (a contiguous stand-in, copied back). Against the
    computed result only: torch 1.13's Gloo leaves a strided slice unchanged on the ranks that
    receive a broadcast (it receives into a contiguous copy that it does not copy back)."""
    rank, n = c.rank, c.n
    base = data(rank, "transposed", 12, torch.float32).view(3, 4)

    def all_reduce_t(g):
        t = base.clone().t()  # 4x3, not contiguous
        assert not t.is_contiguous()
        dist.all_reduce(t, group=g)
        return t
    c.compare("all_reduce of a transposed tensor", all_reduce_t,
              lambda: combine("SUM", [data(r, "transposed", 12, torch.float32).view(3, 4)
                                      for r in range(n)]).t(), gloo=False)

    def broadcast_strided(g):
        t = base.clone()[:, ::2]
        dist.broadcast(t, src=0, group=g)
        return t
    c.compare("broadcast of a strided slice", broadcast_strided,
              lambda: data(0, "transposed", 12, torch.float32).view(3, 4)[:, ::2], gloo=False)


def check_objects(c):
    rank, n = c.rank, c.n

    def all_gather_object(g):
        out = [None] * n
        dist.all_gather_object(out, {"rank": rank, "text": "x" * rank}, group=g)
        return [torch.tensor([o["rank"], len(o["text"])]) for o in out]
    c.compare("all_gather_object", all_gather_object,
              lambda: [torch.tensor([r, r]) for r in range(n)])

    def broadcast_object_list(g):
        objs = [rank, "from " + str(rank), [rank] * 3]
        dist.broadcast_object_list(objs, src=n - 1, group=g)
        return [torch.tensor([objs[0], len(objs[1]), sum(objs[2])])]
    c.compare("broadcast_object_list", broadcast_object_list,
              lambda: [torch.tensor([n - 1, len("from " + str(n - 1)), 3 * (n - 1)])])

    def gather_object(g):
        out = [None] * n if rank == 0 else None
        dist.gather_object(("hello", rank), out, dst=0, group=g)
        return [torch.tensor([o[1]]) for o in out] if rank == 0 else []
    c.compare("gather_object", gather_object,
              lambda: [torch.tensor([r]) for r in range(n)] if rank == 0 else [])

    def scatter_object_list(g):
        out = [None]
        dist.scatter_object_list(out, [p * 10 for p in range(n)] if rank == 0 else None,
                                 src=0, group=g)
        return [torch.tensor([out[0]])]
    c.compare("scatter_object_list", scatter_object_list, lambda: [torch.tensor([rank * 10])])


def check_errors(c):
    """Unsupported calls raise, naming the call."""
    rank = c.rank
    t = torch.zeros(2, dtype=torch.int16)
    try:
        dist.all_reduce(t, group=c.coro)
    except (RuntimeError, ValueError) as e:
        assert "allreduce" in str(e) and "Short" in str(e), str(e)
    else:
        raise AssertionError("all_reduce of int16 was not refused")
    try:
        dist.all_reduce(torch.zeros(2), op=dist.ReduceOp.BAND, group=c.coro)
    except (RuntimeError, ValueError) as e:
        assert "all_reduce" in str(e) or "allreduce" in str(e), str(e)
    else:
        raise AssertionError(f"rank {rank}: BAND on float was not refused")
    dist.barrier(group=c.coro)


def rank_main(rank, n, port):
    store = dist.TCPStore("127.0.0.1", port, n, False, timeout=timedelta(seconds=120))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=n,
                            timeout=timedelta(seconds=120))
    coro = dist.new_group(list(range(n)), backend="corocoll")
    assert dist.get_backend(coro) == "corocoll"
    c = Checker(rank, n, None, coro)
    for dtype in DTYPES:
        for count in COUNTS:
            check_reductions(c, dtype, count)
            check_movement(c, dtype, count)
    for dtype in MOVED_ONLY:
        check_movement(c, dtype, 5)
    check_odd_shapes(c)
    check_objects(c)
    check_errors(c)
    dist.barrier(group=coro)
    dist.barrier()
    if rank == 0:
        print(f"world {n}: {c.against_gloo} results equal to Gloo's, "
              f"{c.against_reference} (where Gloo lacks the op or dtype) equal to the "
              f"computed result", flush=True)
    dist.destroy_process_group()


def main():
    worlds = [int(a) for a in sys.argv[1:]] or [2, 3, 4, 5]
    for n in worlds:
        server = dist.TCPStore("127.0.0.1", 0, n, True, timeout=timedelta(seconds=120),
                               wait_for_workers=False)
        mp.spawn(rank_main, args=(n, server.port), nprocs=n, join=True)
        del server
    print(f"ok: gloo and corocoll agree on world sizes {worlds}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
