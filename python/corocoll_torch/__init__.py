"""corocoll as a torch.distributed backend.

    import corocoll_torch
    dist.init_process_group("corocoll", ...)      # instead of "gloo"

Importing the module registers the backend "corocoll" with
torch.distributed.Backend.register_backend. Its groups take CPU tensors of every dtype:
reductions on int8, uint8, int32, int64, float16, bfloat16, float32 and float64, data movement
(send/recv, broadcast, gather, scatter, all_gather, all_to_all) on any dtype. They are built on
the store torch hands the backend (env://, tcp://, file:// or an explicit store); the
operations run on the group's own progress thread, and every Work completes from it. A group's
close (destroy_process_group, or the process's exit) first waits, up to its timeout and at
most 60 s, until its live peers have closed theirs too.

torch 1.13's dist.monitored_barrier accepts only "gloo" by name; `monitored_barrier` here
calls the same operation on a corocoll group.

`abort(group)` revokes a group from any thread (every Work in flight, here and on every live
peer, fails naming this rank) and closes it without waiting; `failure(group)` says how a group
failed (None while it is sound): what a fault-tolerant trainer polls and calls. `shrink(group)`
makes the group of its live ranks (after a rank died), a torch process group that
torch.distributed's calls and DistributedDataParallel take as any other. `grow(group, n)`
admits processes that called `join_process_group()` (a replacement, or more ranks) and makes
the grown group torch's default group, on its old ranks and on the joiners alike.
"""

import atexit
from datetime import timedelta
import multiprocessing.util
import os
import time

import torch
import torch.distributed as dist

from ._C import close_all, create_process_group
from . import _C

__all__ = ["BACKEND", "abort", "close_all", "create_process_group", "failure", "grow",
           "join_process_group", "monitored_barrier", "shrink"]

BACKEND = "corocoll"


_exit_hook_pid = None


def _close_at_exit():
    """Makes this process close its corocoll groups as it exits, each waiting (up to its
    timeout, at most 60 s) for its live peers to close theirs: a rank whose program is done
    does not take torch's store (rank 0 serves it) away from a slower rank still polling it in
    init_process_group's store-based barrier. atexit covers processes that end normally
    (torchrun, mp.spawn); a torch.multiprocessing.Process ends in os._exit after running
    multiprocessing's finalizers, which the Finalize covers. Registered once per process,
    from the process that made a group (a forked child starts with neither)."""
    global _exit_hook_pid
    if _exit_hook_pid == os.getpid():
        return
    _exit_hook_pid = os.getpid()
    # atexit runs the last registered first; Finalize the highest priority first.
    atexit.register(close_all)
    atexit.register(_leave_together)
    multiprocessing.util.Finalize(None, close_all, exitpriority=100)
    multiprocessing.util.Finalize(None, _leave_together, exitpriority=101)


_LEAVING_KEY = "corocoll/leaving"


def _leave_together(at_most=60.0):
    """As this process exits, before its groups close: counts it out on the default group's
    store, and on rank 0, which serves that store under env:// and tcp://, waits (at most
    `at_most` seconds, and no longer once the group has failed) until every rank has counted
    itself out. A group's own close waits only for the peers it is connected to, and with
    connections on first use a rank that only initialised is not one of them: in the
    tutorial's 4-rank program rank 0 could still exit while rank 2 polled torch's store-based
    barrier ("Connection reset by peer" from store.add, 1 run in 25 forked). Runs once per
    process."""
    global _left
    if _left:
        return
    _left = True
    try:
        if not dist.is_initialized() or str(dist.get_backend()) != BACKEND:
            return
        pg = dist.distributed_c10d._get_default_group()
        backend = _backend_of(pg)
        if _C.failure(backend) is not None:
            return
        store = dist.distributed_c10d._get_default_store()
        size, rank = dist.get_world_size(), dist.get_rank()
        counted = store.add(_LEAVING_KEY, 1)
        if rank != 0:
            return
        deadline = time.monotonic() + at_most
        while counted < size and time.monotonic() < deadline:
            if _C.failure(backend) is not None:
                return
            time.sleep(0.002)
            counted = store.add(_LEAVING_KEY, 0)
    except Exception:  # leaving goes on whatever the store says
        return


