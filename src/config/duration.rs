//! Human durations (`"500ms"`, `"5s"`, `"1m30s"`, `"2h"`, `"1d"`) and UTC timestamps
//! (`"2026-01-01T10:00:00Z"` or integer ms), as used in the config file.
//!
//! Invariant: parsing is exact integer arithmetic in milliseconds; `"off"` is
//! only accepted where a duration is optional.

use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// A non-negative duration in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Millis(pub i64);

impl Millis {
    pub fn parse(s: &str) -> Result<Millis, String> {
        let s = s.trim();
        if s == "0" {
            return Ok(Millis(0));
        }
        let mut total: i64 = 0;
        let mut rest = s;
        if rest.is_empty() {
            return Err("empty duration".into());
        }
        while !rest.is_empty() {
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            if digits == 0 {
                return Err(format!(
                    "{s:?} is not a duration like \"5s\", \"1m30s\" or \"500ms\""
                ));
            }
            let n: i64 = rest[..digits]
                .parse()
                .map_err(|_| format!("{s:?} is too large"))?;
            rest = &rest[digits..];
            let unit_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
            let unit = match &rest[..unit_len] {
                "ms" => 1,
                "s" => 1_000,
                "m" => 60_000,
                "h" => 3_600_000,
                "d" => 86_400_000,
                "" => return Err(format!("{s:?}: a unit is required (ms, s, m, h, d)")),
                u => return Err(format!("{s:?}: unknown unit {u:?} (use ms, s, m, h, d)")),
            };
            rest = &rest[unit_len..];
            total = n
                .checked_mul(unit)
                .and_then(|v| total.checked_add(v))
                .ok_or_else(|| format!("{s:?} is too large"))?;
        }
        Ok(Millis(total))
    }
}

impl fmt::Display for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0;
        for (unit, size) in [
            ("d", 86_400_000),
            ("h", 3_600_000),
            ("m", 60_000),
            ("s", 1_000),
        ] {
            if ms != 0 && ms % size == 0 {
                return write!(f, "{}{unit}", ms / size);
            }
        }
        write!(f, "{ms}ms")
    }
}

impl Serialize for Millis {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Millis {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Millis::parse(&s).map_err(de::Error::custom)
    }
}

/// An optional duration: `"off"` (or `"none"`) disables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OptMillis(pub Option<Millis>);

impl Serialize for OptMillis {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Some(m) => m.serialize(s),
            None => s.serialize_str("off"),
        }
    }
}

impl<'de> Deserialize<'de> for OptMillis {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        match s.trim() {
            "off" | "none" => Ok(OptMillis(None)),
            other => Millis::parse(other)
                .map(|m| OptMillis(Some(m)))
                .map_err(de::Error::custom),
        }
    }
}

/// An integer that may also be written as a string (so env overrides, which are
/// always strings, work for numeric keys).
pub fn de_u64<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    struct V;
    impl Visitor<'_> for V {
        type Value = u64;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a non-negative integer")
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
            Ok(v)
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
            u64::try_from(v).map_err(|_| E::custom(format!("{v} is negative")))
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<u64, E> {
            v.trim()
                .parse()
                .map_err(|_| E::custom(format!("{v:?} is not a non-negative integer")))
        }
    }
    d.deserialize_any(V)
}

/// Parses `"YYYY-MM-DDTHH:MM:SS[.mmm]Z"` (UTC only) or integer milliseconds.
pub fn parse_utc_ms(s: &str) -> Result<i64, String> {
    let s = s.trim();
    if let Ok(ms) = s.parse::<i64>() {
        return Ok(ms);
    }
    let err = || format!("{s:?} is not a UTC time like \"2026-01-01T10:00:00Z\" or integer ms");
    let b = s.as_bytes();
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || b[10] != b'T'
        || b[13] != b':'
        || b[16] != b':'
    {
        return Err(err());
    }
    if !s.ends_with('Z') {
        return Err(format!("{s:?}: only UTC times ending in Z are accepted"));
    }
    let num =
        |r: std::ops::Range<usize>| s.get(r).and_then(|x| x.parse::<i64>().ok()).ok_or_else(err);
    let (y, mo, d, h, mi, sec) = (
        num(0..4)?,
        num(5..7)?,
        num(8..10)?,
        num(11..13)?,
        num(14..16)?,
        num(17..19)?,
    );
    let frac = match &s[19..s.len() - 1] {
        "" => 0,
        f if f.len() == 4 && f.starts_with('.') => num(20..23)?,
        _ => return Err(err()),
    };
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 59 {
        return Err(err());
    }
    Ok(days_from_civil(y, mo, d) * 86_400_000 + h * 3_600_000 + mi * 60_000 + sec * 1_000 + frac)
}

/// Formats ms since the epoch as `"YYYY-MM-DDTHH:MM:SS.mmmZ"`.
pub fn format_utc_ms(ms: i64) -> String {
    let days = ms.div_euclid(86_400_000);
    let rem = ms.rem_euclid(86_400_000);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3_600_000,
        rem / 60_000 % 60,
        rem / 1_000 % 60,
        rem % 1_000
    )
}

// Howard Hinnant's civil-calendar algorithms.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (
        if m <= 2 {
            yoe + era * 400 + 1
        } else {
            yoe + era * 400
        },
        m,
        d,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(Millis::parse("5s"), Ok(Millis(5_000)));
        assert_eq!(Millis::parse("1m30s"), Ok(Millis(90_000)));
        assert_eq!(Millis::parse("500ms"), Ok(Millis(500)));
        assert_eq!(Millis::parse("0"), Ok(Millis(0)));
        assert_eq!(Millis::parse("1d"), Ok(Millis(86_400_000)));
        for bad in ["", "5", "s", "5x", "-5s", "1.5s", "99999999999999999999d"] {
            assert!(Millis::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(Millis(90_000).to_string(), "90s");
        assert_eq!(Millis(60_000).to_string(), "1m");
    }

    #[test]
    fn utc_times_round_trip() {
        assert_eq!(parse_utc_ms("2026-01-01T10:00:44Z"), Ok(1_767_261_644_000));
        assert_eq!(parse_utc_ms("1970-01-01T00:00:00.001Z"), Ok(1));
        assert_eq!(format_utc_ms(1_767_261_644_000), "2026-01-01T10:00:44.000Z");
        assert_eq!(parse_utc_ms("1767261644000"), Ok(1_767_261_644_000));
        assert!(parse_utc_ms("2026-01-01T10:00:44+01:00").is_err());
        assert!(parse_utc_ms("2026-13-01T10:00:44Z").is_err());
        for ms in [0, 951_782_400_000, 4_102_444_799_999] {
            assert_eq!(parse_utc_ms(&format_utc_ms(ms)), Ok(ms));
        }
    }
}
