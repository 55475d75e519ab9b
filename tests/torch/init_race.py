#!/usr/bin/python3
"""The torch tutorial's 4-rank point-to-point program, as the tutorial writes it, run many
times: no rank may fail because another one finished first.

  init_race.py [--runs N] [--start spawn|fork] [--backend corocoll|gloo] [--late]

Each run starts four torch.multiprocessing.Process (the tutorial's init_process: env://,
MASTER_ADDR and MASTER_PORT, no barrier at the end); rank 0 sends one tensor to rank 3,
blocking and then with isend/irecv, and every rank prints what it holds. Ranks 1 and 2 have
nothing to do but initialise: rank 0, which serves torch's TCPStore, used to finish and exit
while they still polled torch's store-based barrier inside init_process_group, and they failed
with "Broken pipe" (8 runs in 20). The port is one the kernel picked, held by this process
(SO_REUSEADDR, not listening) until the run ends; each run is a process of its own, started as
the tutorial is (python3 program.py). Exit 0 when every run's four ranks exited 0 and printed
their lines; 1 with the first failed run's output; 77 (skip) where torch or
corocoll_torch cannot be imported.

--late makes the race certain: rank 2, which no other rank talks to, waits a second after
init_process_group and then uses the default group's store that rank 0 serves; rank 0 must
not have gone. (With connections on first use rank 0 is not connected to rank 2, and its
group's close waited only for the peers it was connected to: rank 0 ended after 0.08 s while
rank 2 slept, and rank 2's store.add failed.)
"""

import argparse
import os
import socket
import subprocess
import sys
import time

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    import corocoll_torch  # noqa: F401 (registers the backend "corocoll")
except ImportError as e:
    print(f"skip: {e}")
    sys.exit(77)

SIZE = 4
LATE = os.environ.get("INIT_RACE_LATE") == "1"


def say(line):
    os.write(1, (line + "\n").encode())


def run(rank, size):
    """The tutorial's blocking and then non-blocking point-to-point programs."""
    tensor = torch.zeros(1)
    if rank == 0:
        tensor += 1
        dist.send(tensor=tensor, dst=size - 1)
    elif rank == size - 1:
        dist.recv(tensor=tensor, src=0)
    say(f"Rank {rank} has data {int(tensor[0])}")
    req = None
    if rank == 0:
        tensor += 1
        req = dist.isend(tensor=tensor, dst=size - 1)
    elif rank == size - 1:
        req = dist.irecv(tensor=tensor, src=0)
    if req is not None:
        req.wait()
    say(f"Rank {rank} has data {int(tensor[0])} after isend/irecv")
    if LATE and rank == 2:
        time.sleep(1.0)
        dist.distributed_c10d._get_default_store().add("init_race/late", 1)
        say("Rank 2 reached the store late")


def init_process(rank, size, fn, backend, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group(backend, rank=rank, world_size=size)
    fn(rank, size)


def tutorial_main(start, backend, port):
    """The tutorial's __main__, but for the port and the backend."""
    mp.set_start_method(start)
    processes = []
    for rank in range(SIZE):
        p = mp.Process(target=init_process, args=(rank, SIZE, run, backend, port))
        p.start()
        processes.append(p)
    for p in processes:
        p.join()
    return 0 if all(p.exitcode == 0 for p in processes) else 1


def expected(rank):
    first = 1 if rank in (0, SIZE - 1) else 0
    second = 2 if rank in (0, SIZE - 1) else 0
    lines = [f"Rank {rank} has data {first}", f"Rank {rank} has data {second} after isend/irecv"]
    if LATE and rank == 2:
        lines.append("Rank 2 reached the store late")
    return lines


def one_run(start, backend, timeout):
    """One run of the tutorial in a process of its own; its exit code, missing lines, output."""
    held = socket.socket()
    held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    held.bind(("127.0.0.1", 0))
    port = held.getsockname()[1]
    cmd = [sys.executable, os.path.abspath(__file__), "--tutorial", start, backend, str(port)]
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=timeout)
        code, text = p.returncode, p.stdout
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout
        code, text = "timeout", out or ""
    finally:
        held.close()
    lines = text.splitlines()
    missing = [line for r in range(SIZE) for line in expected(r) if line not in lines]
    return code, missing, text


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "--tutorial":
        return tutorial_main(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--start", choices=("spawn", "fork"), default="spawn")
    ap.add_argument("--backend", default="corocoll")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds a run may take")
    ap.add_argument("--late", action="store_true",
                    help="rank 2 uses rank 0's store a second after the others are done")
    args = ap.parse_args()
    global LATE
    LATE = args.late
    os.environ["INIT_RACE_LATE"] = "1" if args.late else "0"  # for the runs' processes
    failed = 0
    first_failure = None
    for i in range(args.runs):
        code, missing, text = one_run(args.start, args.backend, args.timeout)
        if code != 0 or missing:
            failed += 1
            if first_failure is None:
                first_failure = (i, code, missing, text)
    print(f"{args.runs - failed} of {args.runs} runs ok ({args.backend}, {args.start})")
    if first_failure is not None:
        i, code, missing, text = first_failure
        print(f"FAIL: run {i}: exit code {code}; missing lines: {missing}\n{text}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
