//! End to end on the real services: dev-broker process → `tally run` → topics →
//! `tally sink` → PostgreSQL.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::*;
use tally::engine::PaneKind;
use tally::kafka::headers;
use tally::kafka::read::read_topic;

const T10: i64 = 1_767_261_600_000; // 2026-01-01T10:00:00Z
const MIN: i64 = 60_000;
const TOPICS: &[(&str, i32)] = &[
    ("requests", 8),
    ("tenant-cost", 4),
    ("requests.late", 2),
    ("requests.dlq", 2),
];

#[test]
fn generated_200k_events_reach_postgres_with_exact_totals_and_redelivery_changes_nothing() {
    let dir = TempDir::new("e2e");
    let broker = DevBroker::start(TOPICS);
    let cfg = write_config(dir.path(), &broker, "e2e", "");
    let cfg = cfg.to_str().unwrap();
    let expected = generate(
        Path::new(cfg),
        dir.path(),
        "expected",
        &["--count", "200000", "--tenants", "60", "--seed", "11"],
    );
    assert_eq!(expected.records, 200_000);
    assert!(
        expected
            .windows
            .iter()
            .map(|w| &w.tenant_id)
            .collect::<BTreeSet<_>>()
            .len()
            >= 50
    );

    let run = tally_ok(
        &["run", "--config", cfg, "--until-end"],
        &[],
        Duration::from_secs(600),
    );
    let log = String::from_utf8_lossy(&run.stderr);
    assert!(
        log.lines()
            .any(|l| l.contains("worker stopped") && l.contains("consumed=200000 folded=200000")),
        "worker totals wrong:\n{log}"
    );

    let db = fresh_database("e2e");
    let env = [("TALLY_SINK__DATABASE_URL", db.as_str())];
    tally_ok(
        &["sink", "--config", cfg, "--until-end"],
        &env,
        Duration::from_secs(300),
    );
    let view = query(
        &db,
        "SELECT tenant_id, window_end::TEXT, cost_pico::TEXT, requests::TEXT FROM tenant_cost_minute \
         ORDER BY tenant_id, window_end",
    );
    let want: Vec<Vec<Option<String>>> = expected
        .windows
        .iter()
        .map(|w| {
            vec![
                Some(w.tenant_id.clone()),
                Some(w.window_end.to_string()),
                Some(w.cost_pico.clone()),
                Some(w.requests.to_string()),
            ]
        })
        .collect();
    assert_eq!(view.len(), want.len(), "number of (tenant, window) lines");
    assert_eq!(view, want);

    // Redeliver the whole results topic: forget the sink's offsets and run it again.
    let snapshot = "SELECT tenant_id, window_end::TEXT, source_partition::TEXT, version::TEXT, \
                    cost_pico::TEXT, updated_at::TEXT FROM tenant_cost_partial ORDER BY 1, 2, 3";
    let before = query(&db, snapshot);
    execute(&db, "DELETE FROM sink_offsets");
    let again = tally_ok(
        &["sink", "--config", cfg, "--until-end"],
        &env,
        Duration::from_secs(300),
    );
    let log = String::from_utf8_lossy(&again.stderr);
    assert!(
        log.contains("rows_changed: 0"),
        "redelivery changed rows:\n{log}"
    );
    assert_eq!(query(&db, snapshot), before);
}

/// The seed: acme's requests completing 10:00:40–59 are delivered after r-105 (10:01:09).
fn seed_story() -> Vec<String> {
    [
        ("r-101", 5),
        ("r-102", 20),
        ("r-105", 69),
        ("r-103", 44),
        ("r-104", 52),
        ("r-106", 90),
        ("r-107", 130),
    ]
    .iter()
    .map(|(id, s)| event(id, "acme", "large", T10 + s * 1_000))
    .collect()
}

