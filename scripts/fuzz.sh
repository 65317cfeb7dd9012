#!/usr/bin/env bash
# The long run of the untrusted-input property tests (issue 39): every decoder of
# bytes tally did not write itself, FUZZ_CASES cases each (default 1,000,000), in a
# release build of the library's tests. Where a reference exists the property is
# more than "no panic": a manifest decodes to itself, a part parses back to its
# entries, the fast input scanner equals the reference parser (serde_json's walk).
#   FUZZ_CASES   cases per property (default 1000000)
#   FUZZ_ONLY    a test-name filter instead of the whole list below
# A failure prints the minimal input; proptest keeps its seed under
# proptest-regressions/ (commit it) and CORPUS in src/untrusted_tests.rs keeps
# crashers as bytes, run on every test run.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/bootstrap.sh
cases=${FUZZ_CASES:-1000000}
filters=(
  untrusted_tests::                    # arbitrary and mutated bytes: records, config, manifests, snapshots, results
  checkpoint::format::roundtrip_tests:: # decode(encode(manifest)) == manifest; parts round trip; mutated parts
  model::input::proptests::            # the scanner against the reference parser, four mappings
)
[ -n "${FUZZ_ONLY:-}" ] && filters=("$FUZZ_ONLY")
cargo test --release --lib --no-run 2>&1 | tail -1
for f in "${filters[@]}"; do
  echo "fuzz: $f ($cases cases a property)" >&2
  start=$(date +%s)
  log=$(mktemp /tmp/tally-fuzz.XXXXXX)
  set +e
  PROPTEST_CASES=$cases cargo test --release --lib -q "$f" -- --test-threads "$(nproc)" >"$log" 2>&1
  status=$?
  set -e
  grep -E "^test result|panicked|minimal failing|FAILED|^test .* \.\.\. " "$log" || tail -20 "$log"
  rm -f "$log"
  echo "fuzz: $f: $(( $(date +%s) - start )) s, exit $status" >&2
  [ "$status" = 0 ] || exit "$status"
done
