#!/usr/bin/env bash
# A fuzz campaign: every target for SECONDS (default 600 = 10 CPU-minutes), JOBS at a time
# (default: the number of cores), logs and final stats under fuzz/logs/.
set -euo pipefail
cd "$(dirname "$0")"
seconds=${SECONDS_PER_TARGET:-600}
jobs=${JOBS:-$(nproc)}
mkdir -p logs
targets=$(cargo +nightly fuzz list)
cargo +nightly fuzz build -O
printf '%s\n' $targets | xargs -P "$jobs" -I{} sh -c \
    "cargo +nightly fuzz run -O {} -- -max_total_time=$seconds -print_final_stats=1 > logs/{}.log 2>&1 && echo '{}: ok' || echo '{}: FAILED (see fuzz/logs/{}.log)'"
