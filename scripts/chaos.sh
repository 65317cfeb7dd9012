#!/usr/bin/env bash
# The scale-out chaos run (release build): dev broker + PostgreSQL + N workers over 12
# partitions + the sink + the generator; a random worker is SIGKILLed every 15–30 s and
# restarted (checkpoints on S3, see below); at the end the PostgreSQL view is compared with
# the exact expectation and one report is printed. Extra arguments go to `tally-dev chaos`
# (see `tally-dev chaos --help`), e.g. scripts/chaos.sh --workers 4 --duration 15m.
#
#   scripts/chaos.sh campaign [ARGS]   the chaos campaign (`tally-dev chaos-campaign`):
#       short randomized runs, three at a time, until --kills (1000) or --budget (60m), e.g.
#       scripts/chaos.sh campaign --kills 1000 --seed 7; report in target/chaos-campaign/.
#   scripts/chaos.sh --replay SEED     replays one campaign run (the campaign prints it).
#
# CHAOS_STORE=local: no S3 server (checkpoints in a local directory only).
# CHAOS_PG_RESTARTS=0: PostgreSQL is not restarted by the faults.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/bootstrap.sh
cargo build --release --bins
pgdir=$(mktemp -d /tmp/tally-chaos-pg.XXXXXX)
s3dir=$(mktemp -d /tmp/tally-chaos-s3.XXXXXX)
trap 'scripts/pg.sh stop "$pgdir"; scripts/s3.sh stop "$s3dir"' EXIT
scripts/pg.sh start "$pgdir"
# Checkpoints on a throw-away S3-compatible server (scripts/s3.sh accepts any
# credentials); CHAOS_STORE=local keeps them in a local directory instead.
s3=()
if [ "${CHAOS_STORE:-s3}" = s3 ]; then
  scripts/s3.sh start "$s3dir"
  export AWS_ACCESS_KEY_ID=${AWS_ACCESS_KEY_ID:-chaos} AWS_SECRET_ACCESS_KEY=${AWS_SECRET_ACCESS_KEY:-chaos-secret} AWS_REGION=${AWS_REGION:-us-east-1}
  s3=(--s3-endpoint "$(cat "$s3dir/endpoint")")
fi
if [ "${CHAOS_PG_RESTARTS:-1}" != 0 ]; then
  export TALLY_CHAOS_PG_DIR=$pgdir
fi
cmd=chaos
if [ "${1:-}" = campaign ]; then
  cmd=chaos-campaign
  shift
fi
TALLY_LOG=${TALLY_LOG:-warn} "${CARGO_TARGET_DIR:-target}/release/tally-dev" "$cmd" --database-url "$(cat "$pgdir/url")" "${s3[@]}" "$@"
