#!/usr/bin/env bash
# Benchmarks, release build. Every figure that can be is a ratio against a baseline
# measured in the same run (these machines are shared and noisy). Prints Markdown tables.
#   BENCH_EVENTS        events in the engine file (default 5,000,000)
#   BENCH_KAFKA_EVENTS  events preloaded on the dev broker (default 1,500,000; the
#                       broker keeps 5 MiB per partition, so they span 32 partitions)
#   BENCH_STATE_SIZES   open-window scales for the state benchmark (default "1000000 10000000")
#   BENCH_BUDGET        state.memory_budget for the state benchmark (default 64MiB)
#   BENCH_DIR           scratch directory (default /tmp/tally-bench; generated files are reused)
#   BENCH_MAPPED_EVENTS events per file of the input-mapping section (default 2,000,000)
#   BENCH_RATED_EVENTS  records per shape of the rating section (default 2,000,000)
#   BENCH_SINK_RECORDS  result records of the sink section (default 1,000,000 over 10,000 tenants)
#   BENCH_API_TENANTS   tenant counts of the usage API section (default 10000,100000)
#   BENCH_ROUNDS        rounds of the sink section (default 2)
#   BENCH_ONLY          run one section: engine, mapped, rated, flink, kafka, state, checkpoint,
#                       budget, sink or api
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/bootstrap.sh
cargo build --release --bins
bin=${CARGO_TARGET_DIR:-target}/release/tally
dev=${CARGO_TARGET_DIR:-target}/release/tally-dev
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

only=${BENCH_ONLY:-all}
section() { [ "$only" = all ] || [ "$only" = "$1" ]; }

echo "### Machine"
echo
echo "$(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo
if section engine; then
  echo "### Engine from a file, one core (taskset -c 0; checkpoints every 10 s, as the worker)"
  echo
  rm -rf "$work/state" "$work/checkpoints"
  TALLY_LOG=warn taskset -c 0 "$dev" bench-engine --config "$work/bench.toml" --input-file "$work/events-$events.jsonl"
  echo
  # High cardinality: 1 M tenants, uniform, 10 % duplicates (issue 38 target 2).
  hc="$work/events-$events-1m-tenants.jsonl"
  if [ ! -s "$hc" ]; then
    echo "generating $events events (1,000,000 tenants, uniform, 10 % duplicates) ..." >&2
    "$bin" gen --config "$work/bench.toml" --count "$events" --tenants 1000000 --skew 0 \
      --duplicate-fraction 0.1 --partitions 1 --output-file "$hc" 2>/dev/null
  fi
  echo "### Engine from a file, one core, high cardinality (1 M tenants, 10 % duplicates)"
  echo
  rm -rf "$work/state" "$work/checkpoints"
  TALLY_LOG=warn taskset -c 0 "$dev" bench-engine --config "$work/bench.toml" --input-file "$hc"
  echo
fi

if section mapped; then
  # The same records in three shapes (the default contract, a nested mapping with
  # RFC 3339 and microsecond times, CloudEvents), each with its config's [input].
  mevents=${BENCH_MAPPED_EVENTS:-2000000}
  cp "$work/bench.toml" "$work/nested.toml"
  cat >>"$work/nested.toml" <<'TOML'
