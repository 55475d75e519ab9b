#!/usr/bin/python3
"""How the backend's Work and errors behave, with 2 or 3 ranks under mp.spawn (an explicit
TCPStore the parent serves on a port of the kernel's choosing):

  - Work.is_completed() is False until the matching send, then wait() returns True;
  - wait(timeout) that ends first raises, naming the operation, and the Work still completes;
  - the GIL is released while a rank waits: the receiving rank's own Python thread must run
    (it writes the store key the sender waits for) before the message can come;
  - an operation past the group's timeout raises corocoll's error text, naming the peer;
  - a peer that dies fails the other rank's pending recv, naming the rank;
  - monitored_barrier (corocoll_torch.monitored_barrier) names the rank that did not come;
  - a barrier that only rank 0 calls, its peers idle in Python, fails at the group's timeout
    saying it timed out and naming the ranks that did not call it (torch's
    test_barrier_timeout_*): idle ranks answer status queries;
  - corocoll_torch.abort from another thread fails rank 0's pending irecv and rank 1's
    recv, both naming rank 0 and the reason; corocoll_torch.failure is None before and says
    'revoked' after, on both ranks;
  - all_gather_coalesced and a sparse (COO) all_reduce give Gloo's results;
  - unsupported calls raise an exception naming the call (several tensors per rank, dtypes
    that cannot be reduced, a sparse reduction other than SUM, CUDA-less checks);
  - torch 2.x only (`torch2`, 3 ranks): the coalesced tensor collectives, batch_isend_irecv
    through the coalescing hooks, shutdown by destroy_process_group.

Assertions are on results and messages, never on times. Exit 77 (skip) without torch or
corocoll_torch.
"""

import os
import sys
import threading
import time
from datetime import timedelta

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    import corocoll_torch
except ImportError as e:
    print(f"skip: {e}")
    sys.exit(77)


def init(rank, n, port, timeout_s):
    store = dist.TCPStore("127.0.0.1", port, n, False, timeout=timedelta(seconds=60))
    # The ranks meet first, as torch's own tests with a short timeout do
    # (test_barrier_timeout_global): the group's set-up waits for every rank for its timeout,
    # and torch 2.11's spawn on 16 cores started ranks more than a second apart.
    if store.add("arrived", 1) == n:
        store.set("everyone arrived", "1")
    store.wait(["everyone arrived"])
    dist.init_process_group("corocoll", store=store, rank=rank, world_size=n,
                            timeout=timedelta(seconds=timeout_s))
    return store


def expect_error(fn, *needles):
    try:
        fn()
    except (RuntimeError, ValueError) as e:
        text = str(e)
        missing = [s for s in needles if s not in text]
        assert not missing, f"error {text!r} lacks {missing}"
        return text
    raise AssertionError(f"no error; expected one naming {needles}")


def works(rank, n, port):
    store = init(rank, n, port, 60)
    t = torch.zeros(3)
    if rank == 0:
        req = dist.irecv(t, src=1)
        assert not req.is_completed()
        # Rank 1 sends only once "go" is set, so this wait(timeout) ends first: it raises,
        # naming the call, and the receive goes on.
        expect_error(lambda: req.wait(timeout=timedelta(milliseconds=1)),
                     "recv from rank 1 on rank 0 of 2: wait(1 ms) ended before the operation did")
        assert not req.is_completed()

        # "go" is set by a thread of ours that needs the GIL 200 times: this rank's wait must
        # let it run, or the message never comes (and the group's timeout fails the test).
        def ticks():
            for _ in range(200):
                store.add("ticks", 1)
            store.set("go", "1")
        threading.Thread(target=ticks).start()
        assert req.wait()
        assert req.is_completed()
        assert t.tolist() == [1.0, 2.0, 3.0], t
        print("rank 0: irecv completed after a wait(timeout) ran out, with the GIL released",
              flush=True)
    else:
        store.wait(["go"])
        req = dist.isend(torch.tensor([1.0, 2.0, 3.0]), dst=0)
        req.wait()
        # A Work names its operation, the peer and the rank in its own errors.
        expect_error(req.source_rank,
                     "send to rank 0 on rank 1 of 2: sourceRank() is only known after a recv")
    # Unsupported calls name themselves.
    pg = dist.distributed_c10d._get_default_group()
    expect_error(lambda: pg.allreduce([torch.zeros(2), torch.zeros(2)]).wait(), "allreduce",
                 "several tensors")
    # all_gather_coalesced (as torch's test builds it: tensors of several shapes, one dtype).
    ins = [torch.full([i] * i, float(rank + i)) for i in range(1, 4)]
    outs = [[torch.full([i] * i, -1.0) for i in range(1, 4)] for _ in range(n)]
    dist.all_gather_coalesced(outs, ins)
    for r in range(n):
        for i in range(1, 4):
            assert torch.equal(outs[r][i - 1], torch.full([i] * i, float(r + i))), (r, i, outs)
    expect_error(lambda: dist.all_gather_coalesced([[torch.zeros(1)]], [torch.zeros(1)]),
                 "allgather_coalesced", "1 output lists in a group of 2")
    # A sparse (COO) all_reduce sums every rank's entries, as Gloo's does: rank r holds ones
    # at rows 0..r of a (n x 2) tensor; the sum has n - i at row i.
    sparse = torch.sparse_coo_tensor(torch.arange(rank + 1).reshape(1, -1),
                                     torch.ones(rank + 1, 2), (n, 2))
    dist.all_reduce(sparse)
    want = torch.tensor([[float(n - i)] * 2 for i in range(n)])
    assert sparse.is_sparse and torch.equal(sparse.to_dense(), want), sparse
    empty = torch.sparse_coo_tensor(torch.zeros(1, 0, dtype=torch.long), torch.zeros(0), (3,))
    dist.all_reduce(empty)
    assert empty._nnz() == 0 and torch.equal(empty.to_dense(), torch.zeros(3)), empty
    expect_error(lambda: dist.all_reduce(sparse, op=dist.ReduceOp.MAX), "allreduce",
                 "op other than SUM")
    print(f"rank {rank}: all_gather_coalesced and a sparse all_reduce", flush=True)
    expect_error(lambda: dist.all_reduce(torch.zeros(2, dtype=torch.int16)), "allreduce",
                 "cannot be reduced")
    # To itself: torch 2.x refuses it in Python before the backend sees it; the group's own
    # send is asked directly.
    expect_error(lambda: pg.send([torch.zeros(1)], rank, 0).wait(), "send", "itself")
    dist.barrier()
    dist.destroy_process_group()


