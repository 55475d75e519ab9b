#!/usr/bin/python3
"""Two hosts made of network namespaces joined by a veth pair (198.18.0.1 and 198.18.0.2, from
the benchmarking range 198.18.0.0/15), with 2 ms of delay added by tc netem where the kernel
has it, and a 1 Gbit/s token bucket (tc tbf) where it has not.
One corocollrun per host, --nnodes=2, two ranks each:

  1. an all_reduce and a broadcast across the 4 ranks, checked by every rank; every rank sees
     the same two hosts, and large and small all_reduce, all_gather and broadcast run
     hierarchically (shared memory within a host, TCP between the leaders);
  2. a rank on host 2 fails: both launchers stop every worker and exit 1, and host 1's launcher
     names the failed rank and its node.

Exits 77 (skipped) where namespaces cannot be made (not root, no `ip`, no veth).
Usage: multinode_test.py <corocollrun> <launcher_worker>
"""
import os
import re
import shutil
import subprocess
import sys
import time

SKIP = 77
TAG = f"cc{os.getpid() % 100000}"
NS = [f"{TAG}h1", f"{TAG}h2"]
VETH = [f"{TAG}v1", f"{TAG}v2"]
ADDR = ["198.18.0.1", "198.18.0.2"]


def sh(*cmd, check=True):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          check=check)


def make_hosts():
    sh("ip", "netns", "add", NS[0])
    sh("ip", "netns", "add", NS[1])
    sh("ip", "link", "add", VETH[0], "netns", NS[0], "type", "veth", "peer", "name", VETH[1],
       "netns", NS[1])
    for i in (0, 1):
        ns = ("ip", "netns", "exec", NS[i])
        sh(*ns, "ip", "link", "set", "lo", "up")
        sh(*ns, "ip", "addr", "add", f"{ADDR[i]}/24", "dev", VETH[i])
        sh(*ns, "ip", "link", "set", VETH[i], "up")
    for i in (0, 1):
        tc = ("ip", "netns", "exec", NS[i], "tc", "qdisc", "add", "dev", VETH[i], "root")
        r = sh(*tc, "netem", "delay", "2ms", check=False)
        if r.returncode == 0:
            print(f"host {i + 1}: 2 ms delay on {VETH[i]} (tc netem)")
            continue
        # Kernels built without sch_netem (this one: "Specified qdisc kind is unknown") can
        # still make the link slower than a loopback with a token bucket.
        print(f"host {i + 1}: tc netem unavailable ({r.stdout.strip()})")
        r = sh(*tc, "tbf", "rate", "1gbit", "burst", "64kb", "latency", "20ms", check=False)
        print(f"host {i + 1}: " + ("1 Gbit/s token bucket on " + VETH[i] + " (tc tbf)"
                                   if r.returncode == 0 else
                                   f"no tc shaping either ({r.stdout.strip()})"))


def remove_hosts():
    for ns in NS:
        try:
            subprocess.run(["ip", "netns", "del", ns], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        except FileNotFoundError:
            return


def clean_env():
    env = dict(os.environ)
    for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_RANK",
              "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
              "COROCOLL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        env.pop(v, None)
    return env


def run_job(run, worker_args, extra_env=None):
    """Starts node 0 with --master_port=0, reads the port it picked, starts node 1 with it."""
    common = ["--nnodes=2", "--nproc_per_node=2", f"--master_addr={ADDR[0]}",
              "--grace_period=2", "--rdzv_conf", "join_timeout=30,exit_barrier_timeout=30"]
    node0 = subprocess.Popen(["ip", "netns", "exec", NS[0], run, *common, "--node_rank=0",
                              "--master_port=0", *worker_args],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**clean_env(), **(extra_env or {})})
    procs = [node0]
    try:
        first = node0.stderr.readline()
        m = re.search(r"serves the store on 198\.18\.0\.1:(\d+)", first)
        if not m:
            raise AssertionError(f"node 0 did not say where its store is: {first!r}")
        port = m.group(1)
        node1 = subprocess.Popen(["ip", "netns", "exec", NS[1], run, *common, "--node_rank=1",
                                  f"--master_port={port}", *worker_args],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env={**clean_env(), **(extra_env or {})})
        procs.append(node1)
        results = []
        for p in procs:
            out, err = p.communicate(timeout=90)
            results.append((p.returncode, out, (first if p is node0 else "") + err))
        return results
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def show(results):
    for i, (code, out, err) in enumerate(results):
        print(f"--- host {i + 1}: exit code {code}\n{out}{err}", flush=True)


