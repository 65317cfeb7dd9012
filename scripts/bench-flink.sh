#!/usr/bin/env bash
# tally against Apache Flink 2.3 SQL on the same file: the same query
# (bench/flink/TallyTumble.java: event time, 5 s watermark bound, 1-minute TUMBLE per
# tenant, exact BIGINT pico-USD sums). Whole processes, best of rounds; Flink's rounds
# are jobs in one JVM, so its best is a warm JIT. The two totals (panes, cost_pico)
# must agree, or the comparison is void and this fails.
#
# Flink is the distribution bundled in PyPI's apache-flink wheel (its lib/ jars), run
# on the machine's JDK 17; the wheel is installed once into <work>/flink-venv.
#   usage: scripts/bench-flink.sh <tally binary> <config> <events.jsonl> <work dir>
#   (the config's state and checkpoint dirs are <work>/state and <work>/checkpoints,
#   as scripts/bench.sh writes them)
#   BENCH_FLINK_ROUNDS  jobs per Flink JVM (default 4); tally runs 3 times
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$1 cfg=$2 file=$3 work=$4
command -v javac >/dev/null || {
  echo "bench-flink: needs a JDK 17 (javac), e.g. apt-get install openjdk-17-jdk-headless" >&2
  exit 1
}
venv=$work/flink-venv
flink_lib() { echo "$venv"/lib/python3*/site-packages/pyflink/lib; }
if [ ! -s "$(flink_lib)/flink-dist-2.3.0.jar" ]; then
  echo "installing apache-flink 2.3.0 from PyPI into $venv (about 850 MB) ..." >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q apache-flink==2.3.0
fi
lib=$(flink_lib)
classes=$work/flink-classes
mkdir -p "$classes"
javac -cp "$lib/*" -d "$classes" bench/flink/TallyTumble.java
events=$(wc -l <"$file")

# Flink: one JVM per parallelism; its stdout has a `round=` line per job.
rounds=${BENCH_FLINK_ROUNDS:-4}
for p in 1 2; do
  java -cp "$classes:$lib/*" TallyTumble "$file" "$rounds" "$p" 2>"$work/flink-p$p.log" \
    | grep '^round=' >"$work/flink-p$p.txt"
done
field() { sed -n "s/.* $1=\([0-9.]*\).*/\1/p"; }
flink_best() { field seconds <"$work/flink-p$1.txt" | sort -n | head -1; }

# tally: the whole process, as a user runs it (state and checkpoints fresh each run).
best=""
for _ in 1 2 3; do
  rm -rf "$work/state" "$work/checkpoints"
  start=$(date +%s.%N)
  TALLY_LOG=warn "$bin" run --config "$cfg" --input-file "$file" --output-file "$work/flink-tally.jsonl" 2>/dev/null
  end=$(date +%s.%N)
  s=$(echo "$end - $start" | bc)
  best=$(echo "$s" | awk -v b="${best:-1e9}" '{print ($1 < b) ? $1 : b}')
done

# The totals must agree: tally's panes and their cost, against every Flink job's.
tally_totals=$(python3 -c '
import json, sys
panes = cost = 0
for line in open(sys.argv[1]):
    r = json.loads(line)
    panes += 1
    cost += int(r["cost_pico"])
print(panes, cost)' "$work/flink-tally.jsonl")
for p in 1 2; do
  while read -r line; do
    got="$(echo "$line" | field panes) $(echo "$line" | field cost_pico)"
    if [ "$got" != "$tally_totals" ]; then
      echo "bench-flink: totals differ: Flink (parallelism $p) panes/cost_pico $got, tally $tally_totals" >&2
      exit 1
    fi
  done <"$work/flink-p$p.txt"
done
rm -f "$work/flink-tally.jsonl"*

flink=$(printf '%s\n%s\n' "$(flink_best 1)" "$(flink_best 2)" | sort -n | head -1)
row() { awk -v n="$events" -v s="$2" -v f="$flink" -v name="$1" \
  'BEGIN {printf "| %s | %d | %.2f | %.0f | %.2f |\n", name, n, s, n / s, f / s}'; }
echo "Totals agree: $(echo "$tally_totals" | cut -d' ' -f1) panes, cost_pico $(echo "$tally_totals" | cut -d' ' -f2)."
echo
echo "| run | events | best seconds | events/s | ratio to Flink's best |"
echo "|---|---:|---:|---:|---:|"
row "Flink 2.3 SQL, parallelism 1 (best of $rounds jobs, one JVM)" "$(flink_best 1)"
row "Flink 2.3 SQL, parallelism 2 (best of $rounds jobs, one JVM)" "$(flink_best 2)"
row "tally run --input-file (whole process, best of 3)" "$best"
