#!/usr/bin/env bash
# The main job on embedded defaults: builds tally, starts a throw-away PostgreSQL,
# and runs `tally demo` (in-process Kafka mock cluster, RocksDB in a temp dir,
# the sink and the invoice view).
#
# It builds the same (dev) profile as scripts/test.sh, so the test command
# afterwards reuses the compiled C/C++ libraries instead of building them again.
# The demo's few thousand records need no optimised build; deployments use
# `cargo build --release` (see docs/operations/running.md).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/bootstrap.sh
bin="${CARGO_TARGET_DIR:-target}/debug/tally"
if [ ! -x "$bin" ]; then
  echo "demo: first build: compiling RocksDB (C++) and librdkafka (C) from source," >&2
  echo "demo: about 10 minutes on 2 cores (RocksDB most of it); later builds take seconds." >&2
fi
cargo build --bins
pgdir=$(mktemp -d /tmp/tally-demo-pg.XXXXXX)
trap 'scripts/pg.sh stop "$pgdir"' EXIT
scripts/pg.sh start "$pgdir"
# The tour counts the dead letters itself (step 5, by reason code); the worker's
# per-record `dead letter` warnings, which both of its jobs log to stderr in the
# middle of the tour, are off. TALLY_LOG set by the caller wins.
TALLY_LOG=${TALLY_LOG:-warn,tally::worker::kafka::outputs=error} \
  "$bin" demo --database-url "$(cat "$pgdir/url")" "$@"
