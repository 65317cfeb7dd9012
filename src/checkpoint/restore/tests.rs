//! The restore decision, table by table.

use super::*;
use crate::checkpoint::{CheckpointId, PartRef, Segment, SegmentKind};
use crate::engine::Counters;

fn manifest(id: u64, fingerprint: &str, entries: &[(i32, i64)]) -> Manifest {
    Manifest {
        format: crate::checkpoint::format::VERSION,
        id: CheckpointId(id),
        worker: "w".into(),
        created_at_ms: 0,
        group: "g".into(),
        topic: "t".into(),
        fingerprint: fingerprint.into(),
        semantics: None,
        partitions: entries
            .iter()
            .map(|&(p, next)| PartitionEntry {
                partition: Partition(p),
                next_offset: NextOffset(next),
                watermark: None,
                high_water: None,
                counters: Counters::default(),
                offsets: OffsetLedger::without_gaps(0, NextOffset(next)),
                segments: vec![Segment {
                    checkpoint: "chk-1-w".into(),
                    kind: SegmentKind::Base,
                    parts: vec![PartRef {
                        bytes: 1,
                        sha256: [0; 32],
                    }],
                }],
            })
            .collect(),
    }
}

/// The plan as `(name | "REFUSE")` per step.
fn shape(steps: &[Try<'_>]) -> Vec<String> {
    steps
        .iter()
        .map(|s| match s {
            Try::Load { name, .. } => name.to_string(),
            Try::Skip { name, .. } => format!("SKIP {name}"),
            Try::Refuse(_) => "REFUSE".into(),
        })
        .collect()
}

#[test]
fn the_plan_orders_by_offset_then_id_and_stops_at_another_fingerprint() {
    let (a, b, c, d) = (
        manifest(1, "f", &[(0, 10), (1, 10)]),
        manifest(2, "f", &[(0, 30)]),
        manifest(3, "f", &[(0, 30), (1, 5)]),
        manifest(4, "old", &[(0, 20)]),
    );
    let policy = StartPolicy::default();
    let reset = StartPolicy {
        reset_state_earliest: true,
        ..StartPolicy::default()
    };
    let found = |ms: Vec<(&'static str, &'static Manifest)>, unreadable: &[Unreadable]| Found {
        checkpoints: ms,
        unreadable: unreadable.to_vec(),
    };
    let (a, b, c, d): (&'static _, &'static _, &'static _, &'static _) = (
        Box::leak(Box::new(a)),
        Box::leak(Box::new(b)),
        Box::leak(Box::new(c)),
        Box::leak(Box::new(d)),
    );
    let all = vec![("a", a), ("b", b), ("c", c), ("d", d)];
    type Row = (
        Partition,
        Found<'static>,
        &'static str,
        StartPolicy,
        Vec<&'static str>,
    );
    let rows: Vec<Row> = vec![
        // Greatest next offset first, ties by id; another fingerprint further down
        // ends the plan with a refusal.
        (
            Partition(0),
            found(all.clone(), &[]),
            "f",
            policy,
            vec!["c", "b", "REFUSE"],
        ),
        // Partition 1: c (5) is behind a (10).
        (
            Partition(1),
            found(all.clone(), &[]),
            "f",
            policy,
            vec!["a", "c"],
        ),
        // Nobody holds partition 2.
        (Partition(2), found(all.clone(), &[]), "f", policy, vec![]),
        // The newest is under another fingerprint: refused at once.
        (
            Partition(0),
            found(vec![("d", d), ("a", a)], &[]),
            "f",
            policy,
            vec!["REFUSE"],
        ),
        // `--reset-state earliest` ignores the checkpoints.
        (Partition(0), found(all.clone(), &[]), "f", reset, vec![]),
        // A damaged manifest is ignored; one of another format is a refusal.
        (
            Partition(1),
            found(
                vec![("a", a)],
                &[Unreadable::Damaged("checksum mismatch".into())],
            ),
            "f",
            policy,
            vec!["a"],
        ),
        (
            Partition(1),
            found(
                vec![("a", a)],
                &[Unreadable::OtherFormat(
                    "a manifest of checkpoint format 2".into(),
                )],
            ),
            "f",
            policy,
            vec!["REFUSE"],
        ),
    ];
    for (i, (p, found, fingerprint, policy, want)) in rows.into_iter().enumerate() {
        let steps = plan(p, &found, &Rules::opaque(fingerprint), policy, None);
        assert_eq!(shape(&steps), want, "row {i}");
    }
    let steps = plan(
        Partition(0),
        &found(vec![("d", d)], &[]),
        &Rules::opaque("f"),
        policy,
        None,
    );
    let Try::Refuse(refusal) = &steps[0] else {
        panic!("{steps:?}")
    };
    assert_eq!(refusal.kind, crate::base::error::RefusalKind::ConfigChanged);
    let msg = &refusal.message;
    assert!(
        msg.contains("another configuration") && msg.contains("job.generation"),
        "{msg}"
    );
}

fn facts(start: i64, end: i64, committed: Option<i64>) -> LogFacts {
    LogFacts {
        partition: Partition(3),
        log_start: start,
        log_end: end,
        committed,
    }
}

#[test]
fn the_start_is_decided_from_the_restore_the_group_and_the_log() {
    let names = Names {
        topic: "requests",
        group: "billing",
        store: "s3://b/p/billing",
    };
    let none = StartPolicy::default();
    let allow = StartPolicy {
        allow_truncated_log: true,
        ..none
    };
    let reset = StartPolicy {
        reset_state_earliest: true,
        ..none
    };
    let onboard = StartPolicy {
        start_at_log_start: true,
        ..none
    };
    let at = |n: i64| {
        Some((
            NextOffset(n),
            OffsetLedger::without_gaps(n as u64, NextOffset(n)),
        ))
    };
    // (facts, restored, policy) → Ok(next, gap offsets, rebuilt_over) or Err(words).
    type Want = Result<(i64, u64, Option<i64>), &'static [&'static str]>;
    type Row = (
        LogFacts,
        Option<(NextOffset, OffsetLedger)>,
        StartPolicy,
        Want,
    );
    let rows: Vec<Row> = vec![
        // A restore inside the log resumes there.
        (facts(0, 100, Some(50)), at(50), none, Ok((50, 0, None))),
        // At the log end exactly: nothing to read yet, fine.
        (facts(0, 100, None), at(100), none, Ok((100, 0, None))),
        // Past the log end: the topic was recreated.
        (
            facts(0, 100, None),
            at(120),
            none,
            Err(&[
                "log ends at 100",
                "Refusing to guess",
                "new consumer group",
                "--reset-state earliest",
            ]),
        ),
        // No checkpoint, nothing committed, the log from 0: a fresh partition.
        (facts(0, 100, None), None, none, Ok((0, 0, None))),
        // No checkpoint but a committed offset: refused, naming the group and store.
        (
            facts(0, 100, Some(40)),
            None,
            none,
            Err(&[
                "committed offset 40",
                "billing",
                "s3://b/p/billing",
                "--reset-state earliest",
            ]),
        ),
        // … unless rebuilt on purpose.
        (facts(0, 100, Some(40)), None, reset, Ok((0, 0, Some(40)))),
        // A checkpoint behind the log start: a gap, refused …
        (
            facts(60, 100, Some(50)),
            at(50),
            none,
            Err(&["offsets 50..60 (10 records)", "--allow-truncated-log"]),
        ),
        // … or accepted and counted.
        (facts(60, 100, Some(50)), at(50), allow, Ok((60, 10, None))),
        // No checkpoint and a log that starts above 0: a partial history.
        // Refused, naming both ways out.
        (
            facts(7, 100, None),
            None,
            none,
            Err(&[
                "offsets 0..7 (7 records)",
                "log starts at offset 7",
                "partial history",
                "--start-at-log-start",
                "--allow-truncated-log",
            ]),
        ),
        (facts(7, 100, None), None, allow, Ok((7, 7, None))),
        // The first start's choice: at the log start, the gap counted.
        (facts(7, 100, None), None, onboard, Ok((7, 7, None))),
        // A log from 0 needs no choice.
        (facts(0, 100, None), None, onboard, Ok((0, 0, None))),
        // The choice covers no later gap: a checkpoint behind the log start is refused.
        (
            facts(60, 100, Some(50)),
            at(50),
            onboard,
            Err(&[
                "offsets 50..60 (10 records)",
                "--allow-truncated-log",
                "`--start-at-log-start` does not cover it",
            ]),
        ),
        // Nor does it change a restore inside the log.
        (facts(0, 100, Some(50)), at(50), onboard, Ok((50, 0, None))),
    ];
    for (i, (f, restored, policy, want)) in rows.into_iter().enumerate() {
        let got = decide(&names, &f, restored, policy, 99);
        match (got, want) {
            (Ok(s), Ok((next, gap, rebuilt))) => {
                assert_eq!(
                    (s.next.0, s.offsets.gap_offsets, s.rebuilt_over),
                    (next, gap, rebuilt),
                    "row {i}"
                );
                assert_eq!(s.accepted_gap.is_some(), gap > 0, "row {i}");
                // Only a first start under the choice is onboarded.
                let first = f.committed.is_none() || policy.reset_state_earliest;
                assert_eq!(
                    s.onboarded,
                    gap > 0 && policy.start_at_log_start && first,
                    "row {i}"
                );
                if let Some((g, _)) = s.accepted_gap {
                    assert_eq!(g.at_ms, 99, "row {i}");
                }
            }
            (Err(refusal), Err(words)) => {
                let msg = refusal.message;
                for w in words {
                    assert!(msg.contains(w), "row {i}: {w:?} not in {msg}");
                }
                assert!(msg.contains("requests/3"), "row {i}: {msg}");
            }
            (got, want) => panic!("row {i}: got {got:?}, want {want:?}"),
        }
    }
}

