//! Engine tests: the seed's retry burst, lateness, dedup and dead letters.

use std::sync::Arc;

use super::*;
use crate::model::{NanoPer1k, Partition, PriceEntry, PriceTable};
use crate::time::WindowSpec;

const T10: i64 = 1_767_261_600_000; // 2026-01-01T10:00:00Z
const S: i64 = 1_000;
const MIN: i64 = 60 * S;

fn cfg(lateness: i64) -> Arc<EngineConfig> {
    let mut prices = PriceTable::default();
    // 1000 prompt + 500 completion tokens = $0.05 + $0.05 = $0.10.
    let entry = PriceEntry {
        effective_from_ms: i64::MIN,
        input: NanoPer1k(50_000_000),
        output: NanoPer1k(100_000_000),
    };
    prices.insert("large", entry);
    Arc::new(EngineConfig {
        window: WindowSpec::new(MIN, 0),
        allowed_lateness_ms: lateness,
        max_out_of_orderness_ms: 5 * S,
        max_future_ms: Some(3_600_000),
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

fn ev(id: &str, tenant: &str, ts: i64) -> String {
    format!(
        r#"{{"request_id":"{id}","tenant_id":"{tenant}","model":"large","prompt_tokens":1000,"completion_tokens":500,"completed_ts":{ts}}}"#
    )
}

/// The seed's burst: r-103/r-104 (10:00:40–59) arrive after r-105 (10:01:09).
fn burst() -> Vec<String> {
    vec![
        ev("r-101", "acme", T10 + 10 * S),
        ev("r-102", "acme", T10 + 20 * S),
        ev("r-105", "acme", T10 + 69 * S),
        ev("r-103", "acme", T10 + 44 * S),
        ev("r-104", "acme", T10 + 52 * S),
        ev("r-106", "acme", T10 + 80 * S),
        // A later event that closes 10:01 (and, with lateness, purges 10:00).
        ev("r-107", "acme", T10 + 160 * S),
    ]
}

fn run(task: &mut PartitionTask, records: &[String]) -> (Vec<Route>, Vec<ResultRecord>) {
    let mut out = Vec::new();
    let routes = records
        .iter()
        .map(|r| {
            task.process(
                RecordIn {
                    payload: r.as_bytes(),
                    kafka_ts: None,
                    now_ms: T10 + 3_600_000,
                },
                &mut out,
            )
            .expect("no spill store")
        })
        .collect();
    (routes, out)
}

#[test]
fn burst_without_lateness_fires_once_and_routes_the_burst_late() {
    let mut task = PartitionTask::new(Partition(0), cfg(0));
    let (routes, panes) = run(&mut task, &burst());
    assert!(
        matches!(routes[3], Route::TooLate { window_end, watermark } if window_end == T10 + MIN && watermark == T10 + 64 * S)
    );
    assert!(matches!(routes[4], Route::TooLate { .. }));
    let summary: Vec<_> = panes
        .iter()
        .map(|p| (p.window_end, p.usd.as_str(), p.pane, p.version))
        .collect();
    assert_eq!(
        summary,
        vec![
            (T10 + MIN, "0.200000000000", PaneKind::OnTime, 2),
            (T10 + 2 * MIN, "0.200000000000", PaneKind::OnTime, 2),
        ]
    );
    assert!(task.counters().balanced());
    assert_eq!(task.counters().too_late, 2);
}

#[test]
fn burst_with_lateness_emits_one_late_pane_per_late_event() {
    let mut task = PartitionTask::new(Partition(3), cfg(30 * S));
    let (routes, panes) = run(&mut task, &burst());
    assert!(routes.iter().all(|r| *r == Route::Window));
    let summary: Vec<_> = panes
        .iter()
        .map(|p| (p.window_end, p.usd.as_str(), p.pane, p.pane_index))
        .collect();
    assert_eq!(
        summary,
        vec![
            (T10 + MIN, "0.200000000000", PaneKind::OnTime, 0),
            (T10 + MIN, "0.300000000000", PaneKind::Late, 1),
            (T10 + MIN, "0.400000000000", PaneKind::Late, 2),
            (T10 + 2 * MIN, "0.200000000000", PaneKind::OnTime, 0),
        ]
    );
    assert!(panes
        .iter()
        .all(|p| p.source_partition == 3 && p.requests == p.version));
    // r-107 moved W to 10:02:35: 10:00 and 10:01 are purged (W >= end-1+30s); only 10:02 is left.
    assert_eq!(task.open_windows(), 1);
}

/// The same burst under the shipped lead limit (`auto` = the 30 s lateness), on a
/// busy partition: another tenant's records every 2 s carry the watermark, as
/// they do in production. acme's panes are the seed's: on time $0.20, then a late
/// pane per late request, and the 10:00 window is purged after.
#[test]
fn burst_with_lateness_under_the_default_lead_limit_emits_the_same_late_panes() {
    let mut c = (*cfg(30 * S)).clone();
    c.max_lead_ms = Some(30 * S);
    let mut task = PartitionTask::new(Partition(3), Arc::new(c));
    let mut records = Vec::new();
    let busy = |records: &mut Vec<String>, from: i64, to: i64| {
        for t in (from..to).step_by(2) {
            records.push(ev(&format!("b-{t}"), "busy", T10 + t * S));
        }
    };
    let story = burst();
    busy(&mut records, 0, 10);
    records.push(story[0].clone()); // r-101 at :10
    busy(&mut records, 10, 20);
    records.push(story[1].clone()); // r-102 at :20
    busy(&mut records, 20, 69);
    records.push(story[2].clone()); // r-105 at 10:01:09, moves W past 10:00:59
    records.push(story[3].clone()); // r-103 (:44) late, within lateness
    records.push(story[4].clone()); // r-104 (:52) late, within lateness
    busy(&mut records, 69, 100);
    let (routes, panes) = run(&mut task, &records);
    assert!(routes.iter().all(|r| *r == Route::Window), "{routes:?}");
    assert_eq!(task.watermark_state().held(), 0);
    let acme: Vec<_> = panes
        .iter()
        .filter(|p| p.tenant_id == "acme")
        .map(|p| (p.window_end, p.usd.as_str(), p.pane, p.pane_index))
        .collect();
    assert_eq!(
        acme,
        vec![
            (T10 + MIN, "0.200000000000", PaneKind::OnTime, 0),
            (T10 + MIN, "0.300000000000", PaneKind::Late, 1),
            (T10 + MIN, "0.400000000000", PaneKind::Late, 2),
        ]
    );
    // W is 10:01:33 (10:01:38 − 5 s): 10:00's purge line 10:01:29 is passed.
    let (_, too_late) = run(&mut task, &[ev("r-108", "acme", T10 + 30 * S)]);
    assert!(too_late.is_empty());
    assert_eq!(task.counters().too_late, 1);
}

#[test]
fn window_created_after_its_end_emits_a_late_pane_at_once() {
    let mut task = PartitionTask::new(Partition(0), cfg(30 * S));
    let recs = [ev("a", "acme", T10 + 70 * S), ev("b", "zeta", T10 + 50 * S)];
    let (_, panes) = run(&mut task, &recs);
    assert_eq!(panes.len(), 1);
    assert_eq!(
        (
            panes[0].tenant_id.as_str(),
            panes[0].pane,
            panes[0].pane_index
        ),
        ("zeta", PaneKind::Late, 0)
    );
}

#[test]
fn duplicates_are_counted_once_even_after_purge() {
    let mut task = PartitionTask::new(Partition(0), cfg(0));
    let recs = [
        ev("x", "acme", T10),
        ev("x", "acme", T10),
        ev("y", "acme", T10 + 10 * MIN),
        ev("x", "acme", T10), // its window is long purged: still a duplicate, not late
    ];
    let (routes, _) = run(&mut task, &recs);
    assert_eq!(
        routes,
        vec![
            Route::Window,
            Route::Duplicate,
            Route::Window,
            Route::Duplicate
        ]
    );
    assert_eq!(task.counters().duplicate, 2);
}

#[test]
fn dead_letters_never_move_the_watermark() {
    let mut task = PartitionTask::new(Partition(0), cfg(0));
    let recs = [
        ev("a", "acme", T10),
        ev("s", "acme", 1_767_261_600),       // seconds, not ms
        ev("f", "acme", T10 + 3 * 3_600_000), // two hours ahead of "now"
        ev("m", "acme", T10).replace("large", "nope"),
        "{\"request_id\":".to_string(),
        format!("{:width$}", ev("big", "acme", T10), width = 5000),
    ];
    let (routes, _) = run(&mut task, &recs);
    let codes: Vec<_> = routes[1..]
        .iter()
        .map(|r| match r {
            Route::DeadLetter(reason) => reason.code(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        codes,
        [
            "timestamp_not_millis",
            "timestamp_in_future",
            "unknown_model",
            "malformed_json",
            "oversized_record"
        ]
    );
    assert_eq!(task.watermark(), crate::time::EventTime(T10 - 5 * S));
    assert!(task.counters().balanced());
}

#[test]
fn snapshot_restore_continues_identically() {
    let records = burst();
    let mut whole = PartitionTask::new(Partition(0), cfg(30 * S));
    let (_, expected) = run(&mut whole, &records);
    for split in 0..=records.len() {
        let mut first = PartitionTask::new(Partition(0), cfg(30 * S));
        let (_, mut got) = run(&mut first, &records[..split]);
        let mut second = PartitionTask::restore(Partition(0), cfg(30 * S), first.snapshot());
        got.extend(run(&mut second, &records[split..]).1);
        assert_eq!(got, expected, "split at {split}");
    }
}

#[test]
fn end_of_input_flushes_open_windows_in_order() {
    let mut task = PartitionTask::new(Partition(0), cfg(0));
    let (_, panes) = run(&mut task, &[ev("a", "zeta", T10), ev("b", "acme", T10 + 1)]);
    assert!(panes.is_empty());
    let mut out = Vec::new();
    task.end_of_input(&mut out).unwrap();
    let tenants: Vec<_> = out.iter().map(|p| p.tenant_id.as_str()).collect();
    assert_eq!(tenants, ["acme", "zeta"]);
}

fn ev_tokens(id: &str, ts: i64, prompt: u64) -> String {
    format!(
        r#"{{"request_id":"{id}","tenant_id":"acme","model":"large","prompt_tokens":{prompt},"completion_tokens":0,"completed_ts":{ts}}}"#
    )
}

/// Issue 19, defect 2: a record dead-lettered because its window's sum would
/// overflow must not make its corrected re-send a duplicate.
#[test]
fn a_dead_lettered_record_never_makes_its_resend_a_duplicate() {
    let mut task = PartitionTask::new(Partition(0), cfg(0));
    let (routes, _) = run(
        &mut task,
        &[
            ev_tokens("big", T10, u64::MAX - 10),
            ev_tokens("r-1", T10 + S, 100),
            ev_tokens("r-1", T10 + S, 5),
            ev_tokens("r-1", T10 + S, 5),
        ],
    );
    assert_eq!(routes[0], Route::Window);
    assert_eq!(routes[1], Route::DeadLetter(DeadLetterReason::Overflow));
    assert_eq!(routes[2], Route::Window, "the corrected re-send is billed");
    assert_eq!(routes[3], Route::Duplicate, "and remembered once billed");
    let c = task.counters();
    assert_eq!((c.folded, c.dead_letter, c.duplicate), (2, 1, 1));
    assert!(c.balanced());
}

/// Issue 19, defect 6: with `max_future = off`, an event time near `i64::MAX`
/// is a dead letter with a reason, not a window whose end wraps negative.
#[test]
fn an_unrepresentable_window_is_a_dead_letter() {
    let mut c = (*cfg(0)).clone();
    c.max_future_ms = None;
    let mut task = PartitionTask::new(Partition(0), Arc::new(c));
    let (routes, panes) = run(
        &mut task,
        &[
            ev("edge", "acme", i64::MAX - 1),
            ev("ok", "acme", i64::MAX - 2 * MIN),
            ev("ok2", "acme", i64::MAX - 2 * MIN + 1),
        ],
    );
    assert_eq!(
        routes[0],
        Route::DeadLetter(DeadLetterReason::WindowOutOfRange(i64::MAX - 1))
    );
    assert_eq!(&routes[1..], &[Route::Window, Route::Window]);
    assert!(panes.iter().all(|p| p.window_end > p.window_start));
    assert_eq!(
        DeadLetterReason::WindowOutOfRange(0).code(),
        "window_out_of_range"
    );
}

fn ev_model(id: &str, model: &str, prompt: u64, ts: i64) -> String {
    format!(
        r#"{{"request_id":"{id}","tenant_id":"acme","model":"{model}","prompt_tokens":{prompt},"completion_tokens":7,"completed_ts":{ts}}}"#
    )
}

/// Two models priced differently: lines per model, sorted, summing to the totals.
#[test]
fn a_pane_itemises_its_models_and_the_lines_sum_to_the_totals() {
    let mut c = (*cfg(0)).clone();
    let small = PriceEntry {
        effective_from_ms: i64::MIN,
        input: NanoPer1k(1_000),
        output: NanoPer1k(3_000),
    };
    c.prices.insert("small", small);
    let c = Arc::new(c);
    let mut task = PartitionTask::new(Partition(0), c.clone());
    let records = [
        ev_model("a", "small", 100, T10 + S),
        ev_model("b", "large", 1000, T10 + 2 * S),
        ev_model("c", "small", 300, T10 + 3 * S),
        ev_model("d", "small", 1, T10 + 2 * MIN),
    ];
    let before = task.memory_bytes();
    let (_, panes) = run(&mut task, &records);
    assert_eq!(task.memory_bytes(), task.recount_bytes());
    assert!(task.memory_bytes() > before);
    let p = &panes[0];
    let models: Vec<&str> = p.lines.iter().map(|l| &*l.model).collect();
    assert_eq!(models, ["large", "small"]);
    let small_line = &p.lines[1];
    assert_eq!((small_line.requests, small_line.prompt_tokens), (2, 400));
    // 400 * 1_000 + 14 * 3_000 nano per 1k tokens = 442_000 pico.
    assert_eq!(small_line.cost_pico, crate::model::Pico(442_000));
    assert_eq!(p.lines.iter().map(|l| l.requests).sum::<u64>(), p.requests);
    assert_eq!(
        p.lines.iter().map(|l| l.cost_pico.0).sum::<u128>(),
        p.cost_pico.0
    );
    assert_eq!(
        p.lines.iter().map(|l| l.prompt_tokens).sum::<u64>(),
        p.prompt_tokens
    );
    // The lines survive a snapshot and a restore, and keep folding.
    let snap = task.snapshot();
    let mut back = PartitionTask::restore(Partition(0), c, snap);
    assert_eq!(back.snapshot(), task.snapshot());
    let (_, more) = run(&mut back, &[ev_model("e", "large", 1, T10 + 5 * MIN)]);
    assert_eq!(more[0].lines.len(), 1, "{:?}", more[0].lines);
    assert_eq!(&*more[0].lines[0].model, "small");
}

/// Progress marks: where the watermark purges a new window end, in pane order.
#[test]
fn progress_is_marked_where_the_watermark_purges_a_window_end() {
    let mut task = PartitionTask::new(Partition(0), cfg(30 * S));
    task.track_progress();
    // W = ts - 5 s. Window 10:00 purges at W >= 10:00:59.999 + 30 s.
    let (_, panes) = run(
        &mut task,
        &[
            ev("a", "acme", T10 + S),
            ev("b", "acme", T10 + 66 * S), // W 10:01:01: fires 10:00, not final yet
            ev("c", "acme", T10 + 96 * S), // W 10:01:31: 10:00 final
            ev("d", "acme", T10 + 97 * S), // nothing new
            ev("e", "acme", T10 + 190 * S), // W 10:03:05: fires 10:01, 10:01 + 10:02 final
        ],
    );
    let marks = task.take_progress();
    // Before the first record's window: the watermark's first value already purges
    // everything before 09:59:26 (the window grid below it).
    let first = marks[0];
    assert_eq!((first.at, first.final_through), (0, T10 - MIN));
    assert_eq!(first.watermark, T10 - 4 * S, "the watermark that made it");
    assert!(
        marks
            .iter()
            .any(|m| (m.at, m.final_through) == (1, T10 + MIN)),
        "{marks:?}"
    );
    let last = marks.last().unwrap();
    assert_eq!(last.final_through, T10 + 2 * MIN);
    assert_eq!(last.at, panes.len(), "after the last pane: {marks:?}");
    assert!(task.take_progress().is_empty());
    // A restored task starts from its watermark's progress: no repeat.
    let mut back = PartitionTask::restore(Partition(0), cfg(30 * S), task.snapshot());
    back.track_progress();
    run(&mut back, &[ev("f", "acme", T10 + 191 * S)]);
    assert!(back.take_progress().is_empty());
    // Untracked (file mode): nothing accumulates.
    let mut plain = PartitionTask::new(Partition(0), cfg(0));
    run(&mut plain, &burst());
    assert!(plain.take_progress().is_empty());
}

/// What the budget counts of a task's changes until a commit has them — the
/// changed windows' copies (long tenant ids and extra line items too) and the new
/// dedup ids, packed — is what its delta holds once drained (`StateDelta::bytes`,
/// the bytes of a checkpoint in flight), and the task no longer counts it.
#[test]
fn the_budget_counts_new_ids_until_a_commit_and_the_delta_counts_them_after() {
    let mut task = PartitionTask::new(Partition(0), cfg(0));
    let long = "t".repeat(200);
    let records: Vec<String> = (0..50)
        .map(|i| ev(&format!("request-{i:04}"), &long, T10 + i * 100))
        .collect();
    let clean = task.budgeted_bytes();
    run(&mut task, &records);
    let held = task.budgeted_bytes();
    let windows = task.memory_bytes();
    // One window, changed: its copy and its id's excess; 50 ids of 12 bytes packed.
    let change = spill::CHANGE_BYTES + 200 - 16;
    assert!(
        held >= windows + change + 50 * 14,
        "{held} < {windows} + {change} + the packed ids"
    );
    let delta = task.drain_changes();
    assert_eq!(delta.changed.len(), 1);
    assert!(delta.bytes() >= change + 50 * 14, "{}", delta.bytes());
    assert_eq!(delta.bytes(), held - task.budgeted_bytes());
    assert!(task.budgeted_bytes() < held && task.budgeted_bytes() >= clean);
}