[input]
request_id = "/meta/request/id"
tenant_id = "/customer/id"
model = "/usage/model"
prompt_tokens = "/usage/input_tokens"
completion_tokens = "/usage/output_tokens"
completed_ts = "/time"
started_ts = "/spans/0/start"
completed_ts_format = "rfc3339"
started_ts_format = "epoch_us"
TOML
  cp "$work/bench.toml" "$work/ce.toml"
  printf '[input]\nformat = "cloudevents"\n' >>"$work/ce.toml"
  echo "### Input mappings: the same $mevents records in three shapes"
  echo
  echo "One core: \`bench-engine --rounds 1\` under taskset -c 0. Two cores: \`tally run --input-file\`, the"
  echo "whole process as a user runs it (its reading thread parses beside the windows). The shapes"
  echo "alternate, three rounds; each figure is the shape's best (a VM that drifts between shapes"
  echo "would otherwise bias their ratio)."
  echo
  shapes="bench nested ce"
  for shape in $shapes; do
    f="$work/mapped-$shape-$mevents.jsonl"
    [ -s "$f" ] || "$bin" gen --config "$work/$shape.toml" --count "$mevents" --tenants 100 --skew 1.0 \
      --partitions 1 --output-file "$f" 2>/dev/null
  done
  declare -A one base two
  best() { awk -v a="${1:-0}" -v b="$2" 'BEGIN {print (b > a) ? b : a}'; }
  for _ in 1 2 3; do
    for shape in $shapes; do
      f="$work/mapped-$shape-$mevents.jsonl"
      rm -rf "$work/state" "$work/checkpoints"
      table=$(TALLY_LOG=warn taskset -c 0 "$dev" bench-engine --config "$work/$shape.toml" --input-file "$f" --rounds 1)
      rate=$(echo "$table" | grep '^| tally run' | awk -F'|' '{gsub(/ /,"",$5); print $5}')
      parse=$(echo "$table" | grep '^| parse-only' | awk -F'|' '{gsub(/ /,"",$5); print $5}')
      one[$shape]=$(best "${one[$shape]:-}" "$rate")
      base[$shape]=$(best "${base[$shape]:-}" "$parse")
      rm -rf "$work/state" "$work/checkpoints"
      start=$(date +%s.%N)
      TALLY_LOG=warn "$bin" run --config "$work/$shape.toml" --input-file "$f" --output-file "$work/mapped-out.jsonl" 2>/dev/null
      end=$(date +%s.%N)
      two[$shape]=$(best "${two[$shape]:-}" "$(awk -v n="$mevents" -v s="$(echo "$end - $start" | bc)" 'BEGIN {printf "%.0f", n / s}')")
    done
  done
  ratio() { awk -v r="$1" -v b="$2" 'BEGIN {printf "%.2f", r / b}'; }
  echo "| shape | one core: engine events/s | ratio to the default shape | engine / its parse-only baseline | two cores: events/s | ratio to the default shape |"
  echo "|---|---:|---:|---:|---:|---:|"
  for shape in $shapes; do
    echo "| $shape | ${one[$shape]} | $(ratio "${one[$shape]}" "${one[bench]}") | $(ratio "${one[$shape]}" "${base[$shape]}") | ${two[$shape]} | $(ratio "${two[$shape]}" "${two[bench]}") |"
  done
  rm -f "$work/mapped-out.jsonl"*
  echo
fi

if section rated; then
  # Rating (docs/reference/rating.md): the default two-quantity shape against an
  # OpenAI-style (five quantities, two parts, a per-call rate, a batch variant, a
  # plan) and an Anthropic-style (four quantities, a long-context tier, a fee) shape.
  revents=${BENCH_RATED_EVENTS:-2000000}
  common_input='prompt_tokens = "/usage/prompt_tokens"
completion_tokens = "/usage/completion_tokens"'
  head -n 6 "$work/bench.toml" >"$work/openai5.toml"
  cat >>"$work/openai5.toml" <<TOML
[input]
$common_input
[input.quantities.cached_tokens]
part_of = "prompt_tokens"
pointer = "/usage/cached_tokens"
[input.quantities.reasoning_tokens]
part_of = "completion_tokens"
pointer = "/usage/reasoning_tokens"
[input.quantities.web_search_calls]
pointer = "/usage/web_search_calls"
[input.variant]
name = "service_tier"
values = ["default", "batch"]
default = "default"
[prices.models.o-large.rates]
prompt_tokens = "0.002"
cached_tokens = "0.0005"
completion_tokens = "0.008"
reasoning_tokens = "0.008"
web_search_calls = { per_unit = "0.01" }
[prices.models.o-large.variants.batch.rates]
prompt_tokens = "0.001"
cached_tokens = "0.00025"
completion_tokens = "0.004"
reasoning_tokens = "0.004"
web_search_calls = { per_1k = "5" }
[prices.plans.enterprise.models.o-large.rates]
prompt_tokens = "0.0015"
[[prices.assignments]]
tenant = "tenant-1"
plan = "enterprise"
TOML
  head -n 6 "$work/bench.toml" >"$work/anthropic4.toml"
  cat >>"$work/anthropic4.toml" <<TOML
