//! Per-partition watermark: bounded out-of-orderness (monotonous = bound 0).
//!
//! Invariants: `W = max_ts - bound`; it never decreases; before the first event
//! it is `i64::MIN` (nothing is late). Only validated event times may be fed in —
//! the timestamp guards run before `observe` (docs/DESIGN.md §4).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Watermark {
    bound_ms: i64,
    max_ts: Option<i64>,
    /// Highest watermark forced by idleness (wall clock); recorded so a restore
    /// reproduces it.
    forced: Option<i64>,
}

impl Watermark {
    pub fn new(bound_ms: i64) -> Self {
        Self {
            bound_ms,
            max_ts: None,
            forced: None,
        }
    }

    /// `(bound, max_ts, forced)`: what a checkpoint stores (`state::stored`).
    pub fn parts(&self) -> (i64, Option<i64>, Option<i64>) {
        (self.bound_ms, self.max_ts, self.forced)
    }

    /// The watermark `parts` returned.
    pub fn from_parts(bound_ms: i64, max_ts: Option<i64>, forced: Option<i64>) -> Self {
        Self {
            bound_ms,
            max_ts,
            forced,
        }
    }

    /// The current watermark: no more events with `ts <= current()` are expected.
    pub fn current(&self) -> i64 {
        let from_data = self
            .max_ts
            .map_or(i64::MIN, |m| m.saturating_sub(self.bound_ms));
        from_data.max(self.forced.unwrap_or(i64::MIN))
    }

    pub fn max_ts(&self) -> Option<i64> {
        self.max_ts
    }

    /// Feeds one validated event time. Returns whether the watermark advanced.
    pub fn observe(&mut self, ts: i64) -> bool {
        let before = self.current();
        self.max_ts = Some(self.max_ts.map_or(ts, |m| m.max(ts)));
        self.current() > before
    }

    /// Advances the watermark to at least `to` regardless of data (idleness).
    pub fn force(&mut self, to: i64) -> bool {
        let before = self.current();
        self.forced = Some(self.forced.map_or(to, |f| f.max(to)));
        self.current() > before
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_out_of_orderness_never_goes_back() {
        let mut w = Watermark::new(5_000);
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
        let mut w = Watermark::new(0);
        w.observe(100);
        assert_eq!(w.current(), 100);
        assert!(w.force(500));
        assert!(!w.force(200));
        assert_eq!(w.current(), 500);
        w.observe(600);
        assert_eq!(w.current(), 600);
    }
}
