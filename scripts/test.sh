#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs prerequisites, builds, starts
# a throw-away PostgreSQL, runs every unit and integration test (integration tests
# start their own `tally dev-broker` processes), stops what it started.
# Exits non-zero on any failure. A test that needs a service fails if it cannot start.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/bootstrap.sh
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}
cargo build --bins --tests

pgdir=$(mktemp -d /tmp/tally-test-pg.XXXXXX)
trap 'scripts/pg.sh stop "$pgdir"' EXIT
scripts/pg.sh start "$pgdir"
export TALLY_TEST_PG_URL
TALLY_TEST_PG_URL=$(cat "$pgdir/url")

# A dev-broker smoke check: the binary starts a broker and publishes its address.
target/debug/tally dev-broker --address-file "$pgdir/bootstrap" --partitions 2 >/dev/null 2>&1 &
broker=$!
for _ in $(seq 1 100); do [ -s "$pgdir/bootstrap" ] && break; sleep 0.1; done
kill "$broker" 2>/dev/null || true
wait "$broker" 2>/dev/null || true
[ -s "$pgdir/bootstrap" ] || { echo "test.sh: tally dev-broker did not start" >&2; exit 1; }

cargo test --no-fail-fast "$@"
