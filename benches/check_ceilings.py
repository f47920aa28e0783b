#!/usr/bin/env python3
"""Fail if an iai-callgrind instruction count exceeds its ceiling.

Usage: check_ceilings.py IAI_OUTPUT CEILINGS
IAI_OUTPUT is what `cargo bench --features internals --bench instructions` printed; CEILINGS has
one `benchmark-name max-instructions` per line (`#` comments). Every ceiling must be matched by a
benchmark, so a renamed benchmark cannot silently drop out of the gate.
"""

import re
import sys


def counts(text: str) -> dict:
    found = {}
    name = None
    for line in text.splitlines():
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


def main() -> int:
    output, ceilings = sys.argv[1], sys.argv[2]
    found = counts(open(output).read())
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


if __name__ == "__main__":
    sys.exit(main())
