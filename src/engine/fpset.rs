//! `FpSet`: the dedup table — request-id fingerprints with their expiry, built for
//! a random lookup-or-insert per event whose cache miss can be prefetched.
//!
//! Layout: buckets of four 16-byte entries, one 64-byte cache line each; a key's
//! home bucket is `a & mask` and probing moves to the next bucket (wrapping). An
//! entry is a 96-bit fingerprint and a 32-bit index into the table of distinct
//! expiries (all ids of a window share one). An all-zero fingerprint marks a free
//! slot. Expired entries are not removed: an insert reuses the first expired slot on
//! its path (after checking the rest of the path for the key itself), and a rebuild
//! — when occupied slots pass 3/4 — drops them and sizes the table for what is live.
//!
//! Invariants: a slot never becomes free except by a rebuild, so a key is absent
//! once its probe reaches a free slot; occupied slots stay at most 3/4 of all.
//!
//! Memory: a large table is its own anonymous mapping (zeroed, so free, and
//! resident only once touched), and a rebuild releases the old table's pages as it
//! moves past them — so growing from N to 2N bytes peaks near 2N, not 3N.

use std::collections::HashMap;

/// A 96-bit fingerprint (see `dedup`); never all zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fp {
    pub a: u64,
    pub b: u32,
}

impl Fp {
    fn is_free(&self) -> bool {
        self.a == 0 && self.b == 0
    }
}

#[derive(Clone, Copy)]
struct Entry {
    fp: Fp,
    expiry: u32,
}

const FREE: Entry = Entry {
    fp: Fp { a: 0, b: 0 },
    expiry: 0,
};

#[derive(Clone, Copy)]
#[repr(align(64))]
struct Bucket([Entry; 4]);

/// The bucket array: a `Vec` when small, an anonymous mapping when large.
enum Table {
    Small(Vec<Bucket>),
    Mapped { ptr: *mut Bucket, len: usize },
}

// SAFETY: the mapping is owned exclusively by the table, like a Vec's buffer.
unsafe impl Send for Table {}
unsafe impl Sync for Table {}

/// Tables at least this large are mapped (and released page by page on rebuild).
const MAPPED_BYTES: usize = 2 << 20;

impl Table {
    fn new(len: usize) -> Table {
        let bytes = len * std::mem::size_of::<Bucket>();
        if bytes >= MAPPED_BYTES {
            // SAFETY: a fresh private anonymous mapping; checked for failure below.
            let ptr = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    bytes,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if ptr != libc::MAP_FAILED {
                // Zero pages are free buckets: all-zero is `FREE`.
                return Table::Mapped {
                    ptr: ptr.cast(),
                    len,
                };
            }
        }
        Table::Small(vec![Bucket([FREE; 4]); len])
    }

    /// Gives the pages wholly inside buckets `from..to` back to the kernel; they
    /// read as free buckets afterwards. Only used on a table about to be dropped.
    fn release(&mut self, from: usize, to: usize) {
        if let Table::Mapped { ptr, .. } = self {
            let page = 4096;
            let start = (*ptr as usize + from * 64).next_multiple_of(page);
            let end = (*ptr as usize + to * 64) & !(page - 1);
            if end > start {
                // SAFETY: the range lies inside our mapping.
                unsafe {
                    libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED);
                }
            }
        }
    }
}

impl std::ops::Deref for Table {
    type Target = [Bucket];
    fn deref(&self) -> &[Bucket] {
        match self {
            Table::Small(v) => v,
            // SAFETY: `len` buckets, mapped readable and writable, owned by us.
            Table::Mapped { ptr, len } => unsafe { std::slice::from_raw_parts(*ptr, *len) },
        }
    }
}

impl std::ops::DerefMut for Table {
    fn deref_mut(&mut self) -> &mut [Bucket] {
        match self {
            Table::Small(v) => v,
            // SAFETY: as in `deref`, and `&mut self` makes the access exclusive.
            Table::Mapped { ptr, len } => unsafe { std::slice::from_raw_parts_mut(*ptr, *len) },
        }
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        if let Table::Mapped { ptr, len } = self {
            // SAFETY: unmapping exactly the mapping made in `new`.
            unsafe {
                libc::munmap(ptr.cast(), *len * std::mem::size_of::<Bucket>());
            }
        }
    }
}

