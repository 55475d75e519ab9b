#!/usr/bin/python3
"""netns_hosts: ranks on many hosts made of network namespaces on this machine, corocoll (one
corocollrun per host, hierarchical collectives) beside Open MPI and MPICH (mpirun across the
namespaces).

    benchmarks/compare/netns_hosts.py [--hosts 16] [--per-host 4] [-b 8] [-e 1M] [-f 128]
        [--iters 20] [--out-dir docs] [--corocollrun PATH] [--coll-perf PATH] [--probe PATH]
        [--mpis openmpi,mpich]

Needs root and iproute2. Makes --hosts namespaces ("hosts") and one more holding a bridge (the
"switch"), each host joined to it by a veth pair, with addresses 198.18.1.1, 198.18.1.2, ...
(the benchmarking range 198.18.0.0/15); every namespace is removed at the end. Then:

  - start-up: startup_probe under one corocollrun per host (--nnodes=H, --nproc_per_node=P),
    from the first launcher's start to the last rank's first all_reduce done; connections per
    rank and shared memory mapped per rank;
  - latency: coll_perf's all_reduce, broadcast and all_gather (-b/-e/-f, --iters) the same way,
    collectives chosen automatically (hierarchical: shared memory within a host, TCP between
    the hosts' leaders);
  - Open MPI: mpi_perf.c (built by run_compare.py's rule) under mpirun.openmpi run in the first
    host, with a host file of the hosts' addresses and a launch agent that starts each host's
    daemon inside its namespace (btl tcp,vader,self); MPICH (ch4:ucx): mpi_perf.c under
    mpirun.mpich (hydra) with the same agent in place of ssh and the hosts' addresses
    (UCX_TLS=tcp,sm,self); each reported as failed where it does not start (--mpis picks them).

Written between <!-- netns:begin --> and <!-- netns:end --> in performance.md under --out-dir.
All ranks share this machine's CPUs: the figures are what oversubscription allows.
"""

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from run_compare import REPO, machine, write_markdown

HERE = Path(__file__).resolve().parent
BEGIN_MARK = "<!-- netns:begin -->"
END_MARK = "<!-- netns:end -->"
TAG = f"ccn{os.getpid() % 10000}"
DONE = re.compile(r"startup_done (\d+) (\d+)")
CONNECTIONS = re.compile(r"connections (\d+) (\d+) (\d+) (\d+) (\d+)")
OPS = "all_reduce,broadcast,all_gather"
NAMES = {"openmpi": "Open MPI", "mpich": "MPICH"}


def sh(*cmd, check=True):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          check=check)


def host_ns(i):
    return f"{TAG}h{i}"


def address(i):
    return f"198.18.1.{i + 1}"


def make_hosts(n):
    switch = f"{TAG}sw"
    sh("ip", "netns", "add", switch)
    sh("ip", "netns", "exec", switch, "ip", "link", "add", "br0", "type", "bridge")
    sh("ip", "netns", "exec", switch, "ip", "link", "set", "br0", "up")
    for i in range(n):
        ns, inner, outer = host_ns(i), f"{TAG}a{i}", f"{TAG}b{i}"
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", inner, "netns", ns, "type", "veth", "peer", "name", outer,
           "netns", switch)
        sh("ip", "netns", "exec", switch, "ip", "link", "set", outer, "master", "br0")
        sh("ip", "netns", "exec", switch, "ip", "link", "set", outer, "up")
        sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{address(i)}/24", "dev", inner)
        sh("ip", "netns", "exec", ns, "ip", "link", "set", inner, "up")


def remove_hosts(n):
    for ns in [f"{TAG}sw", *(host_ns(i) for i in range(n))]:
        subprocess.run(["ip", "netns", "del", ns], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)


def clean_env(extra=None):
    env = dict(os.environ)
    for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "COROCOLL_TRANSPORT",
              "COROCOLL_SOCKET_IFNAME", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        env.pop(v, None)
    env["OMP_NUM_THREADS"] = "1"
    return {**env, **(extra or {})}