def timeout(rank, n, port):
    store = init(rank, n, port, 3)
    if rank == 0:
        # Rank 1 never sends: the group's timeout (3 s) ends the recv with corocoll's error.
        text = expect_error(lambda: dist.recv(torch.zeros(1), src=1), "rank 1")
        print(f"rank 0: recv past the timeout: {text.splitlines()[0]}", flush=True)
        store.set("done", "1")
    else:
        store.wait(["done"])
    # The failed group is closed without hanging.
    dist.destroy_process_group()


def death(rank, n, port):
    store = init(rank, n, port, 60)
    if rank == 1:
        store.wait(["waiting"])
        os._exit(0)  # gone without a word, while rank 0 waits for its message
    req = dist.irecv(torch.zeros(1), src=1)
    store.set("waiting", "1")
    text = expect_error(req.wait, "rank 1")
    print(f"rank {rank}: peer died: {text.splitlines()[0]}", flush=True)
    os._exit(0)  # the group is unusable now; leave without its goodbye


def monitored(rank, n, port):
    store = init(rank, n, port, 60)
    if rank == 2:
        store.wait(["checked"])  # skips the barrier until rank 0 has its verdict
    else:
        text = expect_error(
            lambda: corocoll_torch.monitored_barrier(timeout=timedelta(seconds=2)), "rank(s) 2",
            "did not arrive")
        print(f"rank {rank}: monitored_barrier: {text.splitlines()[0]}", flush=True)
        if rank == 0:
            store.set("checked", "1")
    os._exit(0)


def idle(rank, n, port):
    # torch's test_barrier_timeout_*: only rank 0 calls barrier, with a group timeout of 1 s,
    # while the others are alive and idle in Python. Their progress threads answer rank 0's
    # status query, so the barrier fails at its deadline saying it timed out and naming the
    # ranks that did not call it, and blames nobody for not answering.
    store = init(rank, n, port, 1)
    group = dist.new_group([0, 1, 2], timeout=timedelta(seconds=1))
    if rank == 0:
        for g, what in ((group, "new_group"), (None, "default group")):
            began = time.monotonic()
            text = expect_error(lambda: dist.barrier(g), " timeout ",
                                "ranks 1 and 2 answered but have not called it")
            took = time.monotonic() - began  # printed for people, not asserted
            assert "stopped responding" not in text and "did not answer" not in text, text
            print(f"rank 0: barrier of the {what} with idle peers failed after {took:.2f} s: "
                  f"{text.splitlines()[0]}", flush=True)
        store.set("checked", "1")
    else:
        store.wait(["checked"])
    os._exit(0)  # the groups failed on rank 0 only; leave without their goodbyes


