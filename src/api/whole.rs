//! Whole numbers of any size, as PostgreSQL's unbounded `NUMERIC` sums give them:
//! a month or a year of windows can pass `u64` tokens and `u128` pico-USD, so the
//! usage API neither parses nor adds them in a fixed width.
//!
//! Invariants: a `Whole` is ASCII digits without leading zeros (`"0"` for zero), so
//! equal numbers are equal strings. JSON writes it as a number (RFC 8259 sets no
//! limit; readers that parse numbers as doubles should read `cost_pico`, a string),
//! CSV as its digits. Pure: no I/O.

use serde::{Serialize, Serializer};

use super::ReadError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Whole(String);

impl Whole {
    /// Reads PostgreSQL's text of a non-negative integral `NUMERIC`.
    pub(crate) fn parse(text: &str, what: &str) -> Result<Self, ReadError> {
        let digits = text.trim_start_matches('0');
        if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
            return Err(ReadError::Data(format!(
                "{what} {text:?} is not a whole number"
            )));
        }
        Ok(Self(
            if digits.is_empty() { "0" } else { digits }.to_string(),
        ))
    }

    pub(crate) fn zero() -> Self {
        Self("0".into())
    }

    #[cfg(test)]
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    /// The sum, digit by digit.
    pub(crate) fn add(&self, other: &Whole) -> Whole {
        let (a, b) = (self.0.as_bytes(), other.0.as_bytes());
        let mut out = Vec::with_capacity(a.len().max(b.len()) + 1);
        let (mut i, mut j, mut carry) = (a.len(), b.len(), 0u8);
        while i > 0 || j > 0 || carry > 0 {
            let mut d = carry;
            if i > 0 {
                i -= 1;
                d += a[i] - b'0';
            }
            if j > 0 {
                j -= 1;
                d += b[j] - b'0';
            }
            out.push(b'0' + d % 10);
            carry = d / 10;
        }
        out.reverse();
        let s = String::from_utf8(out).unwrap_or_default();
        Whole(if s.is_empty() { "0".into() } else { s })
    }

    /// These pico-USD in USD with exactly 12 places (`Pico::usd_string`'s format).
    pub(crate) fn usd(&self) -> String {
        let padded = format!("{:0>13}", self.0);
        let (whole, frac) = padded.split_at(padded.len() - 12);
        format!("{whole}.{frac}")
    }
}

impl std::fmt::Display for Whole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for Whole {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match serde_json::value::RawValue::from_string(self.0.clone()) {
            Ok(raw) => raw.serialize(s),
            Err(e) => Err(serde::ser::Error::custom(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Pico;
    use proptest::prelude::*;

    fn w(s: &str) -> Whole {
        Whole::parse(s, "x").unwrap()
    }

    #[test]
    fn sums_past_u128_and_their_usd() {
        let max = u128::MAX.to_string();
        assert_eq!(
            w(&max).add(&w(&max)).as_str(),
            "680564733841876926926749214863536422910"
        );
        assert_eq!(w("0").usd(), "0.000000000000");
        assert_eq!(w("5").usd(), "0.000000000005");
        assert_eq!(w("1000000000000").usd(), "1.000000000000");
        assert_eq!(w("007").as_str(), "7");
        assert!(Whole::parse("-1", "cost_pico").is_err());
        assert!(Whole::parse("1.5", "cost_pico").is_err());
        assert!(Whole::parse("", "cost_pico").is_err());
        let json = serde_json::to_string(&w(&"9".repeat(60))).unwrap();
        assert_eq!(json, "9".repeat(60));
    }

    proptest! {
        /// Within u128, addition and the USD text are the integers'.
        #[test]
        fn agrees_with_u128(a in 0u128..u128::MAX / 2, b in 0u128..u128::MAX / 2) {
            let sum = w(&a.to_string()).add(&w(&b.to_string()));
            prop_assert_eq!(sum.as_str(), (a + b).to_string());
            prop_assert_eq!(w(&a.to_string()).usd(), Pico(a).usd_string());
        }
    }
}
