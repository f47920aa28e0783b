#!/usr/bin/env bash
# Instructions a decision costs redis-server (callgrind: deterministic), next to INCR's.
#
#   benches/server_instructions.sh MODULE.so [POLICY]
#
# Starts redis-server under callgrind with the module loaded, warms 200 batches, then counts
# 500 batches of 32 requests (16,000 decisions) of POLICY (default: the round-trip bench's
# token bucket, whose keys expire between decisions; `token-bucket capacity=100000 rate=1000/h`
# keeps them) and 16,000 pipelined INCRs on warm keys, and prints instructions per operation.
set -euo pipefail
so=$1
policy=${2:-token-bucket capacity=1000 rate=1000/s}
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d)
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
valgrind --tool=callgrind --callgrind-out-file="$out/cg.%p.out" \
    redis-server --port "$port" --save "" --appendonly no --loadmodule "$so" > "$out/log" 2>&1 &
vg=$!
for _ in $(seq 200); do redis-cli -p "$port" PING > /dev/null 2>&1 && break; sleep 0.2; done
pid=$(pgrep -f "callgrind.*--port $port" | head -1)
python3 "$here/drive.py" "$port" "$pid" module 200 32 "$policy" > /dev/null
callgrind_control -z "$pid" > /dev/null 2>&1
python3 "$here/drive.py" "$port" "$pid" module 500 32 "$policy" > /dev/null
callgrind_control -d module "$pid" > /dev/null 2>&1
python3 "$here/drive.py" "$port" "$pid" incr 16000 > /dev/null
callgrind_control -z "$pid" > /dev/null 2>&1
python3 "$here/drive.py" "$port" "$pid" incr 16000 > /dev/null
callgrind_control -d incr "$pid" > /dev/null 2>&1
redis-cli -p "$port" SHUTDOWN NOSAVE > /dev/null 2>&1 || true
wait "$vg" || true
total() { grep -m1 '^totals:\|^summary:' "$1" | awk '{print $2}'; }
module=$(total "$out"/cg.*.out.1)
incr=$(total "$out"/cg.*.out.2)
echo "policy: $policy"
echo "module: $((module / 16000)) instructions per decision (batches of 32)"
echo "INCR:   $((incr / 16000)) instructions per INCR (pipelined)"
python3 -c "print('decision / INCR: %.2f' % ($module / $incr))"
rm -rf "$out"
