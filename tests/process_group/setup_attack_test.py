#!/usr/bin/env python3
"""Set-up against careless launches and strangers, through processes and raw sockets only.

    setup_attack_test.py LAUNCHER_WORKER STORE_TOOL [CASE ...]

LAUNCHER_WORKER is tests/launcher/launcher_worker; its `collectives` mode runs cc::run with
the launcher's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), all_reduces and
broadcasts. Nothing here uses corocoll's C++ API, so the same checks run against any commit
that has launcher_worker and store_tool (27d0911 included). Each case bounds every process by BOUND seconds
and kills what is left: a rank that is still waiting then is a failure ("hung"), not a pass.

Cases (all by default):
  duplicate_rank     RANK 0, 1, 1 with WORLD_SIZE 2 on a store that outlives them (store_tool
                     serve, as torchrun's agent store): no process hangs; each one either
                     completes or names rank 1 as claimed twice, and at least one names it.
  duplicate_late     the same store, RANK 0 and 1 run the job to its end, then another RANK 1
                     comes: it ends (not after COROCOLL_TIMEOUT's 20 s) naming rank 1 as
                     claimed twice, though the first holder has left and removed its claim.
  world_size         WORLD_SIZE 2 on rank 0 and 3 on rank 1: both end naming both sizes.
  not_a_store        MASTER_PORT is a server that answers like HTTP: rank 1 says it is not a
                     store.
  bad_algorithm      COROCOLL_ALGORITHM=bogus: both ranks exit with code 1 and a message that
                     names the variable (not SIGABRT).
  timeout_env        COROCOLL_TIMEOUT=3 with rank 1 never started: rank 0 ends with an error
                     naming rank 1.
  job_token          COROCOLL_JOB_TOKEN the same on both ranks: the job runs (rank 0's store
                     asks every client for the token, the mesh both ends); a different one
                     on rank 1: it is refused, saying that the token differs. In a build
                     without libcrypto (COROCOLL_TEST_TOKEN_AUTH=0): every rank refuses the
                     token, saying why.

Strangers on a rank's mesh port and a forged mesh address are tests/transport/mesh_test.cpp's:
from outside, a stranger cannot be put reliably between the roll call and rank 1's connect.
"""

import os
import socket
import subprocess
import sys
import threading
import time

BOUND = 45.0  # seconds any process of a case may run (COROCOLL_TIMEOUT is 20 where honoured)


