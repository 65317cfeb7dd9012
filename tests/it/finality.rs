//! Finality (docs/DESIGN.md §6.3) end to end: a live worker and sink, records fed
//! one step at a time, the `final` flag read from the invoice views.

use std::time::Duration;

use crate::common::*;
use tally::kafka::read::read_topic;

const T10: i64 = 1_767_261_600_000; // 2026-01-01T10:00:00Z
const S: i64 = 1_000;
/// 1,000 prompt + 500 completion tokens at the suite's prices, in pico-USD.
const SMALL: u128 = 450_000_000;
const MEDIUM: u128 = 10_500_000_000;
const LARGE: u128 = 100_000_000_000;

/// `(requests, cost_pico, final)` of acme's 10:00 window, per model and in total.
/// `(model, requests, cost_pico, final)`.
type Line = (String, String, String, String);
/// `(requests, cost_pico, final)`.
type Total = (String, String, String);

fn ten_oclock(db: &str) -> (Vec<Line>, Option<Total>) {
    let end = T10 + 60 * S;
    let lines = try_query(
        db,
        &format!("SELECT model, requests::TEXT, cost_pico::TEXT, final::TEXT FROM tenant_cost_minute_line WHERE tenant_id = 'acme' AND window_end = {end} ORDER BY model"),
    )
    .unwrap_or_default()
    .into_iter()
    .map(|r| {
        let mut r = r.into_iter().map(Option::unwrap);
        (r.next().unwrap(), r.next().unwrap(), r.next().unwrap(), r.next().unwrap())
    })
    .collect();
    let total = try_query(
        db,
        &format!("SELECT requests::TEXT, cost_pico::TEXT, final::TEXT FROM tenant_cost_minute WHERE tenant_id = 'acme' AND window_end = {end}"),
    )
    .unwrap_or_default()
    .into_iter()
    .next()
    .map(|r| {
        let mut r = r.into_iter().map(Option::unwrap);
        (r.next().unwrap(), r.next().unwrap(), r.next().unwrap())
    });
    (lines, total)
}

fn final_through(db: &str) -> Option<i64> {
    query(db, "SELECT final_through::TEXT FROM tally_final")
        .first()
        .and_then(|r| r[0].as_ref())
        .map(|v| v.parse().unwrap())
}

/// Waits until acme's 10:00 window has `requests` requests; returns its state.
fn until_requests(db: &str, requests: &str) -> (Vec<Line>, Total) {
    wait_until(
        &format!("10:00 has {requests} requests"),
        Duration::from_secs(60),
        || {
            // The two views are read one after the other: wait until both
            // show the same requests (the sink may commit in between).
            let (lines, total) = ten_oclock(db);
            let in_lines: u64 = lines.iter().map(|l| l.1.parse::<u64>().unwrap()).sum();
            total
                .filter(|t| t.0 == requests && in_lines.to_string() == requests)
                .map(|t| (lines, t))
        },
    )
}

