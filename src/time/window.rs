//! Tumbling event-time windows aligned to the epoch plus an optional offset.
//!
//! Invariants: a window is `[start, end)` with `end - start == size`; every
//! timestamp (including negative ones) belongs to exactly one window; the result
//! timestamp of a window is `end - 1`.

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

    /// The window containing `ts`.
    pub fn assign(&self, ts: i64) -> Window {
        let start = ts - (ts - self.offset_ms).rem_euclid(self.size_ms);
        Window {
            start,
            end: start + self.size_ms,
        }
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
            w.assign(T10),
            Window {
                start: T10,
                end: T10 + MIN
            }
        );
        assert_eq!(
            w.assign(T10 + MIN - 1),
            Window {
                start: T10,
                end: T10 + MIN
            }
        );
        assert_eq!(
            w.assign(T10 + MIN),
            Window {
                start: T10 + MIN,
                end: T10 + 2 * MIN
            }
        );
        assert_eq!(w.assign(T10 - 1).end, T10);
    }

    #[test]
    fn offset_shifts_boundaries() {
        let hour = 3_600_000;
        // Days in UTC-5 start at 05:00 UTC: offset +5h (as Flink: UTC+8 uses -8h).
        let w = WindowSpec::new(24 * hour, 5 * hour);
        let d = w.assign(T10);
        assert_eq!(d.start, T10 - 5 * hour);
        assert_eq!(d.end - d.start, 24 * hour);
        assert_eq!(w.assign(T10 - 5 * hour - 1).end, d.start);
    }

    #[test]
    fn negative_and_zero_timestamps() {
        let w = WindowSpec::new(1000, 0);
        assert_eq!(
            w.assign(0),
            Window {
                start: 0,
                end: 1000
            }
        );
        assert_eq!(
            w.assign(-1),
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
}
