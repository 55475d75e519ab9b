#!/usr/bin/python3
"""torch's own distributed test suite (torch.testing._internal.distributed.distributed_test,
what torch's test/distributed/test_distributed_spawn.py runs) on a backend of ours or Gloo's,
WORLD_SIZE ranks per test, file:// initialisation, CPU tensors.

  distributed_suite.py --backend corocoll|gloo [--world-size 3] [--start spawn|fork]
                       [--only NAME,...]
                       [--expected FILE] [--report FILE]

Every test of the suite's class runs, each in a fresh set of ranks (spawned, as torch's suite
does, or with --start fork forked from this process, torch already imported: CI's subset);
the outcome of each (pass, skip and why, failure and its first line) is printed and, with
--report, written as JSON. With --expected (tests/torch/distributed_suite_expected.txt), a
failure listed there with its reason is an expected failure; any other failure, or a listed
test that passes, makes the exit code 1.

For --backend corocoll the suite's name gates are widened, not bypassed: many tests are
decorated `skip_if(BACKEND != "gloo")` for what Gloo does and NCCL does not (CPU tensors,
timeouts, sparse tensors, all_gather_coalesced, DDP on CPU), and all_to_all on CPU is gated on
"mpi" (Gloo has none); the suite's module sees BACKEND as a name that compares equal to
"gloo" and "mpi" as well as to "corocoll", while every group is made by
init_process_group("corocoll") (torch's registry of plugin backends), so every test runs on
corocoll. Checks of the backend's name itself (get_backend() == "gloo", monitored_barrier's
refusal of other backends, isinstance(ProcessGroupGloo)) then fail for what they are; the
expected list names them.

torch 1.13's test utilities import expecttest, which Debian lacks: suite_support/ holds a
stand-in whose one method skips (the distributed tests never call it). Exit 77 (skip) without
torch or, for corocoll, corocoll_torch.
"""

import argparse
import json
import os
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "suite_support"))


class BackendName(str):
    """corocoll's name, which also compares equal to "gloo" and "mpi" and hashes as "gloo":
    the suite's gates for what the CPU backends do (`BACKEND != "gloo"`, `BACKEND in
    {"nccl", "gloo"}`, `BACKEND != "mpi"` for all_to_all on CPU, which Gloo lacks) let the
    tests through, while init_process_group gets "corocoll" (`upper()`, `str(self)`)."""

    ANSWERS_FOR = ("gloo", "mpi")

    def __eq__(self, other):
        return str.__eq__(self, other) or other in self.ANSWERS_FOR

    def __ne__(self, other):
        return not self.__eq__(other)

    def __hash__(self):
        return hash("gloo")

    def lower(self):
        return self

    def upper(self):
        return str.upper(str(self))


def plain_backend_names(dist):
    """torch's own calls get the plain name "corocoll": init_process_group would take a name
    equal to "mpi" for MPI."""
    from torch.distributed import distributed_c10d as c10d

    def plain(fn):
        def call(*args, **kwargs):
            args = tuple(str(a) if isinstance(a, BackendName) else a for a in args)
            kwargs = {k: str(v) if isinstance(v, BackendName) else v for k, v in kwargs.items()}
            return fn(*args, **kwargs)
        return call

    for name in ("init_process_group", "new_group", "new_subgroups",
                 "new_subgroups_by_enumeration"):
        wrapped = plain(getattr(c10d, name))
        setattr(c10d, name, wrapped)
        setattr(dist, name, wrapped)