_left = False


def _create(store, rank, world_size, timeout):
    group = create_process_group(store, rank, world_size, timeout)
    _close_at_exit()
    return group


# torch 2.x wraps what the factory makes (a c10d::Backend) in a ProcessGroup of its own, one
# backend per device type: this one takes CPU tensors. torch 1.13 takes the group itself.
_TORCH2 = int(torch.__version__.split(".")[0]) >= 2

if BACKEND.upper() not in dist.Backend._plugins:
    if _TORCH2:
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])
    else:
        dist.Backend.register_backend(BACKEND, _create)


def _as_process_group(made, store):
    """`made` as the process group torch's calls take: on torch 2.x a backend, wrapped in a
    ProcessGroup as init_process_group and new_group wrap one (CPU tensors go to it); on torch
    1.13 the group itself."""
    if not _TORCH2 or isinstance(made, dist.ProcessGroup):
        return made
    pg = dist.ProcessGroup(store, made.rank(), made.size())
    backend_type = dist.ProcessGroup.BackendType.CUSTOM
    pg._set_default_backend(backend_type)
    pg._register_backend(torch.device("cpu"), backend_type, made)
    return pg


def _register(pg, name, group_ranks, backend_and_store):
    """Enters `pg` in torch.distributed's tables, as new_group does: its name, its ranks as the
    job's ranks, its backend and store."""
    c10d = dist.distributed_c10d
    if hasattr(pg, "_set_group_name"):
        pg._set_group_name(name)
    _world_dict("pg_map")[pg] = backend_and_store
    _world_dict("pg_names")[pg] = name
    _world_dict("pg_group_ranks")[pg] = group_ranks
    world = getattr(c10d, "_world", None)
    if world is not None and hasattr(world, "pg_backend_config"):
        world.pg_backend_config[pg] = f"cpu:{BACKEND}"
    if hasattr(c10d, "_register_process_group"):
        c10d._register_process_group(name, pg)


def monitored_barrier(group=None, timeout=None, wait_all_ranks=True):
    """dist.monitored_barrier for a corocoll group: every rank reports to rank 0, which names
    every rank that did not arrive within `timeout` (all of them: corocoll always does what
    wait_all_ranks=True asks)."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if timeout is None:
        timeout = timedelta(minutes=30)
    pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)


def _backend_of(group):
    """The corocoll process group behind `group` (the default group when None)."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    # torch 2.x wraps a backend in a ProcessGroup of its own.
    get_backend = getattr(pg, "_get_backend", None)
    if get_backend is not None:
        import torch
        try:
            return get_backend(torch.device("cpu"))
        except RuntimeError:
            pass
    return pg


def abort(group=None, reason=""):
    """Revokes `group` (the default group when None) from any thread: every Work in flight on
    it, here and on every live peer, fails with "rank R revoked process group ...: reason";
    then closes it here without waiting for the peers. Nothing if it is closed already."""
    _C.abort(_backend_of(group), reason)


def failure(group=None):
    """How `group` (the default group when None) failed: None while it is sound, else a dict
    with 'cause' ('rank_failed': a rank ended or stopped; 'blamed': a rank is to blame but
    may be alive; 'revoked'; 'closed'), 'rank' (the rank named, -1 for a close),
    'failed_ranks' and 'what' (the error every operation of the group now raises)."""
    return _C.failure(_backend_of(group))


def _world_dict(name):
    """One of torch.distributed's tables of groups: an attribute of `_world` in torch 2.x, a
    module global (with a leading underscore) in torch 1.13."""
    c10d = dist.distributed_c10d
    world = getattr(c10d, "_world", None)
    if world is not None and hasattr(world, name):
        return getattr(world, name)
    return getattr(c10d, "_" + name)


