#!/usr/bin/env python3
"""What including corocoll costs a build: CPU seconds of the compiler (and linker), beside the
targets of issue 18.

Cases (each compiled --reps times; the table gives the smallest CPU time, user + system, of
the compiler driver and everything it ran, which a loaded machine inflates least):
  include_only   an empty main() that includes <corocoll/corocoll.hpp>, compiled (-c)
  all_reduce     benchmarks/compile_time/all_reduce_prog.cpp compiled and linked
  std_floor      an empty main() that includes only the standard and system headers that
                 corocoll's headers include: what no change to corocoll can go below
  library        src/corocoll.cpp compiled: what separate compilation costs once per build
                 (separate mode only)
Configurations: compiler, optimisation level and mode, e.g. g++:-O0, clang++:-O2,
g++:-O0:separate. The mode is header-only (the default: every translation unit compiles the
bodies it includes) or separate (COROCOLL_SEPARATE_COMPILATION: the translation units see
declarations, and the program links the bodies compiled once from src/corocoll.cpp, whose
one-time cost is the library row).

For g++ -O0 include_only it also reports the object's size and how many coroutine bodies
(".actor" clones) it holds: g++ 12 at -O0 emits every inline coroutine that a translation unit
defines, used or not, with everything it calls (docs/architecture.md, "Compile time").

usage: compile_time.py [--reps N] [--cases a,b] [--configs g++:-O0,g++:-O0:separate,...] [--json FILE]
                       [--check]
  --check   exit 1 unless every row was measured and every include_only object that should
            hold nothing of corocoll's (any mode but g++ -O0/-O1 header-only) defines no symbol
            of corocoll's namespace (CI's benchmarks suite runs two small rows)
"""

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INCLUDE = ROOT / "include"
PROG = ROOT / "benchmarks" / "compile_time" / "all_reduce_prog.cpp"
LIBRARY_SRC = ROOT / "src" / "corocoll.cpp"

# Issue 18's targets on this machine, CPU seconds (case, compiler, level), in either mode.
TARGETS = {
    ("include_only", "g++", "-O0"): 3.0,
    ("all_reduce", "g++", "-O0"): 6.0,
    ("all_reduce", "g++", "-O2"): 8.0,
}

CASES = ["include_only", "all_reduce", "std_floor", "library"]
MODES = ["header-only", "separate"]
DEFAULT_CONFIGS = ["g++:-O0", "g++:-Og", "g++:-O2", "clang++:-O0", "clang++:-O2",
                   "g++:-O0:separate", "g++:-O2:separate", "clang++:-O0:separate"]


def std_headers():
    """The <...> headers corocoll's own headers include, other than its own."""
    found = set()
    for path in (INCLUDE / "corocoll").rglob("*.hpp"):
        for line in path.read_text().splitlines():
            line = line.strip()
            if line.startswith("#include <") and not line.startswith("#include <corocoll/"):
                found.add(line[len("#include <"):].split(">")[0])
    return sorted(found)


def flags():
    """What `pkg-config --cflags --libs corocoll` gives an installed corocoll."""
    cflags = ["-std=c++20", f"-I{INCLUDE}"]
    libs = ["-luring", "-pthread"]
    if Path("/usr/include/openssl/hmac.h").exists():
        cflags.append("-DCOROCOLL_WITH_OPENSSL=1")
        libs.append("-lcrypto")
    return cflags, libs


def cpu_of(cmd):
    """Runs cmd; returns (CPU seconds of it and its descendants, wall seconds)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed:\n{done.stdout[-4000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall


def actors_in(obj):
    nm = shutil.which("nm")
    if not nm:
        return None
    out = subprocess.run([nm, obj], stdout=subprocess.PIPE, text=True, check=True).stdout
    return sum(1 for line in out.splitlines() if line.endswith(".actor"))


def library_object(compiler, level, cflags, work):
    """src/corocoll.cpp compiled once for (compiler, level): what a separate-mode program links."""
    obj = work / f"library{compiler}{level}.o"
    if not obj.exists():
        cpu_of([compiler, *cflags, level, "-c", str(LIBRARY_SRC), "-o", str(obj)])
    return obj


def corocoll_symbols(obj):
    """How many functions or data of corocoll's namespace the object defines (nm -C)."""
    nm = shutil.which("nm")
    if not nm:
        return None
    out = subprocess.run([nm, "-C", "--defined-only", obj], stdout=subprocess.PIPE, text=True,
                         check=True).stdout
    return sum(1 for line in out.splitlines() if "corocoll::" in line)


def holds_nothing_unused(compiler, level, mode):
    """Whether an empty program that includes corocoll must define nothing of corocoll's: true
    except for g++ at -O0/-O1 header-only, which outputs every inline coroutine (see the
    module's docstring)."""
    return mode == "separate" or not (compiler.startswith("g++") and level in ("-O0", "-O1"))