def load_suite(backend):
    """Imports torch's suite for `backend`; returns the test class to run. Runs at import in
    the parent and in every spawned rank (which imports this file as __mp_main__), so that
    the class is the same, module-level one in both."""
    os.environ["BACKEND"] = backend
    import torch
    import torch.distributed as dist  # noqa: F401

    if backend == "corocoll":
        import corocoll_torch  # noqa: F401 (registers the backend)
    from torch.testing._internal import common_distributed

    real_environ = os.environ
    if backend == "corocoll":
        # The suite reads BACKEND once, as it is imported, and its gates compare it then.
        os.environ = dict(real_environ, BACKEND=BackendName("corocoll"))
    try:
        from torch.testing._internal.distributed import distributed_test as dt
    finally:
        os.environ = real_environ
    torch.backends.cuda.matmul.allow_tf32 = False
    if backend == "corocoll":
        plain_backend_names(dist)

    class TestDistBackendWithSpawn(dt.TestDistBackend, dt.DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            if os.environ.get("COROCOLL_SUITE_START") == "fork":
                # Forked ranks start with torch and the suite imported (a spawned one imports
                # them again, seconds of a short test on a small machine).
                self._start_processes(torch.multiprocessing.get_context("fork").Process)
            else:
                self._spawn_processes()

    TestDistBackendWithSpawn.__qualname__ = "TestDistBackendWithSpawn"
    TestDistBackendWithSpawn.__module__ = __name__
    return TestDistBackendWithSpawn


SUITE_BACKEND = os.environ.get("COROCOLL_SUITE_BACKEND")
if SUITE_BACKEND:
    try:
        TestDistBackendWithSpawn = load_suite(SUITE_BACKEND)
    except ImportError as e:
        print(f"skip: {e}")
        sys.exit(77)


class Outcomes(unittest.TestResult):
    def __init__(self, out):
        super().__init__()
        self.out = out
        self.rows = {}
        self.began = 0.0

    def _name(self, test):
        return test.id().rsplit(".", 1)[-1]

    def startTest(self, test):  # noqa: N802 (unittest's name)
        super().startTest(test)
        self.began = time.monotonic()

    def _put(self, test, outcome, why=""):
        name = self._name(test)
        took = time.monotonic() - self.began
        self.rows[name] = {"outcome": outcome, "why": why, "seconds": round(took, 1)}
        line = f"{outcome:5} {name} ({took:.1f} s)" + (f": {why}" if why else "")
        print(line, file=self.out, flush=True)

    def addSuccess(self, test):  # noqa: N802
        self._put(test, "pass")

    def addSkip(self, test, reason):  # noqa: N802
        self._put(test, "skip", str(reason).splitlines()[0] if reason else "")

    def _first_line(self, err):
        """The exception itself: the last unindented line of a rank's traceback, else the
        message's first line."""
        lines = [line for line in str(err[1]).splitlines() if line.strip()]
        if any(line.startswith("Traceback") for line in lines):
            for line in reversed(lines):
                if not line[0].isspace() and not line.startswith(("Traceback", "During")):
                    return line.strip()[:300]
        return lines[0].strip()[:300] if lines else err[0].__name__

    def addFailure(self, test, err):  # noqa: N802
        self._put(test, "fail", self._first_line(err))

    def addError(self, test, err):  # noqa: N802
        self._put(test, "error", self._first_line(err))

    def addExpectedFailure(self, test, err):  # noqa: N802
        self._put(test, "xfail", self._first_line(err))

    def addUnexpectedSuccess(self, test):  # noqa: N802
        self._put(test, "pass")


def read_expected(path):
    """`name: reason` per line; # starts a comment."""
    expected = {}
    for line in open(path):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, reason = line.partition(":")
        expected[name.strip()] = reason.strip()
    return expected


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=("corocoll", "gloo"), required=True)
    ap.add_argument("--world-size", type=int, default=3)
    ap.add_argument("--start", choices=("spawn", "fork"), default="spawn",
                    help="how each test's ranks start (torch's suite spawns them)")
    ap.add_argument("--only", default="", help="comma-separated test names (default: all)")
    ap.add_argument("--expected", help="the expected failures, name: reason per line")
    ap.add_argument("--report", help="write every outcome here as JSON")
    ap.add_argument("--skip-unknown", action="store_true",
                    help="leave out --only names this torch's suite lacks (other releases)")
    args = ap.parse_args()

    os.environ["WORLD_SIZE"] = str(args.world_size)
    os.environ["COROCOLL_SUITE_START"] = args.start
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    temp = tempfile.TemporaryDirectory()
    os.environ["TEMP_DIR"] = temp.name
    if SUITE_BACKEND != args.backend:
        # The spawned ranks import this file again and must build the same class: run anew
        # with the backend in the environment they inherit.
        env = dict(os.environ, COROCOLL_SUITE_BACKEND=args.backend)
        os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), *sys.argv[1:]],
                  env)
    cls = TestDistBackendWithSpawn
    names = sorted(n for n in dir(cls) if n.startswith("test"))
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in names]
        if unknown and not args.skip_unknown:
            print(f"no such tests: {unknown}")
            return 2
        if unknown:
            print(f"not in this torch's suite, left out: {unknown}")
        names = [n for n in wanted if n in names]
    suite = unittest.TestSuite(cls(n) for n in names)
    result = Outcomes(sys.stdout)
    began = time.monotonic()
    suite.run(result)
    took = time.monotonic() - began

    counts = {}
    for row in result.rows.values():
        counts[row["outcome"]] = counts.get(row["outcome"], 0) + 1
    expected = read_expected(args.expected) if args.expected else {}
    failed = {n: r for n, r in result.rows.items() if r["outcome"] in ("fail", "error")}
    unexpected = sorted(n for n in failed if n not in expected)
    xfail = sorted(n for n in failed if n in expected)
    fixed = sorted(n for n in expected if n in result.rows and result.rows[n]["outcome"] == "pass")
    summary = {
        "backend": args.backend, "world_size": args.world_size, "tests": len(result.rows),
        "pass": counts.get("pass", 0), "skip": counts.get("skip", 0),
        "expected_failures": len(xfail), "unexpected_failures": len(unexpected),
        "listed_but_passed": fixed, "seconds": round(took),
    }
    if args.report:
        with open(args.report, "w") as f:
            json.dump({"summary": summary, "tests": result.rows}, f, indent=1, sort_keys=True)
    print(json.dumps(summary))
    for n in xfail:
        print(f"expected failure: {n}: {expected[n]}")
    for n in unexpected:
        print(f"UNEXPECTED FAILURE: {n}: {failed[n]['why']}")
    for n in fixed:
        print(f"listed as failing but passed (update the list): {n}")
    if args.expected and (unexpected or fixed):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
