#!/usr/bin/env python3
"""Instructions per decision from iai-callgrind output: (total of x2 - total of x1) / 1000.

Usage: cargo bench --features internals --bench instructions | python3 benches/iai_summary.py
"""

import re
import sys

N = 1000
totals = {}
name = None
for line in sys.stdin:
    line = re.sub(r"\x1b\[[0-9;]*m", "", line)
    header = re.match(r"^\S+::\S+::(\S+) (\S+?):", line)
    if header:
        name = f"{header.group(1)}.{header.group(2)}"
        continue
    m = re.match(r"^\s+Instructions:\s+(\d+)", line)
    if m and name:
        totals[name] = int(m.group(1))
        name = None
for name in sorted(totals):
    if name.endswith("_x1") and name[:-3] + "_x2" in totals:
        per = (totals[name[:-3] + "_x2"] - totals[name]) / N
        print(f"{name[:-3]:32s} {per:7.1f} instructions per decision")
