//! Tumbling event-time windows aligned to the epoch plus an optional offset.
//!
//! Invariants: a window is `[start, end)` with `end - start == size`; every
//! timestamp (including negative ones) belongs to exactly one window, unless that
//! window's bounds do not fit in `i64` (a timestamp within one window size of
//! `i64::MAX` or `i64::MIN`): then `assign` says so, and the engine dead-letters
//! the record (`window_out_of_range`) instead of wrapping. The result timestamp of
//! a window is `end - 1`.

/// Window geometry in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowSpec {
    pub size_ms: i64,
    pub offset_ms: i64,
}

/// One window, `[start, end)` in ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Window {
    pub start: i64,
    pub end: i64,
}

impl WindowSpec {
    /// `size_ms` must be positive (checked by config validation).
    pub fn new(size_ms: i64, offset_ms: i64) -> Self {
        debug_assert!(size_ms > 0);
        Self {
            size_ms,
            offset_ms: offset_ms.rem_euclid(size_ms),
        }
    }

    /// The window containing `ts`; `None` when its bounds are not representable.
    pub fn assign(&self, ts: i64) -> Option<Window> {
        let into = ts.checked_sub(self.offset_ms)?.rem_euclid(self.size_ms);
        let start = ts.checked_sub(into)?;
        Some(Window {
            start,
            end: start.checked_add(self.size_ms)?,
        })
    }

    /// The window that ends at `end`.
    pub fn ending_at(&self, end: i64) -> Window {
        Window {
            start: end - self.size_ms,
            end,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: i64 = 60_000;
    // 2026-01-01T10:00:00Z
    const T10: i64 = 1_767_261_600_000;

    #[test]
    fn aligned_to_the_epoch_with_exclusive_end() {
        let w = WindowSpec::new(MIN, 0);
        assert_eq!(
            w.assign(T10).unwrap(),
            Window {
                start: T10,
                end: T10 + MIN
            }
        );
        assert_eq!(
            w.assign(T10 + MIN - 1).unwrap(),
            Window {
                start: T10,
                end: T10 + MIN
            }
        );
        assert_eq!(
            w.assign(T10 + MIN).unwrap(),
            Window {
                start: T10 + MIN,
                end: T10 + 2 * MIN
            }
        );
        assert_eq!(w.assign(T10 - 1).unwrap().end, T10);
    }

    #[test]
    fn offset_shifts_boundaries() {
        let hour = 3_600_000;
        // Days in UTC-5 start at 05:00 UTC: offset +5h (as Flink: UTC+8 uses -8h).
        let w = WindowSpec::new(24 * hour, 5 * hour);
        let d = w.assign(T10).unwrap();
        assert_eq!(d.start, T10 - 5 * hour);
        assert_eq!(d.end - d.start, 24 * hour);
        assert_eq!(w.assign(T10 - 5 * hour - 1).unwrap().end, d.start);
    }

    #[test]
    fn negative_and_zero_timestamps() {
        let w = WindowSpec::new(1000, 0);
        assert_eq!(
            w.assign(0).unwrap(),
            Window {
                start: 0,
                end: 1000
            }
        );
        assert_eq!(
            w.assign(-1).unwrap(),
            Window {
                start: -1000,
                end: 0
            }
        );
        assert_eq!(
            w.ending_at(3000),
            Window {
                start: 2000,
                end: 3000
            }
        );
    }

    #[test]
    fn windows_beyond_i64_are_refused_not_wrapped() {
        let w = WindowSpec::new(MIN, 0);
        // The last window that fits ends at or below i64::MAX.
        let last = w.assign(i64::MAX - MIN).unwrap();
        assert!(last.end > last.start && last.end - last.start == MIN);
        assert_eq!(w.assign(i64::MAX), None);
        assert_eq!(w.assign(i64::MAX - 1), None);
        assert_eq!(w.assign(i64::MIN), None);
        assert!(WindowSpec::new(MIN, 7).assign(i64::MIN + 3).is_none());
    }
}
