#!/usr/bin/env bash
# Time `ratewell compare --limit` (its 7 policies and the reference) on 10,000,000 requests read
# three ways: a gzipped nginx access log (the `combined` format), the same log uncompressed, and
# the same requests as a trace (CSV). The files are written under target/ (not committed).
# Medians of ROUNDS alternating runs (default 3), and peak memory.
set -euo pipefail
cd "$(dirname "$0")/.."
LINES=${LINES:-10000000}
ROUNDS=${ROUNDS:-3}
cargo build --release -q -p ratewell-cli
mkdir -p target/logs
if [ ! -f "target/logs/access-$LINES.log.gz" ]; then
    python3 - "$LINES" <<'PY'
import gzip, random, sys, time
n = int(sys.argv[1])
rng = random.Random(1)
t = 1_712_311_872.0
first = int(t)
agents = ["curl/8.0", "Mozilla/5.0 (X11; Linux x86_64; rv:120.0) Gecko/20100101 Firefox/120.0",
          "Go-http-client/1.1"]
paths = ["/", "/api/v1/items", "/api/v1/items/42?full=1", "/static/app.js", "/login"]
with open(f"target/logs/access-{n}.log", "w") as log, open(f"target/logs/trace-{n}.csv", "w") as csv:
    second, stamp = None, None
    for i in range(n):
        t += rng.expovariate(2000.0)
        s = int(t)
        if s != second:
            second, stamp = s, time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(s))
        ip = f"10.{rng.randrange(4)}.{rng.randrange(256)}.{int(rng.paretovariate(1.2)) % 256}"
        log.write(f'{ip} - - [{stamp}] "GET {rng.choice(paths)} HTTP/1.1" 200 '
                  f'{rng.randrange(100, 5000)} "-" "{rng.choice(agents)}"\n')
        csv.write(f"{(s - first) * 1_000_000_000},{ip}\n")
PY
    gzip -k -6 "target/logs/access-$LINES.log"
fi
ls -l target/logs/*"$LINES"*
run() {
    local what=$1
    shift
    /usr/bin/time -f "$what %e s %M KiB" target/release/ratewell compare "$@" --limit 10/10s \
        >/dev/null 2>"target/logs/err.txt" || { cat target/logs/err.txt; exit 1; }
    cat target/logs/err.txt
}
for round in $(seq "$ROUNDS"); do
    echo "round $round"
    run csv "target/logs/trace-$LINES.csv"
    run log "target/logs/access-$LINES.log" --log combined
    run gz "target/logs/access-$LINES.log.gz" --log combined
done
