#!/usr/bin/env python3
"""Read iai-callgrind output (`cargo bench --bench instructions`).

  iai.py summary OUTPUT           instructions per decision: (total of x2 - total of x1) / 1000
  iai.py check OUTPUT CEILINGS    fail if a total exceeds its ceiling (`name max` per line, `#`
                                  comments); every ceiling must match a benchmark, so a renamed
                                  benchmark cannot silently drop out of the gate
  iai.py ceilings OUTPUT          print a new ceilings file: every ratewell total measured, plus 3%
"""

import re
import sys

N = 1000


def totals(path: str) -> dict:
    found = {}
    name = None
    for line in open(path):
        line = re.sub(r"\x1b\[[0-9;]*m", "", line)
        header = re.match(r"^\S+::\S+::(\S+) (\S+?):", line)
        if header:
            name = f"{header.group(1)}.{header.group(2)}"
            continue
        m = re.match(r"^\s+Instructions:\s+(\d+)", line)
        if m and name:
            found[name] = int(m.group(1))
            name = None
    return found


def summary(found: dict) -> int:
    for name in sorted(found):
        twice = name[:-3] + "_x2"
        if name.endswith("_x1") and twice in found:
            print(f"{name[:-3]:32s} {(found[twice] - found[name]) / N:7.1f} instructions per decision")
    return 0


def check(found: dict, ceilings: str) -> int:
    failed = False
    for line in open(ceilings):
        line = line.split("#")[0].strip()
        if not line:
            continue
        name, ceiling = line.split()
        got = found.get(name)
        if got is None:
            print(f"MISSING {name}: no such benchmark in the output")
            failed = True
        elif got > int(ceiling):
            print(f"OVER    {name}: {got} instructions > ceiling {ceiling}")
            failed = True
        else:
            print(f"ok      {name}: {got} <= {ceiling}")
    return 1 if failed else 0


def ceilings(found: dict) -> int:
    print("# Instruction ceilings for benches/instructions.rs (iai-callgrind, deterministic).")
    print("# Each is the total measured (setup + 1000 or 2000 decisions) plus 3%: a change that")
    print("# makes a decision more than a few instructions dearer fails .ci/run. Regenerate with:")
    print("#   cargo bench --bench instructions > target/iai.txt")
    print("#   python3 benches/iai.py ceilings target/iai.txt > benches/ceilings.txt")
    print("# governor's counts are measured for comparison, not gated.")
    for name in sorted(found):
        if not name.startswith("governor"):
            print(f"{name} {found[name] * 103 // 100}")
    return 0


def main() -> int:
    mode, output = sys.argv[1], sys.argv[2]
    found = totals(output)
    if not found:
        print(f"no iai-callgrind results in {output}")
        return 1
    if mode == "summary":
        return summary(found)
    if mode == "ceilings":
        return ceilings(found)
    return check(found, sys.argv[3])


if __name__ == "__main__":
    sys.exit(main())
