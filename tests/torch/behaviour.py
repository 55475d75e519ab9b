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
  - unsupported calls raise an exception naming the call (several tensors per rank,
    allgather_coalesced, dtypes that cannot be reduced, CUDA-less checks).

Assertions are on results and messages, never on times. Exit 77 (skip) without torch or
corocoll_torch.
"""

import os
import sys
import threading
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
        expect_error(lambda: req.wait(timeout=timedelta(milliseconds=1)), "recv from rank 1",
                     "wait(")
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
        dist.send(torch.tensor([1.0, 2.0, 3.0]), dst=0)
    # Unsupported calls name themselves.
    pg = dist.distributed_c10d._get_default_group()
    expect_error(lambda: pg.allreduce([torch.zeros(2), torch.zeros(2)]).wait(), "allreduce",
                 "several tensors")
    expect_error(lambda: dist.all_gather_coalesced([[torch.zeros(1)] * n], [torch.zeros(1)]),
                 "allgather_coalesced")
    expect_error(lambda: dist.all_reduce(torch.zeros(2, dtype=torch.int16)), "allreduce",
                 "cannot be reduced")
    expect_error(lambda: dist.send(torch.zeros(1), dst=rank), "send", "itself")
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


CASES = {"works": (works, 2), "timeout": (timeout, 2), "death": (death, 2),
         "monitored": (monitored, 3)}


def main():
    names = sys.argv[1:] or list(CASES)
    for name in names:
        fn, n = CASES[name]
        server = dist.TCPStore("127.0.0.1", 0, n, True, timeout=timedelta(seconds=60),
                               wait_for_workers=False)
        print(f"--- {name} ({n} ranks)", flush=True)
        mp.spawn(fn, args=(n, server.port), nprocs=n, join=True)
        del server
    print(f"ok: {', '.join(names)}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
