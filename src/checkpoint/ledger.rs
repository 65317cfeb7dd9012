//! The offset ledger: where every offset a partition advanced over went.
//!
//! The record audit (`Counters::balanced`) says each record consumed has exactly one
//! route. It cannot see a record that was never consumed. The ledger closes that
//! hole: for every partition, at every checkpoint,
//!
//! ```text
//! consumed + empty_offsets + gap_offsets == next_offset
//! ```
//!
//! - `empty_offsets`: offsets inside the retained log that carry no record for a
//!   consumer. Kafka leaves them in three ways: transaction markers (one offset per
//!   commit or abort and partition), aborted transactional records (the worker
//!   reads `isolation.level=read_committed`, which tally owns) and compacted-away
//!   records. They show up as a record whose offset is past the next expected one,
//!   or as the consumer's position passing them with no record after them
//!   (`passed`: a partition whose log ends in a marker); either way the skipped
//!   offsets are at or above the log start librdkafka last saw.
//! - `gap_offsets`: offsets below the log start, deleted by retention (or
//!   `DeleteRecords`) before tally read them. They are never skipped silently: the
//!   worker refuses and names the range; with `--allow-truncated-log` it accepts
//!   the gap, logs it, counts it here and keeps the newest `MAX_GAPS` ranges.
//!
//! The counters in the snapshot file and the ledger in the manifest are written by
//! the same barrier, so a restored partition balances exactly when it balanced
//! when it was written.
//!
//! Compatibility: the ledger is part of every manifest entry since checkpoint
//! format 2, stored in format 3 as `format::LedgerBody` (empty offsets, gap
//! offsets, the kept gaps as `(from, to, at_ms)`). Changing it is a new checkpoint
//! format (see `format`). `without_gaps` is also the ledger of a file run, whose
//! lines are offsets with no gaps.

use serde::{Deserialize, Serialize};

use crate::model::NextOffset;

/// Accepted gaps kept per partition (the counters keep the total).
pub(crate) const MAX_GAPS: usize = 16;

/// Offsets `from..to` (next-offset convention: `to` is the first offset kept),
/// accepted at wall-clock `at_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gap {
    pub from: i64,
    pub to: i64,
    pub at_ms: i64,
}

impl Gap {
    /// Its offsets; 0 for a backward range (a crafted ledger may hold any).
    pub fn len(&self) -> u64 {
        u64::try_from(i128::from(self.to) - i128::from(self.from)).unwrap_or(0)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl std::fmt::Display for Gap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "offsets {}..{} ({} records)",
            self.from,
            self.to,
            self.len()
        )
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffsetLedger {
    pub empty_offsets: u64,
    pub gap_offsets: u64,
    /// The newest accepted gaps, oldest first.
    pub gaps: Vec<Gap>,
}

/// What lies between the next expected offset and the offset of the record that
/// arrived instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Skip {
    /// Deleted before tally read them (below the log start).
    pub deleted: Option<Gap>,
    /// Empty offsets in the retained log.
    pub empty: u64,
}

/// Classifies the offsets `expected..arrived` given the log start librdkafka last
/// saw (`None`: unknown, so nothing is taken as deleted — the fetch error path
/// still catches retention, see `worker::partitions`).
pub(crate) fn classify(expected: i64, arrived: i64, log_start: Option<i64>, at_ms: i64) -> Skip {
    if arrived <= expected {
        return Skip {
            deleted: None,
            empty: 0,
        };
    }
    match log_start {
        Some(low) if low > expected => {
            let to = low.min(arrived);
            Skip {
                deleted: Some(Gap {
                    from: expected,
                    to,
                    at_ms,
                }),
                empty: (arrived - to) as u64,
            }
        }
        _ => Skip {
            deleted: None,
            empty: (arrived - expected) as u64,
        },
    }
}

/// Where the consumer's `position` lets a partition's next offset move with no
/// record: librdkafka's position is past every record *and control record*
/// (transaction marker) it has handed over, and it passes aborted records
/// without handing them over, so when every record before the position has been
/// applied, the offsets from `next` up to it carry no record for this consumer
/// (classified like any jump, `classify`). A bounded run stops at `end` (records
/// at or past it are read but not processed). `None`: nothing to pass.
pub(crate) fn passed(next: i64, position: i64, end: Option<i64>) -> Option<i64> {
    let to = end.map_or(position, |end| position.min(end));
    (to > next).then_some(to)
}

/// A bounded run (`--until-end`) has read a partition when its next offset
/// reaches the log end seen at assignment. A log that ends in offsets with no
/// record (a transaction marker, an aborted transaction) is reached through the
/// consumer's position (`passed`), not a record.
pub(crate) fn drained(next: NextOffset, end: i64) -> bool {
    next.0 >= end
}

impl OffsetLedger {
    /// No gap: every offset not consumed was empty (a file run: a line that holds no record).
    pub(crate) fn without_gaps(consumed: u64, next: NextOffset) -> Self {
        Self {
            empty_offsets: (next.0.max(0) as u64).saturating_sub(consumed),
            ..Self::default()
        }
    }