[input]
$common_input
[input.quantities.cache_read_input_tokens]
pointer = "/usage/cache_read_input_tokens"
[input.quantities.cache_creation_input_tokens]
pointer = "/usage/cache_creation_input_tokens"
[prices.models.c-sonnet]
fee = "0.0001"
[prices.models.c-sonnet.rates]
prompt_tokens = "0.003"
cache_read_input_tokens = "0.0003"
cache_creation_input_tokens = "0.00375"
completion_tokens = "0.015"
[[prices.models.c-sonnet.tiers]]
above = 200000
on = ["prompt_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"]
rates = { prompt_tokens = "0.006", cache_read_input_tokens = "0.0006", cache_creation_input_tokens = "0.0075", completion_tokens = "0.0225" }
TOML
  echo "### Rating: the default shape against five- and four-quantity shapes ($revents records each)"
  echo
  echo "One core: \`bench-engine --rounds 1\` under taskset -c 0, shapes alternating, three rounds, each"
  echo "shape's best."
  echo
  shapes="bench openai5 anthropic4"
  for shape in $shapes; do
    f="$work/rated-$shape-$revents.jsonl"
    [ -s "$f" ] || "$bin" gen --config "$work/$shape.toml" --count "$revents" --tenants 100 --skew 1.0 \
      --partitions 1 --output-file "$f" 2>/dev/null
  done
  declare -A rone rbase
  best() { awk -v a="${1:-0}" -v b="$2" 'BEGIN {print (b > a) ? b : a}'; }
  for _ in 1 2 3; do
    for shape in $shapes; do
      rm -rf "$work/state" "$work/checkpoints"
      table=$(TALLY_LOG=warn taskset -c 0 "$dev" bench-engine --config "$work/$shape.toml" \
        --input-file "$work/rated-$shape-$revents.jsonl" --rounds 1)
      rone[$shape]=$(best "${rone[$shape]:-}" "$(echo "$table" | grep '^| tally run' | awk -F'|' '{gsub(/ /,"",$5); print $5}')")
      rbase[$shape]=$(best "${rbase[$shape]:-}" "$(echo "$table" | grep '^| parse-only' | awk -F'|' '{gsub(/ /,"",$5); print $5}')")
    done
  done
  ratio() { awk -v r="$1" -v b="$2" 'BEGIN {printf "%.2f", r / b}'; }
  echo "| shape | engine events/s | ratio to the default shape | engine / its parse-only baseline |"
  echo "|---|---:|---:|---:|"
  for shape in $shapes; do
    echo "| $shape | ${rone[$shape]} | $(ratio "${rone[$shape]}" "${rone[bench]}") | $(ratio "${rone[$shape]}" "${rbase[$shape]}") |"
  done
  echo
fi

if section flink; then
  echo "### Against Apache Flink 2.3 SQL: the same query on the same $events events"
  echo
  scripts/bench-flink.sh "$bin" "$work/bench.toml" "$work/events-$events.jsonl" "$work"
  echo
fi

if section kafka; then
  kevents=${BENCH_KAFKA_EVENTS:-1500000}
  kdir="$work/kafka"
  rm -rf "$kdir" && mkdir -p "$kdir"
  "$bin" dev-broker --no-default-topics --topic requests:32 --topic tenant-cost:4 \
    --topic requests.late:4 --topic requests.dlq:4 --address-file "$kdir/bootstrap" >"$kdir/broker.log" 2>&1 &
  broker=$!
  trap 'kill $broker 2>/dev/null || true' EXIT
  for _ in $(seq 100); do [ -s "$kdir/bootstrap" ] && break; sleep 0.1; done
  sed -e "s#$work/state#$kdir/state#; s#$work/checkpoints#$kdir/checkpoints#" "$work/bench.toml" >"$kdir/kafka.toml"
  printf '[kafka]\nbootstrap_servers = "%s"\ngroup_id = "bench"\n' "$(cat "$kdir/bootstrap")" >>"$kdir/kafka.toml"
  echo "preloading $kevents events (1000 tenants, uniform, 32 partitions) ..." >&2
  # In large batches: the dev broker (librdkafka's mock) finds a fetch offset by
  # scanning the partition's batches from the first, so the 5 ms batches of the
  # default linger made every fetch slow and both sides of this benchmark wait on
  # the broker (BENCHMARKS.md §2). A real broker indexes its log.
  cp "$kdir/kafka.toml" "$kdir/preload.toml"
  printf '"linger.ms" = "200"\n"batch.num.messages" = "20000"\n"batch.size" = "4000000"\n' >>"$kdir/preload.toml"
  "$bin" gen --config "$kdir/preload.toml" --count "$kevents" --tenants 1000 --skew 0 --partitions 32 >/dev/null 2>&1
  echo "### Kafka end to end (dev broker, same machine; both sides pinned to 1, then 2 cores)"
  echo
  TALLY_LOG=warn "$dev" bench-kafka --config "$kdir/kafka.toml" --rounds 3 --cores 1,2 --dir "$kdir/runs"
  kill $broker 2>/dev/null || true
  echo
fi

