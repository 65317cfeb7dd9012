//! A model test of the ledger and the drain condition over transactional logs —
//! the cases the dev broker cannot show (librdkafka's mock cluster writes no
//! transaction markers and hands aborted records to a `read_committed` consumer;
//! see docs/DESIGN.md §7.5).
//!
//! Producers write plain records and transactions that span partitions, commit,
//! abort or stay open, interleaved. A broker log holds each record and, per
//! partition a transaction touched, one marker when it ends. A `read_committed`
//! consumer, as librdkafka is one, reads up to the last stable offset (the first
//! offset of the oldest open transaction), hands over plain and committed records,
//! passes aborted records without handing them over and advances its position
//! past every marker. A bounded run's end is that last stable offset (librdkafka's
//! `ListOffsets` asks with the consumer's isolation level). The worker applies
//! what it is handed exactly as `worker::partitions` does: `classify` for a record past
//! the next offset, `passed` for the position at an idle poll, `drained` to stop.

use std::collections::BTreeSet;

use proptest::prelude::*;

use super::{classify, drained, passed, OffsetLedger};
use crate::model::NextOffset;

const PARTITIONS: usize = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Entry {
    Plain,
    /// A record of transaction `t`.
    Txn(usize),
    /// The marker that ends transaction `t` on this partition.
    Marker(usize),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Open,
    Committed,
    Aborted,
}

/// The logs of `PARTITIONS` partitions and each transaction's fate, from a
/// script of `(what, partition, transaction slot)` steps.
fn build(script: &[(u8, usize, usize)]) -> (Vec<Vec<Entry>>, Vec<Fate>) {
    let mut logs = vec![Vec::new(); PARTITIONS];
    let mut fates: Vec<Fate> = Vec::new();
    // Up to three producers, each with at most one open transaction.
    let mut open: [Option<(usize, BTreeSet<usize>)>; 3] = [None, None, None];
    for &(what, p, slot) in script {
        match what % 6 {
            0 | 1 => logs[p].push(Entry::Plain),
            2 | 3 => {
                let (t, touched) = open[slot].get_or_insert_with(|| {
                    fates.push(Fate::Open);
                    (fates.len() - 1, BTreeSet::new())
                });
                logs[p].push(Entry::Txn(*t));
                touched.insert(p);
            }
            end => {
                if let Some((t, touched)) = open[slot].take() {
                    fates[t] = if end == 4 {
                        Fate::Committed
                    } else {
                        Fate::Aborted
                    };
                    for q in touched {
                        logs[q].push(Entry::Marker(t));
                    }
                }
            }
        }
    }
    (logs, fates)
}

/// What a `read_committed` consumer does at one offset.
enum Seen {
    Record(i64),
    /// An idle poll: librdkafka's position.
    Idle(i64),
}

/// The consumer's view of `log` up to its last stable offset, with an idle poll
/// after the offsets in `idle_after` and at the end; and that offset.
fn consume(log: &[Entry], fates: &[Fate], idle_after: &BTreeSet<usize>) -> (Vec<Seen>, i64) {
    let lso = log
        .iter()
        .position(|e| matches!(e, Entry::Txn(t) if fates[*t] == Fate::Open))
        .unwrap_or(log.len());
    let mut seen = Vec::new();
    let mut position = 0i64;
    for (o, e) in log.iter().enumerate().take(lso) {
        match e {
            Entry::Plain => {
                seen.push(Seen::Record(o as i64));
                position = o as i64 + 1;
            }
            Entry::Txn(t) if fates[*t] == Fate::Committed => {
                seen.push(Seen::Record(o as i64));
                position = o as i64 + 1;
            }
            // Aborted: skipped at the batch level, the position does not move.
            Entry::Txn(_) => {}
            // A control record: not handed over, but the position passes it.
            Entry::Marker(_) => position = o as i64 + 1,
        }
        if idle_after.contains(&o) {
            seen.push(Seen::Idle(position));
        }
    }
    seen.push(Seen::Idle(position));
    (seen, lso as i64)
}

/// The worker's side, as `worker::partitions` applies it; `pass`: whether idle polls
/// move the next offset (the fix), or only records do (before it).
struct Worker {
    next: NextOffset,
    ledger: OffsetLedger,
    billed: Vec<i64>,
}

fn work(seen: &[Seen], end: i64, pass: bool) -> Worker {
    let mut w = Worker {
        next: NextOffset(0),
        ledger: OffsetLedger::default(),
        billed: Vec::new(),
    };
    for s in seen {
        let to = match *s {
            Seen::Record(o) if o >= w.next.0 && o < end => o,
            Seen::Idle(position) if pass => match passed(w.next.0, position, Some(end)) {
                Some(to) => to,
                None => continue,
            },
            _ => continue,
        };
        let skip = classify(w.next.0, to, Some(0), 0);
        assert_eq!(skip.deleted, None, "a transaction is never a gap");
        w.ledger.empty(skip.empty);
        w.next = NextOffset(to);
        if let Seen::Record(o) = *s {
            w.billed.push(o);
            w.next = NextOffset(o + 1);
        }
    }
    w
}

/// `log` after every open transaction ended (committed: a marker at the end).
fn resolve(log: &[Entry], fates: &[Fate]) -> (Vec<Entry>, Vec<Fate>) {
    let mut log = log.to_vec();
    let open: BTreeSet<usize> = log
        .iter()
        .filter_map(|e| match e {
            Entry::Txn(t) if fates[*t] == Fate::Open => Some(*t),
            _ => None,
        })
        .collect();
    log.extend(open.iter().map(|t| Entry::Marker(*t)));
    let fates = fates
        .iter()
        .map(|f| match f {
            Fate::Open => Fate::Committed,
            f => *f,
        })
        .collect();
    (log, fates)
}

