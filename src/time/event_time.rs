//! `EventTime`: an instant of event time, as it crosses module boundaries (the
//! task's watermark and max event time → worker → checkpoint manifest, report,
//! metrics).
//!
//! Invariants:
//! - Milliseconds since the Unix epoch, UTC — the unit of every event time in tally
//!   (`completed_ts`, window bounds, watermarks). Any `i64` is representable: a
//!   watermark may sit at `i64::MIN` (nothing seen) or saturate at either end.
//! - It encodes exactly as the `i64` it wraps — serde transparent, so the manifest's
//!   postcard and report.json are unchanged — and orders and displays as that `i64`:
//!   `Display` prints the integer milliseconds, as the Prometheus text, late-event
//!   headers and log fields always have. The human form (`2026-01-01T10:00:00.000Z`,
//!   in `tally delays` and the `time` log line) is `time::utc::format_utc_ms`.
//! - The engine's per-record path (validation, windows, `Watermark`, dedup, routes and
//!   result records) keeps bare `i64`: wrapping happens where a value leaves the task
//!   (`PartitionTask::{watermark, max_ts, next_deadline}`), not per record.

use std::fmt;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct EventTime(pub i64);

impl fmt::Display for EventTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_displays_and_orders_as_the_integer() {
        for t in [0, 1_767_261_600_000, -1, i64::MAX, i64::MIN] {
            assert_eq!(
                postcard::to_allocvec(&EventTime(t)).unwrap(),
                postcard::to_allocvec(&t).unwrap()
            );
            assert_eq!(
                postcard::to_allocvec(&Some(EventTime(t))).unwrap(),
                postcard::to_allocvec(&Some(t)).unwrap()
            );
            assert_eq!(
                serde_json::to_string(&EventTime(t)).unwrap(),
                serde_json::to_string(&t).unwrap()
            );
            let back: EventTime = serde_json::from_str(&t.to_string()).unwrap();
            assert_eq!(back, EventTime(t));
            assert_eq!(EventTime(t).to_string(), t.to_string());
        }
        assert!(EventTime(i64::MIN) < EventTime(-1) && EventTime(-1) < EventTime(0));
    }
}