def main():
    run = os.path.abspath(sys.argv[1])
    worker = os.path.abspath(sys.argv[2])
    if os.geteuid() != 0:
        print("skip: making network namespaces needs root")
        return SKIP
    if shutil.which("ip") is None:
        print("skip: no `ip` (iproute2) to make network namespaces with")
        return SKIP
    try:
        make_hosts()
    except (subprocess.CalledProcessError, FileNotFoundError) as e:
        remove_hosts()
        print(f"skip: cannot make network namespaces here: {getattr(e, 'stdout', e)}")
        return SKIP
    failures = []
    try:
        start = time.monotonic()
        # COROCOLL_DEBUG=INFO: each rank logs the channel of every pair and why.
        results = run_job(run, [worker, "collectives"], {"COROCOLL_DEBUG": "INFO"})
        print(f"collectives across 2 hosts took {time.monotonic() - start:.2f} s")
        show(results)
        for i, (code, out, err) in enumerate(results):
            if code != 0:
                failures.append(f"host {i + 1}: exit code {code}")
            # The two ranks of a host share memory (ring neighbours: connected at set-up);
            # ranks on the other host (another network namespace on this kernel: same boot id)
            # are reached over TCP, connected at set-up (ring neighbours) or left for first use
            # and then on TCP. The hierarchical calls' leaders, ranks 0 and 2, do talk.
            for r in (2 * i, 2 * i + 1):
                same = 2 * i + (1 - r % 2)
                for other in range(4):
                    if other == r:
                        continue
                    pair = rf"rank {r} - rank {other}: "
                    if other == same:
                        if not re.search(pair + r"shm \(", out + err):
                            failures.append(f"host {i + 1}: rank {r} does not log shm to rank {other}")
                        continue
                    if re.search(pair + r"shm", out + err):
                        failures.append(f"host {i + 1}: rank {r} logs shm to rank {other}, on another host")
                    if not re.search(pair + r"(tcp|on first use) \(", out + err):
                        failures.append(f"host {i + 1}: rank {r} logs no channel to rank {other}")
                    if r % 2 == 0 and other % 2 == 0 and not re.search(pair + r"tcp (on first use )?\(", out + err):
                        failures.append(f"host {i + 1}: leader {r} does not log tcp to leader {other}")
            for r in (2 * i, 2 * i + 1):
                # Every rank sees the same two hosts, and all_reduce, broadcast and all_gather
                # run hierarchically (shm within a host, TCP between the two leaders).
                for want in (f"[rank {r}] all_reduce ok: 10",
                             f"[rank {r}] broadcast ok: 42 (world 4, node {i})",
                             f"[rank {r}] topology: 2 hosts: ranks 0,1 | 2,3, hierarchical",
                             f"[rank {r}] hierarchical ok"):
                    if want not in out:
                        failures.append(f"host {i + 1}: missing '{want}'")

        start = time.monotonic()
        results = run_job(run, [worker, "plain-fail", "3", "5"])
        took = time.monotonic() - start
        print(f"a failure on host 2 ended both hosts' jobs in {took:.2f} s")
        show(results)
        if [code for code, _, _ in results] != [1, 1]:
            failures.append(f"failure case: exit codes {[c for c, _, _ in results]}, want 1, 1")
        if not re.search(r"rank 3 \(local rank 1 on node 1, pid \d+\) exited with code 5",
                         results[1][2]):
            failures.append("host 2 does not report rank 3's exit code")
        if "first failure reported by any node: rank 3 (local rank 1 on node 1" not in results[0][2]:
            failures.append("host 1 does not name rank 3 on node 1")
        if took > 30:
            failures.append(f"stopping took {took:.1f} s")
    finally:
        remove_hosts()
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