    pub(crate) fn accept_gap(&mut self, gap: Gap) {
        if gap.is_empty() {
            return;
        }
        // Saturating: a restored ledger is checked to fit below its next offset
        // (`format`), so a saturated sum is already one that cannot balance.
        self.gap_offsets = self.gap_offsets.saturating_add(gap.len());
        self.gaps.push(gap);
        if self.gaps.len() > MAX_GAPS {
            self.gaps.remove(0);
        }
    }

    pub(crate) fn empty(&mut self, n: u64) {
        self.empty_offsets = self.empty_offsets.saturating_add(n);
    }

    /// `consumed + empty + gaps == next` (see the module header).
    pub fn balanced(&self, consumed: u64, next: NextOffset) -> bool {
        consumed
            .checked_add(self.empty_offsets)
            .and_then(|s| s.checked_add(self.gap_offsets))
            == u64::try_from(next.0).ok()
    }
}

#[cfg(test)]
mod model_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_position_passes_offsets_without_a_record_up_to_a_bounded_end() {
        // Records 0..=9, a commit marker at 10: the log ends at 11.
        assert_eq!(passed(10, 11, Some(11)), Some(11));
        assert_eq!(passed(10, 11, None), Some(11));
        // Nothing to pass: at (or behind) the next offset.
        assert_eq!(passed(11, 11, None), None);
        assert_eq!(passed(11, 5, None), None);
        // A bounded run never passes its end: records past it are not processed.
        assert_eq!(passed(10, 40, Some(11)), Some(11));
        assert_eq!(passed(11, 40, Some(11)), None);
        assert!(!drained(NextOffset(10), 11));
        assert!(drained(NextOffset(11), 11));
    }

    #[test]
    fn a_jump_inside_the_retained_log_is_empty_offsets() {
        // A transaction marker at 10: records 9 and 11.
        assert_eq!(
            classify(10, 11, Some(0), 5),
            Skip {
                deleted: None,
                empty: 1
            }
        );
        assert_eq!(classify(10, 10, Some(0), 5).empty, 0);
        assert_eq!(classify(10, 30, None, 5).empty, 20);
    }

    #[test]
    fn a_jump_over_the_log_start_is_a_deletion() {
        // Expected 1000, the log now starts at 16422, the first record there is
        // 16423 (16422 a marker).
        let s = classify(1000, 16423, Some(16422), 7);
        assert_eq!(
            s.deleted,
            Some(Gap {
                from: 1000,
                to: 16422,
                at_ms: 7
            })
        );
        assert_eq!(s.empty, 1);
        assert_eq!(s.deleted.unwrap().len(), 15422);
        assert_eq!(
            s.deleted.unwrap().to_string(),
            "offsets 1000..16422 (15422 records)"
        );
    }

    #[test]
    fn the_ledger_balances_consumed_empty_and_gaps_against_the_next_offset() {
        let mut l = OffsetLedger::default();
        assert!(l.balanced(0, NextOffset(0)));
        l.accept_gap(Gap {
            from: 1000,
            to: 16422,
            at_ms: 0,
        });
        l.empty(3);
        assert!(l.balanced(105_575, NextOffset(121_000)));
        assert!(!l.balanced(105_578, NextOffset(121_000)));
        assert!(!l.balanced(0, NextOffset(-1)));
        // Issue 33: sums that would wrap never balance.
        let max = OffsetLedger {
            empty_offsets: u64::MAX,
            gap_offsets: u64::MAX,
            gaps: Vec::new(),
        };
        for consumed in [0, 1, 2, u64::MAX] {
            assert!(!max.balanced(consumed, NextOffset(i64::MAX)), "{consumed}");
        }
        let wide = Gap {
            from: i64::MIN,
            to: i64::MAX,
            at_ms: 0,
        };
        assert_eq!(wide.len(), u64::MAX);
        let back = Gap {
            from: 5,
            to: 1,
            at_ms: 0,
        };
        assert_eq!(back.len(), 0);
    }

    #[test]
    fn only_the_newest_gaps_are_kept_but_all_are_counted() {
        let mut l = OffsetLedger::default();
        for i in 0..(MAX_GAPS as i64 + 4) {
            l.accept_gap(Gap {
                from: i * 10,
                to: i * 10 + 2,
                at_ms: i,
            });
        }
        assert_eq!(l.gaps.len(), MAX_GAPS);
        assert_eq!(l.gaps[0].at_ms, 4);
        assert_eq!(l.gap_offsets, 2 * (MAX_GAPS as u64 + 4));
    }

    #[test]
    fn without_gaps_balances_by_construction() {
        let l = OffsetLedger::without_gaps(90, NextOffset(100));
        assert_eq!(l.empty_offsets, 10);
        assert!(l.balanced(90, NextOffset(100)));
    }
}
