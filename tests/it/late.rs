//! Reprocessing the late-events topic (docs/DESIGN.md §8) end to end.

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::time::Duration;

use crate::common::*;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use tally::kafka::read::read_topic;

#[test]
fn reprocessed_late_events_complete_the_invoice_exactly_once_however_often_it_runs() {
    let dir = TempDir::new("late");
    let broker = DevBroker::start(&[
        ("requests", 4),
        ("tenant-cost", 2),
        ("requests.late", 2),
        ("requests.dlq", 2),
    ]);
    let cfg = write_config(dir.path(), &broker, "late", "");
    let cfg = cfg.to_str().unwrap();
    let expected = generate(
        Path::new(cfg),
        dir.path(),
        "expected",
        &[
            "--count",
            "20000",
            "--tenants",
            "20",
            "--seed",
            "9",
            "--late-fraction",
            "0.05",
        ]
        .into_iter()
        .chain(DIRTY[2..].iter().copied())
        .collect::<Vec<_>>(),
    );
    assert!(
        expected.too_late.len() > 500,
        "about 5% too late: {}",
        expected.too_late.len()
    );
    tally_ok(
        &["run", "--config", cfg, "--until-end"],
        &[],
        Duration::from_secs(300),
    );

    // Replays can put copies on the late topic: re-produce some late records verbatim.
    let late = read_topic(&broker.kafka(), "requests.late").unwrap();
    assert_eq!(late.len(), expected.too_late.len());
    let p: BaseProducer =
        tally::kafka::client_config(&broker.kafka(), tally::kafka::PRODUCER_DEFAULTS)
            .create()
            .unwrap();
    for r in late.iter().take(25) {
        let mut h = OwnedHeaders::new();
        for (k, v) in &r.headers {
            h = h.insert(Header {
                key: k,
                value: Some(v.as_bytes()),
            });
        }
        p.send(
            BaseRecord::to("requests.late")
                .partition(r.partition)
                .key(r.key.as_deref().unwrap())
                .payload(&r.payload)
                .headers(h),
        )
        .unwrap();
    }
    p.flush(Duration::from_secs(30)).unwrap();

    // Killed midway, then run again.
    let out = tally(
        &["reprocess-late", "--config", cfg, "--from", "earliest"],
        &[("TALLY_CRASH_AT", "reprocess_record:300")],
        Duration::from_secs(120),
    );
    assert_eq!(
        out.status.signal(),
        Some(9),
        "reprocess-late did not crash at its crash point"
    );
    let db = fresh_database("late");
    let env = [("TALLY_SINK__DATABASE_URL", db.as_str())];
    tally_ok(
        &["sink", "--config", cfg, "--until-end"],
        &env,
        Duration::from_secs(300),
    );
    let run = tally_ok(
        &["reprocess-late", "--config", cfg, "--from", "earliest"],
        &[],
        Duration::from_secs(300),
    );
    let log = String::from_utf8_lossy(&run.stderr);
    assert!(
        log.contains(&format!("adjustments {}", expected.too_late.len())),
        "{log}"
    );
    assert!(log.contains("duplicates skipped 25"), "{log}");
    tally_ok(
        &["sink", "--config", cfg, "--until-end"],
        &env,
        Duration::from_secs(300),
    );

    // The view now bills every valid event: on time, late within lateness, too late.
    assert_eq!(invoice(&db), oracle(&expected));
    let count = query(&db, "SELECT count(*)::TEXT FROM tenant_cost_adjustment");
    assert_eq!(
        count[0][0].as_deref(),
        Some(expected.too_late.len().to_string().as_str())
    );

    // Running it again changes no row.
    let snapshot = "SELECT request_id, cost_pico::TEXT, applied_at::TEXT FROM tenant_cost_adjustment ORDER BY 1";
    let before = query(&db, snapshot);
    tally_ok(
        &["reprocess-late", "--config", cfg, "--from", "earliest"],
        &[],
        Duration::from_secs(300),
    );
    let again = tally_ok(
        &["sink", "--config", cfg, "--until-end"],
        &env,
        Duration::from_secs(300),
    );
    assert!(String::from_utf8_lossy(&again.stderr).contains("rows_changed: 0"));
    assert_eq!(query(&db, snapshot), before);
}

/// Every valid event's cost by (tenant, window end): on time, late within
/// lateness, and too late (billed by reprocessing).
fn oracle(e: &tally::gen::Expected) -> BTreeMap<(String, i64), u128> {
    let mut want: BTreeMap<(String, i64), u128> = BTreeMap::new();
    for w in &e.windows {
        *want.entry((w.tenant_id.clone(), w.window_end)).or_default() +=
            w.cost_pico.parse::<u128>().unwrap();
    }
    for l in &e.too_late {
        *want.entry((l.tenant_id.clone(), l.window_end)).or_default() +=
            l.cost_pico.parse::<u128>().unwrap();
    }
    want
}

