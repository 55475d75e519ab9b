#!/usr/bin/python3
"""torch's DistributedDataParallel on the "corocoll" backend, surviving a rank's death.

A 784-128-10 MLP (examples/ddp.cpp's) learns Fashion-MNIST (Debian's dataset-fashion-mnist;
a generated stand-in of the same shape when the files are absent, and the run says so) for
one or more epochs; every rank trains on its own BATCH samples of each global batch. With
--kill-rank R --kill-at-step S, rank R kills itself (SIGKILL) before step S. The survivors'
step fails with an error naming it; they shrink the group (corocoll_torch.shrink), wrap the
model in a new DDP on the shrunk group (which gives every survivor the new rank 0's
parameters), take its optimizer state and place in the epoch, and split what is left of the
epoch, the failed step's samples included, over the survivors: the global batch shrinks with
the group. The last rank 0 prints the test accuracy.

    corocollrun --nproc_per_node=4 --on_failure=continue \\
        python3 examples/ddp_torch.py --kill-rank 2 --kill-at-step 300

Needs a launcher that lets the survivors live and serves the store itself
(corocollrun --on_failure=continue: torch's env:// then uses the launcher's store, which
outlives any rank); PYTHONPATH must reach corocoll_torch (the build's python/ directory).

    --epochs E        passes over the training set (default 1)
    --batch B         samples per rank and step (default 16)
    --lr LR           learning rate (default 0.03); --momentum M (default 0.9)
    --samples N       train on the first N images only (default: all)
    --seed S          seed of the initial parameters and of the shuffle (default 1)
    --kill-rank R --kill-at-step S   as above (steps count from 0 over all epochs)
    --out FILE        rank 0 writes its result there as JSON (accuracy, ranks, steps, lost)
"""

import argparse
import gzip
import json
import os
import signal
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import corocoll_torch

DATA = "/usr/share/datasets/fashion-mnist"


def images(prefix, count):
    """`count` images (float, 0..1) and labels of the set `prefix` ('train' or 't10k'), or a
    generated stand-in; and what they are."""
    xs = os.path.join(DATA, f"{prefix}-images-idx3-ubyte.gz")
    ys = os.path.join(DATA, f"{prefix}-labels-idx1-ubyte.gz")
    if os.path.exists(xs) and os.path.exists(ys):
        with gzip.open(xs, "rb") as f:
            raw = f.read()[16:]
        with gzip.open(ys, "rb") as f:
            lab = f.read()[8:]
        count = min(count, len(lab))
        x = torch.frombuffer(bytearray(raw[:count * 784]), dtype=torch.uint8)
        y = torch.frombuffer(bytearray(lab[:count]), dtype=torch.uint8).long()
        return x.view(count, 784).float() / 255, y, "Fashion-MNIST"
    g = torch.Generator().manual_seed(7 if prefix == "train" else 8)
    y = torch.randint(0, 10, (count,), generator=g)
    x = torch.rand(count, 784, generator=g) * 0.5
    x[torch.arange(count), y * 78] += 1.0  # something to learn
    return x, y, "generated data (dataset-fashion-mnist is not installed)"


def wrap(model, group):
    """The model under DDP on `group`: DDP's set-up broadcasts rank 0's parameters."""
    return DDP(model, process_group=group)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=0.03)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--samples", type=int, default=60000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--kill-rank", type=int, default=-1)
    p.add_argument("--kill-at-step", type=int, default=-1)
    p.add_argument("--out")
    args = p.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("corocoll", timeout=timedelta(seconds=60))
    group = dist.distributed_c10d._get_default_group()
    first_rank = dist.get_rank()
    torch.manual_seed(args.seed)  # the same initial parameters everywhere
    model = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    ddp = wrap(model, group)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    x, y, source = images("train", args.samples)
    loss_fn = torch.nn.CrossEntropyLoss()
    if first_rank == 0:
        print(f"{source}: {len(y)} training images; {group.size()} ranks, {args.batch} "
              f"per rank and step", flush=True)

    steps = 0
    lost = []
    for epoch in range(args.epochs):
        order = torch.randperm(len(y), generator=torch.Generator().manual_seed(1000 * args.seed + epoch))
        done = 0  # samples of this epoch that every rank has trained on
        while done + group.size() * args.batch <= len(y):
            if first_rank == args.kill_rank and steps == args.kill_at_step:
                os.kill(os.getpid(), signal.SIGKILL)
            rank, world = group.rank(), group.size()
            mine = order[done + rank * args.batch:done + (rank + 1) * args.batch]
            try:
                opt.zero_grad()
                loss = loss_fn(ddp(x[mine]), y[mine])
                loss.backward()  # DDP's all_reduce of the gradient: a dead rank fails it
            except RuntimeError:
                failed = corocoll_torch.failure(group)
                if failed is None or failed["cause"] != "rank_failed":
                    raise
                # A rank died during this step. Shrink; the new DDP gives every survivor the
                # new rank 0's parameters, and the momentum and the place in the epoch come
                # from there too (the same everywhere, unless a rank had stepped).
                lost += failed["failed_ranks"]
                shrunk = corocoll_torch.shrink(group)
                corocoll_torch.abort(group)
                group = shrunk
                ddp = wrap(model, group)
                for p_ in model.parameters():
                    buf = opt.state[p_].get("momentum_buffer")
                    if buf is not None:
                        dist.broadcast(buf, src=_global(group, 0), group=group)
                where = torch.tensor([done, steps])
                dist.broadcast(where, src=_global(group, 0), group=group)
                done, steps = int(where[0]), int(where[1])
                if group.rank() == 0:
                    print(f"rank {first_rank} (now rank 0 of {group.size()}): rank(s) "
                          f"{failed['failed_ranks']} died at step {steps}; {len(y) - done} "
                          f"samples of epoch {epoch} left", flush=True)
                continue
            opt.step()
            done += world * args.batch
            steps += 1
        if group.rank() == 0:
            print(f"epoch {epoch}: {steps} steps, last loss {loss.item():.4f}", flush=True)

    # DDP keeps the parameters equal on every rank, bit for bit.
    flat = torch.cat([p_.detach().flatten() for p_ in model.parameters()])
    theirs = flat.clone()
    dist.broadcast(theirs, src=_global(group, 0), group=group)
    if not torch.equal(flat, theirs):
        raise SystemExit(f"rank {first_rank}: parameters differ from rank 0's")
    if group.rank() == 0:
        tx, ty, _ = images("t10k", 10000)
        with torch.no_grad():
            accuracy = (model(tx).argmax(1) == ty).float().mean().item()
        print(f"test accuracy {100 * accuracy:.2f}% after {steps} steps on {group.size()} "
              f"ranks (of {dist.get_world_size()})", flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"accuracy": accuracy, "ranks": group.size(), "steps": steps,
                           "lost": sorted(set(lost)), "data": source, "seed": args.seed}, f)
    dist.barrier(group=group)
    return 0


def _global(group, rank):
    """The job's rank of `group`'s rank `rank`: what torch 1.13's src= takes."""
    ranks = dist.distributed_c10d._pg_group_ranks if hasattr(
        dist.distributed_c10d, "_pg_group_ranks") else dist.distributed_c10d._world.pg_group_ranks
    for g, r in ranks.get(group, {}).items():
        if r == rank:
            return g
    return rank


if __name__ == "__main__":
    sys.exit(main())
