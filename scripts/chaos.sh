#!/usr/bin/env bash
# The scale-out chaos run (release build): dev broker + PostgreSQL + N workers over 12
# partitions + the sink + the generator; a random worker is SIGKILLed every 15–30 s and
# restarted; at the end the PostgreSQL view is compared with the exact expectation and
# one report is printed. Extra arguments go to `tally-dev chaos` (see `tally-dev chaos --help`),
# e.g. scripts/chaos.sh --workers 4 --duration 15m.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/bootstrap.sh
cargo build --release --bins
pgdir=$(mktemp -d /tmp/tally-chaos-pg.XXXXXX)
trap 'scripts/pg.sh stop "$pgdir"' EXIT
scripts/pg.sh start "$pgdir"
TALLY_LOG=${TALLY_LOG:-warn} target/release/tally-dev chaos --database-url "$(cat "$pgdir/url")" "$@"