/// Issue 33: a checkpoint that resumes past the partition's log end (an offset
/// the log never reached: `i64::MAX`, or any crafted value) is damage — the plan
/// skips it and goes on with the next candidate, older ones included.
#[test]
fn a_candidate_past_the_log_end_is_skipped_as_damage() {
    let a: &'static Manifest = Box::leak(Box::new(manifest(1, "f", &[(0, 50)])));
    let b: &'static Manifest = Box::leak(Box::new(manifest(2, "f", &[(0, i64::MAX)])));
    let c: &'static Manifest = Box::leak(Box::new(manifest(3, "f", &[(0, 101)])));
    let found = Found {
        checkpoints: vec![("a", a), ("b", b), ("c", c)],
        unreadable: Vec::new(),
    };
    let rules = Rules::opaque("f");
    let policy = StartPolicy::default();
    let steps = plan(Partition(0), &found, &rules, policy, Some(100));
    assert_eq!(shape(&steps), ["SKIP b", "SKIP c", "a"]);
    let Try::Skip { why, .. } = &steps[0] else {
        panic!("{steps:?}")
    };
    assert!(
        why.contains(&i64::MAX.to_string()) && why.contains("log end 100"),
        "{why}"
    );
    // At the log end exactly is fine; an unknown log end skips nothing.
    assert_eq!(
        shape(&plan(Partition(0), &found, &rules, policy, Some(101))),
        ["SKIP b", "c", "a"]
    );
    assert_eq!(
        shape(&plan(Partition(0), &found, &rules, policy, None)),
        ["b", "c", "a"]
    );
}

/// Issue 33, defect 6: a manifest that could not be read is damage only when
/// the object itself is wrong; the store failing (the object store after its
/// retries, the local directory, a stop request) is never "damaged" — and never
/// "absent": it is returned as the error it is.
#[test]
fn a_read_error_is_never_damage_nor_absence() {
    let at = || "s3://b/g/chk-1-w/MANIFEST".to_string();
    let damage = [
        ObjectError::Refused {
            location: at(),
            msg: "not a regular file".into(),
        },
        ObjectError::NotFound { location: at() },
    ];
    for e in damage {
        assert!(
            matches!(read_failure(e), Ok(Unreadable::Damaged(_))),
            "damage"
        );
    }
    let not_damage = [
        ObjectError::Unavailable {
            location: at(),
            msg: "Server returned non-2xx status code: 500".into(),
        },
        ObjectError::Io {
            location: at(),
            msg: "Input/output error (os error 5)".into(),
        },
        ObjectError::Interrupted { location: at() },
    ];
    for e in not_damage {
        let shown = e.to_string();
        match read_failure(e) {
            Err(back) => assert_eq!(back.to_string(), shown),
            Ok(u) => panic!("{shown} taken for {u:?}"),
        }
    }
}
