#!/usr/bin/env python3
"""The `keyed` group's ratios over several criterion runs of `benches/decisions.rs`.

  for i in 1 2 3 4 5; do cargo bench --bench decisions -- --noplot keyed > runs/keyed-$i.txt; done
  python3 benches/keyed.py 'runs/keyed-*.txt'

Every ratio is computed within one run (ours and its baseline measured by the same process, a
minute apart), then summarised by its median and range over the runs: batches against single
calls over the same request stream and against a dependent DRAM access over the same bytes,
single calls against that access, and ratewell against governor with like-for-like clocks (the
TSC clock against governor's default, quanta's; the coarse clock against governor's upkeep
clock, both reading the one upkeep thread).
"""

import glob
import statistics
import sys

from criterion import medians

SIZES = ["1000", "1000000", "10000000"]


def ratios(t: dict) -> dict:
    r = {}
    for n in SIZES:
        k = lambda name: t.get(f"keyed/{name}/{n}")  # noqa: E731
        single, batch, chase = k("ratewell_stream_single"), k("ratewell_stream_batch"), k("dram_chase")
        if single and batch:
            r[f"{n}: single calls / batch (same stream)"] = single / batch
        if batch and chase:
            r[f"{n}: batch / DRAM access"] = batch / chase
        for path in ["ratewell", "ratewell_allow", "ratewell_coarse"]:
            if k(path) and chase:
                r[f"{n}: `{path}` / DRAM access"] = k(path) / chase
        for ours, theirs in [("ratewell", "governor"), ("ratewell_allow", "governor"),
                             ("ratewell_coarse", "governor_upkeep")]:
            if k(ours) and k(theirs):
                r[f"{n}: `{theirs}` / `{ours}`"] = k(theirs) / k(ours)
    return r


def main() -> int:
    paths = sorted(p for pattern in sys.argv[1:] for p in glob.glob(pattern))
    runs = [ratios(medians(p)) for p in paths]
    runs = [r for r in runs if r]
    if not runs:
        print("no keyed results in", sys.argv[1:])
        return 1
    print(f"{len(runs)} runs: {', '.join(paths)}\n")
    print("| ratio | median | range | per run |")
    print("|-------|-------:|------:|---------|")
    for name in runs[0]:
        values = [r[name] for r in runs if name in r]
        per_run = " ".join(f"{v:.2f}" for v in values)
        print(f"| {name} | **{statistics.median(values):.2f}x** "
              f"| {min(values):.2f}-{max(values):.2f} | {per_run} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
