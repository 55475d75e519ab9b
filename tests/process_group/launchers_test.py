#!/usr/bin/python3
"""The p2p_blocking example under the launchers people already use, unchanged:

  - Open MPI:   mpirun.openmpi -np 4, MASTER_ADDR/MASTER_PORT exported (OMPI_COMM_WORLD_*)
  - MPICH:      mpirun.mpich -np 4 (Hydra's PMI_RANK/PMI_SIZE)
  - torchrun:   Debian's torchrun 1.13 --no_python --nproc_per_node=4 (RANK/WORLD_SIZE, the
                agent's store through TORCHELASTIC_USE_AGENT_STORE)

Every launcher is kept on loopback. A launcher that is not installed is skipped; the test
fails if none could run. Usage: launchers_test.py <p2p_blocking> <launcher...>
(launcher: openmpi, mpich, torchrun).
"""
import os
import shutil
import socket
import subprocess
import sys

EXPECTED = ["Rank 0 has data 1", "Rank 1 has data 0", "Rank 2 has data 0", "Rank 3 has data 1"]
HERE = os.path.dirname(os.path.abspath(__file__))


def reserve_port():
    """A socket that holds a port on 127.0.0.1 for MASTER_PORT until it is closed.

    The launchers need MASTER_PORT before any rank runs. Bound with SO_REUSEADDR and not
    listening, the socket keeps the kernel from handing the port to anyone else, while rank 0's
    store (corocoll's and torch's both set SO_REUSEADDR) can still bind it; binding port 0 and
    closing at once would leave a window for another process to take it. The C++ tests do the
    same with tests/support/port.hpp.
    """
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    return s


def run(label, cmd, env=None):
    print(f"--- {label}: {' '.join(cmd)}", flush=True)
    try:
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=90)
    except subprocess.TimeoutExpired as e:
        print(e.stdout or "")
        print(f"FAIL {label}: timed out")
        return False
    print(p.stdout)
    missing = [line for line in EXPECTED if line not in p.stdout]
    if p.returncode != 0 or missing:
        print(f"FAIL {label}: exit code {p.returncode}, missing lines {missing}")
        return False
    print(f"ok {label}")
    return True


def main():
    prog = os.path.abspath(sys.argv[1])
    passed = failed = skipped = 0
    for launcher in sys.argv[2:]:
        env = dict(os.environ)
        for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(v, None)
        held = reserve_port()  # closed after the run, or when the next launcher's replaces it
        port = str(held.getsockname()[1])
        if launcher == "openmpi":
            mpirun = shutil.which("mpirun.openmpi")
            if mpirun is None:
                print("skip openmpi: mpirun.openmpi not installed")
                skipped += 1
                continue
            cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "4",
                   "--mca", "oob_tcp_if_include", "lo", "--mca", "btl_tcp_if_include", "lo",
                   "--mca", "btl", "self,tcp",
                   "-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={port}", prog]
        elif launcher == "mpich":
            mpirun = shutil.which("mpirun.mpich")
            if mpirun is None:
                print("skip mpich: mpirun.mpich not installed")
                skipped += 1
                continue
            cmd = [mpirun, "-np", "4", "-iface", "lo", "-genv", "MASTER_ADDR", "127.0.0.1",
                   "-genv", "MASTER_PORT", port, prog]
        elif launcher == "torchrun":
            try:
                import torch  # noqa: F401
            except ImportError:
                print("skip torchrun: torch not importable")
                skipped += 1
                continue
            cmd = [sys.executable, os.path.join(HERE, "torchrun_fixed.py"), "--nnodes=1",
                   "--nproc_per_node=4", "--master_addr=127.0.0.1", f"--master_port={port}",
                   "--no_python", prog]
            env["OMP_NUM_THREADS"] = "1"
        else:
            print(f"unknown launcher {launcher}")
            return 2
        ok = run(launcher, cmd, env)
        held.close()
        if ok:
            passed += 1
        else:
            failed += 1
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    if failed:
        return 1
    return 0 if passed else 77


if __name__ == "__main__":
    sys.exit(main())
