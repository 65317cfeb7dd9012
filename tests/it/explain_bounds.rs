//! What bounds `tally explain`'s replay (docs/DESIGN.md §6.2), end to end on
//! the dev broker: a window whose input retention deleted in part is said to be
//! inexact, never given a wrong total as if exact; a window after a checkpoint
//! is replayed from it — exact although the log start is gone — and the replay
//! stops once the watermark has left the window's dedup horizon.

use std::time::Duration;

use crate::common::*;
use crate::explain::{explain, sink_line, MIN};

/// A fresh database named for `tag`, with the results `cfg`'s job wrote applied
/// by `tally sink`.
fn sunk(cfg: &str, tag: &str) -> String {
    let db = fresh_database(tag);
    let env = [("TALLY_SINK__DATABASE_URL", db.as_str())];
    let args = ["sink", "--config", cfg, "--until-end"];
    tally_ok(&args, &env, Duration::from_secs(300));
    db
}

/// A dev broker with one partition of the input and of each output topic.
fn one_partition_broker() -> DevBroker {
    DevBroker::start(&[
        ("requests", 1),
        ("tenant-cost", 1),
        ("requests.late", 1),
        ("requests.dlq", 1),
    ])
}

/// Retention deleted the start of partition 0: a window whose records lie
/// partly before the log start is explained as inexact, naming the offset,
/// with only the records still there; the replay stops once the watermark has
/// left the window's dedup horizon. Then a worker runs over the log and more
/// records come: a window after its checkpoint is explained from that
/// checkpoint — exact although the log start is gone — and agrees with the sink.
#[test]
fn retention_and_checkpoints_bound_what_explain_reads() {
    const BASE_TS: i64 = 1_767_225_600_000;
    let dir = TempDir::new("explain-retention");
    let broker = one_partition_broker();
    let cfg = write_config(dir.path(), &broker, "explain-ret", "");
    let cfg = cfg.to_str().unwrap();
    produce_filling(&broker, 0, 120_000, BASE_TS);
    let log_start = || {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let c: BaseConsumer = tally::kafka::client_config(&broker.kafka(), &[])
            .create()
            .unwrap();
        c.fetch_watermarks("requests", 0, Duration::from_secs(10))
            .unwrap()
            .0
    };
    let low = log_start();
    assert!(low > 0, "retention deleted nothing");
    // Event i is at BASE_TS + 100 ms · i: the window holding the first record
    // still there, with 600 records a minute, lost the ones before it.
    let ts = BASE_TS + low * 100;
    let start = ts.div_euclid(MIN) * MIN;
    let held = (start + MIN - ts + 99) / 100;
    let x = explain(cfg, "tenant-a", start, None);
    assert!(!x.exact);
    assert_eq!(x.billed.len() as i64, held.min(600));
    assert!(held < 600, "the window must have lost records: {held}");
    let note = format!("records before offset {low} of partition 0 were deleted by retention");
    assert!(x.notes.iter().any(|n| n.contains(&note)), "{:?}", x.notes);
    let out = tally_ok(
        &[
            "explain",
            "--config",
            cfg,
            "--tenant",
            "tenant-a",
            "--window-start",
            &start.to_string(),
        ],
        &[],
        Duration::from_secs(120),
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("NOT EXACT"));
    explained_from_a_checkpoint(&broker, cfg, (BASE_TS, log_start));
}