fn check(script: &[(u8, usize, usize)], idle: &BTreeSet<usize>) {
    let (logs, fates) = build(script);
    for (p, log) in logs.iter().enumerate() {
        let ctx = format!("partition {p}: {log:?} {fates:?}");
        // The bounded run's end: the stable offset when it was assigned.
        let (seen, end) = consume(log, &fates, idle);
        let billable: Vec<i64> = (0..end)
            .filter(|o| match log[*o as usize] {
                Entry::Plain => true,
                Entry::Txn(t) => fates[t] == Fate::Committed,
                Entry::Marker(_) => false,
            })
            .collect();
        let w = work(&seen, end, true);
        assert!(w.ledger.balanced(w.billed.len() as u64, w.next), "{ctx}");
        if !drained(w.next, end) {
            // One wait, and only while the open transaction that holds the stable
            // offset lasts: the records before it are aborted ones whose marker
            // lies past it, so neither a record nor a marker moves the position.
            assert!((end as usize) < log.len(), "{ctx}");
            for o in w.next.0..end {
                assert!(
                    matches!(log[o as usize], Entry::Txn(t) if fates[t] == Fate::Aborted),
                    "{ctx}"
                );
            }
        }
        // The open transactions end (or time out): the run goes on to the same end.
        let (log, fates) = resolve(log, &fates);
        let (seen, _) = consume(&log, &fates, idle);
        let w = work(&seen, end, true);
        // Committed and plain records billed once; aborted records never.
        assert_eq!(w.billed, billable, "{ctx}");
        // Markers and aborted records are empty offsets, never gaps.
        let empty = end as u64 - billable.len() as u64;
        assert_eq!(w.ledger.empty_offsets, empty, "{ctx}");
        assert_eq!(w.ledger.gap_offsets, 0, "{ctx}");
        assert!(w.ledger.balanced(w.billed.len() as u64, w.next), "{ctx}");
        // The bounded run drains, whatever the log ends in.
        assert!(drained(w.next, end), "{ctx}");
        // Before the fix only a record moved the next offset: a partition whose
        // read part ends in a marker or an aborted record never drained.
        let old = work(&seen, end, false);
        let ends_in_record = billable.last().is_some_and(|o| o + 1 == end);
        assert_eq!(drained(old.next, end), end == 0 || ends_in_record, "{ctx}");
    }
}

#[test]
fn committed_aborted_and_open_transactions_interleaved_with_plain_records() {
    use Entry::*;
    // Partition 0: plain, a committed transaction, an aborted one, ending in its
    // marker; partition 1: plain records around a mixed transaction.
    let script = [
        (0, 0, 0), // plain p0
        (2, 0, 0), // t0 on p0
        (2, 1, 0), // t0 on p1
        (0, 1, 0), // plain p1
        (4, 0, 0), // t0 commits: markers on p0 and p1
        (2, 0, 1), // t1 on p0
        (2, 0, 1),
        (5, 0, 1), // t1 aborts
        (0, 1, 0),
        (2, 2, 2), // t2 on p2 stays open
        (0, 2, 0),
    ];
    let (logs, fates) = build(&script);
    assert_eq!(
        logs[0],
        vec![Plain, Txn(0), Marker(0), Txn(1), Txn(1), Marker(1)]
    );
    assert_eq!(logs[2], vec![Txn(2), Plain]);
    assert_eq!(fates, vec![Fate::Committed, Fate::Aborted, Fate::Open]);
    check(&script, &BTreeSet::new());
    check(&script, &(0..12).collect());
    // Partition 2: the open transaction holds the stable offset at 0.
    let (seen, end) = consume(&logs[2], &fates, &BTreeSet::new());
    assert_eq!(end, 0);
    assert!(drained(work(&seen, end, true).next, end));
}

#[test]
fn aborted_records_before_an_open_transaction_wait_for_it_to_end() {
    use Entry::*;
    // t0 aborts after t1 (still open) wrote: its marker lies past the stable offset.
    let script = [(0, 0, 0), (2, 0, 0), (2, 0, 1), (5, 0, 0)];
    let (logs, fates) = build(&script);
    assert_eq!(logs[0], vec![Plain, Txn(0), Txn(1), Marker(0)]);
    let (seen, end) = consume(&logs[0], &fates, &BTreeSet::new());
    assert_eq!(end, 2);
    let w = work(&seen, end, true);
    assert_eq!((w.next, w.billed), (NextOffset(1), vec![0]));
    assert!(!drained(w.next, end));
    // t1 ends: the position passes t0's marker, and the run reaches its end.
    let (log, fates) = resolve(&logs[0], &fates);
    let (seen, _) = consume(&log, &fates, &BTreeSet::new());
    let w = work(&seen, end, true);
    assert!(drained(w.next, end));
    assert_eq!(w.ledger.empty_offsets, 1);
    check(&script, &BTreeSet::new());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    #[test]
    fn every_transactional_log_is_billed_exactly_and_drains(
        script in prop::collection::vec((0u8..6, 0..PARTITIONS, 0usize..3), 0..80),
        idle in prop::collection::btree_set(0usize..80, 0..10),
    ) {
        check(&script, &idle);
    }
}
