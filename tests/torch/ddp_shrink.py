#!/usr/bin/python3
"""torch DDP on "corocoll" loses a rank and finishes the epoch: examples/ddp_torch.py under
`corocollrun --on_failure=continue`, once per transport with rank KILL killed (SIGKILL) before
step STEP (and with --compare first once without a failure, for its accuracy). A run with the
failure must end on the survivors (RANKS - 1 of them, rank KILL named as the one lost, every
survivor's parameters equal to the new rank 0's, which the script checks) past step STEP,
with a test accuracy of at least MIN_ACCURACY; the launcher must name rank KILL, and only it,
as failed. One run against another differs by a point or two either way (the batches change
with the group); docs/performance.md compares the means over seeds.

  ddp_shrink.py COROCOLLRUN [--ranks N] [--kill R] [--step S] [--samples M]
                [--transports shm,tcp] [--min-accuracy X] [--compare]

Exit 77 (skip) without torch or corocoll_torch.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

try:
    import torch  # noqa: F401
    import corocoll_torch  # noqa: F401
except ImportError as e:
    print(f"skip: {e}")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "examples", "ddp_torch.py")


def run(args, out, kill, transport=""):
    cmd = [args.corocollrun, f"--nproc_per_node={args.ranks}", "--on_failure=continue",
           "--grace_period=60", sys.executable, SCRIPT, "--samples", str(args.samples),
           "--out", out]
    if kill:
        cmd += ["--kill-rank", str(args.kill), "--kill-at-step", str(args.step)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if transport:
        env["COROCOLL_TRANSPORT"] = transport
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=args.timeout)
    print(f"$ {'COROCOLL_TRANSPORT=' + transport + ' ' if transport else ''}{' '.join(cmd)}\n"
          f"{p.stdout}{p.stderr}exit code {p.returncode}", flush=True)
    return p


def killed_run(args, tmp, transport):
    """The run in which rank args.kill dies: its result, and what went wrong."""
    out = os.path.join(tmp, f"kill_{transport or 'default'}.json")
    killed = run(args, out, True, transport)
    on = f" ({transport})" if transport else ""
    failures = []
    # The launcher reports the killed rank and fails; nobody else may have failed.
    named = re.findall(r"worker failed: rank (\d+) \(local rank", killed.stderr)
    others = re.findall(r"rank (\d+) \(local rank \d+ on node 0, pid \d+\) exited with code "
                        r"[1-9]", killed.stderr)
    if killed.returncode != 1 or named != [str(args.kill)] or others:
        failures.append(f"the launcher named {named + others} as failed (exit code "
                        f"{killed.returncode}){on}; only rank {args.kill} was to fail")
    if not re.search(rf"rank {args.kill} \(local rank {args.kill} on node 0, pid \d+\) was "
                     rf"killed by signal 9", killed.stderr):
        failures.append(f"the launcher did not say that rank {args.kill} was killed{on}")
    if not os.path.exists(out):
        return None, failures + [f"the survivors wrote no result{on}"]
    with open(out) as f:
        result = json.load(f)
    print(f"with rank {args.kill} killed at step {args.step}{on}: {result}")
    if result["ranks"] != args.ranks - 1 or result["lost"] != [args.kill]:
        failures.append(f"the survivors ended on {result['ranks']} ranks having lost "
                        f"{result['lost']}{on}; expected {args.ranks - 1}, [{args.kill}]")
    if result["steps"] <= args.step:
        failures.append(f"the survivors made {result['steps']} steps{on}, no more than "
                        f"{args.step}")
    if result["accuracy"] < args.min_accuracy:
        failures.append(f"test accuracy {100 * result['accuracy']:.2f}%{on} after the failure, "
                        f"below {100 * args.min_accuracy:.0f}%")
    return result, failures


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("corocollrun")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--kill", type=int, default=2)
    p.add_argument("--step", type=int, default=300)
    p.add_argument("--samples", type=int, default=60000)
    p.add_argument("--transports", default="shm,tcp")
    p.add_argument("--min-accuracy", type=float, default=0.80)
    p.add_argument("--compare", action="store_true",
                   help="first run the job without a failure, for its accuracy")
    p.add_argument("--timeout", type=int, default=120)
    args = p.parse_args()
    failures = []
    free_result = None
    with tempfile.TemporaryDirectory() as tmp:
        if args.compare:
            free_out = os.path.join(tmp, "free.json")
            free = run(args, free_out, kill=False)
            if free.returncode != 0 or not os.path.exists(free_out):
                print("FAIL: the run without a failure failed")
                return 1
            with open(free_out) as f:
                free_result = json.load(f)
            print(f"without a failure: {free_result}")
            if free_result["ranks"] != args.ranks or free_result["lost"]:
                failures.append(f"the run without a failure ended on {free_result['ranks']} "
                                f"ranks")
        results = {}
        for transport in args.transports.split(","):
            results[transport], more = killed_run(args, tmp, transport)
            failures += more
    if failures:
        print("\n".join("FAIL: " + f for f in failures))
        return 1
    print(f"ok: {args.ranks - 1} survivors finished the epoch: " + ", ".join(
        f"{100 * r['accuracy']:.2f}% on {t}" for t, r in results.items()) +
        (f"; {100 * free_result['accuracy']:.2f}% without the failure" if free_result else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