def reserved_port():
    """A loopback port held by a bound, not listening socket (SO_REUSEADDR): corocoll's listener
    may take it; no other process can."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    return s, s.getsockname()[1]


class ranks:
    """Processes of launcher_worker `collectives`, each with its own environment."""

    def __init__(self, worker, port, specs, extra=None):
        self.procs = []
        for spec in specs:
            env = dict(os.environ)
            env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                        "COROCOLL_TIMEOUT": "20", "LOCAL_RANK": "0"})
            env.update(extra or {})
            env.update({k: str(v) for k, v in spec.items()})
            self.procs.append(subprocess.Popen([worker, "collectives"], env=env,
                                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                               text=True))
        self.start = time.monotonic()

    def finish(self):
        """[(exit code or 'hung', stdout, stderr)] once each ended or BOUND passed."""
        results = []
        for p in self.procs:
            left = max(0.1, BOUND - (time.monotonic() - self.start))
            try:
                out, err = p.communicate(timeout=left)
                results.append((p.returncode, out, err))
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
                results.append(("hung", out, err))
        return results


failures = []


def expect(ok, what, results=None):
    if ok:
        return
    detail = ""
    for i, (code, out, err) in enumerate(results or []):
        detail += f"\n    process {i}: exit {code}; stderr: {err.strip()[-600:]!r}"
    failures.append(what + detail)
    print("FAIL: " + what + detail)


def ended_with_error(results):
    return all(code not in (0, "hung") for code, _, _ in results)


def case_duplicate_rank(worker, store_tool):
    # A store that outlives the ranks, so that the process that comes second learns why even
    # when the other two have finished the job by then.
    store = subprocess.Popen([store_tool, "serve"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        port = int(store.stdout.readline().split()[1])
        agent = {"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "0"}
        r = ranks(worker, port, [{"RANK": 0, "WORLD_SIZE": 2}, {"RANK": 1, "WORLD_SIZE": 2},
                                 {"RANK": 1, "WORLD_SIZE": 2}], agent).finish()
    finally:
        store.stdin.close()
        store.wait()
    named = [err for code, _, err in r if "rank 1 was claimed by two processes" in err]
    expect(all(code != "hung" for code, _, _ in r), "duplicate_rank: no process hangs", r)
    expect(all(code == 0 or "rank 1 was claimed by two processes" in err for code, _, err in r),
           "duplicate_rank: a process that fails names rank 1 as claimed twice", r)
    expect(len(named) >= 1, "duplicate_rank: at least one process names the duplicate", r)


def case_duplicate_late(worker, store_tool):
    store = subprocess.Popen([store_tool, "serve"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        port = int(store.stdout.readline().split()[1])
        agent = {"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "0"}
        first = ranks(worker, port, [{"RANK": 0, "WORLD_SIZE": 2},
                                     {"RANK": 1, "WORLD_SIZE": 2}], agent).finish()
        late = ranks(worker, port, [{"RANK": 1, "WORLD_SIZE": 2}],
                     dict(agent, COROCOLL_TIMEOUT="40")).finish()
    finally:
        store.stdin.close()
        store.wait()
    expect(all(code == 0 for code, _, _ in first), "duplicate_late: the job itself runs", first)
    expect(late[0][0] not in (0, "hung") and "rank 1 was claimed by two processes" in late[0][2],
           "duplicate_late: the late RANK 1 names rank 1 as claimed twice", late)
    expect("timeout" not in late[0][2], "duplicate_late: not by waiting out its timeout", late)


def case_world_size(worker, store_tool):
    hold, port = reserved_port()
    with hold:
        r = ranks(worker, port, [{"RANK": 0, "WORLD_SIZE": 2},
                                 {"RANK": 1, "WORLD_SIZE": 3}]).finish()
    expect(ended_with_error(r), "world_size: both ranks end with an error", r)
    expect(all("world size 2" in err and "world size 3" in err for _, _, err in r),
           "world_size: both ranks name both sizes", r)


def case_not_a_store(worker, store_tool):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    stop = threading.Event()

    def http_like():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                c, _ = listener.accept()
            except OSError:
                continue
            try:
                c.settimeout(0.5)
                try:
                    c.recv(4096)
                except OSError:
                    pass
                c.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            except OSError:
                pass
            c.close()

    t = threading.Thread(target=http_like, daemon=True)
    t.start()
    r = ranks(worker, port, [{"RANK": 1, "WORLD_SIZE": 2}]).finish()
    stop.set()
    t.join()
    listener.close()
    expect(ended_with_error(r), "not_a_store: rank 1 ends with an error", r)
    expect("is not a store" in r[0][2], "not_a_store: rank 1 says the port is not a store", r)


def case_bad_algorithm(worker, store_tool):
    hold, port = reserved_port()
    with hold:
        r = ranks(worker, port, [{"RANK": 0, "WORLD_SIZE": 2}, {"RANK": 1, "WORLD_SIZE": 2}],
                  {"COROCOLL_ALGORITHM": "bogus"}).finish()
    expect(all(code == 1 for code, _, _ in r), "bad_algorithm: both ranks exit with code 1", r)
    expect(all("COROCOLL_ALGORITHM" in err for _, _, err in r),
           "bad_algorithm: both ranks name COROCOLL_ALGORITHM", r)


def case_timeout_env(worker, store_tool):
    hold, port = reserved_port()
    with hold:
        r = ranks(worker, port, [{"RANK": 0, "WORLD_SIZE": 2}], {"COROCOLL_TIMEOUT": "3"}).finish()
    expect(ended_with_error(r), "timeout_env: rank 0 ends with an error within COROCOLL_TIMEOUT", r)
    expect("rank(s) 1" in r[0][2] or "rank 1" in r[0][2], "timeout_env: rank 0 names rank 1", r)


def case_job_token(worker, store_tool):
    if os.environ.get("COROCOLL_TEST_TOKEN_AUTH") == "0":
        # A build without libcrypto: every rank refuses the token before the store, saying
        # why (not a reset connection from a store whose rank 0 left).
        hold, port = reserved_port()
        with hold:
            r = ranks(worker, port, [{"RANK": 0, "WORLD_SIZE": 2}, {"RANK": 1, "WORLD_SIZE": 2}],
                      {"COROCOLL_JOB_TOKEN": "job-token-3f9c1e7a"}).finish()
        expect(all(code == 1 and "COROCOLL_JOB_TOKEN is set, but this build of corocoll has no "
                   "libcrypto" in err for code, _, err in r),
               "job_token: without libcrypto every rank refuses the token, saying why", r)
        return
    hold, port = reserved_port()
    with hold:
        r = ranks(worker, port, [{"RANK": 0, "WORLD_SIZE": 2}, {"RANK": 1, "WORLD_SIZE": 2}],
                  {"COROCOLL_JOB_TOKEN": "job-token-3f9c1e7a"}).finish()
    expect(all(code == 0 and "broadcast ok" in out for code, out, _ in r),
           "job_token: both ranks complete with the same token", r)
    hold, port = reserved_port()
    with hold:
        r = ranks(worker, port, [{"RANK": 0, "WORLD_SIZE": 2, "COROCOLL_JOB_TOKEN": "one-token"},
                                 {"RANK": 1, "WORLD_SIZE": 2, "COROCOLL_JOB_TOKEN": "another"}],
                  {"COROCOLL_TIMEOUT": "5"}).finish()
    expect(ended_with_error(r), "job_token: ranks with different tokens end with an error", r)
    expect("did not prove" in r[1][2] and "COROCOLL_JOB_TOKEN" in r[1][2],
           "job_token: rank 1 hears that its token differs", r)


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    worker, store_tool = sys.argv[1], sys.argv[2]
    chosen = sys.argv[3:] or list(CASES)
    for name in chosen:
        before = len(failures)
        CASES[name](worker, store_tool)
        print(f"{name}: {'ok' if len(failures) == before else 'FAILED'}", flush=True)
    if failures:
        raise SystemExit(f"setup_attack_test: {len(failures)} check(s) failed")
    print("setup_attack_test: all checks passed")


if __name__ == "__main__":
    main()
