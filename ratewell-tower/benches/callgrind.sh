#!/usr/bin/env bash
# Where one request's instructions go, per variant of benches/overhead.rs: benches/callgrind.rs
# under callgrind at N and 2N requests, then the root's benches/profile.py subtracts the two runs
# and divides by N (by function, and by source line with inlined code charged to the line that
# called it). Usage: ratewell-tower/benches/callgrind.sh [N] [VARIANT ...] (default: 20000, and
# ratewell, ratewell_headers, ratewell_global, tower_governor, governor_global, no_layer).
set -euo pipefail
cd "$(dirname "$0")/../.."
n=${1:-20000}
shift || true
variants=${*:-ratewell ratewell_headers ratewell_global tower_governor governor_global no_layer}
bin=$(cargo bench -q -p ratewell-tower --bench callgrind --no-run --message-format=json |
    python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "callgrind" and m.get("executable"):
        print(m["executable"])')
out=target/tower-callgrind
for v in $variants; do
    for x in 1 2; do
        mkdir -p "$out/${v}_x$x"
        valgrind --tool=callgrind --dump-instr=yes --callgrind-out-file="$out/${v}_x$x/callgrind.${v}_x$x.out" \
            "$bin" "$v" $((n * x)) 2> /dev/null
    done
    python3 benches/profile.py "$v" --dir "$out" --n "$n" --top 25
    echo
done
