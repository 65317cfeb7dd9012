//! UTC instants as people write them: RFC 3339 (`2026-01-01T10:00:00Z`,
//! `2026-01-01T12:00:00.250+02:00`) or integer milliseconds since the epoch, parsed
//! and printed by `chrono` (already in the tree through `object_store`).
//!
//! Invariants:
//! - Every place that parses or prints a UTC time goes through here (config
//!   `effective_from`, `--from`/`--until`/`--start`, `tally delays`, logs, listings).
//! - A calendar date that does not exist (`2026-02-30`, `2026-04-31`, `2025-02-29`)
//!   is an error, never rolled over into the next month.
//! - Any offset is accepted and converted to UTC; a time without an offset is
//!   refused (a local time would bill the wrong minute in another zone).
//! - Precision is the millisecond, the unit of every event time: in configuration
//!   and on the command line, fractional seconds finer than that must be zeros
//!   (`.250000` is fine, `.2501` is refused), never silently truncated. An event's
//!   own RFC 3339 time (`parse_event_rfc3339`) is floored to its millisecond.
//! - Printing is `YYYY-MM-DDTHH:MM:SS.mmmZ`; an instant outside chrono's range
//!   (about ±262,000 years; a watermark may sit at `i64::MIN`) prints as its integer
//!   milliseconds.

use std::cell::Cell;

use chrono::{DateTime, SecondsFormat, Utc};

/// Parses an RFC 3339 time with any offset, or integer milliseconds since the epoch.
pub fn parse_utc_ms(s: &str) -> Result<i64, String> {
    let s = s.trim();
    if let Ok(ms) = s.parse::<i64>() {
        return Ok(ms);
    }
    let t = DateTime::parse_from_rfc3339(s).map_err(|e| {
        format!(
            "{s:?} is not a time like \"2026-01-01T10:00:00Z\" (RFC 3339, with an offset) \
             or integer milliseconds: {e}"
        )
    })?;
    if t.timestamp_subsec_nanos() % 1_000_000 != 0 {
        return Err(format!(
            "{s:?} is finer than a millisecond; event times are whole milliseconds"
        ));
    }
    Ok(t.timestamp_millis())
}

/// An event's RFC 3339 time (an input mapping's `rfc3339` field) in ms, floored:
/// producers write micro- and nanoseconds (CloudEvents `time` often does), and an
/// event belongs to the window of its millisecond. `None` if it is not RFC 3339
/// with an offset, or names a date that does not exist.
pub fn parse_event_rfc3339(s: &str) -> Option<i64> {
    if let Some(ms) = utc_z_ms(s.as_bytes()) {
        return Some(ms);
    }
    DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.timestamp_millis())
}

thread_local! {
    /// The date `utc_z_ms` read last (its ten bytes) and its midnight in seconds
    /// since the epoch: consecutive events nearly always share a day, and the
    /// calendar was a third of the time's cost. All zeros matches no date.
    static LAST_DAY: Cell<([u8; 10], i64)> = const { Cell::new(([0; 10], 0)) };
}

/// The common form `YYYY-MM-DDTHH:MM:SS[.f…]Z` read without chrono's general
/// parser (most of what an RFC 3339 time cost in the profile): the digits are split
/// here, the calendar is still chrono's (`from_ymd_opt` refuses a day that does
/// not exist; a date it accepted is remembered, `LAST_DAY`). `None` for anything
/// else — an offset, a leap second, a day that does not exist — which the general
/// parser then decides.
fn utc_z_ms(b: &[u8]) -> Option<i64> {
    use chrono::NaiveDate;
    if b.len() < 20 || b.len() > 30 || !matches!(b[b.len() - 1], b'Z' | b'z') {
        return None;
    }
    let d = |i: usize| u32::from(b[i].wrapping_sub(b'0'));
    const DIGITS: [usize; 14] = [0, 1, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18];
    if DIGITS.iter().any(|&i| d(i) > 9) {
        return None;
    }
    let two = |i: usize| d(i) * 10 + d(i + 1);
    let punct = b[4] == b'-'
        && b[7] == b'-'
        && matches!(b[10], b'T' | b't')
        && b[13] == b':'
        && b[16] == b':';
    if !punct {
        return None;
    }
    let frac = &b[19..b.len() - 1];
    let ms = match frac {
        [] => 0,
        [b'.', digits @ ..] if !digits.is_empty() && digits.iter().all(u8::is_ascii_digit) => {
            let mut ms = 0u32;
            for i in 0..3 {
                ms = ms * 10 + digits.get(i).map_or(0, |&c| u32::from(c - b'0'));
            }
            ms
        }
        _ => return None,
    };
    let (sec, min, hour) = (two(17), two(14), two(11));
    if sec > 59 {
        return None; // a leap second (`:60`) or an error: the general parser's call
    }
    if hour > 23 || min > 59 {
        return None; // chrono's `and_hms_opt` refuses them too
    }
    let date: [u8; 10] = b[..10].try_into().expect("ten bytes");
    let (last, midnight) = LAST_DAY.get();
    let midnight = if last == date {
        midnight
    } else {
        let day = NaiveDate::from_ymd_opt((two(0) * 100 + two(2)) as i32, two(5), two(8))?;
        let midnight = day.and_hms_opt(0, 0, 0)?.and_utc().timestamp();
        LAST_DAY.set((date, midnight));
        midnight
    };
    let secs = midnight + i64::from(hour * 3600 + min * 60 + sec);
    Some(secs * 1000 + i64::from(ms))
}

/// Formats milliseconds since the epoch as `"YYYY-MM-DDTHH:MM:SS.mmmZ"`.
pub fn format_utc_ms(ms: i64) -> String {
    match DateTime::<Utc>::from_timestamp_millis(ms) {
        Some(t) => t.to_rfc3339_opts(SecondsFormat::Millis, true),
        None => ms.to_string(),
    }
}

