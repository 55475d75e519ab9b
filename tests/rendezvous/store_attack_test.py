#!/usr/bin/env python3
"""The store server in a process of its own, under attack, serving a client in another process.

    store_attack_test.py STORE_TOOL [--fuzz-seconds S] [--latency-ms MS] [--rss-mib MIB]
                                    [--corpus DIR]

STORE_TOOL is tests/rendezvous/store_tool; `store_tool serve` runs corocoll's tcp_store_server
on 127.0.0.1:0 until its standard input closes. Everything here speaks torch's TCPStore wire
format with raw sockets, so it checks any commit that has store_tool (27d0911 included).

In this order, each attack staying in place for the next:
  1. ADD up to INT64_MAX, then past it: the reply is never a wrapped number.
  2. 300 abandoned WAITs (their clients connect, wait for missing keys, one in three for two
     keys, and go away); their descriptors return to the server.
  3. Ten SETs each announcing a 1 GiB value and sending nothing more, left open.
  4. Fuzzing: four threads send mutated copies of the store corpus on fresh connections.
  5. While 3 and 4 go on, a legitimate client in another process makes 100 set/get round trips.
Then every attacker goes away, and the server must be back to its baseline of descriptors; its
peak resident memory must stay under the bound; closing its standard input must stop it with
exit code 0 with a WAIT for two missing keys still parked (under ASan, a freed waiter read at
shutdown fails that).

What is asserted is what the server did: round trips answered (100 of 100, each within the
client's 10 s socket deadline), descriptors, resident memory, exit code, ADD's replies. The
latency of each round trip is printed; --latency-ms turns a bound on it into a check, for a
quiet machine (the default, 0, checks none).
"""

import argparse
import json
import os
import random
import socket
import struct
import subprocess
import sys
import threading
import time

SET, COMPARE_SET, GET, ADD, CHECK, WAIT = 0, 1, 2, 3, 4, 5
INT64_MAX = 2**63 - 1


def u64(v):
    return struct.pack("<Q", v)


def text(s):
    b = s.encode() if isinstance(s, str) else s
    return u64(len(b)) + b


def connect(port, timeout=10.0):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def recv_exact(s, n):
    out = b""
    while len(out) < n:
        got = s.recv(n - len(out))
        if not got:
            raise ConnectionError(f"the server closed the connection after {len(out)} of {n} bytes")
        out += got
    return out


