#!/usr/bin/python3
"""torch on "corocoll" loses a rank and grows back: under `corocollrun --on_failure=replace
--max_restarts=1`, 4 ranks all_reduce until rank 2 kills itself (SIGKILL); the survivors
shrink (corocoll_torch.shrink), the launcher starts rank 2 again with COROCOLL_JOIN=1, which
calls corocoll_torch.join_process_group() instead of init_process_group, and the survivors
admit it with corocoll_torch.grow(). Then every process, through torch's default group (which
grow made the grown group), all_reduces its rank + 1 (1+2+3+4 = 10), broadcasts from rank 0
and gathers everyone's rank to rank 0. A second grow at a step boundary, with nobody waiting,
fails on every rank saying that 0 came, and the group goes on.

  grow.py COROCOLLRUN             the test
  grow.py --worker                one process of it (what corocollrun starts)

Checks: the launcher exits 0 having started one replacement and named nobody as failed; the
three survivors say they shrank to 3 and grew to 4 keeping their ranks 0, 1, 3 -> 0, 1, 2; the
joiner says it is rank 3 of 4; every process says all_reduce 10, broadcast 1234 and the failed
second grow; rank 0 says gather [0, 1, 2, 3].

Exit 77 (skip) without torch or corocoll_torch.
"""

import os
import re
import signal
import subprocess
import sys
from datetime import timedelta

try:
    import torch
    import torch.distributed as dist
    import corocoll_torch
except ImportError as e:
    print(f"skip: {e}")
    sys.exit(77)

KILL = 2
RANKS = 4


def say(text):
    print(f"[{os.environ.get('RANK')}] {text}", flush=True)


def worker():
    if os.environ.get("COROCOLL_JOIN") == "1":
        corocoll_torch.join_process_group(timeout=timedelta(seconds=60))
        say(f"joined as rank {dist.get_rank()} of {dist.get_world_size()}")
    else:
        dist.init_process_group("corocoll", timeout=timedelta(seconds=60))
        me = dist.get_rank()
        t = torch.ones(4)
        try:
            for step in range(1_000_000):
                if me == KILL and step == 5:
                    os.kill(os.getpid(), signal.SIGKILL)
                dist.all_reduce(t)
                t.fill_(1)
        except RuntimeError as e:
            say(f"step {step} failed: {str(e).splitlines()[0][:100]}")
        small = corocoll_torch.shrink(join_window=timedelta(seconds=20))
        say(f"shrank to {small.size()} as rank {small.rank()}")
        corocoll_torch.abort()  # the old default group: its Work failed already
        grown = corocoll_torch.grow(small, RANKS, join_window=timedelta(seconds=60))
        say(f"grew to {grown.size()} as rank {grown.rank()}; default group rank "
            f"{dist.get_rank()} of {dist.get_world_size()}")
    # From here on every process, the joiner too, uses torch's default group.
    me = dist.get_rank()
    v = torch.tensor([me + 1], dtype=torch.int64)
    dist.all_reduce(v)
    b = torch.tensor([1234 if me == 0 else 0], dtype=torch.int32)
    dist.broadcast(b, 0)
    gathered = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
    dist.gather(torch.tensor([me]), gathered if me == 0 else None, dst=0)
    say(f"rank {me}: all_reduce {v.item()}, broadcast {b.item()}")
    if me == 0:
        say(f"gather {[int(g.item()) for g in gathered]}")
    try:
        corocoll_torch.grow(new_size=RANKS + 1, join_window=timedelta(milliseconds=300))
        say("the second grow grew")
    except RuntimeError as e:
        m = re.search(r"but (\d+) of the 1 process|rank 0 did not see 1 process", str(e))
        say(f"second grow failed: {m.group(0) if m else e}")
    dist.barrier()  # the group went on
    dist.destroy_process_group()
    say("done")


def main():
    corocollrun = sys.argv[1]
    cmd = [corocollrun, f"--nproc_per_node={RANKS}", "--on_failure=replace",
           "--max_restarts=1", "--grace_period=60", sys.executable, os.path.abspath(__file__),
           "--worker"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=240)
    print(f"$ {' '.join(cmd)}\n{p.stdout}{p.stderr}exit code {p.returncode}", flush=True)
    out = p.stdout
    expect = [
        (p.returncode == 0, "the launcher exits 0"),
        (re.search(rf"rank {KILL} \(local rank {KILL} on node 0, pid \d+\) was killed by signal 9"
                   rf"[^\n]*starting a replacement that joins", p.stderr) is not None,
         f"the launcher starts a replacement for rank {KILL}"),
        ("worker failed" not in p.stderr, "the launcher names nobody as failed"),
        (f"[{KILL}] joined as rank 3 of 4" in out, "the joiner is rank 3 of 4"),
        ("[0] gather [0, 1, 2, 3]" in out, "rank 0 gathers [0, 1, 2, 3]"),
    ]
    for first, now in ((0, 0), (1, 1), (3, 2)):
        expect.append((f"[{first}] shrank to 3 as rank {now}" in out,
                       f"rank {first} shrank to 3 as rank {now}"))
        expect.append((f"[{first}] grew to 4 as rank {now}; default group rank {now} of 4" in out,
                       f"rank {first} grew to 4 keeping rank {now}, as the default group"))
    for first, now in ((0, 0), (1, 1), (3, 2), (KILL, 3)):
        expect.append((f"[{first}] rank {now}: all_reduce 10, broadcast 1234" in out,
                       f"process {first} (rank {now}) all_reduces 10 and gets the broadcast"))
        expect.append((re.search(rf"\[{first}\] second grow failed: (but 0 of the 1 process|"
                                 rf"rank 0 did not see 1 process)", out) is not None,
                       f"process {first}'s second grow fails, saying nobody came"))
        expect.append((f"[{first}] done" in out, f"process {first} finishes"))
    failed = [what for ok, what in expect if not ok]
    for what in failed:
        print(f"FAILED: {what}")
    print(f"{len(expect) - len(failed)} of {len(expect)} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        worker()
    else:
        sys.exit(main())
