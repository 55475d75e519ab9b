"""ddp_epoch: one epoch of torch DDP training, timed, on the backend given: the 784-128-10 MLP
of examples/ddp.cpp on Fashion-MNIST (Debian's dataset-fashion-mnist), 64 samples per rank and
step, SGD with momentum, DDP's default bucketed all_reduce.

    corocollrun --nproc_per_node=N python3 ddp_epoch.py --backend gloo|corocoll

Rank 0 prints one JSON line: backend, ranks, steps, epoch seconds (the slowest rank's, from the
barrier after set-up to the end of the last step), seconds in DDP's backward (all_reduce
included) and the last loss. The data is read before the clock starts.
"""

import argparse
import gzip
import json
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

DATA = "/usr/share/datasets/fashion-mnist"


def load():
    with gzip.open(os.path.join(DATA, "train-images-idx3-ubyte.gz"), "rb") as f:
        raw = f.read()[16:]
    with gzip.open(os.path.join(DATA, "train-labels-idx1-ubyte.gz"), "rb") as f:
        lab = f.read()[8:]
    x = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(-1, 784).float() / 255
    return x, torch.frombuffer(bytearray(lab), dtype=torch.uint8).long()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backend", choices=("gloo", "corocoll"), default="gloo")
    p.add_argument("--batch", type=int, default=64)
    a = p.parse_args()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if a.backend == "corocoll":
        import corocoll_torch  # noqa: F401
    dist.init_process_group(a.backend)
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x, y = load()
    model = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    steps = len(x) // (a.batch * n)
    backward = 0.0
    dist.barrier()
    start = time.perf_counter()
    for step in range(steps):
        first = (step * n + rank) * a.batch
        opt.zero_grad()
        loss = loss_fn(ddp(x[first:first + a.batch]), y[first:first + a.batch])
        t0 = time.perf_counter()
        loss.backward()
        backward += time.perf_counter() - t0
        opt.step()
    took = torch.tensor([time.perf_counter() - start, backward], dtype=torch.float64)
    dist.all_reduce(took, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(json.dumps({"backend": a.backend, "ranks": n, "steps": steps,
                          "epoch_s": round(took[0].item(), 3),
                          "backward_s": round(took[1].item(), 3),
                          "last_loss": round(loss.item(), 4)}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