#[test]
fn a_window_turns_final_when_lateness_is_over_and_then_only_an_adjustment_changes_it() {
    let dir = TempDir::new("final");
    let broker = DevBroker::start(&[
        ("requests", 1),
        ("tenant-cost", 2),
        ("requests.late", 1),
        ("requests.dlq", 1),
    ]);
    let cfg = write_config(dir.path(), &broker, "final", "");
    let cfg = cfg.to_str().unwrap();
    let db = fresh_database("final");
    let env = [("TALLY_SINK__DATABASE_URL", db.as_str())];
    let _worker = Service::start(
        &["run", "--config", cfg],
        &[],
        dir.path().join("worker.log"),
    );
    let _sink = Service::start(
        &["sink", "--config", cfg],
        &env,
        dir.path().join("sink.log"),
    );
    let send = |id: &str, model: &str, ts: i64| {
        produce(
            &broker,
            "requests",
            0,
            "acme",
            &[event(id, "acme", model, ts)],
        );
    };

    // W = 10:01:05 (5 s bound): 10:00 has fired, and lateness (30 s) is not over.
    send("a", "small", T10 + 10 * S);
    send("b", "small", T10 + 70 * S);
    let (lines, total) = until_requests(&db, "1");
    assert_eq!(total.2, "false", "final before lateness is over");
    assert_eq!(lines.len(), 1);
    // Both results partitions carry the worker's progress (the first record's).
    wait_until(
        "progress on both results partitions",
        Duration::from_secs(30),
        || {
            (try_query(&db, "SELECT count(*)::TEXT FROM tally_progress")?[0][0].as_deref()
                == Some("2"))
            .then_some(())
        },
    );
    assert!(final_through(&db).is_some_and(|f| f < T10 + 60 * S));

    // A late event inside lateness changes the (non-final) line: a new model.
    send("c", "medium", T10 + 50 * S);
    let (lines, total) = until_requests(&db, "2");
    assert_eq!(total.1, (SMALL + MEDIUM).to_string());
    assert_eq!(total.2, "false");
    let models: Vec<&str> = lines.iter().map(|l| l.0.as_str()).collect();
    assert_eq!(models, ["medium", "small"]);

    // W = 10:01:35: past 10:00's purge line (10:00:59.999 + 30 s). Final now, and
    // exactly windows ending by 10:01 are.
    send("d", "small", T10 + 100 * S);
    wait_until("10:00 final", Duration::from_secs(60), || {
        (ten_oclock(&db).1?.2 == "true").then_some(())
    });
    assert_eq!(final_through(&db), Some(T10 + 60 * S));
    assert!(ten_oclock(&db).0.iter().all(|l| l.3 == "true"));

    // Too late for 10:00 now: to the late topic; the final line does not move.
    send("e", "large", T10 + 30 * S);
    wait_until(
        "the too-late event on the late topic",
        Duration::from_secs(60),
        || (read_topic(&broker.kafka(), "requests.late").ok()?.len() == 1).then_some(()),
    );
    std::thread::sleep(Duration::from_secs(2));
    let (_, total) = ten_oclock(&db);
    assert_eq!(
        total.unwrap(),
        ("2".into(), (SMALL + MEDIUM).to_string(), "true".into())
    );

    // Reprocessed, it changes the final window only as an adjustment, in its line.
    tally_ok(
        &["reprocess-late", "--config", cfg, "--from", "earliest"],
        &[],
        Duration::from_secs(120),
    );
    let (lines, total) = until_requests(&db, "3");
    assert_eq!(
        total,
        (
            "3".into(),
            (SMALL + MEDIUM + LARGE).to_string(),
            "true".into()
        )
    );
    assert_eq!(
        lines[0],
        ("large".into(), "1".into(), LARGE.to_string(), "true".into())
    );
    let adjustments = query(&db, "SELECT request_id, model FROM tenant_cost_adjustment");
    assert_eq!(
        adjustments,
        vec![vec![Some("e".into()), Some("large".into())]]
    );
    let partial = query(
        &db,
        "SELECT version::TEXT FROM tenant_cost_partial WHERE window_end = 1767261660000",
    );
    assert_eq!(
        partial,
        vec![vec![Some("2".into())]],
        "the partial itself is unchanged"
    );
}

#[test]
fn a_silent_partition_holds_finality_back_without_idleness_and_not_with_it() {
    let dir = TempDir::new("final-idle");
    let broker = DevBroker::start(&[
        ("requests", 2),
        ("tenant-cost.off", 2),
        ("tenant-cost.on", 2),
        ("requests.late", 1),
        ("requests.dlq", 1),
    ]);
    // Only partition 0 has data (three records: the lead limit is off, so that
    // they start the partition, DESIGN §4.4); partition 1 never does.
    let records: Vec<String> = [10, 70, 100]
        .iter()
        .enumerate()
        .map(|(i, s)| event(&format!("r{i}"), "acme", "small", T10 + s * S))
        .collect();
    produce(&broker, "requests", 0, "acme", &records);
    let run = |group: &str, idle: &str| {
        let results = format!("tenant-cost.{group}");
        let sections =
            format!("[topics]\nresults = \"{results}\"\n[watermark]\nidle_timeout = \"{idle}\"\nmax_lead = \"off\"\n");
        let cfg = write_config(dir.path(), &broker, group, &sections);
        let db = fresh_database("idle");
        let env = [("TALLY_SINK__DATABASE_URL", db.as_str())];
        let cfg = cfg.to_str().unwrap().to_string();
        let worker = Service::start(
            &["run", "--config", &cfg],
            &[],
            dir.path().join(format!("{group}-worker.log")),
        );
        let sink = Service::start(
            &["sink", "--config", &cfg],
            &env,
            dir.path().join(format!("{group}-sink.log")),
        );
        (db, worker, sink)
    };

    // Idleness off: partition 0 reports 10:01 final, partition 1 nothing, so
    // nothing is final.
    let (db, worker, sink) = run("off", "off");
    wait_until("partition 0's progress", Duration::from_secs(60), || {
        let rows = try_query(
            &db,
            "SELECT final_through::TEXT FROM tally_progress WHERE source_partition = 0",
        )?;
        (rows.len() == 2
            && rows
                .iter()
                .all(|r| r[0].as_deref() == Some("1767261660000")))
        .then_some(())
    });
    until_requests(&db, "1");
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(final_through(&db), None);
    assert_eq!(ten_oclock(&db).1.unwrap().2, "false");
    drop((worker, sink));

    // Idleness on (2 s): the silent partition's progress follows the wall clock,
    // and 10:00 turns final.
    let (db, _worker, _sink) = run("on", "2s");
    wait_until("10:00 final with idleness", Duration::from_secs(60), || {
        (ten_oclock(&db).1?.2 == "true").then_some(())
    });
    let p1 = query(
        &db,
        "SELECT count(*)::TEXT FROM tally_progress WHERE source_partition = 1",
    );
    assert_eq!(p1[0][0].as_deref(), Some("2"));
}
