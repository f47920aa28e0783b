#!/usr/bin/env python3
"""Two builds compared over alternating criterion runs of `benches/decisions.rs`.

  ab.py A_LABEL 'A_GLOB' B_LABEL 'B_GLOB'

Each glob names the raw outputs of one build's runs (run the two builds alternately, `A B A B`,
in one sitting). Prints, per benchmark, each build's median time over its runs with the range,
then the ratios benches/README.md quotes, computed within each run (never across runs) and
summarised by their median over the runs.
"""

import glob
import statistics
import sys

from criterion import medians


def ratios(t: dict) -> dict:
    r = {}
    base = t.get("baseline/quanta_raw_plus_cas")
    if base:
        for path in ["gcra", "gcra_allow", "governor"]:
            key = f"direct/allowed/{path}"
            if key in t:
                r[f"`{key}` / raw read + CAS"] = t[key] / base
    for n in ["1000", "1000000", "10000000"]:
        gov, chase = t.get(f"keyed/governor/{n}"), t.get(f"keyed/dram_chase/{n}")
        for path in ["ratewell", "ratewell_allow"]:
            ours = t.get(f"keyed/{path}/{n}")
            if ours and gov:
                r[f"`keyed/{path}/{n}`: governor's time / ours"] = gov / ours
            if ours and chase:
                r[f"`keyed/{path}/{n}` / DRAM chase"] = ours / chase
    return r


def spread(xs: list, fmt: str) -> str:
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def main() -> int:
    if len(sys.argv) != 5:
        print(__doc__)
        return 2
    builds = []
    for label, pattern in [(sys.argv[1], sys.argv[2]), (sys.argv[3], sys.argv[4])]:
        runs = [medians(f) for f in sorted(glob.glob(pattern))]
        if not runs:
            print(f"no runs match {pattern}")
            return 1
        builds.append((label, runs))
    (a, a_runs), (b, b_runs) = builds
    print(f"| benchmark | {a}: median ns ({len(a_runs)} runs, range) | {b} ({len(b_runs)} runs) |")
    print("|-----------|------:|------:|")
    for name in a_runs[0]:
        xs, ys = [t[name] for t in a_runs if name in t], [t[name] for t in b_runs if name in t]
        if xs and ys:
            print(f"| `{name}` | {spread(xs, '{:.1f}')} | {spread(ys, '{:.1f}')} |")
    print()
    print(f"| ratio (within each run) | {a}: median (range) | {b} |")
    print("|-------------------------|------:|------:|")
    for name in ratios(a_runs[0]):
        xs = [ratios(t)[name] for t in a_runs if name in ratios(t)]
        ys = [ratios(t)[name] for t in b_runs if name in ratios(t)]
        if xs and ys:
            print(f"| {name} | {spread(xs, '{:.2f}x')} | {spread(ys, '{:.2f}x')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