/// The invoice view by (tenant, window end).
fn invoice(db: &str) -> BTreeMap<(String, i64), u128> {
    query(
        db,
        "SELECT tenant_id, window_end::TEXT, cost_pico::TEXT FROM tenant_cost_minute",
    )
    .into_iter()
    .map(|r| {
        (
            (
                r[0].clone().unwrap(),
                r[1].clone().unwrap().parse().unwrap(),
            ),
            r[2].clone().unwrap().parse().unwrap(),
        )
    })
    .collect()
}

/// A re-bill under generation 2 with a corrected price (a new group: the workers
/// and the reprocessing rebuild from the log start) re-prices the adjustments as
/// well as the partials: the invoice equals the oracle under the new table.
#[test]
fn a_rebill_under_a_new_generation_reprices_the_adjustments_too() {
    let dir = TempDir::new("rebill");
    let broker = DevBroker::start(&[
        ("requests", 2),
        ("tenant-cost", 2),
        ("requests.late", 2),
        ("requests.dlq", 2),
    ]);
    let args = [
        "--count",
        "6000",
        "--tenants",
        "10",
        "--seed",
        "5",
        "--late-fraction",
        "0.05",
        "--partitions",
        "2",
    ];
    let cfg = write_config(dir.path(), &broker, "rebill", "");
    let old = generate(&cfg, dir.path(), "old", &args);
    let cfg = cfg.to_str().unwrap();
    let db = fresh_database("rebill");
    let env = [("TALLY_SINK__DATABASE_URL", db.as_str())];
    let long = Duration::from_secs(300);
    tally_ok(&["run", "--config", cfg, "--until-end"], &[], long);
    tally_ok(&["reprocess-late", "--config", cfg], &[], long);
    tally_ok(&["sink", "--config", cfg, "--until-end"], &env, long);
    assert_eq!(invoice(&db), oracle(&old));

    // Generation 2, small's input price corrected, a new group.
    let fixed = write_config(dir.path(), &broker, "rebill2", "[job]\ngeneration = 2\n");
    let text = std::fs::read_to_string(&fixed).unwrap();
    let corrected = text.replacen("input_per_1k = \"0.00015\"", "input_per_1k = \"0.0002\"", 1);
    assert_ne!(text, corrected);
    std::fs::write(&fixed, corrected).unwrap();
    // The oracle under the new table: the same records, written to a file.
    let mut file_args = args.to_vec();
    let scratch = dir.path().join("same-records.jsonl");
    file_args.extend(["--output-file", scratch.to_str().unwrap()]);
    let new = generate(&fixed, dir.path(), "new", &file_args);
    assert_eq!(new.too_late.len(), old.too_late.len());
    assert_ne!(
        expected_rows(&new),
        expected_rows(&old),
        "the correction changes the bill"
    );
    let fixed = fixed.to_str().unwrap();
    tally_ok(&["run", "--config", fixed, "--until-end"], &[], long);
    tally_ok(&["reprocess-late", "--config", fixed], &[], long);
    tally_ok(&["sink", "--config", fixed, "--until-end"], &env, long);
    assert_eq!(invoice(&db), oracle(&new));
    let by_generation = query(
        &db,
        "SELECT generation::TEXT, count(*)::TEXT FROM tenant_cost_adjustment GROUP BY 1",
    );
    assert_eq!(
        by_generation,
        vec![vec![Some("2".into()), Some(old.too_late.len().to_string())]]
    );
    // Reprocessing generation 1 again now changes nothing: a lower generation.
    tally_ok(
        &["reprocess-late", "--config", cfg],
        &[("TALLY_KAFKA__GROUP_ID", "rebill-again")],
        long,
    );
    let again = tally_ok(&["sink", "--config", fixed, "--until-end"], &env, long);
    assert!(String::from_utf8_lossy(&again.stderr).contains("rows_changed: 0"));
    assert_eq!(invoice(&db), oracle(&new));
}