/// Formats milliseconds since the epoch as RFC 3339 in UTC, with a fraction only
/// when there is one (`"2026-01-01T00:00:00Z"`, `"2026-01-01T00:00:00.250Z"`):
/// the usage API's times.
pub fn format_rfc3339_ms(ms: i64) -> String {
    match DateTime::<Utc>::from_timestamp_millis(ms) {
        Some(t) => t.to_rfc3339_opts(SecondsFormat::AutoSi, true),
        None => ms.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `…Z` fast path gives chrono's answer, or leaves the string to it, for
    /// random strings of that shape: valid and impossible dates, leap seconds,
    /// fractions of 0-9 digits, wrong punctuation.
    #[test]
    fn the_utc_fast_path_agrees_with_chrono() {
        let mut rng = crate::gen::Rng::new(7);
        let mut fast = 0;
        for _ in 0..200_000 {
            let mut n = |hi: u64| rng.below(hi);
            let frac = match n(4) {
                0 => String::new(),
                1 => ".".into(),
                _ => format!(".{:09}", n(1_000_000_000))[..1 + 1 + n(9) as usize].to_string(),
            };
            let sep = if n(8) == 0 {
                ['t', ' ', '-'][n(3) as usize]
            } else {
                'T'
            };
            let zone = if n(4) == 0 {
                ["z", "+00:00", "+02:00", "X", ""][n(5) as usize]
            } else {
                "Z"
            };
            let s = format!(
                "{:04}-{:02}-{:02}{sep}{:02}:{:02}:{:02}{frac}{zone}",
                1900 + n(300),
                n(14),
                n(33),
                n(25),
                n(61),
                n(62),
            );
            let want = DateTime::parse_from_rfc3339(&s)
                .ok()
                .map(|t| t.timestamp_millis());
            if let Some(ms) = utc_z_ms(s.as_bytes()) {
                fast += 1;
                assert_eq!(Some(ms), want, "{s}");
            }
            assert_eq!(parse_event_rfc3339(&s), want, "{s}");
        }
        assert!(fast > 50_000, "the fast path took only {fast}");
    }

    /// Consecutive times on a few days, some that do not exist, take the
    /// remembered midnight (`LAST_DAY`) and still give chrono's answer.
    #[test]
    fn repeated_days_agree_with_chrono() {
        let mut rng = crate::gen::Rng::new(11);
        let days = [
            "2026-01-01",
            "2025-02-29",
            "2028-02-29",
            "2026-04-31",
            "1999-12-31",
        ];
        for _ in 0..50_000 {
            let mut n = |hi: u64| rng.below(hi);
            let day = days[(n(8) as usize).min(days.len() - 1)];
            let s = format!(
                "{day}T{:02}:{:02}:{:02}.{:03}Z",
                n(25),
                n(61),
                n(61),
                n(1000)
            );
            let want = DateTime::parse_from_rfc3339(&s)
                .ok()
                .map(|t| t.timestamp_millis());
            assert_eq!(parse_event_rfc3339(&s), want, "{s}");
        }
    }

    #[test]
    fn calendar_dates_are_checked() {
        // 2028 is a leap year, 2026 and 2100 are not, 2000 is.
        assert_eq!(parse_utc_ms("2028-02-29T00:00:00Z"), Ok(1_835_395_200_000));
        assert_eq!(parse_utc_ms("2000-02-29T00:00:00Z"), Ok(951_782_400_000));
        for bad in [
            "2026-02-29T00:00:00Z",
            "2100-02-29T00:00:00Z",
            "2026-02-30T00:00:00Z",
            "2026-04-31T00:00:00Z",
            "2026-13-01T00:00:00Z",
            "2026-01-01T24:00:00Z",
            "2026-01-01T10:00:00",
            "2026-01-01",
            "",
        ] {
            let e = parse_utc_ms(bad).unwrap_err();
            assert!(e.contains(&format!("{bad:?}")), "{bad}: {e}");
        }
    }

    #[test]
    fn offsets_fractions_and_integers() {
        let utc = parse_utc_ms("2026-01-01T10:00:44Z").unwrap();
        assert_eq!(utc, 1_767_261_644_000);
        assert_eq!(parse_utc_ms("2026-01-01T12:00:44+02:00"), Ok(utc));
        assert_eq!(parse_utc_ms("2026-01-01T05:30:44-04:30"), Ok(utc));
        assert_eq!(parse_utc_ms("2026-01-01t10:00:44z"), Ok(utc));
        assert_eq!(parse_utc_ms("2026-01-01T10:00:44.5Z"), Ok(utc + 500));
        assert_eq!(parse_utc_ms("2026-01-01T10:00:44.250000Z"), Ok(utc + 250));
        assert!(parse_utc_ms("2026-01-01T10:00:44.2501Z")
            .unwrap_err()
            .contains("finer than a millisecond"));
        assert_eq!(parse_utc_ms(" 1767261644000 "), Ok(utc));
        assert_eq!(parse_utc_ms("-1"), Ok(-1));
    }

    #[test]
    fn prints_utc_with_milliseconds() {
        assert_eq!(format_utc_ms(1_767_261_644_000), "2026-01-01T10:00:44.000Z");
        assert_eq!(format_utc_ms(-1), "1969-12-31T23:59:59.999Z");
        assert_eq!(format_utc_ms(i64::MIN), i64::MIN.to_string());
        for ms in [0, 951_782_400_000, 4_102_444_799_999, -62_135_596_800_000] {
            assert_eq!(parse_utc_ms(&format_utc_ms(ms)), Ok(ms));
        }
    }
}