def corocoll_job(a, program, timeout=600):
    """One corocollrun per host running `program`; (seconds from the first launch to the end,
    start time ns, [stdout of each host])."""
    common = [f"--nnodes={a.hosts}", f"--nproc_per_node={a.per_host}",
              f"--master_addr={address(0)}", "--no_prefix", "--grace_period=5",
              "--rdzv_conf", "join_timeout=120,exit_barrier_timeout=120"]
    start = time.time_ns()
    first = subprocess.Popen(["ip", "netns", "exec", host_ns(0), a.corocollrun, *common,
                              "--node_rank=0", "--master_port=0", *program],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=clean_env())
    procs = [first]
    try:
        line = first.stderr.readline()
        m = re.search(r"serves the store on [0-9.]+:(\d+)", line)
        if not m:
            raise RuntimeError(f"host 1's launcher did not say where its store is: {line!r}")
        for i in range(1, a.hosts):
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", host_ns(i), a.corocollrun, *common, f"--node_rank={i}",
                 f"--master_port={m.group(1)}", *program],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env()))
        outs = []
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            if p.returncode != 0:
                raise RuntimeError(f"a launcher exited {p.returncode}: "
                                   f"{(err or out).strip().splitlines()[-1:]}")
            outs.append(out)
        return (time.time_ns() - start) / 1e9, start, outs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def rows_of(text):
    """coll_perf's JSON rows in `text`."""
    rows = []
    for line in text.splitlines():
        line = line.strip().rstrip(",")
        if line.startswith("{") and '"op"' in line:
            rows.append(json.loads(line))
    return rows


def build_mpi_perf(a, flavour):
    """mpi_perf.c built with `flavour`'s mpicc (openmpi or mpich); its path."""
    exe = Path(a.build_dir) / f"mpi_perf_{flavour}"
    if not exe.exists() or exe.stat().st_mtime < (HERE / "mpi_perf.c").stat().st_mtime:
        exe.parent.mkdir(parents=True, exist_ok=True)
        sh(f"mpicc.{flavour}", "-O2", "-std=c11", "-D_POSIX_C_SOURCE=200809L", "-o", str(exe),
           str(HERE / "mpi_perf.c"))
    return exe


def launch_agent(a, path):
    """The launch agent both MPIs call in place of ssh, as `agent [options] HOST COMMAND...`: it
    runs the command inside that host's network namespace, with a host name of its own (a UTS
    namespace: both MPIs tell nodes apart by name)."""
    cases = "".join(f'        {address(i)}) ns={host_ns(i)} ;;\n' for i in range(a.hosts))
    path.write_text("#!/bin/bash\nwhile [[ $1 == -* ]]; do shift; done\nhost=$1; shift\n"
                    f"case $host in\n{cases}        *) echo \"no host $host\" >&2; exit 1 ;;\n"
                    "esac\nexec ip netns exec \"$ns\" unshare --uts /bin/sh -c "
                    "\"hostname $ns; $*\"\n")
    path.chmod(0o755)


