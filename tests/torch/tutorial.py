#!/usr/bin/python3
"""The torch tutorial's programs ("Writing Distributed Applications with PyTorch") on the
backend "corocoll", written as the tutorial writes them for "gloo" with only the backend's name
changed, with 4 ranks: the examples/ of the C++ library come from the same programs, and print
the same lines.

  tutorial.py --launch torchrun|spawn [--init env|store|file|tcp] [PROGRAM...]

runs the programs (default: all of them, in one process group, in the order of PROGRAMS) on
4 ranks under Debian's torchrun (tests/process_group/torchrun_fixed.py) or
torch.multiprocessing.spawn, and checks that every expected line was printed and every rank
exited 0. Each rank also checks its own data and fails at the first difference. Under spawn,
--init picks how the ranks meet: an explicit TCPStore that the parent serves on a port of the
kernel's choosing (store), file:// in a temporary directory (file), tcp:// on a reserved port
(tcp). Exit 77 (skip) where torch or corocoll_torch cannot be imported.
"""

import argparse
from datetime import timedelta
import os
import socket
import subprocess
import sys
import tempfile

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    import corocoll_torch  # noqa: F401 (registers the backend "corocoll")
except ImportError as e:
    print(f"skip: {e}")
    sys.exit(77)

BACKEND = "corocoll"
WORLD = 4
HERE = os.path.dirname(os.path.abspath(__file__))


def say(line):
    # One write per line: the ranks share the pipe, and a line under PIPE_BUF is not torn.
    os.write(1, (line + "\n").encode())


def expect(rank, got, want, what):
    say(f"Rank {rank} {what}: {[int(v) for v in got.tolist()]}")
    if not torch.equal(got, want):
        raise AssertionError(f"rank {rank}: {what}: expected {want.tolist()}, got {got.tolist()}")


def start_of(r):
    return torch.tensor([1.0 + 2 * r, 2.0 + 2 * r])


# ---- the tutorial's programs (its tensors; the C++ examples' lines) ----


def p2p_blocking(rank, size):
    tensor = torch.zeros(1)
    last = size - 1
    if rank == 0:
        tensor += 1
        dist.send(tensor=tensor, dst=last)
    elif rank == last:
        dist.recv(tensor=tensor, src=0)
    say(f"Rank {rank} has data {int(tensor[0])}")
    assert tensor[0] == (1 if rank in (0, last) else 0)


def p2p_nonblocking(rank, size):
    tensor = torch.zeros(1)
    last = size - 1
    req = None
    if rank == 0:
        tensor += 1
        req = dist.isend(tensor=tensor, dst=last)
        say("Rank 0 started sending")
    elif rank == last:
        req = dist.irecv(tensor=tensor, src=0)
        say(f"Rank {last} started receiving")
    if req is not None:
        req.wait()
        assert req.is_completed()
    say(f"Rank {rank} has data {int(tensor[0])}")
    assert tensor[0] == (1 if rank in (0, last) else 0)


def recv_any(rank, size):
    """dist.recv without a source returns the sender (Work.sourceRank)."""
    tensor = torch.zeros(1)
    if rank == size - 1:
        senders = set()
        for _ in range(size - 1):
            sender = dist.recv(tensor=tensor)
            assert tensor[0] == 10 + sender, (sender, tensor)
            senders.add(sender)
        say(f"Rank {rank} heard from {sorted(senders)}")
        assert senders == set(range(size - 1))
    else:
        dist.send(torch.tensor([10.0 + rank]), dst=size - 1)


def broadcast(rank, size):
    t = start_of(rank)
    dist.broadcast(t, src=0)
    expect(rank, t, torch.tensor([1.0, 2.0]), "has after broadcast from 0")


def scatter(rank, size):
    t = torch.zeros(2)
    chunks = [torch.tensor([float(r), float(r)]) for r in range(size)] if rank == 0 else None
    dist.scatter(t, scatter_list=chunks, src=0)
    expect(rank, t, torch.tensor([float(rank), float(rank)]), "got from scatter")


def gather(rank, size):
    t = start_of(rank)
    everything = [torch.zeros(2) for _ in range(size)] if rank == 0 else None
    dist.gather(t, gather_list=everything, dst=0)
    if rank == 0:
        for r in range(size):
            expect(0, everything[r], start_of(r), f"gathered from rank {r}")


def reduce(rank, size):
    t = start_of(rank)
    dist.reduce(t, dst=3, op=dist.ReduceOp.SUM)
    want = torch.tensor([16.0, 20.0]) if rank == 3 else start_of(rank)
    expect(rank, t, want, "has after reduce to 3")


def all_gather(rank, size):
    t = start_of(rank)
    everything = [torch.zeros(2) for _ in range(size)]
    dist.all_gather(everything, t)
    for r in range(size):
        expect(rank, everything[r], start_of(r), f"holds rank {r}'s")


def all_reduce(rank, size):
    t = start_of(rank)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    expect(rank, t, torch.tensor([16.0, 20.0]), "has after all_reduce")


def gather_object(rank, size):
    everything = [None] * size if rank == 0 else None
    dist.gather_object(f"hello from rank {rank}", everything, dst=0)
    if rank == 0:
        for r in range(size):
            say(f"Rank 0 received: {everything[r]}")
            assert everything[r] == f"hello from rank {r}"


def group_all_reduce(rank, size):
    group = dist.new_group([0, 1])
    t = start_of(rank)
    if rank in (0, 1):
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
        expect(rank, t, torch.tensor([4.0, 6.0]), "has after all_reduce on group {0, 1}")
    else:
        expect(rank, t, start_of(rank), "is not in group {0, 1} and keeps")


