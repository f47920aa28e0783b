#!/usr/bin/env bash
# A fuzz campaign: every target (or those named as arguments) for SECONDS_PER_TARGET seconds of
# wall time (default 600), JOBS at a time (default: the number of cores). Each log under
# fuzz/logs/ ends with libFuzzer's final stats and the CPU time the run really got (user + sys),
# which is what to report: on a busy machine it is less than the wall time.
set -euo pipefail
cd "$(dirname "$0")"
seconds=${SECONDS_PER_TARGET:-600}
jobs=${JOBS:-$(nproc)}
mkdir -p logs
targets=${*:-$(cargo +nightly fuzz list)}
cargo +nightly fuzz build -O
export seconds
printf '%s\n' $targets | xargs -P "$jobs" -I{} bash -c '
    TIMEFORMAT="cpu: user %U s, sys %S s, wall %R s"
    { time cargo +nightly fuzz run -O {} -- -max_total_time=$seconds -print_final_stats=1; } > logs/{}.log 2>&1 \
        && echo "{}: ok ($(tail -1 logs/{}.log))" || echo "{}: FAILED (see fuzz/logs/{}.log)"'
