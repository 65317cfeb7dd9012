use super::*;
use crate::base::histogram::Histogram;
use crate::metrics::tests::part;
use crate::metrics::CheckpointStats;
use crate::time::EventTime;

const MIN: i64 = 60_000;
// 2026-01-01T10:00:00Z
const T10: i64 = 1_767_261_600_000;

fn report(idle: Option<i64>, partitions: Vec<PartitionReport>) -> WorkerReport {
    WorkerReport {
        at_ms: T10 + 10 * MIN,
        topic: "requests".into(),
        group: "g".into(),
        bound_ms: 5_000,
        allowed_lateness_ms: 30_000,
        window_size_ms: MIN,
        window_offset_ms: 0,
        checkpoint_interval_ms: 1_000,
        checkpoint: CheckpointStats::default(),
        idle_ms: idle,
        partitions,
        pane_ack_us: Histogram::default(),
    }
}

/// A partition at watermark `w`, caught up, with its progress from `w`.
fn at(p: i32, w: Option<i64>, idle_ms: u64) -> PartitionReport {
    let mut r = part(p, w, idle_ms, &[]);
    r.log_end = Some(r.next_offset.0);
    r.final_through = w.map(|w| {
        let x = w + 1 - 30_000;
        x - x.rem_euclid(MIN)
    });
    r
}

#[test]
fn the_silent_partition_holds_the_window_back_until_it_passes() {
    // Partition 1 is silent (idleness off) at 10:00:20; partition 0 is far on.
    let r = report(
        None,
        vec![
            at(0, Some(T10 + 5 * MIN), 10),
            at(1, Some(T10 + 20_000), 90_000),
        ],
    );
    let f = explain(&r, WindowRef::Start(T10)).unwrap();
    assert_eq!((f.window_start, f.window_end), (T10, T10 + MIN));
    assert_eq!(f.needs_watermark, T10 + MIN - 1 + 30_000);
    assert!(!f.is_final);
    assert_eq!(f.held_back_by, Some(Partition(1)));
    assert!(f.partitions[0].passed && f.partitions[0].reasons.is_empty());
    let p1 = &f.partitions[1];
    assert!(!p1.passed);
    assert_eq!(p1.lateness_to_run_ms, MIN - 1 + 30_000 - 20_000);
    assert_eq!(
        p1.reasons,
        vec![
            Reason::LatenessToRun { ms: 69_999 },
            Reason::SilentIdlenessOff { silent_ms: 90_000 }
        ]
    );
    let table = f.render_table();
    assert!(
        table.contains("not final: held back by partition 1"),
        "{table}"
    );
    assert!(table.contains("idleness off"), "{table}");
    assert!(table.contains("partitions judged: 0, 1 "), "{table}");

    // Data on partition 1 moves it past: the same window is final, nobody named.
    let r = report(
        None,
        vec![
            at(0, Some(T10 + 5 * MIN), 10),
            at(1, Some(T10 + 2 * MIN), 0),
        ],
    );
    let f = explain(&r, WindowRef::End(T10 + MIN)).unwrap();
    assert!(f.is_final);
    assert_eq!(f.held_back_by, None);
    assert!(f.partitions.iter().all(|p| p.reasons.is_empty()));
    assert!(f.render_table().contains("final: every partition"));
}

#[test]
fn the_partition_furthest_behind_is_named_and_every_reason_said() {
    let mut held = at(2, Some(T10), 0);
    held.held = 7;
    held.log_end = Some(held.next_offset.0 + 40);
    // At the line, its progress not recorded yet.
    let mut pending = at(1, Some(T10 + MIN + 29_999), 20_000);
    pending.final_through = Some(T10);
    let r = report(Some(60_000), vec![held, at(0, None, 5_000), pending]);
    let f = explain(&r, WindowRef::Start(T10)).unwrap();
    // No watermark is furthest behind.
    assert_eq!(f.held_back_by, Some(Partition(0)));
    let by = |n: i32| {
        f.partitions
            .iter()
            .find(|p| p.partition == Partition(n))
            .unwrap()
    };
    assert_eq!(
        by(0).reasons,
        vec![Reason::NoWatermark, Reason::IdleTimeoutToRun { ms: 55_000 }]
    );
    assert_eq!(
        by(2).reasons,
        vec![
            Reason::LatenessToRun {
                ms: MIN - 1 + 30_000
            },
            Reason::HeldRecords { count: 7 },
            Reason::Backlog { records: 40 }
        ]
    );
    assert_eq!(by(1).lateness_to_run_ms, 0);
    assert!(
        by(1).reasons.contains(&Reason::ProgressPending),
        "{:?}",
        by(1)
    );
    // Without partition 0, the lowest watermark: partition 2.
    let mut r = r;
    r.partitions.retain(|p| p.partition != Partition(0));
    assert_eq!(
        explain(&r, WindowRef::Start(T10)).unwrap().held_back_by,
        Some(Partition(2))
    );
}

#[test]
fn a_window_off_the_grid_or_without_a_size_is_refused() {
    let r = report(None, vec![at(0, Some(T10), 0)]);
    let e = explain(&r, WindowRef::Start(T10 + 1)).unwrap_err();
    assert!(e.contains("not a window boundary"), "{e}");
    let mut old = r.clone();
    old.window_size_ms = 0;
    assert!(explain(&old, WindowRef::End(T10)).is_err());
    // No partition: not final, and nobody named.
    let f = explain(&report(None, vec![]), WindowRef::Start(T10)).unwrap();
    assert!(!f.is_final && f.held_back_by.is_none());
    assert!(f.render_table().contains("no partition"));
}

#[test]
fn merged_reports_keep_each_partition_once_from_the_one_further_along() {
    let a = report(None, vec![at(1, Some(T10), 0), at(0, Some(T10), 0)]);
    let mut newer = at(1, Some(T10 + MIN), 0);
    newer.next_offset.0 += 5;
    let b = report(None, vec![newer, at(3, Some(T10), 0)]);
    let m = merge(vec![a, b]).unwrap();
    let parts: Vec<i32> = m.partitions.iter().map(|p| p.partition.0).collect();
    assert_eq!(parts, vec![0, 1, 3]);
    assert_eq!(m.partitions[1].watermark, Some(EventTime(T10 + MIN)));
    let mut other = report(None, vec![]);
    other.group = "h".into();
    assert!(merge(vec![m, other])
        .unwrap_err()
        .contains("different jobs"));
    assert!(merge(vec![]).is_err());
}
