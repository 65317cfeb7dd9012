//! Human byte sizes (`"512MiB"`, `"1GiB"`, `"300MB"`, `"64KiB"`, plain bytes) and
//! `"off"` for "no limit", as used in the config file.
//!
//! Invariant: parsing is exact integer arithmetic; binary units are powers of
//! 1024, decimal units powers of 1000.

use std::fmt;

use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize, Serializer};

/// A byte budget; `None` means unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Budget(pub Option<u64>);

const UNITS: [(&str, u64); 7] = [
    ("GiB", 1 << 30),
    ("MiB", 1 << 20),
    ("KiB", 1 << 10),
    ("GB", 1_000_000_000),
    ("MB", 1_000_000),
    ("KB", 1_000),
    ("B", 1),
];

impl Budget {
    pub fn parse(s: &str) -> Result<Budget, String> {
        let s = s.trim();
        if s == "off" || s == "none" {
            return Ok(Budget(None));
        }
        let digits = s.bytes().take_while(u8::is_ascii_digit).count();
        let n: u64 = s[..digits]
            .parse()
            .map_err(|_| format!("{s:?} is not a size like \"512MiB\", \"1GiB\" or \"off\""))?;
        let unit = s[digits..].trim();
        let mult = match unit {
            "" => 1,
            u => UNITS
                .iter()
                .find(|(name, _)| *name == u)
                .map(|(_, m)| *m)
                .ok_or_else(|| {
                    format!("{s:?}: unknown unit {u:?} (use B, KiB, MiB, GiB, KB, MB, GB)")
                })?,
        };
        n.checked_mul(mult)
            .map(|b| Budget(Some(b)))
            .ok_or_else(|| format!("{s:?} is too large"))
    }
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(b) = self.0 else {
            return f.write_str("off");
        };
        for (name, size) in UNITS {
            if b != 0 && b % size == 0 {
                return write!(f, "{}{name}", b / size);
            }
        }
        write!(f, "{b}B")
    }
}

impl Serialize for Budget {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Budget {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Budget::parse(&s).map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_sizes() {
        assert_eq!(Budget::parse("512MiB"), Ok(Budget(Some(512 << 20))));
        assert_eq!(Budget::parse("1GiB").unwrap().to_string(), "1GiB");
        assert_eq!(Budget::parse("300 MB"), Ok(Budget(Some(300_000_000))));
        assert_eq!(Budget::parse("4096"), Ok(Budget(Some(4096))));
        assert_eq!(Budget::parse("off"), Ok(Budget(None)));
        assert!(Budget::parse("1TiB").unwrap_err().contains("unknown unit"));
        assert!(Budget::parse("lots").is_err());
        assert!(Budget::parse("99999999999GiB")
            .unwrap_err()
            .contains("too large"));
    }
}
