#!/usr/bin/python3
"""torch's TCPStore against corocoll's store, both ways: Debian's torch 1.13 here, torch 2.x
where it is installed (tools/device_check.sh runs it there).

  1. corocoll's tcp_store_server  <- torch's TCPStore client (and corocoll's client beside it)
  2. torch's TCPStore server      <- corocoll's tcp_store client; with torch's libuv server
     and again with its legacy one where torch has both (use_libuv, torch >= 2.3 or so)

In each case torch sets some keys, store_tool's client checks them and sets its own, torch
blocks in get() until the client sets a key late, and checks what the client left.
Usage: torch_interop_test.py <path to store_tool>. Exits 77 (skip) when torch is missing.
"""
import subprocess
import sys
from datetime import timedelta

try:
    import torch.distributed as dist
except ImportError as e:  # python3-torch not installed
    print(f"SKIP: torch is not importable ({e})")
    sys.exit(77)

TOOL = sys.argv[1]
TIMEOUT = timedelta(seconds=20)


def exercise(store, port, label):
    store.set("from_torch", "hello-cpp")
    assert store.add("counter", 5) == 5
    store.set("to_delete", "bye")
    client = subprocess.Popen([TOOL, "client", str(port)])
    try:
        # Blocks until the C++ client sets it, about 200 ms from now.
        assert store.get("late") == b"finally", "late"
        assert store.get("from_cpp") == b"hello-torch", "from_cpp"
        assert store.get("binary") == b"\x00\x01\x02\xff", "binary"
        assert store.get("counter") == b"12", "counter"
        assert store.get("cas") == b"x", "cas"
        assert store.compare_set("cas", "x", "torch") == b"torch", "compare_set"
        assert store.add("counter", 0) == 12
        assert store.num_keys() >= 6
        store.set("torch_done", "1")
        rc = client.wait(timeout=30)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
    assert rc == 0, f"store_tool client exited with {rc}"
    print(f"ok: {label}")


def main():
    # 1. Our server, torch's client.
    server = subprocess.Popen([TOOL, "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        line = server.stdout.readline()
        assert line.startswith("PORT "), f"store_tool serve said {line!r}"
        port = int(line.split()[1])
        store = dist.TCPStore("127.0.0.1", port, None, False, TIMEOUT,
                              wait_for_workers=False)
        exercise(store, port, "corocoll server <- torch client")
        del store
    finally:
        server.stdin.close()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    assert server.returncode == 0, f"store_tool serve exited with {server.returncode}"

    # 2. torch's server(s), our client.
    import torch
    print(f"torch {torch.__version__}")
    servers = [("torch server", {})]
    try:
        probe = dist.TCPStore("127.0.0.1", 0, None, True, TIMEOUT, wait_for_workers=False,
                              use_libuv=False)
        del probe
        servers = [("torch libuv server", {"use_libuv": True}),
                   ("torch legacy server", {"use_libuv": False})]
    except TypeError:  # no use_libuv: one server
        pass
    for label, kwargs in servers:
        master = dist.TCPStore("127.0.0.1", 0, None, True, TIMEOUT, wait_for_workers=False,
                               **kwargs)
        exercise(master, master.port, f"{label} <- corocoll client")
        del master
    print(f"{1 + len(servers)} passed, 0 failed")


if __name__ == "__main__":
    main()
