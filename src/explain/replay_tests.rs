//! The replay keeps exactly the window's records of the tenant, each with the
//! route the engine gave it and why.

use super::*;
use crate::engine::EngineConfig;
use crate::model::{NanoPer1k, PriceEntry, PriceTable};
use crate::time::WindowSpec;

pub(crate) const T10: i64 = 1_767_261_600_000; // 2026-01-01T10:00:00Z
pub(crate) const S: i64 = 1_000;
pub(crate) const MIN: i64 = 60 * S;

pub(crate) fn cfg() -> Arc<EngineConfig> {
    let mut prices = PriceTable::default();
    prices.insert(
        "large",
        PriceEntry {
            effective_from_ms: 0,
            input: NanoPer1k(50_000_000),
            output: NanoPer1k(100_000_000),
        },
    );
    Arc::new(EngineConfig {
        window: WindowSpec::new(MIN, 0),
        allowed_lateness_ms: 30 * S,
        max_out_of_orderness_ms: 5 * S,
        max_future_ms: None,
        time_source: TimeSource::CompletedTs,
        max_lead_ms: None,
        dedup_extra_ms: 3_600_000,
        max_record_bytes: 4096,
        generation: 1,
        prices,
        rating: None,
        rating_source: String::new(),
        input: Default::default(),
    })
}

pub(crate) fn ev(id: &str, tenant: &str, model: &str, ts: i64) -> String {
    format!(
        r#"{{"request_id":"{id}","tenant_id":"{tenant}","model":"{model}","prompt_tokens":1000,"completion_tokens":500,"completed_ts":{ts}}}"#
    )
}

pub(crate) fn log(payloads: &[String]) -> PartitionLog {
    PartitionLog {
        partition: 3,
        log_start: 0,
        log_end: payloads.len() as i64,
        records: payloads
            .iter()
            .enumerate()
            .map(|(i, p)| InputRecord {
                offset: i as i64,
                key: Some(b"acme".to_vec()),
                payload: p.clone().into_bytes(),
                kafka_ts: None,
            })
            .collect(),
    }
}

#[test]
fn every_record_of_the_window_with_its_route() {
    let records = [
        ev("a", "acme", "large", T10 + 10 * S),  // 0: billed on time
        ev("x", "other", "large", T10 + 11 * S), // 1: another tenant
        ev("a", "acme", "large", T10 + 10 * S),  // 2: duplicate of 0
        ev("b", "acme", "nope", T10 + 12 * S),   // 3: dead letter, unknown model
        ev("c", "acme", "large", T10 + 70 * S),  // 4: next window, fires ours
        ev("d", "acme", "large", T10 + 50 * S),  // 5: late pane (within lateness)
        ev("e", "acme", "large", T10 + 200 * S), // 6: purges ours
        ev("f", "acme", "large", T10 + 20 * S),  // 7: too late
        "{\"tenant_id\":\"acme\",\"completed".into(), // 8: unreadable dead letter
    ];
    let r = replay(&cfg(), "acme", (T10, T10 + MIN), &log(&records), T10).unwrap();
    let billed: Vec<_> = r
        .billed
        .iter()
        .map(|b| (b.offset, b.request_id.as_str(), b.pane.as_str()))
        .collect();
    assert_eq!(billed, [(0, "a", "on_time"), (5, "d", "late")]);
    assert_eq!(r.billed[0].cost_pico, "100000000000");
    assert_eq!(r.billed[0].price_effective_from, Some(0));
    assert_eq!(r.billed[0].partition, 3);
    assert_eq!(r.billed[1].watermark, Some(T10 + 70 * S - 5 * S));
    let routes: Vec<_> = r
        .elsewhere
        .iter()
        .map(|e| (e.offset, e.route.clone()))
        .collect();
    assert_eq!(
        routes[0],
        (
            2,
            Routed::Duplicate {
                of_offset: Some(0),
                before_offset: None
            }
        )
    );
    assert!(matches!(&routes[1], (3, Routed::DeadLetter { code, .. }) if code == "unknown_model"));
    assert!(
        matches!(&routes[2], (7, Routed::TooLate { watermark, .. }) if *watermark == T10 + 200 * S - 5 * S)
    );
    assert_eq!(routes.len(), 3);
    assert_eq!(r.range.unreadable_dead_letters, 1);
    assert!(r.range.final_here);
}

