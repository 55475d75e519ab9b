#!/usr/bin/python3
"""DDP on "corocoll" against DDP on "gloo": torch's DistributedDataParallel trains the
784-128-10 MLP of examples/ddp.cpp on Fashion-MNIST (Debian's dataset-fashion-mnist; a
generated data set of the same shape stands in where it is missing, and the run says so) for
STEPS steps, from the same seed on the same global batches, and the parameters must agree
within float tolerance.

  ddp.py --launch spawn|torchrun [--ranks N] [--steps S]

Runs, each with N ranks (default 2): Gloo with DDP's default all_reduce; corocoll with the
default; corocoll with the comm hook torch.distributed.algorithms.ddp_comm_hooks.default_hooks
.allreduce_hook and small buckets (bucket_cap_mb=0.1, so that the gradients go in several
buckets, through Work.get_future and Python callbacks). Every rank checks that its parameters
equal rank 0's (DDP keeps them in step); rank 0 writes them to a file, and the parent compares
each corocoll run's with Gloo's. Under --launch torchrun each run is a torchrun of 2 workers
(tests/process_group/torchrun_fixed.py --standalone); under spawn, mp.spawn on an explicit
TCPStore served on a port of the kernel's choosing. Exit 77 (skip) without torch or
corocoll_torch.
"""

import argparse
import gzip
import os
import subprocess
import sys
import tempfile
from datetime import timedelta

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    import corocoll_torch  # noqa: F401
except ImportError as e:
    print(f"skip: {e}")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = "/usr/share/datasets/fashion-mnist"
BATCH = 32  # per rank
RUNS = {
    "gloo": ("gloo", None),
    "corocoll": ("corocoll", None),
    "corocoll_hook": ("corocoll", "allreduce_hook"),
}


def load(samples):
    """The first `samples` training images (float, 0..1) and labels."""
    images = os.path.join(DATA, "train-images-idx3-ubyte.gz")
    labels = os.path.join(DATA, "train-labels-idx1-ubyte.gz")
    if os.path.exists(images) and os.path.exists(labels):
        with gzip.open(images, "rb") as f:
            raw = f.read(16 + samples * 784)[16:]
        with gzip.open(labels, "rb") as f:
            lab = f.read(8 + samples)[8:]
        x = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(samples, 784).float() / 255
        y = torch.frombuffer(bytearray(lab), dtype=torch.uint8).long()
        return x, y, "Fashion-MNIST"
    g = torch.Generator().manual_seed(7)
    y = torch.randint(0, 10, (samples,), generator=g)
    x = torch.rand(samples, 784, generator=g) * 0.5
    x[torch.arange(samples), y * 78] += 1.0  # something to learn
    return x, y, "generated data (dataset-fashion-mnist is not installed)"


def train(rank, n, steps, hook, out):
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    ddp = DDP(model, bucket_cap_mb=0.1 if hook else 25)
    if hook == "allreduce_hook":
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    x, y, source = load(steps * BATCH * n)
    loss_fn = torch.nn.CrossEntropyLoss()
    for step in range(steps):
        first = (step * n + rank) * BATCH
        opt.zero_grad()
        loss = loss_fn(ddp(x[first:first + BATCH]), y[first:first + BATCH])
        loss.backward()
        opt.step()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    # DDP keeps every rank's parameters equal: check against rank 0's.
    mine = flat.clone()
    dist.broadcast(flat, src=0)
    if not torch.equal(mine, flat):
        raise AssertionError(f"rank {rank}: parameters differ from rank 0's by "
                             f"{(mine - flat).abs().max().item()}")
    if rank == 0:
        torch.save({"params": flat, "loss": loss.item(), "data": source}, out)
        print(f"{dist.get_backend()} hook={hook}: {steps} steps on {source}, last loss "
              f"{loss.item():.4f}", flush=True)


def spawned(rank, n, port, backend, hook, steps, out):
    store = dist.TCPStore("127.0.0.1", port, n, False, timeout=timedelta(seconds=120))
    dist.init_process_group(backend, store=store, rank=rank, world_size=n,
                            timeout=timedelta(seconds=120))
    train(rank, n, steps, hook, out)
    dist.destroy_process_group()


def run_one(args, name, out):
    backend, hook = RUNS[name]
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    if args.launch == "torchrun":
        cmd = [sys.executable, os.path.join(HERE, "..", "process_group", "torchrun_fixed.py"),
               "--standalone", "--nnodes=1", f"--nproc_per_node={args.ranks}",
               os.path.abspath(__file__), "--worker", backend, str(hook), str(args.steps), out]
    else:
        cmd = [sys.executable, os.path.abspath(__file__), "--spawn", str(args.ranks), backend,
               str(hook), str(args.steps), out]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=args.timeout)
    print(p.stdout, flush=True)
    if p.returncode != 0:
        raise SystemExit(f"FAIL: {name} under {args.launch}: exit code {p.returncode}")
    return torch.load(out)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        backend, hook, steps, out = sys.argv[2:6]
        dist.init_process_group(backend, timeout=timedelta(seconds=120))
        train(dist.get_rank(), dist.get_world_size(), int(steps),
              None if hook == "None" else hook, out)
        dist.destroy_process_group()
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--spawn":
        n, backend, hook, steps, out = sys.argv[2:7]
        server = dist.TCPStore("127.0.0.1", 0, int(n), True, timeout=timedelta(seconds=120),
                               wait_for_workers=False)
        mp.spawn(spawned, args=(int(n), server.port, backend, None if hook == "None" else hook,
                                int(steps), out), nprocs=int(n), join=True)
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--launch", choices=("torchrun", "spawn"), required=True)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--timeout", type=int, default=200)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = {name: run_one(args, name, os.path.join(tmp, name + ".pt")) for name in RUNS}
    want = results["gloo"]["params"]
    for name in ("corocoll", "corocoll_hook"):
        got = results[name]["params"]
        diff = (got - want).abs().max().item()
        print(f"{name}: {got.numel()} parameters, largest difference from gloo's {diff:.3g}")
        # Same batches, same seed: only the order of additions in the all_reduce differs.
        if not torch.allclose(got, want, rtol=1e-4, atol=1e-5):
            print(f"FAIL: {name}'s parameters differ from gloo's (largest difference {diff})")
            return 1
    print(f"ok: DDP on corocoll matches DDP on gloo after {args.steps} steps, {args.ranks} ranks, "
          f"under {args.launch}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