/// The second half of `retention_and_checkpoints_bound_what_explain_reads`.
fn explained_from_a_checkpoint(
    broker: &DevBroker,
    cfg: &str,
    (base_ts, log_start): (i64, impl Fn() -> i64),
) {
    let run = |extra: &[&str]| {
        let args = [&["run", "--config", cfg, "--until-end"], extra].concat();
        tally_ok(&args, &[], Duration::from_secs(300))
    };
    run(&["--start-at-log-start"]);
    // Three more minutes at 100 ms, then 400 records 10 s apart (under the
    // lead limit, so each moves the watermark): 66 minutes more.
    produce_filling(broker, 120_000, 1_800, base_ts);
    let sparse_from = base_ts + 121_800 * 100;
    produce_at(broker, 121_800..122_200, |i| {
        sparse_from + (i - 121_800) * 10_000
    });
    run(&[]);
    let db = sunk(cfg, "explain_ret");
    // The first whole minute after the records the first run read.
    let start = (base_ts + 120_000 * 100).div_euclid(MIN) * MIN + MIN;
    let x = explain(cfg, "tenant-a", start, Some(&db));
    let p = &x.partitions[0];
    let from = p.checkpoint.as_ref().expect("started from a checkpoint");
    assert!(x.exact, "{:?}", x.notes);
    assert_eq!(x.agrees, Some(true), "{:?}", x.notes);
    assert_eq!(x.billed.len(), 600);
    assert!(from.high_water.is_some_and(|h| h < start), "{from:?}");
    assert!(
        p.from_offset == from.next_offset && from.next_offset >= log_start(),
        "{p:?}"
    );
    assert!(p.from_offset >= 120_000, "{p:?}");
    // The watermark left the window's horizon (end − 1 + 30 s lateness + 1 h)
    // with the sparse record 10 s · 366 past the window's end, or so: nothing
    // later was read.
    let past = 121_800 + (start + MIN - 1 + 30_000 + 3_600_000 + 5_000 - sparse_from) / 10_000;
    assert!(p.stopped_early && p.log_end == 122_200, "{p:?}");
    assert!(
        (past..=past + 2).contains(&p.to_offset),
        "{p:?}, expected about {past}"
    );
    assert!(
        x.notes
            .iter()
            .any(|n| n.contains(&format!("replayed from checkpoint {}", from.name))),
        "{:?}",
        x.notes
    );
    assert_eq!(
        sink_line(&db, "tenant-a", start + MIN),
        Some(x.totals.cost_pico.clone())
    );
}

/// Retention keeps the first checkpoint of the day (an anchor, by default)
/// after newer ones push the first run's last checkpoint out: a window after
/// the first run's records, which every kept newest checkpoint has passed, is
/// still replayed from a snapshot taken before it — the anchor.
#[test]
fn an_anchor_kept_by_retention_starts_a_past_windows_replay() {
    const BASE_TS: i64 = 1_767_225_600_000;
    let dir = TempDir::new("explain-anchor");
    let broker = one_partition_broker();
    let cfg = write_config(dir.path(), &broker, "explain-anchor", "");
    let cfg = cfg.to_str().unwrap();
    let run = || {
        let args = ["run", "--config", cfg, "--until-end"];
        tally_ok(&args, &[], Duration::from_secs(300))
    };
    // Ten minutes, then five more, then four runs of a few records each: every
    // run ends with a checkpoint, so the first run's are held by 3 newer ones.
    produce_filling(&broker, 0, 6_000, BASE_TS);
    run();
    produce_filling(&broker, 6_000, 3_000, BASE_TS);
    run();
    for k in 0..4 {
        produce_filling(&broker, 9_000 + 10 * k, 10, BASE_TS);
        run();
    }
    let store = tally::checkpoint::store::CheckpointStore::open_existing(
        &tally::config::CheckpointConfig {
            dir: dir.path().join("checkpoints"),
            ..Default::default()
        },
        "explain-anchor",
    )
    .unwrap();
    let complete: Vec<_> = (store.list().unwrap().into_iter())
        .filter_map(|l| l.manifest.and_then(Result::ok).map(|m| (l.name, m)))
        .collect();
    let oldest = &complete[0];
    let at = |m: &tally::checkpoint::Manifest| m.partitions[0].next_offset.0;
    assert!(
        at(&oldest.1) <= 6_000,
        "the anchor is the first run's: {}",
        at(&oldest.1)
    );
    assert!(
        complete[1..].iter().all(|(_, m)| at(m) > 6_000),
        "only the anchor is left of the first run: {:?}",
        complete.iter().map(|(n, m)| (n, at(m))).collect::<Vec<_>>()
    );
    let db = sunk(cfg, "explain_anchor");
    // The first whole minute of the second run's records.
    let start = (BASE_TS + 6_000 * 100).div_euclid(MIN) * MIN + MIN;
    let x = explain(cfg, "tenant-a", start, Some(&db));
    let from = x.partitions[0]
        .checkpoint
        .as_ref()
        .expect("started from the anchor");
    assert_eq!(from.name, oldest.0);
    assert!(x.exact && x.agrees == Some(true), "{:?}", x.notes);
    assert_eq!(x.billed.len(), 600);
    assert_eq!(
        sink_line(&db, "tenant-a", start + MIN),
        Some(x.totals.cost_pico.clone())
    );
}
