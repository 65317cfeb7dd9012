#!/usr/bin/env bash
# The main job on embedded defaults: builds tally, starts a throw-away PostgreSQL,
# and runs `tally demo` (in-process Kafka mock cluster, RocksDB in a temp dir,
# the sink and the invoice view).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/bootstrap.sh
cargo build --release --bin tally
pgdir=$(mktemp -d /tmp/tally-demo-pg.XXXXXX)
trap 'scripts/pg.sh stop "$pgdir"' EXIT
scripts/pg.sh start "$pgdir"
TALLY_LOG=${TALLY_LOG:-warn} target/release/tally demo --database-url "$(cat "$pgdir/url")" "$@"