pub struct FpSet {
    buckets: Table,
    occupied: usize,
    expiries: Vec<i64>,
    expiry_ids: HashMap<i64, u32>,
    last: Option<(i64, u32)>,
}

impl Default for FpSet {
    fn default() -> Self {
        Self::with_buckets(16)
    }
}

impl std::fmt::Debug for FpSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FpSet")
            .field("occupied", &self.occupied)
            .field("buckets", &self.buckets.len())
            .finish()
    }
}

impl FpSet {
    fn with_buckets(n: usize) -> Self {
        Self {
            buckets: Table::new(n.next_power_of_two().max(16)),
            occupied: 0,
            expiries: Vec::new(),
            expiry_ids: HashMap::new(),
            last: None,
        }
    }

    /// Occupied slots: live entries and expired ones not yet dropped by a rebuild.
    pub fn len(&self) -> usize {
        self.occupied
    }

    pub fn is_empty(&self) -> bool {
        self.occupied == 0
    }

    /// Starts loading `fp`'s home bucket into the cache (a hint; no effect on results).
    #[inline]
    pub fn prefetch(&self, fp: Fp) {
        let i = fp.a as usize & (self.buckets.len() - 1);
        let p = self.buckets[i..].as_ptr() as *const i8;
        #[cfg(target_arch = "x86_64")]
        // SAFETY: prefetching is a hint and `p` points into the table.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p);
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = p;
    }

    fn expiry_of(&self, e: &Entry) -> i64 {
        self.expiries[e.expiry as usize]
    }

    fn expiry_id(&mut self, expiry: i64) -> u32 {
        if let Some((e, id)) = self.last {
            if e == expiry {
                return id;
            }
        }
        let next = self.expiries.len() as u32;
        let id = *self.expiry_ids.entry(expiry).or_insert(next);
        if id == next {
            self.expiries.push(expiry);
        }
        self.last = Some((expiry, id));
        id
    }

    /// The expiry of `fp`, if present (live or expired).
    pub fn get(&self, fp: Fp) -> Option<i64> {
        let buckets: &[Bucket] = &self.buckets;
        let mask = buckets.len() - 1;
        let mut i = fp.a as usize & mask;
        loop {
            for e in &buckets[i].0 {
                if e.fp == fp {
                    return Some(self.expiry_of(e));
                }
                if e.fp.is_free() {
                    return None;
                }
            }
            i = (i + 1) & mask;
        }
    }

