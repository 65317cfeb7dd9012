//! Per-partition watermark: bounded out-of-orderness (monotonous = bound 0), led
//! by the event times most of the partition agrees on.
//!
//! Invariants:
//! - `W = max(max_ts - bound, forced)`; it never decreases; before the first
//!   confirmed event it is `i64::MIN` (nothing is late). Only validated event times
//!   are fed in — the timestamp guards run before `observe` (docs/DESIGN.md §4).
//! - `max_ts` is the greatest *confirmed* event time. Without a lead limit every
//!   event time is confirmed. With `max_lead` (docs/DESIGN.md §4.4):
//!   - an event time at most `max_lead` ahead of the reference (`max_ts`, or the
//!     forced watermark plus the bound, whichever is later) is confirmed;
//!   - one further ahead is *held*: counted (`held`), billed by the caller like any
//!     other, but it moves nothing — unless more than half of the last `RECENT`
//!     observed event times lead the reference by more than `max_lead` too, in
//!     which case `max_ts` moves to their median (the time most of the partition
//!     now shares: a real jump, such as the end of a quiet period);
//!   - the partition's first event time is confirmed as it is: a partition has
//!     to start somewhere, and delaying its first records would change what the
//!     first records of every partition do (a wild *first* record does start it
//!     there; one anywhere later does not).
//! - Everything is a function of the observed event times in order (and of the
//!   forced advances, which are recorded): a replay computes the same watermark,
//!   and the state (`parts`, `lead_parts`) is stored in checkpoints.

use std::collections::VecDeque;

/// How many of the latest event times the majority rule looks at.
pub const RECENT: usize = 256;

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

    /// Feeds one validated event time. Returns whether the watermark advanced.
    pub fn observe(&mut self, ts: i64) -> bool {
        let before = self.current();
        let confirmed = match self.max_lead_ms {
            None => Some(ts),
            Some(max_lead) => {
                if self.recent.len() == RECENT {
                    self.recent.pop_front();
                }
                self.recent.push_back(ts);
                let reference = match (self.max_ts, self.forced) {
                    (None, _) => None,
                    (m, f) => m.max(f.map(|f| f.saturating_add(self.bound_ms))),
                };
                match reference {
                    None => Some(ts),
                    Some(r) if ts <= r.saturating_add(max_lead) => Some(ts),
                    Some(r) => {
                        self.held += 1;
                        let limit = r.saturating_add(max_lead);
                        let ahead = self.recent.iter().filter(|&&t| t > limit).count();
                        (2 * ahead > self.recent.len()).then(|| median(&self.recent))
                    }
                }
            }
        };
        if let Some(c) = confirmed {
            self.max_ts = Some(self.max_ts.map_or(c, |m| m.max(c)));
        }
        self.current() > before
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
mod tests {
    use super::*;

    #[test]
    fn bounded_out_of_orderness_never_goes_back() {
        let mut w = Watermark::new(5_000, None);
        assert_eq!(w.current(), i64::MIN);
        assert!(w.observe(10_000));
        assert_eq!(w.current(), 5_000);
        assert!(!w.observe(7_000)); // out of order inside the bound
        assert_eq!(w.current(), 5_000);
        assert!(w.observe(69_000));
        assert_eq!(w.current(), 64_000);
    }

    #[test]
    fn monotonous_is_bound_zero_and_force_only_raises() {
        let mut w = Watermark::new(0, None);
        w.observe(100);
        assert_eq!(w.current(), 100);
        assert!(w.force(500));
        assert!(!w.force(200));
        assert_eq!(w.current(), 500);
        w.observe(600);
        assert_eq!(w.current(), 600);
    }

    const MIN: i64 = 60_000;

    /// One producer in twenty leads by `lead`, steadily: the watermark follows the
    /// other nineteen, and the leader's records are held.
    #[test]
    fn a_steady_minority_ahead_is_held() {
        for lead in [10 * MIN, 45 * MIN, 1_000 * 365 * 24 * 60 * MIN] {
            let mut w = Watermark::new(5_000, Some(5 * MIN));
            let mut held = 0;
            for i in 0..20_000i64 {
                let t = 1_000_000 + i * 10;
                if i % 20 == 7 {
                    w.observe(t + lead);
                    held += 1;
                } else {
                    w.observe(t);
                }
                assert!(w.current() <= t, "lead {lead}, record {i}");
            }
            assert_eq!(w.held(), held);
            assert_eq!(w.max_ts(), Some(1_000_000 + 19_999 * 10));
        }
    }

    /// A whole partition that jumps ahead (a quiet hour) is followed once most of
    /// its recent records share the jump; a burst of one producer smaller than
    /// that is not.
    #[test]
    fn a_majority_ahead_is_a_real_jump() {
        let mut w = Watermark::new(0, Some(5 * MIN));
        for i in 0..1_000 {
            w.observe(i);
        }
        // A burst of 100 records an hour ahead, then the partition goes on.
        for i in 0..100 {
            w.observe(60 * MIN + i);
        }
        assert_eq!(w.max_ts(), Some(999));
        for i in 1_000..1_200 {
            w.observe(i);
        }
        assert_eq!(w.max_ts(), Some(1_199));
        // The whole partition moves an hour on: followed after a majority.
        let mut moved_at = None;
        for i in 0..RECENT as i64 {
            w.observe(120 * MIN + i);
            if moved_at.is_none() && w.max_ts() > Some(120 * MIN) {
                moved_at = Some(i);
            }
        }
        assert_eq!(moved_at, Some(RECENT as i64 / 2));
        // From there on it follows every record again.
        w.observe(124 * MIN);
        assert_eq!(w.max_ts(), Some(124 * MIN));
    }

    /// One record in microseconds among milliseconds is held: the partition is
    /// not made late by it.
    #[test]
    fn a_record_in_microseconds_is_held() {
        let t0 = 1_767_261_600_000;
        let mut w = Watermark::new(0, Some(5 * MIN));
        w.observe(t0);
        assert!(!w.observe(t0 * 1_000));
        for i in 1..1_000 {
            w.observe(t0 + i);
        }
        assert_eq!((w.current(), w.held()), (t0 + 999, 1));
    }

    /// Idleness moves the reference: records after a forced advance are near it.
    #[test]
    fn a_forced_advance_moves_the_reference() {
        let mut w = Watermark::new(1_000, Some(5 * MIN));
        for t in [0, 10, 20] {
            w.observe(t);
        }
        w.force(60 * MIN);
        assert!(w.observe(60 * MIN + 2 * MIN));
        assert_eq!(w.held(), 0);
    }

    #[test]
    fn the_lead_state_restores() {
        let mut w = Watermark::new(0, Some(MIN));
        for t in [0, 10, 20, 10 * MIN, 30] {
            w.observe(t);
        }
        let (b, m, f) = w.parts();
        let (recent, held) = w.lead_parts();
        assert_eq!(held, 1);
        let back = Watermark::from_parts(b, m, f)
            .with_lead_state(recent, held)
            .with_max_lead(Some(MIN));
        assert_eq!(back, w);
    }
}
