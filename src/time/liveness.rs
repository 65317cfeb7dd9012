//! The liveness rule (docs/DESIGN.md §4.3): when a caught-up partition's
//! watermark follows the wall clock, and to where. Pure: the caller reads the clocks and
//! the consumer's position, and applies the answer with `Watermark::force`.
//!
//! Invariants:
//! - Nothing is forced unless the partition is caught up (its position is its log
//!   end: every record the log holds has been read). A replay of an existing log
//!   is never caught up before its end, so it forces nothing between records: the
//!   records decide alone.
//! - Caught up, the partition's held event times (DESIGN §4.4) are trusted up to
//!   the wall clock: `min(latest, wall) − bound`. Live, a record far ahead of the
//!   others is then trusted only as far as the present, where the others' next
//!   records are anyway; so it cannot make them late.
//! - Caught up and silent for `idle_ms` (quiet), the partition is done up to the
//!   wall clock: `max(wall, max_ts + silence) − bound` (the second term for event
//!   times ahead of the wall clock).

/// What the rule needs to know of one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quiet {
    /// The consumer's position is the partition's log end.
    pub caught_up: bool,
    /// Wall-clock milliseconds since its last record (or its assignment).
    pub silence_ms: i64,
    /// Its greatest confirmed event time, if any.
    pub max_ts: Option<i64>,
    /// Its greatest event time among the latest (held ones included), if any.
    pub latest: Option<i64>,
}

/// The watermark the rule forces for `q`, if it applies: `idle_ms` is
/// `watermark.idle_timeout`, `wall_ms` the wall clock (Unix ms), `bound_ms` the
/// out-of-orderness bound.
pub fn forced(q: Quiet, idle_ms: i64, wall_ms: i64, bound_ms: i64) -> Option<i64> {
    if !q.caught_up {
        return None;
    }
    let trusted = q.latest.map(|l| l.min(wall_ms).saturating_sub(bound_ms));
    if q.silence_ms < idle_ms {
        return trusted;
    }
    let from_data = q
        .max_ts
        .map_or(i64::MIN, |m| m.saturating_add(q.silence_ms));
    Some(from_data.max(wall_ms).saturating_sub(bound_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    const WALL: i64 = 1_780_000_000_000;

    fn quiet(caught_up: bool, silence_ms: i64, max_ts: Option<i64>) -> Quiet {
        Quiet {
            caught_up,
            silence_ms,
            max_ts,
            latest: max_ts,
        }
    }

    #[test]
    fn nothing_is_forced_behind_the_log_end() {
        assert_eq!(forced(quiet(true, 59_999, None), 60_000, WALL, 5_000), None);
        assert_eq!(
            forced(quiet(false, 600_000, Some(0)), 60_000, WALL, 5_000),
            None
        );
        assert_eq!(
            forced(quiet(true, 60_000, Some(0)), 60_000, WALL, 5_000),
            Some(WALL - 5_000)
        );
    }

    /// Old data (a replay, a weekend) is done up to the wall clock; data ahead
    /// of the wall clock goes on from where it left plus the silence; a partition
    /// that never had a record follows the wall clock.
    #[test]
    fn the_wall_clock_or_the_data_plus_silence_whichever_is_later() {
        let day = 86_400_000;
        assert_eq!(
            forced(quiet(true, 60_000, Some(WALL - day)), 60_000, WALL, 5_000),
            Some(WALL - 5_000)
        );
        assert_eq!(
            forced(
                quiet(true, 60_000, Some(WALL + 600_000)),
                60_000,
                WALL,
                5_000
            ),
            Some(WALL + 660_000 - 5_000)
        );
        assert_eq!(
            forced(quiet(true, 60_000, None), 60_000, WALL, 5_000),
            Some(WALL - 5_000)
        );
    }

    /// Caught up but not quiet: held records are trusted, never past the wall
    /// clock (a record a day ahead is trusted as far as the present).
    #[test]
    fn caught_up_held_records_are_trusted_up_to_the_wall_clock() {
        let q = |latest| Quiet {
            caught_up: true,
            silence_ms: 1_000,
            max_ts: Some(WALL - 600_000),
            latest: Some(latest),
        };
        assert_eq!(
            forced(q(WALL - 60_000), 60_000, WALL, 5_000),
            Some(WALL - 65_000)
        );
        assert_eq!(
            forced(q(WALL + 86_400_000), 60_000, WALL, 5_000),
            Some(WALL - 5_000)
        );
        let behind = Quiet {
            caught_up: false,
            ..q(WALL)
        };
        assert_eq!(forced(behind, 60_000, WALL, 5_000), None);
    }
}
