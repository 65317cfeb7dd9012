//! The generator's construction: its records and the totals they imply.

use super::*;
use crate::model::{NanoPer1k, Partition, PriceEntry};

fn prices() -> PriceTable {
    let mut t = PriceTable::default();
    for m in ["a", "b"] {
        t.insert(
            m,
            PriceEntry {
                effective_from_ms: i64::MIN,
                input: NanoPer1k(150_000),
                output: NanoPer1k(600_000),
            },
        );
    }
    t
}

fn opts() -> GenOptions {
    GenOptions {
        seed: 7,
        count: 20_000,
        tenants: 50,
        skew_milli: 1000,
        partitions: 4,
        start_ms: 1_767_261_600_000,
        step_ms: 10,
        jitter_ms: 4_000,
        late_per_million: 20_000,
        duplicate_per_million: 20_000,
        malformed_per_million: 20_000,
    }
}

#[test]
fn deterministic_and_accounted() {
    let p = prices();
    let w = WindowSpec::new(60_000, 0);
    let a: Vec<_> = Generator::new(opts(), &p, w, 0, 5_000)
        .map(|r| r.payload)
        .collect();
    let mut g = Generator::new(opts(), &p, w, 0, 5_000);
    let b: Vec<_> = g.by_ref().map(|r| r.payload).collect();
    assert_eq!(a, b);
    let e = g.expected();
    let normal: u64 = e.windows.iter().map(|w| w.requests).sum();
    let dlq: u64 = e.dead_letters.values().sum();
    assert_eq!(
        normal + e.too_late.len() as u64 + e.duplicates + dlq,
        20_000
    );
    assert!(e.duplicates > 100 && e.too_late.len() > 100 && dlq > 100);
}

/// Without a lead limit, and with the default one (`auto`: the lateness).
#[test]
fn engine_agrees_with_the_construction() {
    engine_agrees(0, None);
    engine_agrees(30_000, Some(30_000));
    engine_agrees(0, Some(1_000));
}

fn engine_agrees(lateness: i64, max_lead: Option<i64>) {
    use crate::engine::{EngineConfig, PartitionTask, RecordIn, Route, TimeSource};
    use std::sync::Arc;
    let p = prices();
    let w = WindowSpec::new(60_000, 0);
    let mut g = Generator::new(opts(), &p, w, lateness, 5_000).with_max_lead(max_lead);
    let records: Vec<_> = g.by_ref().collect();
    let cfg = Arc::new(EngineConfig {
        window: w,
        allowed_lateness_ms: lateness,
        max_out_of_orderness_ms: 5_000,
        max_future_ms: None,
        time_source: TimeSource::CompletedTs,
        max_lead_ms: max_lead,
        dedup_extra_ms: 3_600_000,
        max_record_bytes: 1 << 20,
        generation: 1,
        prices: p.clone(),
        rating: None,
        rating_source: String::new(),
        input: Default::default(),
    });
    let mut tasks: BTreeMap<i32, PartitionTask> = BTreeMap::new();
    let mut panes = Vec::new();
    for r in &records {
        let task = tasks
            .entry(r.partition)
            .or_insert_with(|| PartitionTask::new(Partition(r.partition), cfg.clone()));
        let route = task
            .process(
                RecordIn {
                    payload: r.payload.as_bytes(),
                    kafka_ts: None,
                    now_ms: 0,
                },
                &mut panes,
            )
            .expect("no spill store");
        let ok = match (r.kind, &route) {
            (Kind::Normal, Route::Window)
            | (Kind::TooLate, Route::TooLate { .. })
            | (Kind::Duplicate, Route::Duplicate) => true,
            (Kind::Malformed(code), Route::DeadLetter(reason)) => reason.code() == code,
            _ => false,
        };
        assert!(
            ok,
            "{:?} routed {route:?} (lateness {lateness}, lead {max_lead:?}): {}",
            r.kind, r.payload
        );
    }
    for t in tasks.values_mut() {
        t.end_of_input(&mut panes).unwrap();
    }
    let mut got: BTreeMap<(String, i64), (u128, u64)> = BTreeMap::new();
    for pane in panes {
        got.insert(
            (pane.tenant_id.clone(), pane.window_end),
            (pane.cost_pico.0, pane.requests),
        );
    }
    let want: BTreeMap<_, _> = g
        .expected()
        .windows
        .into_iter()
        .map(|w| {
            (
                (w.tenant_id, w.window_end),
                (w.cost_pico.parse::<u128>().unwrap(), w.requests),
            )
        })
        .collect();
    assert_eq!(got, want);
}