def aborted(rank, n, port):
    store = init(rank, n, port, 60)
    assert corocoll_torch.failure() is None
    if rank == 0:
        req = dist.irecv(torch.zeros(1), src=1)  # rank 1 never sends
        store.wait(["waiting"])
        # Another thread aborts, as a trainer's supervisor would, while this one waits.
        threading.Timer(0.1, corocoll_torch.abort, kwargs={"reason": "the trainer gives up"}).start()
        text = expect_error(req.wait, "rank 0 revoked process group", "the trainer gives up")
    else:
        store.set("waiting", "1")
        text = expect_error(lambda: dist.recv(torch.zeros(1), src=0),
                            "rank 0 revoked process group", "the trainer gives up",
                            "reported by rank 0")
    f = corocoll_torch.failure()
    assert f is not None and f["cause"] == "revoked" and f["rank"] == 0, f
    assert f["failed_ranks"] == [] and "the trainer gives up" in f["what"], f
    if rank == 1:
        corocoll_torch.abort()  # a failed group closes at once, without waiting for rank 0
    print(f"rank {rank}: aborted: {text.splitlines()[0]}; failure(): {f['cause']}", flush=True)
    dist.destroy_process_group()  # after abort: nothing left to close, no hang


TORCH2 = int(torch.__version__.split(".")[0]) >= 2


def torch2(rank, n, port):
    """What torch 2.x asks of a backend beyond 1.13's ProcessGroup: the coalesced tensor
    collectives (_coalescing_manager's fast path), the coalescing hooks (batch_isend_irecv),
    and shutdown through destroy_process_group."""
    init(rank, n, port, 60)
    pg = dist.distributed_c10d._get_default_group()
    assert dist.get_backend() == "corocoll", dist.get_backend()
    backend = pg._get_backend(torch.device("cpu"))
    assert backend.supports_coalescing, "the backend says it coalesces"
    # all_gather_into_tensor, three at once: rank r's input i is (10 r + i, 10 r + i).
    ins = [torch.full((2,), float(10 * rank + i)) for i in range(3)]
    outs = [torch.full((2 * n,), -1.0) for _ in range(3)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for o, i in zip(outs, ins):
            dist.all_gather_into_tensor(o, i)
    cm.wait()
    for i, o in enumerate(outs):
        want = torch.tensor([float(10 * r + i) for r in range(n) for _ in range(2)])
        assert torch.equal(o, want), (i, o, want)
    # reduce_scatter_tensor, two at once: input i of every rank is arange(2n) + i; rank r
    # gets the sum of elements 2r, 2r + 1 over the ranks.
    ins = [torch.arange(2.0 * n) + i for i in range(2)]
    outs = [torch.full((2,), -1.0) for _ in range(2)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for o, i in zip(outs, ins):
            dist.reduce_scatter_tensor(o, i)
    cm.wait()
    for i, o in enumerate(outs):
        want = torch.tensor([float(n * (2 * rank + i)), float(n * (2 * rank + 1 + i))])
        assert torch.equal(o, want), (i, o, want)
    # all_reduce, two at once (allreduce_coalesced).
    a, b = torch.full((3,), float(rank)), torch.full((5,), 1.0)
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_reduce(a)
        dist.all_reduce(b)
    cm.wait()
    assert torch.equal(a, torch.full((3,), float(sum(range(n))))), a
    assert torch.equal(b, torch.full((5,), float(n))), b
    # A ring through batch_isend_irecv, which coalesces on a backend that says it does.
    got = torch.zeros(4)
    ops = [dist.P2POp(dist.isend, torch.full((4,), float(rank)), (rank + 1) % n),
           dist.P2POp(dist.irecv, got, (rank - 1) % n)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    assert torch.equal(got, torch.full((4,), float((rank - 1) % n))), got
    print(f"rank {rank}: coalesced all_gather, reduce_scatter, all_reduce and a batched ring",
          flush=True)
    dist.barrier()
    dist.destroy_process_group()  # torch 2.x: the backend's shutdown


CASES = {"works": (works, 2), "aborted": (aborted, 2), "timeout": (timeout, 2), "death": (death, 2),
         "monitored": (monitored, 3), "idle": (idle, 3)}
if TORCH2:
    CASES["torch2"] = (torch2, 3)


def main():
    names = sys.argv[1:] or list(CASES)
    failed = []
    # Every case runs, whichever failed before it: a run on a machine lent for minutes
    # learns about all of them at once.
    for name in names:
        fn, n = CASES[name]
        server = dist.TCPStore("127.0.0.1", 0, n, True, timeout=timedelta(seconds=60),
                               wait_for_workers=False)
        print(f"--- {name} ({n} ranks)", flush=True)
        try:
            mp.spawn(fn, args=(n, server.port), nprocs=n, join=True)
        except Exception as e:  # a rank's failure, as torch.multiprocessing reports it
            last = (str(e).strip().splitlines() or [type(e).__name__])[-1]
            print(f"FAILED: {name}: {last}", flush=True)
            failed.append(name)
        del server
    if failed:
        print(f"failed: {', '.join(failed)} (of {', '.join(names)})")
        return 1
    print(f"ok: {', '.join(names)}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
