#!/usr/bin/env bash
# Benchmarks, release build. Every figure that can be is a ratio against a baseline
# measured in the same run (these machines are shared and noisy). Prints Markdown tables.
#   BENCH_EVENTS   events in the generated file (default 5,000,000)
#   BENCH_DIR      scratch directory (default /tmp/tally-bench; the file is reused)
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/bootstrap.sh
cargo build --release --bin tally
bin=target/release/tally
work=${BENCH_DIR:-/tmp/tally-bench}
events=${BENCH_EVENTS:-5000000}
mkdir -p "$work"
cat >"$work/bench.toml" <<TOML
[watermark]
max_future = "off"
[state]
dir = "$work/state"
[checkpoint]
dir = "$work/checkpoints"
[prices.small]
input_per_1k = "0.00015"
output_per_1k = "0.0006"
[prices.medium]
input_per_1k = "0.003"
output_per_1k = "0.015"
[prices.large]
input_per_1k = "0.05"
output_per_1k = "0.10"
TOML
if [ ! -s "$work/events-$events.jsonl" ]; then
  echo "generating $events events (100 tenants, Zipf 1.0, 3 models, 4 s jitter) ..." >&2
  "$bin" gen --config "$work/bench.toml" --count "$events" --tenants 100 --skew 1.0 --partitions 1 \
    --output-file "$work/events-$events.jsonl" 2>/dev/null
fi

echo "### Machine"
echo
echo "$(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo
echo "### Engine from a file, one core (taskset -c 0)"
echo
TALLY_LOG=warn taskset -c 0 "$bin" bench-engine --config "$work/bench.toml" --input-file "$work/events-$events.jsonl"
echo
echo "### Checkpoints (state part of the barrier; 4 partitions)"
echo
TALLY_LOG=warn "$bin" bench-checkpoint --dir "$work/checkpoint-bench"
