//! The demo as `scripts/demo.sh` runs it (issue 37, step 6): `tally demo` on a
//! real PostgreSQL with the script's log filter. Its tour is not interrupted by
//! the worker's per-record dead-letter warnings (each job used to log every one,
//! twice in all, amid the tour), and it ends by asking the usage API with keys
//! and printing acme's invoice as readable JSON, not an escaped string.

use std::time::Duration;

use crate::common::*;

/// The `TALLY_LOG` that scripts/demo.sh gives `tally demo` when the caller sets none.
fn script_log_filter() -> String {
    let script =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/demo.sh")).unwrap();
    let at = script
        .find("TALLY_LOG=${TALLY_LOG:-")
        .expect("demo.sh sets a default TALLY_LOG")
        + "TALLY_LOG=${TALLY_LOG:-".len();
    script[at..].split('}').next().unwrap().to_string()
}

#[test]
fn the_demo_asks_the_api_with_keys_and_prints_the_invoice_as_json_without_interleaved_warnings() {
    let db = fresh_database("demo");
    let filter = script_log_filter();
    let out = tally_ok(
        &["demo", "--database-url", &db],
        &[("TALLY_LOG", &filter)],
        Duration::from_secs(300),
    );
    let (stdout, stderr) = (
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    );
    assert!(!stderr.contains("dead letter"), "{stderr}");
    assert!(!stdout.contains("dead letter source="), "{stdout}");
    // The tour still counts them, once.
    assert_eq!(
        stdout.matches("dead letters on requests.dlq").count(),
        1,
        "{stdout}"
    );

    // The usage API, asked with keys; the invoice is the JSON it answered, pretty.
    assert!(stdout.contains("with an admin key:"), "{stdout}");
    let at = stdout
        .find("with a key scoped to tenant acme")
        .expect("the invoice part");
    let json_at = at + stdout[at..].find("\n{").unwrap() + 1;
    let invoice: serde_json::Value = serde_json::from_str(stdout[json_at..].trim())
        .unwrap_or_else(|e| panic!("{e}: {}", &stdout[json_at..]));
    assert_eq!(invoice["tenant_id"], "acme");
    assert_eq!(invoice["total"]["cost_pico"], "700000000000");
    assert!(
        stdout[json_at..].contains("\n  \"tenant_id\": \"acme\",\n"),
        "not pretty: {stdout}"
    );
    assert!(!stdout.contains("\\\""), "an escaped JSON string: {stdout}");
}
