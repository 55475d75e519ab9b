#!/usr/bin/python3
"""corocollrun on one node: the workers' environment, the flags, failures, signals, restarts.

Usage: launcher_test.py <corocollrun> <launcher_worker>

Every case checks afterwards that none of the processes the workers reported (their pids, and
in the signal case their own children) is still alive.
"""
import os
import re
import signal
import subprocess
import sys
import time
import unittest

RUN = WORKER = None


def alive(pid):
    """True while `pid` runs; a zombie is dead (whoever adopted it has not reaped it yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def pids_in(text, word="pid"):
    return [int(m.group(1)) for m in re.finditer(rf"^(?:\[rank \d+\] )?{word} \d+ (\d+)$", text,
                                                 re.M)]


def clean_env():
    env = dict(os.environ)
    for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
              "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE",
              "SLURM_PROCID", "SLURM_NTASKS", "OMP_NUM_THREADS"):
        env.pop(v, None)
    return env


def launch(*args, timeout=60, env=None):
    start = time.monotonic()
    p = subprocess.run([RUN, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout, env=env or clean_env())
    return p, time.monotonic() - start


class LauncherTest(unittest.TestCase):
    def assert_none_left(self, pids):
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(alive(p) for p in pids):
            time.sleep(0.05)
        left = [p for p in pids if alive(p)]
        self.assertEqual(left, [], f"processes left behind: {left}")

    def test_worker_environment(self):
        env = clean_env()
        env["SLURM_PROCID"] = "5"  # another launcher's variables must not reach the workers
        env["SLURM_NTASKS"] = "9"
        p, _ = launch("--nproc-per-node=3", "--rdzv_id", "job7", "--role=trainer", "env",
                      env=env)
        self.assertEqual(p.returncode, 0, p.stderr)
        per_rank = {}
        for line in p.stdout.splitlines():
            m = re.match(r"^\[rank (\d+)\] ([A-Z_]+)=(.*)$", line)
            if m:
                per_rank.setdefault(int(m.group(1)), {})[m.group(2)] = m.group(3)
        self.assertEqual(sorted(per_rank), [0, 1, 2])
        port = per_rank[0]["MASTER_PORT"]
        self.assertTrue(port.isdigit() and int(port) > 0)
        for r, e in per_rank.items():
            want = {"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "3",
                    "LOCAL_WORLD_SIZE": "3", "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1",
                    "ROLE_RANK": str(r), "ROLE_WORLD_SIZE": "3", "ROLE_NAME": "trainer",
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                    "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "0",
                    "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": "job7",
                    "OMP_NUM_THREADS": "1"}
            for k, v in want.items():
                self.assertEqual(e.get(k), v, f"rank {r}: {k}")
            self.assertNotIn("SLURM_PROCID", e)
            self.assertIn("COROCOLL_FAILURE_FD", e)

    def test_no_prefix_and_double_dash(self):
        p, _ = launch("--nproc_per_node", "2", "--no_prefix", "--", "echo", "hello")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout, "hello\nhello\n")
        p, _ = launch("--standalone", "--nproc_per_node=2", "sh", "-c",
                      "printf 'no newline at the end'")
        self.assertEqual(sorted(p.stdout.splitlines()),
                         ["[rank 0] no newline at the end", "[rank 1] no newline at the end"])

    def test_usage_errors(self):
        cases = [
            (["--nnodes=2", "env"], "needs --master_port"),
            (["--nnodes=1:4", "env"], "elastic ranges are not supported"),
            (["--standalone", "--nnodes=2", "env"], "cannot go with --nnodes=2"),
            (["--nnodes=2", "--node_rank=2", "--master_port=1", "env"],
             "--node_rank=2 must be below --nnodes=2"),
            (["--nnodes=2", "--node_rank=1", "--master_port=0", "env"], "only on node 0"),
            (["--nproc_per_node=0", "env"], "must be in [1, 4096]"),
            (["--nproc_per_node=two", "env"], "expected a whole number"),
            (["--tee", "3", "env"], "--tee is not supported"),
            (["-t", "3", "env"], "-t (torchrun's --tee) is not supported"),
            (["-r3", "env"], "-r (torchrun's --redirects) is not supported"),
            (["--bogus", "env"], "unknown option '--bogus'"),
            (["--nproc_per_node=2"], "no program to run"),
            (["--rdzv_conf", "join_timeout=abc", "env"], "expected a number of seconds"),
            (["--on_failure=later", "env"], "--on_failure=later: expected stop, continue or replace"),
            (["--on_failure=continue", "--max_restarts=1", "env"],
             "--on_failure=continue cannot go with --max_restarts"),
            (["--on_failure=replace", "env"], "--on_failure=replace needs --max_restarts N"),
        ]
        for args, message in cases:
            p, _ = launch(*args)
            self.assertEqual(p.returncode, 2, args)
            self.assertIn(message, p.stderr, args)
        p, _ = launch("--help")
        self.assertEqual(p.returncode, 0)
        self.assertIn("--nproc_per_node", p.stdout)
        self.assertIn("--version", p.stdout)
        p, _ = launch("--version")
        self.assertEqual(p.returncode, 0)
        self.assertRegex(p.stdout, r"^corocollrun \d+\.\d+\.\d+ \(corocoll \d+\.\d+\.\d+\)\n$")
        p, _ = launch("--nproc_per_node=2", "no-such-program-anywhere")
        self.assertEqual(p.returncode, 1)
        self.assertIn("cannot start 'no-such-program-anywhere'", p.stderr)

    def test_a_join_says_which_nodes_it_waits_for_and_a_failed_one_keeps_no_store_up(self):
        # Node 0 of 3 alone: it names the missing nodes while it waits, then in the error; no
        # node joined besides itself, so it does not keep the store up for them afterwards.
        p, _ = launch("--nnodes=3", "--node_rank=0", "--master_port=0", "--rdzv_conf",
                      "join_timeout=2", "env")
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertRegex(p.stderr, r"node 0 waits for node\(s\) 1, 2 to join at 127\.0\.0\.1:\d+")
        self.assertIn("node(s) 1, 2 did not join within 2 s", p.stderr)
        self.assertNotIn("keeps the store up", p.stderr)
        self.assertEqual(p.stdout, "")

    def test_failing_worker_stops_the_others(self):
        p, took = launch("--nproc_per_node=3", "--grace_period=30", WORKER, "plain-fail", "1",
                         "3")
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertRegex(p.stderr, r"worker failed: rank 1 \(local rank 1 on node 0, pid \d+\) "
                                   r"exited with code 3")
        self.assertIn("last 3 line(s) of rank 1's stderr:\n    rank 1: first line", p.stderr)
        self.assertIn("    rank 1: giving up", p.stderr)
        self.assertIn("stopped rank(s) 0, 2", p.stderr)
        self.assertIn("[rank 1] rank 1: second line", p.stderr)  # passed through as well
        # SIGTERM was enough: the 30 s grace period was not spent. The bound leaves a loaded
        # machine its time to start and stop three workers.
        self.assertLess(took, 15)
        pids = pids_in(p.stdout)
        self.assertEqual(len(pids), 3)
        self.assert_none_left(pids)

    def test_killed_worker_is_reported_with_its_signal(self):
        p, took = launch("--nproc_per_node=4", "--grace_period=30", WORKER, "plain-kill", "2")
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertRegex(p.stderr, r"rank 2 \(local rank 2 on node 0, pid \d+\) was killed by "
                                   r"signal 9")
        self.assertIn("rank 2 wrote nothing to stderr", p.stderr)
        self.assertLess(took, 15)  # the others stopped at SIGTERM, not after the grace period
        self.assert_none_left(pids_in(p.stdout))

    def test_workers_that_ignore_sigterm_are_killed_after_the_grace_period(self):
        p, took = launch("--nproc_per_node=3", "--grace_period=1", WORKER, "stubborn-fail", "0")
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("rank 0 (local rank 0", p.stderr)
        self.assertGreaterEqual(took, 1.0)
        self.assertLess(took, 5)
        self.assert_none_left(pids_in(p.stdout))

    def test_on_failure_continue_lets_the_others_live(self):
        # Rank 2 is killed; the others see it in failed_ranks, carry on without it (a
        # collective among themselves) and exit 0. The launcher stops nobody and still fails.
        p, _ = launch("--on_failure=continue", "--nproc_per_node=4", "--grace_period=30", WORKER,
                      "survive-kill", "2")
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertRegex(p.stderr, r"rank 2 \(local rank 2 on node 0, pid \d+\) was killed by "
                                   r"signal 9[^\n]*; the other workers go on \(--on_failure=continue\)")
        self.assertRegex(p.stderr, r"worker failed: rank 2 \(local rank 2 on node 0, pid \d+\) "
                                   r"was killed by signal 9")
        self.assertNotIn("stopped rank(s)", p.stderr)
        for r in (0, 1, 3):
            self.assertIn(f"rank {r}: rank 2 failed (failed_ranks [2]); the survivors' barrier "
                          f"passed", p.stdout)
        self.assert_none_left(pids_in(p.stdout))

    def test_on_failure_replace_starts_a_replacement_that_joins(self):
        # Rank 2 is killed; the launcher starts it again alone with COROCOLL_JOIN=1; the
        # others shrink to 3, admit it with grow, and all 4 all_reduce: 1+2+3+4. Nobody else
        # is stopped, and the job succeeds.
        p, _ = launch("--on_failure=replace", "--max_restarts=1", "--nproc_per_node=4", WORKER,
                      "replace", "2")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertRegex(p.stderr, r"rank 2 \(local rank 2 on node 0, pid \d+\) was killed by "
                                   r"signal 9[^\n]*; starting a replacement that joins the others "
                                   r"\(1 of 1, --on_failure=replace\)")
        self.assertNotIn("worker failed", p.stderr)
        self.assertNotIn("stopped rank(s)", p.stderr)
        for r in (0, 1, 3):
            self.assertIn(f"[rank {r}] rank {r}: shrank to 3, grew back to 4 of 4; all_reduce 10",
                          p.stdout)
        self.assertIn("[rank 2] joined as rank 3 of 4; all_reduce 10", p.stdout)
        self.assert_none_left(pids_in(p.stdout))

    def test_corocoll_rank_that_fails_first_is_named(self):
        # The other ranks fail too (their peer is gone) and may exit first; the rank that
        # failed first says so through COROCOLL_FAILURE_FD.
        p, _ = launch("--nproc_per_node=4", WORKER, "corocoll-fail", "2")
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertRegex(p.stderr, r"worker failed: rank 2 \(local rank 2 on node 0, pid \d+\) "
                                   r"exited with code 1")
        self.assertIn("gives up on purpose", p.stderr.split("worker failed:")[1])
        self.assert_none_left(pids_in(p.stdout))

    def test_sigint_stops_every_worker_and_their_children(self):
        proc = subprocess.Popen([RUN, "--nproc_per_node=3", "--grace_period=30", WORKER, "sleep"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=clean_env())
        try:
            seen = ""
            deadline = time.monotonic() + 30
            while seen.count("grandchild") < 3 and time.monotonic() < deadline:
                line = proc.stdout.readline()
                if not line:
                    break
                seen += line
            self.assertEqual(seen.count("grandchild"), 3, seen)
            pids = pids_in(seen) + pids_in(seen, "grandchild")
            self.assertTrue(all(alive(p) for p in pids))
            start = time.monotonic()
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=60)
            # SIGINT stopped them: the 30 s grace period was not spent.
            self.assertLess(time.monotonic() - start, 15)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.assertEqual(proc.returncode, 130, err)
        self.assertIn("interrupted by signal 2", err)
        self.assert_none_left(pids)

    def test_killed_launcher_takes_its_workers_along(self):
        proc = subprocess.Popen([RUN, "--nproc_per_node=2", WORKER, "plain-fail", "9"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=clean_env())
        try:
            seen = proc.stdout.readline() + proc.stdout.readline()
            pids = pids_in(seen)
            self.assertEqual(len(pids), 2, seen)
            proc.kill()
            proc.wait(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.assert_none_left(pids)

    def test_max_restarts_starts_every_worker_again(self):
        p, _ = launch("--nproc_per_node=3", "--max_restarts=2", WORKER, "fail-first-attempt",
                      "1")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("rank 1 fails in attempt 0", p.stderr)
        self.assertIn("restarting the workers (restart 1 of 2)", p.stderr)
        self.assertEqual(p.stdout.count("all_reduce ok: 6"), 3, p.stdout)
        for r in range(3):
            self.assertIn(f"[rank {r}] attempt 1", p.stdout)
        self.assert_none_left(pids_in(p.stdout))

    def test_torch_gloo_workers_use_the_launchers_store(self):
        # torch's env:// with TORCHELASTIC_USE_AGENT_STORE connects to the store corocollrun
        # serves (torch 1.13's TCPStore protocol) under /worker/attempt_0.
        try:
            subprocess.run(["/usr/bin/python3", "-c", "import torch.distributed"], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
        except (subprocess.CalledProcessError, FileNotFoundError):
            self.skipTest("python3-torch is not installed")
        script = ("import torch, torch.distributed as dist\n"
                  "dist.init_process_group('gloo')\n"
                  "t = torch.tensor([dist.get_rank() + 1.0])\n"
                  "dist.all_reduce(t)\n"
                  "print(f'torch rank {dist.get_rank()} of {dist.get_world_size()}: {t.item()}')\n"
                  "dist.destroy_process_group()\n")
        p, _ = launch("--nproc_per_node=3", "/usr/bin/python3", "-c", script, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        for r in range(3):
            self.assertIn(f"[rank {r}] torch rank {r} of 3: 6.0", p.stdout)

    def test_without_restarts_a_failure_ends_the_job(self):
        p, _ = launch("--nproc_per_node=2", WORKER, "fail-first-attempt", "0")
        self.assertEqual(p.returncode, 1)
        self.assertNotIn("restarting", p.stderr)
        self.assert_none_left(pids_in(p.stdout))


if __name__ == "__main__":
    RUN = os.path.abspath(sys.argv[1])
    WORKER = os.path.abspath(sys.argv[2])
    unittest.main(argv=[sys.argv[0], "-v"])