    /// Looks `fp` up. If it is present with an expiry above `dead_through`, returns
    /// that expiry and changes nothing. Otherwise records it with `expiry` — over
    /// its own expired entry, or the first expired slot on its path, or a free
    /// slot — and returns `None`. `dead_through = i64::MIN` is an unconditional
    /// put: nothing is expired and an existing entry takes the new expiry.
    pub fn check_insert(&mut self, fp: Fp, expiry: i64, dead_through: i64) -> Option<i64> {
        debug_assert!(!fp.is_free());
        let buckets: &[Bucket] = &self.buckets;
        let mask = buckets.len() - 1;
        let mut i = fp.a as usize & mask;
        let mut reuse: Option<(usize, usize)> = None;
        let (bi, bj, fresh) = 'probe: loop {
            for j in 0..4 {
                let e = buckets[i].0[j];
                if e.fp == fp {
                    let current = self.expiry_of(&e);
                    if current > dead_through && dead_through != i64::MIN {
                        return Some(current);
                    }
                    break 'probe (i, j, false);
                }
                if e.fp.is_free() {
                    break 'probe reuse.map_or((i, j, true), |(ri, rj)| (ri, rj, false));
                }
                if reuse.is_none() && self.expiry_of(&e) <= dead_through {
                    reuse = Some((i, j));
                }
            }
            i = (i + 1) & mask;
        };
        let id = self.expiry_id(expiry);
        self.buckets[bi].0[bj] = Entry { fp, expiry: id };
        if fresh {
            self.occupied += 1;
            if self.occupied * 4 > self.buckets.len() * 4 * 3 {
                self.rebuild(dead_through);
            }
        }
        None
    }

    /// Inserts, keeping the larger expiry if present (restores).
    pub fn insert_max(&mut self, fp: Fp, expiry: i64) {
        if self.get(fp).is_some_and(|current| current >= expiry) {
            return;
        }
        self.check_insert(fp, expiry, i64::MIN);
    }

    /// Drops the entries expiring at or below `dead_through` if they hold at least
    /// half of the occupied slots (otherwise inserts reuse them as they come).
    pub fn compact(&mut self, dead_through: i64) {
        let dead = self.iter().filter(|(_, e)| *e <= dead_through).count();
        if dead > 0 && dead * 2 >= self.occupied {
            self.rebuild(dead_through);
        }
    }

    fn rebuild(&mut self, dead_through: i64) {
        let live = self.iter().filter(|(_, e)| *e > dead_through).count();
        let mut old = std::mem::replace(self, Self::with_buckets((live * 2).div_ceil(4)));
        const CHUNK: usize = 32_768; // buckets: 2 MiB
        let mut from = 0;
        while from < old.buckets.len() {
            let to = (from + CHUNK).min(old.buckets.len());
            for i in from..to {
                for e in old.buckets[i].0 {
                    if !e.fp.is_free() && old.expiry_of(&e) > dead_through {
                        self.check_insert(e.fp, old.expiry_of(&e), i64::MIN);
                    }
                }
            }
            old.buckets.release(from, to);
            from = to;
        }
    }

    /// Every occupied entry with its expiry, in table order.
    pub fn iter(&self) -> impl Iterator<Item = (Fp, i64)> + '_ {
        self.buckets
            .iter()
            .flat_map(|b| b.0.iter())
            .filter(|e| !e.fp.is_free())
            .map(|e| (e.fp, self.expiry_of(e)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(i: u64) -> Fp {
        // Clustered keys on purpose: many share a home bucket.
        Fp {
            a: (i % 7) * 64 + 1,
            b: i as u32,
        }
    }

    #[test]
    fn large_tables_are_mapped_and_survive_growth_and_compaction() {
        let mut s = FpSet::default();
        let key = |i: u64| Fp {
            a: i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            b: i as u32,
        };
        for i in 0..400_000u64 {
            assert_eq!(s.check_insert(key(i), (i / 1000) as i64 + 10, 0), None);
        }
        assert!(matches!(s.buckets, Table::Mapped { .. }));
        for i in (0..400_000u64).step_by(7) {
            assert_eq!(s.get(key(i)), Some((i / 1000) as i64 + 10));
            assert_eq!(s.check_insert(key(i), 999, 0), Some((i / 1000) as i64 + 10));
        }
        // Expire the older half and compact: a rebuild through `release`.
        s.compact(209);
        assert_eq!(s.len(), 200_000);
        assert_eq!(s.get(key(0)), None);
        assert_eq!(s.get(key(399_999)), Some(409));
    }

    #[test]
    fn behaves_like_a_map_with_expiry() {
        let mut s = FpSet::default();
        let mut model = std::collections::BTreeMap::new();
        for i in 0..20_000u64 {
            let w = (i / 100) as i64;
            let k = fp(i % 6_000);
            let exp = w + 1 + (i % 13) as i64;
            let want = model.get(&k).copied().filter(|e: &i64| *e > w);
            assert_eq!(s.check_insert(k, exp, w), want, "key {i}");
            if want.is_none() {
                model.insert(k, exp);
            }
            if i % 997 == 0 {
                s.compact(w);
                model.retain(|_, e| *e > w);
            }
        }
        let w = 200;
        for (k, e) in &model {
            assert_eq!(s.get(*k).filter(|g| *g > w), Some(*e).filter(|e| *e > w));
        }
        s.insert_max(fp(1), 5);
        s.insert_max(fp(1), 5_000);
        s.insert_max(fp(1), 50);
        assert_eq!(s.get(fp(1)), Some(5_000));
        assert_eq!(s.get(fp(1_000_000)), None);
    }
}
