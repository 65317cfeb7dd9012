//! Per-partition watermark: bounded out-of-orderness (monotonous = bound 0), led
//! by the event times most of the partition agrees on. The rule and its reasons
//! are docs/DESIGN.md §4.4; this header states what the code keeps true.
//!
//! Invariants:
//! - `W = max(max_ts - bound, forced)`; it never decreases; before the partition
//!   has started (no confirmed event time, no forced advance) it is `i64::MIN`:
//!   nothing fires and nothing is late. Only validated event times are fed in —
//!   the timestamp guards run before `observe` (docs/DESIGN.md §4).
//! - `max_ts` is the greatest *confirmed* event time. Without a lead limit every
//!   event time is confirmed, the first one included. With `max_lead`:
//!   - the partition starts at the `START_RANK`-th smallest of its first `START`
//!     event times (the greatest of them less than `max_lead` above it is
//!     confirmed, the others are held);
//!   - after that, an event time less than `max_lead` ahead of the reference
//!     (`max_ts`, or the forced watermark plus the bound, whichever is later) is
//!     confirmed; one further ahead is *held*: counted (`held`), billed by the
//!     caller like any other, but it moves nothing — unless more than half of the
//!     `RECENT` latest event times (a count, not a share of those seen) lead the
//!     reference that far too: then `max_ts` moves to their median (a real jump).
//! - Everything is a function of the observed event times in order (and of the
//!   forced advances, which are recorded): a replay computes the same watermark,
//!   and the state (`parts`, `lead_parts`) is stored in checkpoints. A stored
//!   `recent` of any length restores (the latest `RECENT` are kept).
//! - What moves a quiet partition on by the wall clock (the liveness rule,
//!   `time::liveness`) comes in by `force`, and is recorded as `forced`.

use std::collections::VecDeque;

/// How many of the latest event times the majority rule looks at. A burst of up
/// to `RECENT / 2` records from one leading producer cannot move the watermark.
pub const RECENT: usize = 2048;

/// How many event times a partition's start is chosen from (with a lead limit):
/// the `START_RANK`-th smallest of the first `START` starts it.
pub const START: usize = 8;

/// The rank (from 0) of a partition's start among its first `START` event times:
/// up to `START - START_RANK - 1` records ahead of the others (a wild first
/// record, the start of a burst) and `START_RANK` behind them do not start it. A
/// low rank because a start too early only delays, and one too late makes late.
pub const START_RANK: usize = 2;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watermark {
    bound_ms: i64,
    max_ts: Option<i64>,
    /// Highest watermark forced by idleness (wall clock); recorded so a restore
    /// reproduces it.
    forced: Option<i64>,
    /// The lead limit (config, not state); `None` = every event time is confirmed.
    max_lead_ms: Option<i64>,
    /// The last `RECENT` observed event times, oldest first (kept only with a limit).
    recent: VecDeque<i64>,
    /// Event times held so far (observability; part of the state so a restored
    /// partition goes on counting).
    held: u64,
}

impl Watermark {
    /// A watermark with bound `bound_ms` and, if given, the lead limit `max_lead_ms`.
    pub fn new(bound_ms: i64, max_lead_ms: Option<i64>) -> Self {
        Self::from_parts(bound_ms, None, None).with_max_lead(max_lead_ms)
    }

    /// `(bound, max_ts, forced)`: what a checkpoint stores (`state::stored`).
    pub fn parts(&self) -> (i64, Option<i64>, Option<i64>) {
        (self.bound_ms, self.max_ts, self.forced)
    }

    /// The lead limit's state, `(recent, held)`.
    pub fn lead_parts(&self) -> (Vec<i64>, u64) {
        (self.recent.iter().copied().collect(), self.held)
    }

    /// The watermark `parts` returned, without a lead limit or its state.
    pub fn from_parts(bound_ms: i64, max_ts: Option<i64>, forced: Option<i64>) -> Self {
        Self {
            bound_ms,
            max_ts,
            forced,
            max_lead_ms: None,
            recent: VecDeque::new(),
            held: 0,
        }
    }

    /// With the lead state `lead_parts` returned.
    pub fn with_lead_state(mut self, recent: Vec<i64>, held: u64) -> Self {
        let skip = recent.len().saturating_sub(RECENT);
        self.recent = recent.into_iter().skip(skip).collect();
        self.held = held;
        self
    }

    /// With the lead limit `max_lead_ms` (or none).
    pub fn with_max_lead(mut self, max_lead_ms: Option<i64>) -> Self {
        self.max_lead_ms = max_lead_ms;
        self
    }

    /// The current watermark: no more events with `ts <= current()` are expected.
    pub fn current(&self) -> i64 {
        let from_data = self
            .max_ts
            .map_or(i64::MIN, |m| m.saturating_sub(self.bound_ms));
        from_data.max(self.forced.unwrap_or(i64::MIN))
    }

    /// The greatest confirmed event time.
    pub fn max_ts(&self) -> Option<i64> {
        self.max_ts
    }

    /// Event times held because they led the partition by more than the limit.
    pub fn held(&self) -> u64 {
        self.held
    }

    /// The greatest event time among the latest `RECENT`, held ones included (the
    /// liveness rule trusts it up to the wall clock, docs/DESIGN.md §4.3).
    pub fn latest(&self) -> Option<i64> {
        self.recent.iter().copied().max().max(self.max_ts)
    }

    /// Feeds one validated event time. Returns whether the watermark advanced.
    pub fn observe(&mut self, ts: i64) -> bool {
        let before = self.current();
        let confirmed = match self.max_lead_ms {
            None => Some(ts),
            Some(max_lead) => self.lead_rule(ts, max_lead),
        };
        if let Some(c) = confirmed {
            self.max_ts = Some(self.max_ts.map_or(c, |m| m.max(c)));
        }
        self.current() > before
    }

    /// The event time `ts` confirms under the lead limit, if any.
    fn lead_rule(&mut self, ts: i64, max_lead: i64) -> Option<i64> {
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(ts);
        let reference = match (self.max_ts, self.forced) {
            (None, None) => None,
            (m, f) => m.max(f.map(|f| f.saturating_add(self.bound_ms))),
        };
        let Some(r) = reference else {
            // Not started: a low rank of the first START, and what agrees with it.
            if self.recent.len() < START {
                return None;
            }
            let mut first: Vec<i64> = self.recent.iter().copied().collect();
            let mid = *first.select_nth_unstable(START_RANK).1;
            let limit = mid.saturating_add(max_lead);
            let agree = |t: i64| t <= mid || t < limit;
            self.held += self.recent.iter().filter(|&&t| !agree(t)).count() as u64;
            return self.recent.iter().copied().filter(|&t| agree(t)).max();
        };
        let limit = r.saturating_add(max_lead);
        if ts <= r || ts < limit {
            return Some(ts);
        }
        self.held += 1;
        let ahead = self.recent.iter().filter(|&&t| t > r && t >= limit).count();
        (2 * ahead > RECENT).then(|| median(&self.recent))
    }

    /// Advances the watermark to at least `to` regardless of data (idleness).
    pub fn force(&mut self, to: i64) -> bool {
        let before = self.current();
        self.forced = Some(self.forced.map_or(to, |f| f.max(to)));
        self.current() > before
    }
}

/// The upper median of `v` (not empty).
fn median(v: &VecDeque<i64>) -> i64 {
    let mut s: Vec<i64> = v.iter().copied().collect();
    let mid = s.len() / 2;
    *s.select_nth_unstable(mid).1
}

#[cfg(test)]
mod tests;
