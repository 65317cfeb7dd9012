//! A blocked Bloom filter over dedup fingerprints: each key sets and tests 8
//! bits inside one 64-byte block (one cache line, so one miss per probe).
//!
//! Fingerprints are already uniform hashes (SipHash, `dedup`), so the block is
//! chosen from `a` and the bits from `b` and the rest of `a`; nothing is hashed
//! again. A filter never says "absent" for a key it holds; it says "maybe" for
//! a key it does not hold with a probability that grows with its load (about
//! 0.5% at 12 bits a key, 2.5% at 8). Its size is fixed when it is made.

use super::fpset::Fp;

const BITS_PER_KEY_SET: u32 = 8;

#[derive(Clone)]
pub(crate) struct Bloom {
    blocks: Vec<[u64; 8]>,
    keys: usize,
}

impl std::fmt::Debug for Bloom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bloom")
            .field("bytes", &self.bytes())
            .field("keys", &self.keys)
            .finish()
    }
}

impl Bloom {
    /// A filter of about `bytes` (at least one block).
    pub(crate) fn with_bytes(bytes: usize) -> Self {
        Self {
            blocks: vec![[0; 8]; (bytes / 64).max(1)],
            keys: 0,
        }
    }

    pub fn bytes(&self) -> usize {
        self.blocks.len() * 64
    }

    /// Keys added so far.
    #[cfg(test)]
    pub(crate) fn keys(&self) -> usize {
        self.keys
    }

    #[inline]
    fn probe(&self, fp: Fp) -> (usize, [(usize, u64); BITS_PER_KEY_SET as usize]) {
        // Lemire's range reduction of the high half of `a`: no modulo.
        let block = (((fp.a >> 32) * self.blocks.len() as u64) >> 32) as usize;
        let mut bits = [(0usize, 0u64); BITS_PER_KEY_SET as usize];
        // 8 bit positions of 9 bits each (512 bits a block) from `b` and the low
        // half of `a` (72 bits; double hashing past them).
        let mut h = (u64::from(fp.b) << 32) | (fp.a & 0xFFFF_FFFF);
        let step = (fp.a >> 32) | 1;
        for slot in bits.iter_mut() {
            let bit = (h & 511) as usize;
            *slot = (bit / 64, 1u64 << (bit % 64));
            h = (h >> 9) ^ step.wrapping_mul(h | 1);
        }
        (block, bits)
    }

    pub(crate) fn insert(&mut self, fp: Fp) {
        let (b, bits) = self.probe(fp);
        let block = &mut self.blocks[b];
        for (word, mask) in bits {
            block[word] |= mask;
        }
        self.keys += 1;
    }

    /// `false`: `fp` was never inserted. `true`: it may have been.
    #[inline]
    pub(crate) fn maybe(&self, fp: Fp) -> bool {
        let (b, bits) = self.probe(fp);
        let block = &self.blocks[b];
        bits.iter().all(|(word, mask)| block[*word] & mask != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_every_key_and_rarely_says_maybe_for_others() {
        let n = 100_000;
        // 12 bits a key.
        let mut f = Bloom::with_bytes(n * 12 / 8);
        for i in 0..n {
            f.insert(Fp::of(&format!("in-{i}")));
        }
        assert!((0..n).all(|i| f.maybe(Fp::of(&format!("in-{i}")))));
        let false_maybes = (0..n)
            .filter(|i| f.maybe(Fp::of(&format!("out-{i}"))))
            .count();
        let rate = false_maybes as f64 / n as f64;
        assert!(rate < 0.012, "false-positive rate {rate}");
        assert_eq!(f.keys(), n);
    }
}
