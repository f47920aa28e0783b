#!/usr/bin/env bash
# End to end on loopback with wrk (Debian's package): the axum example with and without the
# layer, alternating, then a flood of 1,000,000 distinct API keys against a table of 100,000.
# Usage: benches/wrk.sh [SECONDS] > benches/results/wrk-DATE.txt (RUNS=7 alternations by default)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-10}
runs=${RUNS:-7}
command -v wrk > /dev/null || { echo "wrk is missing: apt-get install wrk" >&2; exit 1; }
command -v taskset > /dev/null || { echo "taskset is missing: apt-get install util-linux" >&2; exit 1; }
command -v curl > /dev/null || { echo "curl is missing: apt-get install curl" >&2; exit 1; }
cargo build --release --quiet --example axum
bin=../target/release/examples/axum
open='token-bucket capacity=1000000000 rate=1000000000/s'
port=${PORT:-38080}

# The server on core 0 (one tokio worker), wrk on core 1: the two do not take turns on a core.
serve() { # args: extra options; prints the pid
    TOKIO_WORKER_THREADS=1 taskset -c 0 "$bin" --serve "127.0.0.1:$port" --ip-policy "$open" --key-policy "$open" --search-policy "$open" "$@" > /dev/null &
    echo $!
}
wait_up() { for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port/metrics" && return; sleep 0.1; done; exit 1; }
rss_kib() { awk '/VmRSS/ {print $2}' "/proc/$1/status"; }
rps() { awk '/Requests\/sec/ {print $2}'; }
throughput() { # args: extra wrk options; the three servers alternating, $runs times
    for run in $(seq "$runs"); do
        for mode in none layer layer-no-headers; do
            case $mode in
                none) pid=$(serve --no-limit) ;;
                layer) pid=$(serve) ;;
                layer-no-headers) pid=$(serve --no-headers) ;;
            esac
            wait_up
            r=$(taskset -c 1 wrk -t1 -c32 -d"${seconds}s" "$@" "http://127.0.0.1:$port/" | rps)
            kill "$pid"; wait "$pid" 2> /dev/null || true
            echo "run $run $mode $r"
        done
    done
}

echo "# $(date -u +%FT%TZ) $(nproc) cores; wrk -t1 -c32 -d${seconds}s on core 1, the server on core 0 (one tokio worker)"
echo "## throughput: GET / (ip layer decides, api-key and search layers skipped), alternating runs"
echo "## (layer: RateLimit fields on every response; layer-no-headers: on rejections only)"
throughput
echo "## throughput: GET / with an API key (ip and api-key layers decide), alternating runs"
cat > /tmp/ratewell-wrk-key.lua <<'LUA'
wrk.headers["x-api-key"] = "one-key"
LUA
throughput -s /tmp/ratewell-wrk-key.lua

echo "## flood: distinct API keys, --key-capacity 100000"
cat > /tmp/ratewell-wrk-flood.lua <<'LUA'
local counter = 0
request = function()
    counter = counter + 1
    return wrk.format(nil, "/", { ["x-api-key"] = "flood-" .. counter .. "-" .. math.random(1, 1000000000) })
end
LUA
# The API-key limit is the example's own (1000 a minute): a key stays live for a minute, so the
# table fills and evicts.
pid=$(TOKIO_WORKER_THREADS=1 taskset -c 0 "$bin" --serve "127.0.0.1:$port" --ip-policy "$open" --search-policy "$open" --key-capacity 100000 > /dev/null & echo $!)
wait_up
echo "rss before: $(rss_kib "$pid") KiB"
for round in 1 2 3 4; do
    out=$(taskset -c 1 wrk -t1 -c32 -d"${FLOOD_SECONDS:-15}s" -s /tmp/ratewell-wrk-flood.lua "http://127.0.0.1:$port/")
    requests=$(echo "$out" | awk '/requests in/ {print $1}')
    echo "round $round: $requests requests ($(echo "$out" | rps)/s), rss $(rss_kib "$pid") KiB"
    curl -s "http://127.0.0.1:$port/metrics" | grep '^api-key'
done
kill "$pid"; wait "$pid" 2> /dev/null || true