PROGRAMS = {
    "p2p_blocking": p2p_blocking,
    "p2p_nonblocking": p2p_nonblocking,
    "recv_any": recv_any,
    "broadcast": broadcast,
    "scatter": scatter,
    "gather": gather,
    "reduce": reduce,
    "all_gather": all_gather,
    "all_reduce": all_reduce,
    "gather_object": gather_object,
    "group_all_reduce": group_all_reduce,
}


def expected_lines(names, size=WORLD):
    """What the ranks print between them (the C++ examples' lines)."""
    last = size - 1
    out = []
    for name in names:
        if name in ("p2p_blocking", "p2p_nonblocking"):
            out += [f"Rank {r} has data {1 if r in (0, last) else 0}" for r in range(size)]
            if name == "p2p_nonblocking":
                out += ["Rank 0 started sending", f"Rank {last} started receiving"]
        elif name == "recv_any":
            out.append(f"Rank {last} heard from {list(range(last))}")
        elif name == "broadcast":
            out += [f"Rank {r} has after broadcast from 0: [1, 2]" for r in range(size)]
        elif name == "scatter":
            out += [f"Rank {r} got from scatter: [{r}, {r}]" for r in range(size)]
        elif name == "gather":
            out += [f"Rank 0 gathered from rank {r}: [{1 + 2 * r}, {2 + 2 * r}]"
                    for r in range(size)]
        elif name == "reduce":
            out += [f"Rank {r} has after reduce to 3: "
                    + ("[16, 20]" if r == 3 else f"[{1 + 2 * r}, {2 + 2 * r}]")
                    for r in range(size)]
        elif name == "all_gather":
            out += [f"Rank {r} holds rank {q}'s: [{1 + 2 * q}, {2 + 2 * q}]"
                    for r in range(size) for q in range(size)]
        elif name == "all_reduce":
            out += [f"Rank {r} has after all_reduce: [16, 20]" for r in range(size)]
        elif name == "gather_object":
            out += [f"Rank 0 received: hello from rank {r}" for r in range(size)]
        elif name == "group_all_reduce":
            out += [f"Rank {r} has after all_reduce on group {{0, 1}}: [{4}, {6}]"
                    for r in (0, 1)]
            out += [f"Rank {r} is not in group {{0, 1}} and keeps: [{1 + 2 * r}, {2 + 2 * r}]"
                    for r in range(2, size)]
    return out


def run_programs(names):
    rank, size = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == BACKEND, dist.get_backend()
    for name in names:
        PROGRAMS[name](rank, size)
        dist.barrier()
    dist.destroy_process_group()


def spawned(rank, size, init, where, names):
    """One rank under mp.spawn; `where` is the store's port, the file or the tcp:// URL."""
    if init == "store":
        store = dist.TCPStore("127.0.0.1", where, size, False, timeout=timedelta(seconds=60))
        dist.init_process_group(BACKEND, store=store, rank=rank, world_size=size)
    else:
        dist.init_process_group(BACKEND, init_method=where, rank=rank, world_size=size)
    run_programs(names)


def launch(args):
    names = args.programs or list(PROGRAMS)
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["GLOO_SOCKET_IFNAME"] = "lo"
    if args.launch == "torchrun":
        cmd = [sys.executable, os.path.join(HERE, "..", "process_group", "torchrun_fixed.py"),
               "--standalone", "--nnodes=1", f"--nproc_per_node={WORLD}",
               os.path.abspath(__file__), "--worker", *names]
    else:
        cmd = [sys.executable, os.path.abspath(__file__), "--spawn", args.init, *names]
    print("---", " ".join(cmd), flush=True)
    try:
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired as e:
        print(e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or ""))
        print(f"FAIL: {args.launch} timed out after {args.timeout} s")
        return 1
    print(p.stdout)
    missing = [line for line in expected_lines(names) if line not in p.stdout.splitlines()]
    if p.returncode != 0 or missing:
        print(f"FAIL: {args.launch}: exit code {p.returncode}; missing lines: {missing}")
        return 1
    print(f"ok: {len(names)} programs, {len(expected_lines(names))} lines, under {args.launch}"
          + (f" (init {args.init})" if args.launch == "spawn" else ""))
    return 0


def spawn_main(init, names):
    with tempfile.TemporaryDirectory() as tmp:
        server = held = None
        if init == "store":
            # The parent serves the store on a port the kernel picks; ranks get it as an argument.
            server = dist.TCPStore("127.0.0.1", 0, WORLD, True, timeout=timedelta(seconds=60),
                                   wait_for_workers=False)
            where = server.port
        elif init == "file":
            where = "file://" + os.path.join(tmp, "store")
        elif init == "tcp":
            # A reserved port (bound with SO_REUSEADDR, not listening) that rank 0's store binds.
            held = socket.socket()
            held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            held.bind(("127.0.0.1", 0))
            where = f"tcp://127.0.0.1:{held.getsockname()[1]}"
        else:
            raise SystemExit(f"unknown --init {init}")
        mp.spawn(spawned, args=(WORLD, init, where, names), nprocs=WORLD, join=True)
        if held is not None:
            held.close()
        del server


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        dist.init_process_group(BACKEND)
        run_programs(sys.argv[2:])
        return 0
    if len(sys.argv) > 2 and sys.argv[1] == "--spawn":
        spawn_main(sys.argv[2], sys.argv[3:])
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--launch", choices=("torchrun", "spawn"), required=True)
    p.add_argument("--init", choices=("env", "store", "file", "tcp"), default="store")
    p.add_argument("--timeout", type=int, default=120)
    p.add_argument("programs", nargs="*", default=[])
    args = p.parse_args()
    unknown = [n for n in args.programs if n not in PROGRAMS]
    if unknown:
        p.error(f"unknown programs {unknown}; known: {', '.join(PROGRAMS)}")
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