def shrink(group=None, join_window=timedelta(seconds=10)):
    """The group of the live ranks of `group` (the default group when None), as MPI's
    MPIX_Comm_shrink: every live rank calls it, typically once `failure(group)` says a rank
    failed. Its members are the ranks that call it within `join_window` of the first and that
    nobody knows to have failed, renumbered in the old order; it is a new torch process group
    with its own connections, which dist.get_rank(g), dist.get_world_size(g), every
    collective's group= and DistributedDataParallel(process_group=g) take. A rank left out, or
    a shrink that every try failed, raises an error that says why. `group` stays as it was:
    abort it (its Work failed already). The agreement runs through the job's store, which must
    outlive the failed rank (corocollrun's agent serves it: launch with --on_failure=continue
    so that the others go on)."""
    old = group if group is not None else dist.distributed_c10d._get_default_group()
    made, old_ranks = _C.shrink(_backend_of(old), join_window)
    # torch's tables: the new group's ranks as the job's (global) ranks, as new_group leaves
    # them, so that torch's calls that take a group know it.
    group_ranks = _world_dict("pg_group_ranks")
    if old in group_ranks:
        global_of = {r: g for g, r in group_ranks[old].items()}
    else:
        global_of = {r: r for r in range(old.size())}
    backend_and_store = _world_dict("pg_map").get(old, (BACKEND, None))
    made = _as_process_group(made, backend_and_store[1])
    _register(made, f"corocoll_shrink_{id(made)}",
              {global_of[r]: i for i, r in enumerate(old_ranks)}, backend_and_store)
    return made


def _make_default(pg, backend_and_store):
    """Makes `pg` torch.distributed's default group, as init_process_group leaves one: its
    ranks are the job's ranks from now on (dist.get_rank(), group=None, DDP without a group)."""
    c10d = dist.distributed_c10d
    c10d._update_default_pg(pg)
    _register(pg, f"corocoll_world_{id(pg)}", {i: i for i in range(pg.size())},
              backend_and_store)
    if hasattr(c10d, "_backend"):
        c10d._backend = BACKEND


def grow(group=None, new_size=None, join_window=timedelta(seconds=60)):
    """The group `group` (the default group when None) grown to `new_size` ranks (one more
    when None), as NCCL's ncclCommGrow: its ranks keep their numbers, and the processes that
    called `join_process_group` come after them, in the order they came. Every rank of
    `group` calls it, typically after `shrink` and once the launcher started a replacement
    (corocollrun --on_failure=replace). Too few joiners within `join_window` raise an error,
    on every rank, that says how many came; `group` goes on. The grown group becomes torch's
    default group here, as it is on the joiners: dist.get_rank() and dist.get_world_size()
    are its rank and size from now on. Groups descend from the default group (through shrink
    and grow) to be grown: the joiners meet it in the job's store."""
    old = group if group is not None else dist.distributed_c10d._get_default_group()
    if new_size is None:
        new_size = old.size() + 1
    made = _C.grow(_backend_of(old), new_size, join_window)
    pg_map = _world_dict("pg_map")
    store = pg_map[old][1] if old in pg_map else None
    made = _as_process_group(made, store)
    _make_default(made, (BACKEND, store))
    return made


def join_process_group(timeout=timedelta(minutes=30), init_method="env://"):
    """What a process that joins a running job calls instead of init_process_group (the one
    corocollrun --on_failure=replace starts with COROCOLL_JOIN=1, or one more rank): it
    reaches the job's store as init_process_group would (RANK and WORLD_SIZE are those of the
    launcher, used to reach the store only), waits up to `timeout` until the job's ranks call
    `grow`, and returns its group, made torch's default group: its rank is the one grow hands
    out (after the old ranks), not RANK."""
    store, rank, world_size = next(dist.rendezvous(init_method, timeout=timeout))
    store.set_timeout(timeout)
    # The groups meet joiners in the job's store under every prefix: this one is only for
    # torch's tables, as init_process_group's default group has it.
    store = dist.PrefixStore("default_pg", store)
    made = _as_process_group(_C.join(store, rank, world_size, timeout), store)
    _close_at_exit()
    _make_default(made, (BACKEND, store))
    return made
