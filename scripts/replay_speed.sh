#!/usr/bin/env bash
# `ratewell replay` of a 10,000,000-line trace over 1,000,000 distinct keys (written under target/,
# not committed), against the binary of a base commit (default 4dde619) built side by side in a
# worktree: alternating runs, each build's times and median, and whether the outputs (the default
# format and `--format full`) are byte-identical. Usage: scripts/replay_speed.sh [BASE] [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:-4dde619}
runs=${2:-5}
cargo build --release -q -p ratewell-cli
if [ ! -x "target/replay-base/$base/release/ratewell" ]; then
    rm -rf "target/replay-base/src-$base"
    git worktree add -f "target/replay-base/src-$base" "$base" -q
    (cd "target/replay-base/src-$base" &&
        CARGO_TARGET_DIR="../$base" cargo build --release -q -p ratewell-cli)
    git worktree remove --force "target/replay-base/src-$base"
fi
old="target/replay-base/$base/release/ratewell"
new="target/release/ratewell"
trace=target/traces/replay-10m.csv
mkdir -p target/traces
if [ ! -f "$trace" ]; then
    python3 - "$trace" <<'PY'
import random
import sys
rng = random.Random(7)
t = 0
keys = [f"client-{rng.getrandbits(48):012x}" for _ in range(1_000_000)]
with open(sys.argv[1], "w") as f:
    out = []
    for i in range(10_000_000):
        t += rng.randrange(0, 2_000)
        # Every key once in the first million lines, then uniformly at random.
        out.append(f"{t},{keys[i] if i < 1_000_000 else keys[rng.randrange(1_000_000)]}\n")
        if len(out) == 100_000:
            f.write("".join(out))
            out.clear()
    f.write("".join(out))
PY
fi
# A table of 4,194,304 slots (25% load): no key is evicted by either build, so the outputs can
# be compared byte for byte.
args=(replay --policy 'token-bucket capacity=3 rate=1/s' --capacity 4194304 "$trace")
for build in old new; do
    bin=${!build}
    "$bin" "${args[@]}" > "target/traces/replay-$build.out"
    "$bin" "${args[@]}" --format full > "target/traces/replay-$build.full"
done
cmp target/traces/replay-old.out target/traces/replay-new.out && echo "default output: identical"
cmp target/traces/replay-old.full target/traces/replay-new.full && echo "--format full: identical"
echo "$(grep -c '^1' target/traces/replay-new.out) of $(wc -l < target/traces/replay-new.out) admitted"
rm -f target/traces/replay-{old,new}.full
for i in $(seq "$runs"); do
    for build in old new; do
        bin=${!build}
        start=$(date +%s%N)
        "$bin" "${args[@]}" > /dev/null
        echo "run $i $build $(awk -v a="$start" -v b="$(date +%s%N)" 'BEGIN { printf "%.2f", (b - a) / 1e9 }')"
    done
done | tee target/traces/replay-times.txt
for build in old new; do
    echo "$build median: $(awk -v b="$build" '$3 == b { print $4 }' target/traces/replay-times.txt |
        sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }') s"
done
