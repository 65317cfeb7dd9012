//! A log-linear histogram of non-negative millisecond values.
//!
//! Invariants: values below 16 have exact buckets; above, each power of two is split
//! into 8 buckets, so a quantile is reported with at most 12.5% relative error, and
//! always as the bucket's upper bound (a bound recommended from it is never too
//! small). Recording is O(1) and allocation-free.

use serde::{Deserialize, Serialize};

const SUB: u32 = 8;
const BUCKETS: usize = 16 + (64 - 4) * SUB as usize;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Histogram {
    #[serde(with = "counts")]
    counts: Box<[u64; BUCKETS]>,
    total: u64,
    max: u64,
    /// Sum of the recorded values (Prometheus's `_sum`).
    #[serde(default)]
    sum: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            counts: Box::new([0; BUCKETS]),
            total: 0,
            max: 0,
            sum: 0,
        }
    }
}

fn bucket(v: u64) -> usize {
    if v < 16 {
        return v as usize;
    }
    let msb = 63 - v.leading_zeros(); // >= 4
    let sub = (v >> (msb - 3)) & (u64::from(SUB) - 1);
    16 + ((msb - 4) * SUB) as usize + sub as usize
}

/// The largest value that falls into bucket `b`.
fn upper(b: usize) -> u64 {
    if b < 16 {
        return b as u64;
    }
    let i = (b - 16) as u32;
    let msb = i / SUB + 4;
    let sub = u64::from(i % SUB);
    let low = (1u64 << msb) | (sub << (msb - 3));
    low + (1u64 << (msb - 3)) - 1
}

impl Histogram {
    pub fn record(&mut self, ms: i64) {
        let v = ms.max(0) as u64;
        self.counts[bucket(v)] += 1;
        self.total += 1;
        self.max = self.max.max(v);
        self.sum = self.sum.saturating_add(v);
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    pub fn max(&self) -> u64 {
        self.max
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += b;
        }
        self.total += other.total;
        self.max = self.max.max(other.max);
        self.sum = self.sum.saturating_add(other.sum);
    }

    pub fn sum(&self) -> u64 {
        self.sum
    }

    /// Counts per upper bound `bounds[i]` (ascending, same unit as the values),
    /// not cumulative, for a Prometheus histogram: a bucket of ours is counted
    /// under the first bound at or above its upper end, so a value is never
    /// reported below a bound it exceeds (it may be reported one bound higher,
    /// within this histogram's 12.5%). What lies above the last bound is left
    /// for `+Inf` (`count()`).
    pub fn counts_by_bound(&self, bounds: &[u64]) -> Vec<u64> {
        let mut out = vec![0; bounds.len()];
        for (b, c) in self.counts.iter().enumerate().filter(|(_, c)| **c > 0) {
            if let Some(i) = bounds.iter().position(|bound| upper(b) <= *bound) {
                out[i] += c;
            }
        }
        out
    }

    /// The value at quantile `per_mille / 1000` (e.g. 990 = p99), as a bucket upper
    /// bound capped at the observed maximum; `None` when empty.
    pub fn quantile(&self, per_mille: u64) -> Option<u64> {
        if self.total == 0 {
            return None;
        }
        let rank = (self.total * per_mille).div_ceil(1000).max(1);
        let mut seen = 0;
        for (b, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(upper(b).min(self.max));
            }
        }
        Some(self.max)
    }
}

mod counts {
    use super::BUCKETS;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    /// Sparse `[bucket, count]` pairs: most buckets are empty.
    pub fn serialize<S: Serializer>(c: &[u64; BUCKETS], s: S) -> Result<S::Ok, S::Error> {
        let sparse: Vec<(usize, u64)> = c
            .iter()
            .copied()
            .enumerate()
            .filter(|(_, n)| *n > 0)
            .collect();
        sparse.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Box<[u64; BUCKETS]>, D::Error> {
        let sparse: Vec<(usize, u64)> = Vec::deserialize(d)?;
        let mut c = Box::new([0u64; BUCKETS]);
        for (i, n) in sparse {
            if i < BUCKETS {
                c[i] = n;
            }
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_cover_u64() {
        for b in 0..BUCKETS - 1 {
            assert_eq!(bucket(upper(b)), b);
            assert_eq!(bucket(upper(b) + 1), b + 1);
        }
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn quantiles_are_upper_bounds_within_an_eighth() {
        let mut h = Histogram::default();
        for v in 1..=1000 {
            h.record(v);
        }
        let p50 = h.quantile(500).unwrap();
        assert!((500..=563).contains(&p50), "{p50}");
        let p99 = h.quantile(990).unwrap();
        assert!((990..=1000).contains(&p99), "{p99}");
        assert_eq!(h.quantile(1000), Some(1000));
        h.record(-5);
        assert_eq!(h.count(), 1001);
        assert_eq!(Histogram::default().quantile(500), None);
    }

    #[test]
    fn counts_by_bound_never_report_a_value_below_its_bound() {
        let mut h = Histogram::default();
        for v in [0, 3, 5, 9, 10, 11, 999, 1000, 1001, 5000, 90_000] {
            h.record(v);
        }
        // 999..1001 share an internal bucket ending above 1000: all go to 2000.
        assert_eq!(
            h.counts_by_bound(&[5, 10, 1000, 2000, 60_000]),
            [3, 2, 1, 3, 1]
        );
        assert_eq!(h.sum(), 98_038);
        assert_eq!(h.count(), 11);
    }

    #[test]
    fn merge_and_serde_round_trip() {
        let mut a = Histogram::default();
        let mut b = Histogram::default();
        a.record(3);
        b.record(70_000);
        a.merge(&b);
        let back: Histogram = serde_json::from_str(&serde_json::to_string(&a).unwrap()).unwrap();
        assert_eq!(back, a);
        assert_eq!(back.max(), 70_000);
    }
}
