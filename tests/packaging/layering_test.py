#!/usr/bin/env python3
"""The layer rule of docs/architecture.md, checked on every file under include/corocoll/.

Each layer is a folder; a file may include its own layer and the layers below it, never one
above. The order is written here once (docs/architecture.md, "Layers", points at it):
"""
import pathlib
import re
import sys

# Lowest first. version.hpp is below every layer; corocoll.hpp (everything a CPU program needs)
# and impl/src.hpp (the one translation unit of separate compilation) are above every layer.
LAYERS = ["version", "core", "io", "rendezvous", "transport", "collectives", "process_group", "top"]


def layer_of(rel: str) -> str:
    """The layer of a path relative to include/, "corocoll/io/socket.hpp" -> "io"."""
    parts = rel.split("/")
    if parts[1] == "version.hpp":
        return "version"
    if parts[1] in ("corocoll.hpp", "impl"):
        return "top"
    if parts[1] == "gpu.hpp" or parts[1] == "gpu":
        return "gpu"
    return parts[1]


def main() -> int:
    root = pathlib.Path(sys.argv[1]) / "include"
    include = re.compile(r'^\s*#\s*include\s*<(corocoll/[^>]+)>')
    files = sorted(p for p in root.rglob("*") if p.suffix in (".hpp", ".ipp"))
    problems = [] if files else [f"no header found under {root}"]
    for path in files:
        rel = path.relative_to(root).as_posix()
        mine = layer_of(rel)
        if mine not in LAYERS:
            problems.append(f"{rel}: its folder is in no layer (add it to LAYERS)")
            continue
        lines = path.read_text().split("\n")
        # An opening comment: a header says what it holds before its first include or code.
        first = next((l for l in lines if l.strip() and l.strip() != "#pragma once"), "")
        if not first.startswith("//"):
            problems.append(f"{rel}: no opening comment (its first line after #pragma once is "
                            f"{first.strip()[:60]!r})")
        for n, line in enumerate(lines, 1):
            m = include.match(line)
            if not m:
                continue
            if not (root / m.group(1)).exists():
                # version.hpp's language guard includes a header named for its message, so that
                # a compiler in C++17 mode stops with "compile_with_-std=c++20" in the error.
                if rel != "corocoll/version.hpp":
                    problems.append(f"{rel}:{n}: includes <{m.group(1)}>, which does not exist")
                continue
            theirs = layer_of(m.group(1))
            if theirs not in LAYERS:
                problems.append(f"{rel}:{n}: includes <{m.group(1)}>, in no layer")
            elif LAYERS.index(theirs) > LAYERS.index(mine):
                problems.append(f"{rel}:{n}: layer {mine} includes <{m.group(1)}> of layer "
                                f"{theirs}, which is above it")
    for p in problems:
        print(p)
    print(f"{len(files)} files read, {len(problems)} problem(s); layers, lowest first: "
          + " < ".join(LAYERS))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