def measure(case, compiler, level, mode, reps, work):
    cflags, libs = flags()
    extra = []
    if mode == "separate":
        cflags.append("-DCOROCOLL_SEPARATE_COMPILATION=1")
        if case == "all_reduce":
            extra = [str(library_object(compiler, level, cflags, work))]
    src = work / f"{case}.cpp"
    if case == "include_only":
        src.write_text("#include <corocoll/corocoll.hpp>\nint main() {}\n")
    elif case == "std_floor":
        src.write_text("".join(f"#include <{h}>\n" for h in std_headers()) + "int main() {}\n")
    elif case == "library":
        src = LIBRARY_SRC
    else:
        src = PROG
    out = work / f"{case}.out"
    if case == "all_reduce":
        cmd = [compiler, *cflags, level, str(src), *extra, "-o", str(out), *libs]
    else:
        cmd = [compiler, *cflags, level, "-c", str(src), "-o", str(out)]
    cpus, walls = [], []
    for _ in range(reps):
        cpu, wall = cpu_of(cmd)
        cpus.append(cpu)
        walls.append(wall)
    row = {
        "case": case,
        "compiler": compiler,
        "level": level,
        "mode": mode,
        "cpu_s_min": min(cpus),
        "cpu_s_median": statistics.median(cpus),
        "wall_s_min": min(walls),
        "reps": reps,
        "bytes": out.stat().st_size,
        "target_cpu_s": TARGETS.get((case, compiler, level)),
    }
    if case == "include_only" and compiler.startswith("g++"):
        row["coroutine_bodies"] = actors_in(out)
    if case == "include_only":
        row["corocoll_symbols"] = corocoll_symbols(out)
    return row


def version(compiler):
    out = subprocess.run([compiler, "--version"], stdout=subprocess.PIPE, text=True).stdout
    return out.splitlines()[0] if out else compiler


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--configs", default=",".join(DEFAULT_CONFIGS))
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()

    cases = [c for c in args.cases.split(",") if c]
    for c in cases:
        if c not in CASES:
            ap.error(f"unknown case {c!r} (cases: {', '.join(CASES)})")
    configs = []
    for c in args.configs.split(","):
        compiler, level, mode = (c.split(":") + ["", ""])[:3]
        mode = mode or "header-only"
        if mode not in MODES:
            ap.error(f"unknown mode {mode!r} in {c!r} (modes: {', '.join(MODES)})")
        if not shutil.which(compiler):
            print(f"# {compiler}: not installed, its rows are left out")
            continue
        configs.append((compiler, level or "-O0", mode))
    if args.reps < 1:
        ap.error("--reps must be at least 1")

    load = os.getloadavg()
    print(f"# corocoll compile time: {os.cpu_count()} CPUs, load {load[0]:.2f} at the start")
    for compiler in sorted({c for c, _, _ in configs}):
        print(f"# {compiler}: {version(compiler)}")
    print(f"# CPU seconds (user+sys of the compiler, assembler and linker), best of {args.reps}")
    print()
    print("| case | compiler | level | mode | CPU s (best) | CPU s (median) | target | object/binary | coroutine bodies |")
    print("|---|---|---|---|---:|---:|---|---:|---:|")
    rows = []
    with tempfile.TemporaryDirectory(prefix="corocoll-compile-time.") as tmp:
        for case in cases:
            for compiler, level, mode in configs:
                if case == "library" and mode != "separate":
                    continue
                if case == "std_floor" and mode == "separate":
                    continue
                row = measure(case, compiler, level, mode, args.reps, Path(tmp))
                rows.append(row)
                target = row["target_cpu_s"]
                met = ""
                if target is not None:
                    met = f"≤ {target:g} s: {'met' if row['cpu_s_min'] <= target else 'missed'}"
                bodies = row.get("coroutine_bodies")
                print(f"| {case} | {compiler} | {level} | {mode} | {row['cpu_s_min']:.2f} | "
                      f"{row['cpu_s_median']:.2f} | {met} | {row['bytes'] / 1024:,.0f} KiB | "
                      f"{'' if bodies is None else bodies} |", flush=True)
    print(f"\n# load at the end {os.getloadavg()[0]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    if args.check:
        bad = [r for r in rows if not (r["cpu_s_min"] > 0 and r["bytes"] > 0)]
        if not rows or bad:
            print(f"check: FAIL: {len(rows)} rows, {len(bad)} without a measurement", file=sys.stderr)
            return 1
        for r in rows:
            if r["case"] == "include_only" and holds_nothing_unused(r["compiler"], r["level"], r["mode"]):
                n = r.get("corocoll_symbols")
                print(f"check: {r['compiler']} {r['level']} {r['mode']}: an empty program defines "
                      f"{n} symbols of corocoll's")
                if n != 0:
                    print("check: FAIL: a program that uses nothing of corocoll compiles some of it "
                          "(one cause seen: a virtual function defined out of class without "
                          "COROCOLL_DECL on its declaration is a key function, whose vtable pulls "
                          "in every virtual function; `nm -C` the object to see what is there)",
                          file=sys.stderr)
                    return 1
        print(f"check: {len(rows)} rows measured")
    return 0


if __name__ == "__main__":
    sys.exit(main())
