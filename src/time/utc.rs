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
    DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.timestamp_millis())
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