def mpi_job(a, flavour, perf_args, timeout=900):
    """mpi_perf under mpirun.openmpi or mpirun.mpich across the hosts, started in the first
    host; its JSON rows."""
    exe = build_mpi_perf(a, flavour)
    with tempfile.TemporaryDirectory() as tmp:
        agent = Path(tmp) / "netns_rsh"
        launch_agent(a, agent)
        first = ["ip", "netns", "exec", host_ns(0), "unshare", "--uts", "sh", "-c",
                 f'hostname {TAG}mpirun; exec "$@"', "sh"]
        ranks = str(a.hosts * a.per_host)
        if flavour == "openmpi":
            hostfile = Path(tmp) / "hosts"
            hostfile.write_text("".join(f"{address(i)} slots={a.per_host}\n"
                                        for i in range(a.hosts)))
            argv = [*first, "mpirun.openmpi", "--allow-run-as-root", "--oversubscribe",
                    "--bind-to", "none", "-np", ranks, "--hostfile", str(hostfile),
                    "--mca", "plm_rsh_agent", str(agent), "--mca", "pml", "ob1",
                    "--mca", "btl", "tcp,vader,self", "--mca", "btl_tcp_if_include",
                    "198.18.1.0/24", "--mca", "oob_tcp_if_include", "198.18.1.0/24",
                    str(exe), *perf_args]
        else:
            # Hydra with its ssh launcher run through the agent; the proxies reach mpiexec at
            # the first host's address; UCX (MPICH's ch4 device here) uses TCP between hosts
            # (the only device besides loopback in each namespace) and shared memory within.
            hosts = ",".join(f"{address(i)}:{a.per_host}" for i in range(a.hosts))
            argv = [*first, "mpirun.mpich", "-launcher", "ssh", "-launcher-exec", str(agent),
                    "-localhost", address(0), "-hosts", hosts, "-n", ranks,
                    "-genv", "UCX_TLS", "tcp,sm,self", str(exe), *perf_args]
        # mpi_perf takes one collective at a time.
        found = []
        for op in OPS.split(","):
            r = subprocess.run([*argv, "--coll", op], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, timeout=timeout,
                               env=clean_env())
            if r.returncode != 0:
                said = [x for x in (r.stderr + r.stdout).splitlines()
                        if x.strip() and not x.startswith("---")]
                raise RuntimeError(f"mpirun.{flavour} ({op}) exited {r.returncode}: "
                                   f"{' / '.join(said[-3:])}")
            found += rows_of(r.stdout)
        return found


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hosts", type=int, default=16)
    p.add_argument("--per-host", type=int, default=4)
    p.add_argument("-b", dest="min_bytes", default="8")
    p.add_argument("-e", dest="max_bytes", default="1M")
    p.add_argument("-f", dest="factor", default="128")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--out-dir", type=Path, default=REPO / "docs")
    p.add_argument("--corocollrun", default=str(REPO / "build-release/tools/corocollrun"))
    p.add_argument("--coll-perf", default=str(REPO / "build-release/benchmarks/coll_perf"))
    p.add_argument("--probe", default=str(REPO / "build-release/benchmarks/startup_probe"))
    p.add_argument("--build-dir", default="/tmp/corocoll-compare")
    p.add_argument("--mpis", default="openmpi,mpich",
                   help="the MPIs to run beside corocoll, of openmpi and mpich")
    a = p.parse_args()
    if os.geteuid() != 0:
        print("netns_hosts: making network namespaces needs root", file=sys.stderr)
        return 1
    ranks = a.hosts * a.per_host
    perf_args = ["--coll", OPS, "-b", a.min_bytes, "-e", a.max_bytes, "-f", a.factor,
                 "-n", str(a.iters), "-w", "3", "-c", "1"]
    make_hosts(a.hosts)
    try:
        took, start, outs = corocoll_job(a, [a.probe])
        text = "".join(outs)
        done = [int(ns) for _, ns in DONE.findall(text)]
        conns = [(int(n), int(seg) + int(arena)) for _, n, _, seg, arena in
                 CONNECTIONS.findall(text)]
        if len(done) != ranks or len(conns) != ranks:
            raise RuntimeError(f"startup_probe: {len(done)} of {ranks} ranks reported")
        startup = ((max(done) - start) / 1e9, statistics.median(c[0] for c in conns),
                   max(c[0] for c in conns), statistics.median(c[1] for c in conns) / 1024)
        print(f"corocoll start-up: {startup[0] * 1e3:.0f} ms, connections per rank "
              f"{startup[1]:g} (max {startup[2]}), shared memory {startup[3]:.1f} MiB", flush=True)
        _, _, outs = corocoll_job(a, [a.coll_perf, "-d", "float", "-o", "sum", "-F", "json",
                                      *perf_args])
        ours = rows_of("".join(outs))
        theirs, notes = {}, {}
        for flavour in a.mpis.split(","):
            try:
                theirs[flavour] = mpi_job(a, flavour,
                                          [x for x in perf_args if x != OPS and x != "--coll"])
            except (RuntimeError, subprocess.TimeoutExpired, subprocess.CalledProcessError) as e:
                theirs[flavour], notes[flavour] = [], str(e).splitlines()[0][:200]
                print(f"{NAMES[flavour]}: {notes[flavour]}", flush=True)
    finally:
        remove_hosts(a.hosts)

    m = machine()
    out = [BEGIN_MARK, "<!-- Written by benchmarks/compare/netns_hosts.py; edits here are "
           "overwritten. -->", "",
           f"### {ranks} ranks on {a.hosts} hosts of network namespaces ({a.per_host} per host)",
           "", f"Machine: {m['cpu']}, {m['cpus']} CPUs ({m['caches']}), Linux {m['kernel']}; "
           f"measured {m['date']}; corocoll {m['corocoll_commit']}.", "",
           "Reproduce from the repository root (as root):", "", "```sh",
           shlex.join([sys.executable, "benchmarks/compare/netns_hosts.py", "--hosts",
                       str(a.hosts), "--per-host", str(a.per_host), "-b", a.min_bytes, "-e",
                       a.max_bytes, "-f", a.factor, "--iters", str(a.iters)]), "```", "",
           f"Each host is a network namespace joined to a bridge by a veth pair (198.18.1.x); "
           f"all {ranks} ranks share the machine's {m['cpus']} CPUs. corocoll: one corocollrun "
           "per host; within a host ranks share memory, between hosts TCP; the collectives are "
           "chosen automatically (hierarchical across hosts). Open MPI: mpirun.openmpi with a "
           "host file of the hosts' addresses and a launch agent that starts each host's daemon "
           "in its namespace, btl tcp,vader,self. MPICH (ch4:ucx): mpirun.mpich with the same "
           "agent as hydra's ssh, the hosts' addresses, UCX_TLS=tcp,sm,self. Times: coll_perf's (mean per iteration, "
           f"largest over the ranks), {a.iters} iterations.", "",
           f"Start-up (startup_probe: the first launcher's start to the last rank's first "
           f"all_reduce done): {startup[0] * 1e3:,.0f} ms; connections per rank, median "
           f"{startup[1]:g}, largest {startup[2]}; shared memory per rank {startup[3]:.1f} MiB "
           "(COROCOLL_CONNECT as the environment says: on first use unless set).", ""]
    for flavour, note in notes.items():
        out += [f"{NAMES[flavour]} did not run: {note}", ""]
    flavours = list(theirs)
    out += ["| op | size | corocoll µs |" +
            "".join(f" {NAMES[f]} µs | corocoll ÷ {NAMES[f]} |" for f in flavours),
            "|---|---:|---:|" + "---:|---:|" * len(flavours)]
    peers = {f: {(r["op"], r["size"]): r for r in rows} for f, rows in theirs.items()}
    for r in ours:
        wrong = "" if r["wrong"] == 0 else f" ({r['wrong']} wrong)"
        line = f"| {r['op']} | {r['size']:,} | {r['time_us']:,.1f}{wrong} | "
        for f in flavours:
            q = peers[f].get((r["op"], r["size"]))
            mpi = f"{q['time_us']:,.1f}" if q else "–"
            ratio = f"{r['time_us'] / q['time_us']:.3g}" if q and q["time_us"] > 0 else "–"
            line += f"{mpi} | {ratio} | "
        out.append(line.rstrip())
    out += ["", END_MARK]
    write_markdown(a.out_dir / "performance.md", "\n".join(out), BEGIN_MARK, END_MARK)
    print(f"netns_hosts: wrote {a.out_dir / 'performance.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