def proc_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def proc_status(pid, field):
    """A /proc/<pid>/status field in KiB (VmRSS, VmHWM)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def eventually(check, tries=2000, pause=0.005):
    """Polls `check` at most `tries` times; its last value."""
    for _ in range(tries):
        value = check()
        if value:
            return value
        time.sleep(pause)
    return check()


def sanitized(binary):
    """True when the binary carries a sanitizer runtime (its memory use is not the server's own):
    g++ links libasan/libtsan, clang links its runtime in (its entry points in the binary)."""
    out = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
    if "libasan" in out or "libtsan" in out:
        return True
    with open(binary, "rb") as f:
        image = f.read()
    return b"__asan_init" in image or b"__tsan_init" in image


# --- the legitimate client, run as a process of its own -------------------------------------

def legitimate_client(port, rounds):
    """`rounds` set/get round trips on one connection; prints a JSON list of latencies (ms)."""
    s = connect(port)
    latencies = []
    for i in range(rounds):
        key, value = f"legit/{i}", f"value-{i}-" + "x" * (i % 50)
        start = time.monotonic()
        s.sendall(bytes([SET]) + text(key) + text(value))
        s.sendall(bytes([GET]) + text(key))
        (n,) = struct.unpack("<Q", recv_exact(s, 8))
        got = recv_exact(s, n).decode()
        latencies.append((time.monotonic() - start) * 1000.0)
        if got != value:
            raise SystemExit(f"legitimate client: round trip {i} read {got!r}, wrote {value!r}")
    s.close()
    print(json.dumps(latencies))


# --- attackers ------------------------------------------------------------------------------

def corpus_streams(directory):
    """The store corpus' client byte streams (each file's first byte seeds the fuzz targets'
    cutting; the rest is what a client sends)."""
    streams = []
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            data = f.read()
        if len(data) > 1:
            streams.append(data[1:])
    return streams


def mutate(rng, seeds):
    data = bytearray(rng.choice(seeds))
    for _ in range(rng.randint(1, 8)):
        kind = rng.randrange(6)
        if kind == 0 and data:
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif kind == 1:
            data.insert(rng.randrange(len(data) + 1), rng.randrange(256))
        elif kind == 2 and data:
            del data[rng.randrange(len(data))]
        elif kind == 3:  # splice another seed in
            other = rng.choice(seeds)
            data[rng.randrange(len(data) + 1):] = other[rng.randrange(len(other) + 1):]
        elif kind == 4 and len(data) >= 8:  # an interesting length where one might be
            at = rng.randrange(len(data) - 7)
            data[at:at + 8] = u64(rng.choice([0, 1, 255, 4096, 2**20, 2**30, 2**40, 2**63,
                                              2**64 - 1]))
        else:
            data += bytes(rng.randrange(256) for _ in range(rng.randrange(1, 32)))
    return bytes(data)


class fuzzers:
    def __init__(self, port, seeds, threads=4, seed=1):
        self.port, self.seeds = port, seeds
        self.stop = threading.Event()
        self.inputs = 0
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(seed + i,), daemon=True)
                        for i in range(threads)]
        for t in self.threads:
            t.start()

    def run(self, seed):
        rng = random.Random(seed)
        while not self.stop.is_set():
            data = mutate(rng, self.seeds)
            try:
                s = connect(self.port, timeout=0.005)
                cut = 0
                while cut < len(data):  # in pieces, as a socket may deliver it
                    step = rng.randint(1, max(1, len(data) - cut))
                    s.sendall(data[cut:cut + step])
                    cut += step
                try:
                    s.recv(4096)  # whatever comes back within the socket's bound
                except OSError:
                    pass
                s.close()
            except OSError:
                pass
            with self.lock:
                self.inputs += 1

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join()


failures = []


def check(ok, what):
    """Records a failed check and goes on, so that one run shows every finding."""
    if not ok:
        failures.append(what)
        print("FAIL: " + what, flush=True)
    return ok


def alive(server, stage):
    return check(server.poll() is None, f"the server died during {stage}: exit {server.poll()}")


def report_latencies(latencies, inputs, inputs_during_client, bound_ms):
    check(len(latencies) == 100, f"{len(latencies)} of 100 round trips")
    ordered = sorted(latencies)
    print(f"legitimate client (pid of its own): {len(latencies)} of 100 set/get round trips under "
          f"{inputs} fuzzed inputs ({inputs_during_client} by the client's end), 300 abandoned "
          f"WAITs and ten 1 GiB announcements; latency ms: median {ordered[len(ordered) // 2]:.3f}, "
          f"p99 {ordered[len(ordered) * 99 // 100 - 1]:.3f}, max {ordered[-1]:.3f}")
    print("latencies ms: " + " ".join(f"{v:.2f}" for v in latencies))
    if bound_ms > 0:
        slow = [v for v in latencies if v > bound_ms]
        check(not slow, f"{len(slow)} round trips over {bound_ms} ms: {slow}")


def add_past_the_end(port):
    with connect(port) as s:
        s.sendall(bytes([ADD]) + text("counter") + struct.pack("<q", INT64_MAX - 1))
        (first,) = struct.unpack("<q", recv_exact(s, 8))
        check(first == INT64_MAX - 1, f"ADD to INT64_MAX-1 replied {first}")
        s.sendall(bytes([ADD]) + text("counter") + struct.pack("<q", 5))
        try:
            reply = s.recv(8)
        except OSError:
            reply = b""
        if len(reply) == 8:
            (wrapped,) = struct.unpack("<q", reply)
            check(False, f"ADD past INT64_MAX replied {wrapped} (the counter wrapped)")
        else:
            print("ADD past INT64_MAX: refused (the connection closed), nothing wrapped")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("store_tool")
    ap.add_argument("--client", type=int, help=argparse.SUPPRESS)  # run as the client: PORT
    ap.add_argument("--fuzz-seconds", type=float, default=3.0,
                    help="fuzzing before the client starts (default 3)")
    ap.add_argument("--latency-ms", type=float, default=0.0,
                    help="check every round trip against this bound (default: none)")
    ap.add_argument("--rss-mib", type=float, default=64.0,
                    help="bound on the server's peak resident memory (skipped under sanitizers)")
    ap.add_argument("--corpus", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                     "..", "fuzz", "corpus", "store_protocol"))
    ap.add_argument("--no-add", action="store_true",
                    help="leave out stage 1 (to reach the later stages on an old build whose "
                         "UBSan stops the server at the overflow)")
    args = ap.parse_args()
    if args.client is not None:
        legitimate_client(args.client, 100)
        return False

    server = subprocess.Popen([args.store_tool, "serve"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        first = server.stdout.readline().split()
        check(len(first) == 2 and first[0] == "PORT", f"store_tool serve printed {first}")
        port, pid = int(first[1]), server.pid
        baseline_fds = proc_fds(pid)
        print(f"server pid {pid} on port {port}: {baseline_fds} descriptors, "
              f"{proc_status(pid, 'VmRSS')} KiB resident")

        # 1. ADD to INT64_MAX, then past it.
        if not args.no_add:
            add_past_the_end(port)
            if not alive(server, "ADD"):
                raise SystemExit(1)

        # A WAIT for two missing keys that stays parked until the server stops.
        parked = connect(port)
        parked.sendall(bytes([WAIT]) + u64(2) + text("never/a") + text("never/b"))

        # 2. 300 abandoned WAITs.
        for i in range(300):
            try:
                with connect(port) as s:
                    keys = [f"missing/{i}"] + ([f"missing/{i}/b"] if i % 3 == 0 else [])
                    s.sendall(bytes([WAIT]) + u64(len(keys)) + b"".join(text(k) for k in keys))
            except OSError as e:
                check(False, f"abandoned WAIT {i}: {e}")
                break
        if not alive(server, "the abandoned WAITs"):
            raise SystemExit(1)
        back = eventually(lambda: proc_fds(pid) <= baseline_fds + 1)
        print(f"300 abandoned WAITs: server at {proc_fds(pid)} descriptors "
              f"(baseline {baseline_fds}, plus one parked WAIT)")
        check(back, f"the abandoned WAITs kept their descriptors: {proc_fds(pid)} open, "
                    f"baseline {baseline_fds} plus one")

        # 3. Ten 1 GiB announcements, left open.
        announcers = []
        for i in range(10):
            s = connect(port)
            s.sendall(bytes([SET]) + text(f"big/{i}") + u64(1 << 30))
            announcers.append(s)
            rss = proc_status(pid, "VmRSS")
            if not check(sanitized(args.store_tool) or rss <= args.rss_mib * 1024,
                         f"after {i + 1} announcement(s) of 1 GiB the server holds {rss} KiB "
                         "resident"):
                break  # one is enough to show it; ten would take 10 GiB

        # 4. Fuzzing, then 5. the legitimate client while it goes on.
        seeds = corpus_streams(args.corpus)
        check(len(seeds) > 0, f"no corpus in {args.corpus}")
        fuzz = fuzzers(port, seeds)
        time.sleep(args.fuzz_seconds)
        client = subprocess.run([sys.executable, os.path.abspath(__file__), args.store_tool,
                                 "--client", str(port)], capture_output=True, text=True,
                                timeout=300)
        inputs_during_client = fuzz.inputs
        fuzz.finish()
        if check(client.returncode == 0, f"the legitimate client failed (exit "
                 f"{client.returncode}): {client.stderr.strip()[-400:]}"):
            report_latencies(json.loads(client.stdout), fuzz.inputs, inputs_during_client,
                             args.latency_ms)

        # Everybody goes away but the parked WAIT: descriptors back to the baseline.
        for s in announcers:
            s.close()
        back = eventually(lambda: proc_fds(pid) <= baseline_fds + 1)
        peak = proc_status(pid, "VmHWM")
        print(f"after the attack: {proc_fds(pid)} descriptors (baseline {baseline_fds} plus the "
              f"parked WAIT), peak resident {peak} KiB"
              + (" (sanitizer build: not checked)" if sanitized(args.store_tool) else
                 f" (bound {args.rss_mib:.0f} MiB)"))
        check(back, f"descriptors did not return: {proc_fds(pid)}, baseline {baseline_fds}")
        check(sanitized(args.store_tool) or peak <= args.rss_mib * 1024,
              f"peak resident memory {peak} KiB over {args.rss_mib} MiB")

        # The server stops with the WAIT still parked.
        server.stdin.close()
        code = server.wait(timeout=60)
        parked.close()
        check(code == 0, f"store_tool serve exited with {code} when stopped with a parked WAIT")
        return True
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


if __name__ == "__main__":
    try:
        served = main()
    finally:
        if failures:
            print(f"store_attack_test: {len(failures)} check(s) failed")
    if failures:
        sys.exit(1)
    if served:
        print("store_attack_test: all checks passed")
