"""startup_torch: one rank of the start-up benchmark for torch.distributed with Gloo: imports
torch, sets up the default group from the launcher's environment (env://), runs one all_reduce
of one float, checks it and prints "startup_done RANK NS" (the wall clock, ns since the epoch).
"""
import os
import time

os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

import torch  # noqa: E402  (after the interface is chosen)
import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo", init_method="env://")
one = torch.ones(1)
dist.all_reduce(one)
done = time.time_ns()
if one.item() != dist.get_world_size():
    raise SystemExit("startup_torch: all_reduce gave a wrong sum")
# One write(2) per line: the ranks share the launcher's stdout, and print() may split a line.
os.write(1, f"startup_done {dist.get_rank()} {done}\n".encode())
dist.destroy_process_group()