/// The sum of `tally_reprocess_backlog_records` at `addr`, once it is published.
fn backlog(addr: &str) -> Option<u64> {
    let (status, body) = http_get(addr, "/metrics")?;
    let samples: Vec<f64> = body
        .lines()
        .filter(|l| l.starts_with("tally_reprocess_backlog_records{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (status == 200 && !samples.is_empty()).then(|| samples.iter().sum::<f64>() as u64)
}

/// `tally_reprocess_records_total{outcome="adjusted"}` at `addr`.
fn adjusted(addr: &str) -> Option<u64> {
    let (_, body) = http_get(addr, "/metrics")?;
    body.lines()
        .find(|l| l.starts_with("tally_reprocess_records_total{outcome=\"adjusted\"}"))?
        .rsplit(' ')
        .next()?
        .parse()
        .ok()
}

/// `reprocess-late --follow` as a service: its backlog metric counts the late
/// records it has not billed and falls to 0 as it catches up, also after new late
/// records; SIGTERM stops it with its position committed.
#[test]
fn the_late_backlog_metric_drains_to_zero_as_the_service_catches_up() {
    let dir = TempDir::new("backlog");
    let broker = DevBroker::start(&[
        ("requests", 1),
        ("tenant-cost", 1),
        ("requests.late", 2),
        ("requests.dlq", 1),
    ]);
    let cfg = write_config(dir.path(), &broker, "backlog", "");
    let late = |from: usize, n: usize| -> Vec<String> {
        (from..from + n)
            .map(|i| {
                event(
                    &format!("late-{i}"),
                    "acme",
                    "small",
                    1_767_261_600_000 + i as i64,
                )
            })
            .collect()
    };
    produce(&broker, "requests.late", 0, "acme", &late(0, 3_000));
    produce(&broker, "requests.late", 1, "acme", &late(3_000, 2_000));
    let log = dir.path().join("reprocess.log");
    let mut child = std::process::Command::new(tally_bin())
        .args([
            "reprocess-late",
            "--config",
            cfg.to_str().unwrap(),
            "--follow",
            "--from",
            "group",
        ])
        .env("TALLY_METRICS__LISTEN", "127.0.0.1:0")
        .env("TALLY_LOG", "info")
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let addr = bound_addr(&log, METRICS_SERVING);
    let wait_for = |what: &str, ok: &dyn Fn(u64) -> bool| {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(b) = backlog(&addr) {
                if ok(b) {
                    return b;
                }
            }
            assert!(std::time::Instant::now() < deadline, "backlog never {what}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    // The first figures are published before anything is read: all 5000.
    assert_eq!(wait_for("published", &|_| true), 5_000);
    wait_for("drained", &|b| b == 0);
    // More late records: billed as they come (within a round or two), so the
    // backlog is 0 again once the adjustments count them.
    produce(&broker, "requests.late", 1, "acme", &late(5_000, 700));
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while adjusted(&addr) != Some(5_700) {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?} adjusted",
            adjusted(&addr)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(backlog(&addr), Some(0));
    signal(child.id(), libc::SIGTERM);
    let status = child.wait().unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "{text}");
    assert!(text.contains("adjustments 5700"), "{text}");
    // Its position is committed: a second run from the group has nothing to do.
    let again = tally_ok(
        &[
            "reprocess-late",
            "--config",
            cfg.to_str().unwrap(),
            "--from",
            "group",
        ],
        &[],
        Duration::from_secs(120),
    );
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("read 0 |"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
}

/// Under `time_source = "kafka_timestamp"` a late record carries its original
/// Kafka timestamp (`tally.kafka_timestamp`), and reprocessing windows it by that
/// time, not by the late record's own timestamp (when tally routed it).
#[test]
fn reprocessing_uses_the_original_kafka_timestamp() {
    let dir = TempDir::new("kafka-ts");
    let broker = DevBroker::start(&[
        ("requests", 1),
        ("tenant-cost", 1),
        ("requests.late", 1),
        ("requests.dlq", 1),
    ]);
    let cfg = write_config(
        dir.path(),
        &broker,
        "kts",
        // The lead limit off: a handful of records, each moving the watermark.
        "[window]\nallowed_lateness = \"0\"\n[watermark]\ntime_source = \"kafka_timestamp\"\nmax_lead = \"off\"\n",
    );
    let t10: i64 = 1_767_261_600_000;
    let p: BaseProducer =
        tally::kafka::client_config(&broker.kafka(), tally::kafka::PRODUCER_DEFAULTS)
            .create()
            .unwrap();
    // The payloads' completed_ts (where prices are looked up) is 10:00:01 for all.
    for (id, at) in [
        ("r-1", 5_000),
        ("r-2", 20_000),
        ("r-3", 70_000),
        ("r-late", 10_000),
    ] {
        let payload = event(id, "acme", "small", t10 + 1_000);
        p.send(
            BaseRecord::to("requests")
                .partition(0)
                .key("acme")
                .payload(&payload)
                .timestamp(t10 + at),
        )
        .unwrap();
    }
    p.flush(Duration::from_secs(30)).unwrap();
    let cfg = cfg.to_str().unwrap();
    tally_ok(
        &["run", "--config", cfg, "--until-end"],
        &[],
        Duration::from_secs(120),
    );
    let late = read_topic(&broker.kafka(), "requests.late").unwrap();
    assert_eq!(late.len(), 1);
    let original = (t10 + 10_000).to_string();
    assert_eq!(
        late[0].header(tally::kafka::headers::KAFKA_TIMESTAMP),
        Some(original.as_str())
    );
    tally_ok(
        &["reprocess-late", "--config", cfg],
        &[],
        Duration::from_secs(120),
    );
    let adjustments: Vec<serde_json::Value> = read_topic(&broker.kafka(), "tenant-cost")
        .unwrap()
        .iter()
        .map(|r| serde_json::from_slice(&r.payload).unwrap())
        .filter(|v: &serde_json::Value| v["kind"] == "adjustment")
        .collect();
    assert_eq!(adjustments.len(), 1);
    assert_eq!(adjustments[0]["request_id"], "r-late");
    assert_eq!(
        adjustments[0]["window_end"],
        t10 + 60_000,
        "{:?}",
        adjustments[0]
    );
}