#[test]
fn seed_burst_without_lateness_bills_twenty_cents_and_routes_the_burst_to_the_late_topic() {
    let dir = TempDir::new("burst");
    let broker = DevBroker::start(TOPICS);
    let cfg = write_config(
        dir.path(),
        &broker,
        "burst",
        // The seed's rule: every record moves the watermark (the lead limit off,
        // DESIGN §4.4; under it the 10:01 record would be held and nothing late).
        "[window]\nallowed_lateness = \"0\"\n[watermark]\nmax_future = \"off\"\nmax_lead = \"off\"\n",
    );
    let story = seed_story();
    produce(&broker, "requests", 0, "acme", &story);
    tally_ok(
        &["run", "--config", cfg.to_str().unwrap(), "--until-end"],
        &[],
        Duration::from_secs(120),
    );

    let acme: Vec<_> = results(&broker, "tenant-cost")
        .into_iter()
        .filter(|r| r.tenant_id == "acme")
        .collect();
    let ten: Vec<_> = acme.iter().filter(|r| r.window_end == T10 + MIN).collect();
    assert_eq!(ten.len(), 1, "10:00 fires exactly once: {ten:?}");
    assert_eq!(
        (ten[0].usd.as_str(), ten[0].pane, ten[0].version),
        ("0.200000000000", PaneKind::OnTime, 2)
    );
    let eleven: Vec<_> = acme
        .iter()
        .filter(|r| r.window_end == T10 + 2 * MIN)
        .collect();
    assert_eq!(eleven.len(), 1);
    assert_eq!(eleven[0].usd, "0.200000000000");

    let late = read_topic(&broker.kafka(), "requests.late").unwrap();
    assert_eq!(late.len(), 2);
    for (rec, (orig, offset)) in late.iter().zip([(&story[3], 3), (&story[4], 4)]) {
        assert_eq!(rec.payload, orig.as_bytes(), "original bytes, unchanged");
        assert_eq!(rec.key.as_deref(), Some(&b"acme"[..]));
        assert_eq!(rec.header(headers::REASON), Some("too_late"));
        assert_eq!(
            rec.header(headers::WINDOW_END),
            Some((T10 + MIN).to_string().as_str())
        );
        assert_eq!(
            rec.header(headers::WATERMARK),
            Some((T10 + 64_000).to_string().as_str())
        );
        assert_eq!(
            rec.header(headers::SOURCE),
            Some(format!("requests/0/{offset}").as_str())
        );
    }
}

#[test]
fn bad_records_go_to_the_dead_letter_topic_and_the_worker_keeps_running() {
    let dir = TempDir::new("dlq");
    let broker = DevBroker::start(TOPICS);
    let cfg = write_config(
        dir.path(),
        &broker,
        "dlq",
        "[limits]\nmax_record_bytes = 2048\n",
    );
    let mut worker = std::process::Command::new(tally_bin())
        .args(["run", "--config", cfg.to_str().unwrap()])
        .env("TALLY_LOG", "info")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let now = tally::base::clock::now_ms();
    let good = event("ok-1", "beta", "small", T10 + 5_000);
    let bad = vec![
        "{\"request_id\":\"x\",".to_string(),
        event("bad-model", "beta", "gigantic", T10 + 6_000),
        event("bad-secs", "beta", "small", (T10 + 7_000) / 1000),
        event("bad-neg", "beta", "small", T10 + 8_000)
            .replace("\"prompt_tokens\":1000", "\"prompt_tokens\":-1"),
        event("bad-future", "beta", "small", now + 2 * 3_600_000),
        format!(
            "{}{}",
            event("bad-big", "beta", "small", T10 + 9_000).trim_end_matches('}'),
            format!(",\"pad\":\"{}\"}}", "x".repeat(3000))
        ),
    ];
    let closer = event("ok-2", "beta", "small", T10 + 90_000);
    produce(&broker, "requests", 1, "beta", &[good]);
    produce(&broker, "requests", 1, "beta", &bad);
    produce(&broker, "requests", 1, "beta", &[closer]);

    let deadline = Instant::now() + Duration::from_secs(60);
    let (dlq, panes) = loop {
        let dlq = read_topic(&broker.kafka(), "requests.dlq").unwrap();
        let panes = results(&broker, "tenant-cost");
        if dlq.len() >= bad.len() && !panes.is_empty() {
            break (dlq, panes);
        }
        assert!(
            worker.try_wait().unwrap().is_none(),
            "the worker died on bad input"
        );
        assert!(
            Instant::now() < deadline,
            "timed out: {} dead letters, {} panes",
            dlq.len(),
            panes.len()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let codes: BTreeSet<_> = dlq
        .iter()
        .map(|d| d.header(headers::ERROR).unwrap().to_string())
        .collect();
    let want: BTreeSet<_> = [
        "malformed_json",
        "unknown_model",
        "timestamp_not_millis",
        "negative_tokens",
        "timestamp_in_future",
        "oversized_record",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(codes, want);
    for (d, original) in dlq.iter().zip(&bad) {
        assert_eq!(d.payload, original.as_bytes());
        assert!(d
            .header(headers::ERROR_DETAIL)
            .is_some_and(|s| !s.is_empty()));
        assert!(d
            .header(headers::SOURCE)
            .is_some_and(|s| s.starts_with("requests/1/")));
    }
    // The good record before the bad ones was billed, and the watermark moved only
    // by the good records (10:01:25): 10:00 fired with exactly one request.
    assert_eq!(panes.len(), 1);
    assert_eq!(
        (
            panes[0].tenant_id.as_str(),
            panes[0].window_end,
            panes[0].requests
        ),
        ("beta", T10 + MIN, 1)
    );

    assert!(
        worker.try_wait().unwrap().is_none(),
        "worker still running after bad input"
    );
    signal(worker.id(), libc::SIGTERM);
    let out = worker.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "graceful stop failed:\n{log}");
    assert!(
        log.lines()
            .any(|l| l.contains("worker stopped") && l.contains("dead_letter=6")),
        "dead letters not counted:\n{log}"
    );
}
