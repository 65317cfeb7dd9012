//! Human durations (`"500ms"`, `"5s"`, `"1m30s"`, `"2h"`, `"1d"`), as used in the
//! config file. UTC times are `crate::time::utc`.
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

/// `watermark.max_lead`: `"auto"` (the default: the allowed lateness, at least
/// 1 s), `"off"`, or a duration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MaxLead {
    #[default]
    Auto,
    Off,
    Fixed(Millis),
}

impl MaxLead {
    /// The least lead `auto` stands for, whatever the lateness.
    pub const AUTO_FLOOR_MS: i64 = 1_000;

    /// The limit in milliseconds for a window's `allowed_lateness_ms` (`None`: off).
    pub fn resolve(self, allowed_lateness_ms: i64) -> Option<i64> {
        match self {
            MaxLead::Auto => Some(allowed_lateness_ms.max(Self::AUTO_FLOOR_MS)),
            MaxLead::Off => None,
            MaxLead::Fixed(m) => Some(m.0),
        }
    }
}

impl Serialize for MaxLead {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            MaxLead::Auto => s.serialize_str("auto"),
            MaxLead::Off => s.serialize_str("off"),
            MaxLead::Fixed(m) => m.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for MaxLead {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        match s.trim() {
            "auto" => Ok(MaxLead::Auto),
            "off" | "none" => Ok(MaxLead::Off),
            other => Millis::parse(other)
                .map(MaxLead::Fixed)
                .map_err(|e| de::Error::custom(format!("{e} (or \"auto\", \"off\")"))),
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

/// A boolean that may also be written as the string `"true"` or `"false"` (so
/// env overrides, which are always strings, work for boolean keys).
pub fn de_bool<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    struct V;
    impl Visitor<'_> for V {
        type Value = bool;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("true or false")
        }
        fn visit_bool<E: de::Error>(self, v: bool) -> Result<bool, E> {
            Ok(v)
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<bool, E> {
            match v.trim() {
                "true" => Ok(true),
                "false" => Ok(false),
                _ => Err(E::custom(format!("{v:?} is not true or false"))),
            }
        }
    }
    d.deserialize_any(V)
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
}