if section state; then
  sdir="$work/state-scale"
  mkdir -p "$sdir"
  sed -e "s#$work/state#$sdir/state#; s#$work/checkpoints#$sdir/checkpoints#" "$work/bench.toml" >"$sdir/state.toml"
  printf '[window]\nallowed_lateness = "3h"\n' >>"$sdir/state.toml"
  budget=${BENCH_BUDGET:-64MiB}
  echo "### State scale (1M tenants, uniform, 1 ms apart, allowed lateness 3 h: every window stays open)"
  echo
  echo "| open windows | memory budget | events/s | peak RSS MiB | windows spilled | RocksDB on disk | checkpoint on disk |"
  echo "|---:|---:|---:|---:|---:|---:|---:|"
  for n in ${BENCH_STATE_SIZES:-1000000 10000000}; do
    f="$sdir/events-$n.jsonl"
    [ -s "$f" ] || "$bin" gen --config "$sdir/state.toml" --count "$n" --tenants 1000000 --skew 0 --step 1ms \
      --partitions 1 --output-file "$f" >/dev/null 2>&1
    budgets="$budget"
    [ "$n" -le 1000000 ] && budgets="off $budget"
    for b in $budgets; do
      rm -rf "$sdir/state" "$sdir/checkpoints"
      start=$(date +%s.%N)
      TALLY_STATE__MEMORY_BUDGET=$b TALLY_LOG=info /usr/bin/time -f "%M" -o "$sdir/rss" \
        "$bin" run --config "$sdir/state.toml" --input-file "$f" --output-file "$sdir/out.jsonl" 2>"$sdir/log"
      end=$(date +%s.%N)
      windows=$(grep -o 'panes [0-9]*' "$sdir/log" | awk '{print $2}')
      spilled=$(grep -o 'windows_spilled=[0-9]*' "$sdir/log" | cut -d= -f2)
      rate=$(echo "$n / ($end - $start)" | bc)
      echo "| $windows | $b | $rate | $(( $(cat "$sdir/rss") / 1024 )) | $spilled | $(du -sh "$sdir/state" | cut -f1) | $(du -sh "$sdir/checkpoints" | cut -f1) |"
    done
  done
  rm -f "$sdir/out.jsonl"*
  echo
fi

if section checkpoint; then
  echo "### Checkpoints (state part of the barrier; 4 partitions): local directory, then S3"
  echo
  # S3: an S3-compatible server on this machine (scripts/s3.sh: moto, one Python
  # process; a real S3 adds network round trips and its own throughput).
  s3dir=$(mktemp -d /tmp/tally-bench-s3.XXXXXX)
  scripts/s3.sh start "$s3dir"
  AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench-secret AWS_REGION=us-east-1 TALLY_LOG=warn \
    "$dev" bench-checkpoint --dir "$work/checkpoint-bench" --s3-endpoint "$(cat "$s3dir/endpoint")"
  scripts/s3.sh stop "$s3dir"
fi

if section budget; then
  echo "### Long lateness under a memory budget (100k tenants, 1 h lateness, a checkpoint a minute)"
  echo
  TALLY_LOG=warn "$dev" bench-lateness --dir "$work/lateness-bench"
  echo
  echo "### 50 M live dedup ids, without and with a 256 MiB budget (each in its own process)"
  echo
  TALLY_LOG=warn "$dev" bench-dedup --dir "$work/dedup-bench"
  echo
fi

# A throw-away PostgreSQL (scripts/pg.sh) for the sink and API sections, stopped on exit.
pg_start() {
  pgdir=$(mktemp -d /tmp/tally-bench-pg.XXXXXX)
  trap 'scripts/pg.sh stop "$pgdir" >/dev/null 2>&1 || true' EXIT
  scripts/pg.sh start "$pgdir" >&2
}

if section sink; then
  pg_start
  records=${BENCH_SINK_RECORDS:-1000000}
  echo "### The sink: $records result records over 10,000 tenants, against a plain batched upsert loop"
  echo
  echo "Each round into fresh databases of one local PostgreSQL (pg.sh's defaults); both sides"
  echo "alternate; the database holds exactly the expected rows after each."
  echo
  TALLY_LOG=warn "$dev" bench-sink --database-url "$(cat "$pgdir/url")" --records "$records" \
    --tenants 10000 --rounds "${BENCH_ROUNDS:-2}" --dir "$work/sink"
  scripts/pg.sh stop "$pgdir" >&2
  echo
fi

if section api; then
  pg_start
  echo "### The usage API: latency per query, and the plans of its statements"
  echo
  TALLY_LOG=warn "$dev" bench-api --database-url "$(cat "$pgdir/url")" \
    --tenants "${BENCH_API_TENANTS:-10000,100000}" --dir "$work/api" --plans "$work/api/plans.md"
  echo
  echo "The plans of every statement (auto_explain, ANALYZE, BUFFERS): $work/api/plans.md"
  scripts/pg.sh stop "$pgdir" >&2
  echo
fi
