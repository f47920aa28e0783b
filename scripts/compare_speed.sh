#!/usr/bin/env bash
# Time `ratewell compare` on two 1,000,000-line traces (written under target/, not committed):
# skewed traffic over ~1,000 keys, and 1,000,000 distinct keys (every lookup a table miss).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p ratewell-cli
mkdir -p target/traces
python3 - <<'PY'
import random
rng = random.Random(1)
t = 0
with open("target/traces/skewed.csv", "w") as f:
    for _ in range(1_000_000):
        t += rng.randrange(0, 200_000)
        f.write(f"{t},k{int(rng.paretovariate(1.2)) % 10000}\n")
with open("target/traces/distinct.csv", "w") as f:
    for i in range(1_000_000):
        f.write(f"{i * 1000},key{i}\n")
PY
five=(--policy 'token-bucket capacity=100 rate=100/s' --policy 'leaky-bucket rate=100r/s burst=99'
      --policy 'fixed-window limit=100 window=1s' --policy 'sliding-window limit=100 window=1s'
      --policy 'sliding-log limit=100 window=1s')
for trace in skewed distinct; do
    /usr/bin/time -f "$trace, 5 policies: %e s, %M KiB peak" \
        target/release/ratewell compare "target/traces/$trace.csv" "${five[@]}" >/dev/null
    /usr/bin/time -f "$trace, the 7 of --limit 100/s with SVG and PNG: %e s, %M KiB peak" \
        target/release/ratewell compare "target/traces/$trace.csv" --limit 100/s \
        --svg target/traces/chart.svg --png target/traces/chart.png >/dev/null
done
