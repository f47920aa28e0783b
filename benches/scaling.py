#!/usr/bin/env python3
"""The `contention` group of benches/decisions.rs at 1, 2, 4, ... N threads, as one scaling table.

  python3 benches/scaling.py                      # 1, 2, 4, ... and N = nproc threads
  python3 benches/scaling.py --threads 1,2,8      # these counts
  python3 benches/scaling.py --from FILE          # tabulate a run saved earlier (--raw)

It runs `RATEWELL_BENCH_THREADS=<counts> cargo bench --bench decisions -- --noplot contention`
(the group's own settings: 1 s of warm-up and 3 s of measurement a benchmark, 20 samples), saves
criterion's output (--raw, by default target/scaling-criterion.txt), and prints, for every
benchmark of the group and every thread count, the aggregate decisions per second and its ratio
to one thread's, then ratewell's aggregate over governor's on the same distinct keys.

criterion's time for a benchmark of the group is the wall time over the decisions of one thread
(every thread makes as many): with k threads the aggregate is k / t(k) decisions per second, and
k x t(1) / t(k) times one thread's.
"""

import argparse
import os
import platform
import re
import subprocess
import sys

UNITS = {"ps": 1e-3, "ns": 1.0, "µs": 1e3, "us": 1e3, "ms": 1e6, "s": 1e9}
OURS, GOVERNOR = "distinct_keys_allowed", "governor_distinct_keys_allowed"


def default_counts() -> list[int]:
    n = os.cpu_count() or 1
    counts, k = [], 1
    while k < n:
        counts.append(k)
        k *= 2
    return counts + [n]


def medians(text: str) -> dict[tuple[str, int], float]:
    """(benchmark, threads) -> criterion's median time (ns) of each `contention/NAME/THREADS`."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    pattern = r"^contention/(\S+)/(\d+)\s*\n?\s*time:\s+\[\S+ \S+ (\S+) (\S+) \S+ \S+\]"
    return {
        (m.group(1), int(m.group(2))): float(m.group(3)) * UNITS[m.group(4)]
        for m in re.finditer(pattern, text, re.M)
    }


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.split(":")[0].strip() in ("model name", "Model", "CPU part"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def machine() -> str:
    return f"{os.cpu_count()} CPUs ({cpu_model()}), {platform.machine()}"


def table(t: dict[tuple[str, int], float]) -> str:
    names = list(dict.fromkeys(name for name, _ in t))
    counts = sorted({k for _, k in t})
    head = "| benchmark | " + " | ".join(f"{k} thread{'s' if k > 1 else ''}" for k in counts) + " |"
    lines = [head, "|-----------|" + "---:|" * len(counts)]
    for name in names:
        cells = []
        for k in counts:
            tk, t1 = t.get((name, k)), t.get((name, 1))
            if tk is None:
                cells.append("")
                continue
            rate = k / tk * 1e3  # decisions per µs = M/s
            cells.append(f"{rate:.1f} M/s" + (f" ({k * t1 / tk:.2f}x)" if t1 else ""))
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    ratio = []
    for k in counts:
        ours, theirs = t.get((OURS, k)), t.get((GOVERNOR, k))
        ratio.append(f"{theirs / ours:.2f}x" if ours and theirs else "")
    lines.append(f"| ratewell over governor (`{OURS}` / `{GOVERNOR}`) | " + " | ".join(ratio) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", help="comma-separated thread counts (default: 1, 2, 4, ... nproc)")
    parser.add_argument("--raw", default="target/scaling-criterion.txt", help="criterion's output, saved here")
    parser.add_argument("--from", dest="source", help="tabulate this saved output instead of running")
    args = parser.parse_args()

    if args.source:
        with open(args.source, encoding="utf-8") as f:
            text = f.read()
    else:
        counts = args.threads or ",".join(map(str, default_counts()))
        env = dict(os.environ, RATEWELL_BENCH_THREADS=counts)
        command = ["cargo", "bench", "--bench", "decisions", "--", "--noplot", "contention"]
        print(f"RATEWELL_BENCH_THREADS={counts} {' '.join(command)}", file=sys.stderr)
        run = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True)
        text = f"# machine: {machine()}\n" + run.stdout
        os.makedirs(os.path.dirname(args.raw) or ".", exist_ok=True)
        with open(args.raw, "w", encoding="utf-8") as f:
            f.write(text)
        if run.returncode != 0:
            print(f"cargo bench failed ({run.returncode}); its output is in {args.raw}", file=sys.stderr)
            return 1

    t = medians(text)
    if not t:
        print("no contention results in the output", file=sys.stderr)
        return 1
    found = re.search(r"^# machine: (.*)$", text, re.M)
    print(f"`contention` scaling on {found.group(1) if found else 'a machine not recorded'}")
    print("aggregate decisions per second, and over one thread's (k x t(1) / t(k))")
    print()
    print(table(t))
    return 0


if __name__ == "__main__":
    sys.exit(main())
