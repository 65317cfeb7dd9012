//! Integer money: pico-USD amounts and nano-USD-per-1k-token prices.
//!
//! Invariants:
//! - No floating point anywhere. A price is parsed from a decimal string with at
//!   most 9 fractional digits into nano-USD per 1,000 tokens; a cost is
//!   `tokens * nano_per_1k` pico-USD, exactly (1 nano-USD / 1,000 = 1 pico-USD).
//! - Every addition and multiplication is checked: overflow is an error, never a wrap.
//! - `Pico::usd_string` renders exactly 12 fractional digits, so the string and the
//!   integer always agree.

use std::fmt;

use serde::{Deserialize, Serialize};

/// An amount of money in pico-USD (10^-12 USD).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct Pico(pub u128);

/// Raised when a sum or product of money leaves the representable range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("money overflow")]
pub struct Overflow;

impl Pico {
    pub const ZERO: Pico = Pico(0);
    const PER_USD: u128 = 1_000_000_000_000;

    pub fn is_zero(&self) -> bool {
        self.0 == 0
    }

    pub fn checked_add(self, other: Pico) -> Result<Pico, Overflow> {
        self.0.checked_add(other.0).map(Pico).ok_or(Overflow)
    }

    /// The amount as a decimal USD string with exactly 12 fractional digits.
    pub fn usd_string(self) -> String {
        // Every amount below 2^64 pico-USD (about 18 million USD) in `u64`
        // arithmetic: `u128` division and `format!` were a pane's costliest step.
        let Ok(v) = u64::try_from(self.0) else {
            return format!("{}.{:012}", self.0 / Self::PER_USD, self.0 % Self::PER_USD);
        };
        let per = Self::PER_USD as u64;
        let (whole, frac) = (v / per, v % per);
        let (mut w, mut f) = (itoa::Buffer::new(), itoa::Buffer::new());
        let frac = f.format(frac);
        let mut s = String::with_capacity(24);
        s.push_str(w.format(whole));
        s.push('.');
        s.extend(std::iter::repeat_n('0', 12 - frac.len()));
        s.push_str(frac);
        s
    }
}

impl fmt::Display for Pico {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A price in nano-USD per 1,000 tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NanoPer1k(pub u64);

impl NanoPer1k {
    /// Cost of `tokens` tokens at this price, in pico-USD. Cannot overflow:
    /// `u64 * u64 < 2^128`.
    pub fn cost(self, tokens: u64) -> Pico {
        Pico(u128::from(tokens) * u128::from(self.0))
    }

    /// Parses a decimal USD-per-1k-tokens string (`"0.00015"`) with at most 9
    /// fractional digits. Rejects signs, exponents, empty parts and overflow.
    pub fn parse_usd(s: &str) -> Result<NanoPer1k, String> {
        let (int, frac) = match s.split_once('.') {
            Some((i, f)) => (i, f),
            None => (s, ""),
        };
        let digits = |p: &str| p.bytes().all(|b| b.is_ascii_digit());
        if int.is_empty() || !digits(int) || !digits(frac) || (s.contains('.') && frac.is_empty()) {
            return Err(format!(
                "{s:?} is not a plain decimal number like \"0.00015\""
            ));
        }
        if frac.len() > 9 {
            return Err(format!("{s:?} has more than 9 decimal places"));
        }
        let int: u64 = int.parse().map_err(|_| format!("{s:?} is too large"))?;
        let frac_nano: u64 = format!("{frac:0<9}")
            .parse()
            .map_err(|_| format!("{s:?} is invalid"))?;
        int.checked_mul(1_000_000_000)
            .and_then(|n| n.checked_add(frac_nano))
            .map(NanoPer1k)
            .ok_or_else(|| format!("{s:?} is too large"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_exact_decimals() {
        assert_eq!(NanoPer1k::parse_usd("0.00015"), Ok(NanoPer1k(150_000)));
        assert_eq!(NanoPer1k::parse_usd("0.0006"), Ok(NanoPer1k(600_000)));
        assert_eq!(NanoPer1k::parse_usd("2"), Ok(NanoPer1k(2_000_000_000)));
        assert_eq!(NanoPer1k::parse_usd("0.000000001"), Ok(NanoPer1k(1)));
        assert_eq!(NanoPer1k::parse_usd("12.5"), Ok(NanoPer1k(12_500_000_000)));
    }

    #[test]
    fn rejects_what_is_not_an_exact_decimal() {
        for bad in [
            "",
            ".5",
            "5.",
            "-1",
            "+1",
            "1e-3",
            "0.0000000001",
            "0,5",
            " 1",
            "NaN",
        ] {
            assert!(NanoPer1k::parse_usd(bad).is_err(), "{bad:?} accepted");
        }
        assert!(NanoPer1k::parse_usd("18446744073709551615").is_err());
    }

    #[test]
    fn cost_is_tokens_times_nano_in_pico() {
        // 1,200 tokens at $0.00015/1k = $0.00018 = 180,000,000 pico.
        assert_eq!(NanoPer1k(150_000).cost(1_200), Pico(180_000_000));
        // The largest token count at the largest price does not wrap.
        let max = NanoPer1k(u64::MAX).cost(u64::MAX);
        assert_eq!(max.0, u128::from(u64::MAX) * u128::from(u64::MAX));
    }

    #[test]
    fn sum_overflow_is_an_error() {
        assert_eq!(Pico(u128::MAX).checked_add(Pico(1)), Err(Overflow));
        assert_eq!(Pico(1).checked_add(Pico(2)), Ok(Pico(3)));
    }

    #[test]
    fn usd_string_has_twelve_places() {
        assert_eq!(Pico(0).usd_string(), "0.000000000000");
        assert_eq!(Pico(200_000_000_000).usd_string(), "0.200000000000");
        assert_eq!(
            Pico(1_234_000_000_000_007).usd_string(),
            "1234.000000000007"
        );
        // The u64 path and the u128 one agree, at the edge between them too.
        let mut rng = crate::gen::Rng::new(3);
        let edge = u128::from(u64::MAX);
        for v in [edge - 1, edge, edge + 1, u128::MAX]
            .into_iter()
            .chain((0..10_000).map(|_| u128::from(rng.next_u64() >> rng.below(64))))
        {
            let want = format!("{}.{:012}", v / 1_000_000_000_000, v % 1_000_000_000_000);
            assert_eq!(Pico(v).usd_string(), want);
        }
    }
}
