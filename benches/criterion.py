#!/usr/bin/env python3
"""Tables of one criterion run of `benches/decisions.rs`, with the ratios benches/README.md quotes.

  cargo bench --bench decisions -- --noplot | tee target/criterion.txt
  python3 benches/criterion.py target/criterion.txt

Ratios are only meaningful within one run (this machine is shared and drifts between runs).
"""

import re
import sys

UNITS = {"ps": 1e-3, "ns": 1.0, "µs": 1e3, "us": 1e3, "ms": 1e6, "s": 1e9}


def medians(path: str) -> dict:
    text = re.sub(r"\x1b\[[0-9;]*m", "", open(path, encoding="utf-8").read())
    found = {}
    pattern = r"^(\S+)\s*\n?\s*time:\s+\[\S+ \S+ (\S+) (\S+) \S+ \S+\]"
    for m in re.finditer(pattern, text, re.M):
        found[m.group(1)] = float(m.group(2)) * UNITS[m.group(3)]
    return found


def main() -> int:
    t = medians(sys.argv[1])
    if not t:
        print(f"no criterion results in {sys.argv[1]}")
        return 1
    base = t.get("baseline/quanta_raw_plus_cas")
    print("| benchmark | median | ratio |")
    print("|-----------|-------:|------:|")
    for name, ns in t.items():
        if name.startswith(("baseline/", "direct/")):
            ratio = f"{ns / base:.2f}x raw+CAS" if base and name.startswith("direct/") else ""
            print(f"| `{name}` | {ns:.1f} ns | {ratio} |")
    print()
    print("| benchmark | median | ratio |")
    print("|-----------|-------:|------:|")
    for name, ns in t.items():
        if not name.startswith("keyed/"):
            continue
        _, who, n = name.split("/")
        chase, gov = t.get(f"keyed/dram_chase/{n}"), t.get(f"keyed/governor/{n}")
        notes = []
        if chase and who != "dram_chase":
            notes.append(f"{ns / chase:.2f}x chase")
        if gov and who.startswith("ratewell"):
            notes.append(f"{gov / ns:.2f}x faster than governor")
        print(f"| `{name}` | {ns:.1f} ns | {', '.join(notes)} |")
    print()
    # Throughput with k threads over one thread: k x t(1) / t(k), t per thread-decision.
    for name, ns in t.items():
        if name.startswith("contention/") and name.endswith("/1"):
            runs = sorted(
                (int(other.rsplit("/", 1)[1]), tk)
                for other, tk in t.items()
                if other.rsplit("/", 1)[0] == name[:-2] and not other.endswith("/1")
            )
            scaling = ", ".join(f"{k} threads **{k * ns / tk:.2f}x** ({tk:.1f} ns)" for k, tk in runs)
            if scaling:
                print(f"- `{name[11:-2]}` (1 thread {ns:.1f} ns per decision): {scaling}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
