#!/usr/bin/env python3
"""Overheads and ratios of `cargo bench -p ratewell-tower --bench overhead` runs.

  overhead.py RUN.txt [RUN.txt ...]

Each file is one run's criterion output. Per run: each variant's time (criterion's point estimate)
minus `no_layer`'s in the same run, and ratewell's overhead over tower_governor's for the three
pairs (`ratewell` / `tower_governor`, `ratewell_headers` / `tower_governor_headers`,
`ratewell_global` / `governor_global`); then the median of each ratio over the runs.
"""

import re
import statistics
import sys

PAIRS = [
    ("ratewell", "tower_governor"),
    ("ratewell_headers", "tower_governor_headers"),
    ("ratewell_global", "governor_global"),
]
UNITS = {"ps": 1e-3, "ns": 1.0, "µs": 1e3, "us": 1e3, "ms": 1e6}


def times(path: str) -> dict:
    """Each variant's point estimate in ns."""
    text = open(path).read()
    found = {}
    for m in re.finditer(r"overhead/(\w+)\s+time:\s+\[\S+ \S+ (\S+) (\S+) \S+ \S+\]", text):
        found[m.group(1)] = float(m.group(2)) * UNITS[m.group(3)]
    return found


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    ratios = {pair: [] for pair in PAIRS}
    for path in sys.argv[1:]:
        t = times(path)
        base = t["no_layer"]
        cells = [f"no_layer {base:.1f} ns"]
        for ours, theirs in PAIRS:
            a, b = t[ours] - base, t[theirs] - base
            ratios[(ours, theirs)].append(a / b)
            cells.append(f"{ours} +{a:.1f} / {theirs} +{b:.1f} = {a / b:.2f}")
        print(f"{path}: " + "; ".join(cells))
    print("medians: " + "; ".join(
        f"{ours} / {theirs} {statistics.median(r):.2f} ({min(r):.2f} to {max(r):.2f})"
        for (ours, theirs), r in ratios.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