#[test]
fn a_range_of_windows_keeps_each_record_with_its_window() {
    let records = [
        ev("a", "acme", "large", T10 + 10 * S),
        ev("b", "acme", "large", T10 + 70 * S),
        ev("c", "acme", "large", T10 + 130 * S),
        ev("a", "acme", "large", T10 + 10 * S),
    ];
    let r = replay(&cfg(), "acme", (T10, T10 + 2 * MIN), &log(&records), T10).unwrap();
    let billed: Vec<_> = r.billed.iter().map(|b| (b.offset, b.window_end)).collect();
    assert_eq!(billed, [(0, T10 + MIN), (1, T10 + 2 * MIN)]);
    assert_eq!(r.elsewhere.len(), 1);
    assert_eq!(r.elsewhere[0].window_end, T10 + MIN);
    assert_eq!(
        r.elsewhere[0].route,
        Routed::Duplicate {
            of_offset: Some(0),
            before_offset: None
        }
    );
}

/// The records up to `k` through a fresh task, its state restored as a
/// checkpoint would restore it, and a replay resumed there.
fn resumed(records: &[String], k: usize) -> Replayed {
    let cfg = cfg();
    let mut task = PartitionTask::new(Partition(3), cfg.clone());
    let mut panes = Vec::new();
    for p in &records[..k] {
        let rec = RecordIn {
            payload: p.as_bytes(),
            kafka_ts: None,
            now_ms: T10,
        };
        task.process(rec, &mut panes).unwrap();
    }
    let high_water = task.high_water().map(|t| t.0);
    let task = PartitionTask::restore(Partition(3), cfg.clone(), task.snapshot());
    let whole = log(records);
    let bounds = (whole.log_start, whole.log_end);
    let start = CheckpointStart {
        name: "chk-1-w".into(),
        next_offset: k as i64,
        high_water,
    };
    let mut r = Replayer::new(&cfg, "acme", (T10, T10 + MIN), (3, bounds), T10).resume(task, start);
    for rec in &whole.records[k..] {
        if r.push(rec).unwrap() {
            break;
        }
    }
    r.finish()
}

/// A replay resumed from the state before the window's first record lists what
/// the replay from the log start lists — a repeat of an id seen before the
/// checkpoint named by the checkpoint's offset.
#[test]
fn a_replay_resumed_before_the_window_lists_what_the_whole_replay_lists() {
    let records = [
        ev("p1", "acme", "large", T10 - 50 * S),
        ev("p2", "other", "large", T10 - 40 * S),
        ev("p3", "acme", "large", T10 - 2 * S),
        ev("a", "acme", "large", T10 + 10 * S),
        ev("p1", "acme", "large", T10 + 11 * S), // a repeat of offset 0's id
        ev("a", "acme", "large", T10 + 10 * S),  // a duplicate of offset 3
        ev("c", "acme", "large", T10 + 70 * S),
        ev("d", "acme", "large", T10 + 50 * S),
        ev("e", "acme", "large", T10 + 200 * S),
        ev("f", "acme", "large", T10 + 20 * S),
    ];
    let whole = replay(&cfg(), "acme", (T10, T10 + MIN), &log(&records), T10).unwrap();
    let from = resumed(&records, 3);
    assert_eq!(from.billed, whole.billed);
    assert_eq!(from.range.watermark, whole.range.watermark);
    assert_eq!(from.range.from_offset, 3);
    let strip = |r: &Replayed| -> Vec<(i64, Routed)> {
        r.elsewhere
            .iter()
            .map(|e| (e.offset, e.route.clone()))
            .collect()
    };
    let (w, f) = (strip(&whole), strip(&from));
    assert_eq!(w.len(), 3, "{w:?}");
    assert_eq!(
        w[0],
        (
            4,
            Routed::Duplicate {
                of_offset: None,
                before_offset: None
            }
        )
    );
    assert_eq!(
        f[0],
        (
            4,
            Routed::Duplicate {
                of_offset: None,
                before_offset: Some(3)
            }
        )
    );
    assert_eq!(f[1..], w[1..]);
}

/// Once the watermark is past `end − 1 + lateness + extra horizon` the replay
/// is done: it says where it stopped, and reads no further.
#[test]
fn the_replay_stops_once_the_watermark_leaves_the_dedup_horizon() {
    let records = [
        ev("a", "acme", "large", T10 + 10 * S),
        ev("b", "acme", "large", T10 + 30 * MIN),
        ev("c", "acme", "large", T10 + 2 * 60 * MIN),
        ev("z", "acme", "large", T10 + 20 * S), // too late: not read
        ev("y", "acme", "large", T10 + 20 * S),
    ];
    let r = replay(&cfg(), "acme", (T10, T10 + MIN), &log(&records), T10).unwrap();
    assert!(r.range.stopped_early && r.range.final_here);
    assert_eq!((r.range.to_offset, r.range.log_end), (3, 5));
    assert_eq!(r.billed.len(), 1);
    assert!(r.elsewhere.is_empty());
    // Not past the horizon at the log end: read to the end.
    let r = replay(&cfg(), "acme", (T10, T10 + MIN), &log(&records[..2]), T10).unwrap();
    assert!(!r.range.stopped_early);
    assert_eq!(r.range.to_offset, 2);
}
