"""corocoll as a torch.distributed backend.

    import corocoll_torch
    dist.init_process_group("corocoll", ...)      # instead of "gloo"

Importing the module registers the backend "corocoll" with
torch.distributed.Backend.register_backend. Its groups take CPU tensors of every dtype:
reductions on int8, uint8, int32, int64, float16, bfloat16, float32 and float64, data movement
(send/recv, broadcast, gather, scatter, all_gather, all_to_all) on any dtype. They are built on
the store torch hands the backend (env://, tcp://, file:// or an explicit store); the
operations run on the group's own progress thread, and every Work completes from it.

torch 1.13's dist.monitored_barrier accepts only "gloo" by name; `monitored_barrier` here
calls the same operation on a corocoll group.
"""

from datetime import timedelta

import torch.distributed as dist

from ._C import create_process_group

__all__ = ["BACKEND", "create_process_group", "monitored_barrier"]

BACKEND = "corocoll"


def _create(store, rank, world_size, timeout):
    return create_process_group(store, rank, world_size, timeout)


if BACKEND.upper() not in dist.Backend._plugins:
    dist.Backend.register_backend(BACKEND, _create)


def monitored_barrier(group=None, timeout=None, wait_all_ranks=True):
    """dist.monitored_barrier for a corocoll group: every rank reports to rank 0, which names
    every rank that did not arrive within `timeout` (all of them: corocoll always does what
    wait_all_ranks=True asks)."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if timeout is None:
        timeout = timedelta(minutes=30)
    pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)
