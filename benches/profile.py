#!/usr/bin/env python3
"""Per-decision profile of one iai-callgrind benchmark, by function and by source line.

  profile.py NAME [--dir DIR] [--n N] [--top K]

NAME is a benchmark without its `_x1`/`_x2` suffix (`keyed_allow.hit_1k`, `allow_manual.allowed`).
Reads the callgrind outputs that `cargo bench --bench instructions` left
under DIR (default `target/iai`) for the `x1` run (N decisions) and the `x2` run (2N), and prints
`(x2 - x1) / N` for every function and every source line: what one decision costs, with the setup,
the teardown and everything else the two runs share cancelled out. This is `callgrind_annotate`
(which annotates one run) made differential; the release profile's line tables (`debug = 1`)
attribute inlined code to the line it was written on, innermost first (so `wrapping_mul` shows as
core's `uint_macros.rs`, called from the ratewell line just above it in the listing).
"""

import argparse
import glob
import os
import re
import subprocess
import sys
from collections import defaultdict


def parse(path: str):
    """Self cost (the first event, Ir) of one callgrind output, by `(object, function, file, line,
    address)`; the address is `None` unless the run dumped instructions (`--dump-instr=yes`)."""
    costs = defaultdict(int)
    names = {}
    ob = fl = fi = fn = None
    positions = ["line"]
    pos = [0, 0]
    skip_next = False

    def name(kind: str, value: str) -> str:
        # Name compression: "(7) /path" defines id 7 and "(7)" refers to it (ids per kind).
        m = re.match(r"\((\d+)\)\s*(.*)", value)
        if not m:
            return value
        if m.group(2):
            names[(kind, m.group(1))] = m.group(2)
        return names.get((kind, m.group(1)), value)

    for raw in open(path):
        line = raw.rstrip("\n")
        if line.startswith("positions:"):
            positions = line.split(":", 1)[1].split()
            continue
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if sep and re.fullmatch(r"[a-z]+", key):
            kind = {"cob": "ob", "cfi": "fl", "cfl": "fl", "fi": "fl", "fe": "fl", "cfn": "fn"}.get(key, key)
            value = name(kind, value)
            if key == "ob":
                ob = value
            elif key == "fl":
                fl = fi = value
            elif key in ("fi", "fe"):
                fi = value
            elif key == "fn":
                fn = value
                fi = fl
            elif key == "calls":
                skip_next = True  # the next cost line is the call's inclusive cost
            continue
        fields = line.split()
        if len(fields) <= len(positions) or not re.match(r"^([+-]?(0x)?[0-9a-fA-F]+|\*)$", fields[0]):
            continue  # headers: version, events, summary, totals, ...
        for i, field in enumerate(fields[: len(positions)]):
            if field == "*":
                continue
            value = int(field.lstrip("+-"), 0)
            pos[i] = pos[i] + value if field[0] == "+" else pos[i] - value if field[0] == "-" else value
        if skip_next:
            skip_next = False
            continue
        cost = int(fields[len(positions)])
        address = pos[positions.index("instr")] if "instr" in positions else None
        costs[(ob, fn, fi, pos[positions.index("line")], address)] += cost
    return costs


def inline_owners(binary: str, addresses: list) -> dict:
    """For each address of `binary`, the innermost inlined frame that is not the standard
    library's: `(function, file, line)` (so an `AtomicU64::store` is charged to the ratewell line
    that called it, ahash's code to ahash)."""
    if not addresses:
        return {}
    try:
        out = subprocess.run(
            ["addr2line", "-a", "-i", "-f", "-C", "-e", binary] + [hex(a) for a in addresses],
            capture_output=True, text=True, check=True,
        ).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"profile.py: addr2line failed ({e}): by source line only", file=sys.stderr)
        return {}
    owners = {}
    i = 0
    while i < len(out):
        address = int(out[i], 16)
        i += 1
        frames = []
        while i + 1 < len(out) and not re.fullmatch(r"0x[0-9a-f]+", out[i]):
            func, where = out[i], out[i + 1].split(" (")[0]
            file, _, line = where.rpartition(":")
            frames.append((func, file, int(line) if line.isdigit() else 0))
            i += 2
        own = [f for f in frames if not f[1].startswith("/rustc/") and f[1] != "??"]
        owners[address] = own[0] if own else (frames[0] if frames else ("???", "??", 0))
    return owners


def short(path: str) -> str:
    if path is None:
        return "???"
    root = os.getcwd() + "/"
    if path.startswith(root):
        return path[len(root):]
    m = re.search(r"/library/(.*)$", path)
    if m and path.startswith("/rustc/"):
        return m.group(1)
    m = re.search(r"/registry/src/[^/]+/(.*)$", path)
    return m.group(1) if m else path


def source(path: str, line: int) -> str:
    try:
        with open(path) as f:
            for i, text in enumerate(f, 1):
                if i == line:
                    return text.strip()
    except OSError:
        pass
    return ""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("name")
    p.add_argument("--dir", default="target/iai")
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--top", type=int, default=40)
    args = p.parse_args()

    runs = []
    for suffix in ("_x1", "_x2"):
        pattern = f"{args.dir}/**/{args.name}{suffix}/callgrind.{args.name}{suffix}.out"
        found = glob.glob(pattern, recursive=True)
        if len(found) != 1:
            print(f"profile.py: expected one file for {pattern}, found {len(found)}", file=sys.stderr)
            return 2
        runs.append(parse(found[0]))

    # Where the run dumped instructions, charge each to its innermost non-std inlined frame.
    owners = {}
    by_binary = defaultdict(set)
    for run in runs:
        for ob, _, _, _, address in run:
            if address is not None and ob and os.path.isfile(ob) and "/target/" in ob:
                by_binary[ob].add(address)
    for binary, addresses in by_binary.items():
        for address, owner in inline_owners(binary, sorted(addresses)).items():
            owners[(binary, address)] = owner

    def group(key) -> dict:
        sums = [defaultdict(int), defaultdict(int)]
        for run, acc in zip(runs, sums):
            for (ob, fn, fi, line, address), cost in run.items():
                acc[key(ob, fn, fi, line, address)] += cost
        rows = [(k, (sums[1].get(k, 0) - sums[0].get(k, 0)) / args.n) for k in set(sums[0]) | set(sums[1])]
        return sorted((r for r in rows if abs(r[1]) >= 0.05), key=lambda r: -abs(r[1]))

    def owner(ob, fn, fi, line, address):
        return owners.get((ob, address), (fn, fi, line))

    fns = group(lambda ob, fn, fi, line, address: fn)
    total = sum(v for _, v in fns)
    print(f"{args.name}: {total:.1f} instructions per decision ((x2 - x1) / {args.n})")
    print("\nby function, as called (self cost):")
    for f, v in fns:
        print(f"  {v:7.1f}  {f}")
    if owners:
        print("\nby function, as written (inlined code charged to its innermost non-std function):")
        for f, v in group(lambda *k: owner(*k)[0]):
            print(f"  {v:7.1f}  {f}")
        lines = group(lambda *k: owner(*k)[1:])
        print("\nby source line, as written:")
    else:
        lines = group(lambda ob, fn, fi, line, address: (fi, line))
        print("\nby source line (inlined code at the line it was written on; run the benches with")
        print("IAI_CALLGRIND_CALLGRIND_ARGS=--dump-instr=yes to charge std's lines to their callers):")
    for (path, line), v in lines[: args.top]:
        text = source(path, line) if path else ""
        print(f"  {v:7.1f}  {short(path)}:{line}  {text[:90]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
