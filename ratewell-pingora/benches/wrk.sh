#!/usr/bin/env bash
# End to end on loopback with wrk (Debian's package): the proxy example with no limit, with a
# ratewell limit (fields on rejections only, and on every response), and with pingora-limits'
# Rate on the same policy (at most N requests per client address per second; ratewell's
# `fixed-window limit=N window=1s`), alternating; N is large, so every request is admitted and
# what is measured is the limiter's cost.
# Usage: benches/wrk.sh [SECONDS] > benches/results/wrk-DATE.txt (RUNS=7 alternations by default)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-5}
runs=${RUNS:-7}
command -v wrk > /dev/null || { echo "wrk is missing: apt-get install wrk" >&2; exit 1; }
command -v taskset > /dev/null || { echo "taskset is missing: apt-get install util-linux" >&2; exit 1; }
cargo build --release --quiet --example proxy --example upstream
bin=target/release/examples
port=${PORT:-38180}
up=${UPSTREAM_PORT:-38181}
n=1000000000

# The upstream and wrk on core 1, the proxy on core 0.
taskset -c 1 "$bin/upstream" "127.0.0.1:$up" > /dev/null &
upstream=$!
trap 'kill $upstream 2> /dev/null || true' EXIT
wait_up() { for _ in $(seq 200); do (exec 3<> "/dev/tcp/127.0.0.1/$1") 2> /dev/null && return; sleep 0.05; done; exit 1; }
wait_up "$up"
serve() { # args: the proxy's limit options; prints the pid
    taskset -c 0 "$bin/proxy" --listen "127.0.0.1:$port" --upstream "127.0.0.1:$up" "$@" > /dev/null 2>&1 &
    echo $!
}
rps() { awk '/Requests\/sec/ {print $2}'; }

echo "# $(date -u +%FT%TZ) $(nproc) cores; wrk -t1 -c32 -d${seconds}s and the upstream on core 1, the proxy on core 0"
echo "## throughput: GET /, every request admitted, alternating runs"
echo "## (none: no limit; ratewell: fields on rejections only; ratewell-fields: on every response;"
echo "##  pingora-limits: its Rate, at most $n a second per address)"
for run in $(seq "$runs"); do
    for mode in none ratewell pingora-limits ratewell-fields; do
        case $mode in
            none) pid=$(serve --no-limit) ;;
            ratewell) pid=$(serve --policy "fixed-window limit=$n window=1s" --no-headers) ;;
            pingora-limits) pid=$(serve --pingora-limits "$n") ;;
            ratewell-fields) pid=$(serve --policy "fixed-window limit=$n window=1s") ;;
        esac
        wait_up "$port"
        r=$(taskset -c 1 wrk -t1 -c32 -d"${seconds}s" "http://127.0.0.1:$port/" | rps)
        kill "$pid"; wait "$pid" 2> /dev/null || true
        echo "run $run $mode $r"
    done
done
