#!/usr/bin/env bash
# Redraw docs/compare.png, the chart the README shows: the README's first command, written into
# docs/ (the output is deterministic: the same trace and binary give the same bytes).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo run --release -p ratewell-cli -- compare examples/sample.csv --limit 20/10s --png docs/compare.png
