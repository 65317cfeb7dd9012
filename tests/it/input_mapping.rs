//! The input mapping end to end on the dev broker (docs/DESIGN.md §3.1): a
//! CloudEvents stream and a custom-mapped stream (nested pointers, RFC 3339 and
//! microsecond times), both written by the generator the way the config reads
//! them, bill exactly what the generator expects — windows, dead letters by
//! reason, and the too-late events `reprocess-late` adjusts, keyed by the
//! mapping's dedup key. A pointer to a field the records do not have names the
//! pointer in every dead letter.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tally::engine::{ResultKind, SinkRecord};
use tally::kafka::headers;
use tally::kafka::read::read_topic;

use crate::common::*;

const T10: i64 = 1_767_261_600_000; // 2026-01-01T10:00:00Z
const TOPICS: &[(&str, i32)] = &[
    ("requests", 3),
    ("tenant-cost", 3),
    ("requests.late", 3),
    ("requests.dlq", 1),
];

const NESTED: &str = r#"
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
"#;

/// Generates 20,000 dirty records as `cfg` reads them, runs the worker and
/// `reprocess-late` to the end, and checks every outcome against the generator.
fn bills_exactly(group: &str, input: &str, shape: impl Fn(&str) -> bool) {
    let dir = TempDir::new(group);
    let broker = DevBroker::start(TOPICS);
    let cfg = write_config(dir.path(), &broker, group, input);
    let mut args = vec!["--count", "20000", "--tenants", "12", "--seed", "5"];
    args.extend_from_slice(DIRTY);
    let expected = generate(&cfg, dir.path(), group, &args);
    let first = read_topic(&broker.kafka(), "requests").unwrap();
    let sample = String::from_utf8_lossy(&first[0].payload).into_owned();
    assert!(
        shape(&sample),
        "records are not in the mapped shape: {sample}"
    );

    let cfg = cfg.to_str().unwrap();
    let long = Duration::from_secs(300);
    let run = tally_ok(&["run", "--config", cfg, "--until-end"], &[], long);
    let log = String::from_utf8_lossy(&run.stderr).into_owned();
    let dead: u64 = expected.dead_letters.values().sum();
    let folded = expected.records - dead - expected.duplicates - expected.too_late.len() as u64;
    assert!(
        log.contains(&format!("consumed=20000 folded={folded}")),
        "worker totals differ from the generator's ({folded} folded):\n{log}"
    );

    // Windows: the final pane of each (tenant, window end) equals the expectation.
    let mut got = BTreeMap::new();
    for (_, (_, payload)) in final_payloads(&broker, "tenant-cost") {
        let r: tally::engine::ResultRecord = serde_json::from_slice(&payload).unwrap();
        got.insert(
            (r.tenant_id.clone(), r.window_end),
            (r.cost_pico.0.to_string(), r.requests),
        );
    }
    let want: BTreeMap<_, _> = expected
        .windows
        .iter()
        .map(|w| {
            (
                (w.tenant_id.clone(), w.window_end),
                (w.cost_pico.clone(), w.requests),
            )
        })
        .collect();
    assert_eq!(got.len(), want.len(), "number of windows");
    assert_eq!(got, want);

    // Dead letters, by reason, as the generator made them.
    let mut reasons: BTreeMap<String, u64> = BTreeMap::new();
    for d in read_topic(&broker.kafka(), "requests.dlq").unwrap() {
        *reasons
            .entry(d.header(headers::ERROR).unwrap().to_string())
            .or_default() += 1;
    }
    assert_eq!(reasons, expected.dead_letters);

    // The too-late events, adjusted under the same mapping, keyed by its dedup key.
    tally_ok(&["reprocess-late", "--config", cfg], &[], long);
    let adjusted: BTreeSet<String> = read_topic(&broker.kafka(), "tenant-cost")
        .unwrap()
        .iter()
        .filter_map(|r| match SinkRecord::parse(&r.payload) {
            Ok(SinkRecord::Adjustment(a)) if a.kind == ResultKind::Adjustment => Some(a.request_id),
            _ => None,
        })
        .collect();
    let late: BTreeSet<String> = expected
        .too_late
        .iter()
        .map(|l| l.request_id.clone())
        .collect();
    assert!(!late.is_empty());
    assert_eq!(adjusted, late);
}

#[test]
fn a_cloudevents_stream_bills_exactly_what_the_generator_expects() {
    bills_exactly("ce", "[input]\nformat = \"cloudevents\"\n", |r| {
        r.contains(r#""specversion":"1.0""#) && r.contains(r#""data":{"model":"#)
    });
}

#[test]
fn a_custom_mapped_stream_bills_exactly_what_the_generator_expects() {
    bills_exactly("nested", NESTED, |r| {
        r.contains(r#""customer":{"id":"tenant-"#) && r.contains(r#""time":"2026-01-01T"#)
    });
}

#[test]
fn a_pointer_to_a_missing_field_names_the_pointer_in_every_dead_letter() {
    let dir = TempDir::new("badptr");
    let broker = DevBroker::start(TOPICS);
    // The records have `tenant_id` at the top; the mapping looks elsewhere.
    let cfg = write_config(
        dir.path(),
        &broker,
        "badptr",
        "[input]\ntenant_id = \"/customer/id\"\n",
    );
    let records: Vec<String> = (0..5)
        .map(|i| event(&format!("r-{i}"), "acme", "small", T10 + i * 1000))
        .collect();
    produce(&broker, "requests", 0, "acme", &records);
    let cfg = cfg.to_str().unwrap();
    tally_ok(
        &["run", "--config", cfg, "--until-end"],
        &[],
        Duration::from_secs(120),
    );
    let dlq = read_topic(&broker.kafka(), "requests.dlq").unwrap();
    assert_eq!(dlq.len(), 5);
    for d in &dlq {
        assert_eq!(d.header(headers::ERROR), Some("missing_field"));
        let detail = d.header(headers::ERROR_DETAIL).unwrap();
        assert_eq!(
            detail,
            "missing required field `tenant_id` (JSON Pointer `/customer/id`)"
        );
    }
    assert!(results(&broker, "tenant-cost").is_empty());

    // A pointer that is not one is refused at start, naming the key (exit 2).
    let bad = dir.path().join("bad.toml");
    let text = std::fs::read_to_string(cfg)
        .unwrap()
        .replace("\"/customer/id\"", "\"customer.id\"");
    std::fs::write(&bad, text).unwrap();
    let out = tally(
        &["run", "--config", bad.to_str().unwrap()],
        &[],
        Duration::from_secs(30),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("input.tenant_id") && err.contains("must start with '/'"),
        "{err}"
    );
}
