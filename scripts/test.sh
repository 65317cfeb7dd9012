#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs prerequisites, builds, starts
# a throw-away PostgreSQL and S3-compatible server (scripts/s3.sh), runs every unit and integration test (integration tests
# start their own `tally dev-broker` processes), stops what it started.
# Exits non-zero on any failure. A test that needs a service fails if it cannot start.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/bootstrap.sh
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}
cargo build --bins --tests

pgdir=$(mktemp -d /tmp/tally-test-pg.XXXXXX)
s3dir=$(mktemp -d /tmp/tally-test-s3.XXXXXX)
trap 'scripts/pg.sh stop "$pgdir"; scripts/s3.sh stop "$s3dir"' EXIT
scripts/pg.sh start "$pgdir"
export TALLY_TEST_PG_URL
TALLY_TEST_PG_URL=$(cat "$pgdir/url")
scripts/s3.sh start "$s3dir"
export TALLY_TEST_S3_ENDPOINT
TALLY_TEST_S3_ENDPOINT=$(cat "$s3dir/endpoint")

# A dev-broker smoke check: the binary starts a broker and publishes its address.
"${CARGO_TARGET_DIR:-target}/debug/tally" dev-broker --address-file "$pgdir/bootstrap" --partitions 2 >/dev/null 2>&1 &
broker=$!
for _ in $(seq 1 100); do [ -s "$pgdir/bootstrap" ] && break; sleep 0.1; done
kill "$broker" 2>/dev/null || true
wait "$broker" 2>/dev/null || true
[ -s "$pgdir/bootstrap" ] || { echo "test.sh: tally dev-broker did not start" >&2; exit 1; }

log="$pgdir/cargo-test.log"
set +e
cargo test --no-fail-fast "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
# One closing line over every test binary.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "tally tests: %d passed, %d failed\n", p, f }' "$log"
exit "$status"
