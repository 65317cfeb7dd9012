//! `FpSet`: the dedup table — request-id fingerprints with their expiry, built for
//! a random lookup-or-insert per event whose cache miss can be prefetched.
//!
//! Layout: buckets of four 16-byte entries, one 64-byte cache line each (checked
//! at compile time); a key's home bucket is `a & mask` and probing moves to the
//! next bucket (wrapping). An entry is a 96-bit fingerprint and a 32-bit index
//! into the table of distinct expiries (all ids of a window share one). An
//! all-zero fingerprint marks a free slot. Expired entries are not removed one by
//! one: an insert reuses the first expired slot on its path (after checking the
//! rest of the path for the key itself). When occupied slots pass 3/4 (or at a
//! drain, when half are expired) a clean-up drops them: **in place** if what is
//! live fits in half the table and fills at least 1/16 of it (free the dead, then
//! move each live entry back to the first free slot of its path), otherwise into
//! a new table sized at twice what is live.
//!
//! Invariants: no probe path crosses a free slot (slots become free only in a
//! clean-up, which re-places every entry), so a key is absent once its probe
//! reaches a free slot; occupied slots stay at most 3/4 of all.
//!
//! A lookup is one `probe` (branch-free over a bucket's four entries) that also
//! finds where the key would go, and `put` records it there: the dedup step of a
//! record looks up once, then inserts without a second probe.
//!
//! Memory: a large table is its own anonymous mapping (zeroed, so free, and
//! resident only once touched; advised for transparent huge pages, which cut the
//! stall of its random lookups' prefetches on one VM), and a rebuild releases the
//! old table's pages as it moves past them — so growing from N to 2N bytes peaks near 2N, not 3N; an
//! in-place clean-up allocates nothing.

#![allow(unsafe_code)] // the dedup table: its own anonymous mapping, prefetches, raw slot access.

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

/// 16 bytes: the fingerprint's fields are stored flat (an `Fp` field would be
/// padded to 16 bytes by its `u64`, making entries 24 and buckets two lines).
#[derive(Clone, Copy)]
#[repr(C)]
struct Entry {
    a: u64,
    b: u32,
    expiry: u32,
}

impl Entry {
    #[inline]
    fn fp(&self) -> Fp {
        Fp {
            a: self.a,
            b: self.b,
        }
    }

    /// Without a branch (`Bucket::scan`).
    #[inline(always)]
    fn is(&self, fp: Fp) -> bool {
        (self.a == fp.a) & (self.b == fp.b)
    }

    #[inline(always)]
    fn is_free(&self) -> bool {
        (self.a | u64::from(self.b)) == 0
    }
}

const FREE: Entry = Entry {
    a: 0,
    b: 0,
    expiry: 0,
};

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Bucket([Entry; 4]);

impl Bucket {
    /// Bit `j` set: entry `j` holds `fp` (`hit`) / is free (`free`). Without
    /// branches: where a key or the first free slot sits in its bucket is random,
    /// so a compare-and-branch per entry mispredicts.
    #[inline(always)]
    fn scan(&self, fp: Fp) -> (u32, u32) {
        let (mut hit, mut free) = (0u32, 0u32);
        for (j, e) in self.0.iter().enumerate() {
            hit |= u32::from(e.is(fp)) << j;
            free |= u32::from(e.is_free()) << j;
        }
        (hit, free)
    }
}

/// What `FpSet::probe` found: the key live (its expiry), or the slot it goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    Live(i64),
    /// `fresh`: a free slot (the key is new and no expired slot is on its path).
    Put {
        bucket: usize,
        j: u32,
        fresh: bool,
    },
}

const _: () = assert!(std::mem::size_of::<Entry>() == 16);
const _: () = assert!(std::mem::size_of::<Bucket>() == 64);

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
                // Huge pages where the kernel allows them (`madvise` mode); a hint.
                // SAFETY: advice on our own fresh mapping.
                unsafe {
                    libc::madvise(ptr, bytes, libc::MADV_HUGEPAGE);
                }
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

pub(crate) struct FpSet {
    buckets: Table,
    occupied: usize,
    expiries: Vec<i64>,
    expiry_ids: HashMap<i64, u32>,
    last: Option<(i64, u32)>,
    /// The `dead_through` of `compact`'s last count of dead entries.
    counted_through: i64,
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
            counted_through: i64::MIN,
        }
    }

    /// Memory the table takes (its buckets; the expiry table is small).
    pub fn bytes(&self) -> usize {
        self.buckets.len() * std::mem::size_of::<Bucket>()
    }

    /// Occupied slots: live entries and expired ones not yet dropped by a rebuild.
    pub fn len(&self) -> usize {
        self.occupied
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.occupied == 0
    }

    /// Starts loading `fp`'s home bucket into the cache (a hint; no effect on results).
    #[inline]
    pub(crate) fn prefetch(&self, fp: Fp) {
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
    pub(crate) fn get(&self, fp: Fp) -> Option<i64> {
        let buckets: &[Bucket] = &self.buckets;
        let mask = buckets.len() - 1;
        let mut i = fp.a as usize & mask;
        loop {
            let (hit, free) = buckets[i].scan(fp);
            if hit != 0 {
                return Some(self.expiry_of(&buckets[i].0[hit.trailing_zeros() as usize]));
            }
            if free != 0 {
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    /// Where `fp` is, or would be recorded, with `dead_through` as in
    /// `check_insert`; changes nothing (`put` records it there).
    #[inline]
    pub(crate) fn probe(&self, fp: Fp, dead_through: i64) -> Slot {
        debug_assert!(!fp.is_free());
        let buckets: &[Bucket] = &self.buckets;
        let mask = buckets.len() - 1;
        let mut i = fp.a as usize & mask;
        let mut reuse: Option<(usize, u32)> = None;
        loop {
            let b = &buckets[i];
            let (hit, free) = b.scan(fp);
            // No probe path crosses a free slot: a present key lies before any.
            if hit != 0 {
                let j = hit.trailing_zeros();
                let current = self.expiry_of(&b.0[j as usize]);
                if current > dead_through && dead_through != i64::MIN {
                    return Slot::Live(current);
                }
                return Slot::Put {
                    bucket: i,
                    j,
                    fresh: false,
                };
            }
            if reuse.is_none() {
                // The entries before the first free one (all four if none is).
                let before = if free == 0 {
                    0b1111
                } else {
                    (free & free.wrapping_neg()) - 1
                };
                let mut dead = 0u32;
                for (j, e) in b.0.iter().enumerate() {
                    let d = self
                        .expiries
                        .get(e.expiry as usize)
                        .is_some_and(|&x| x <= dead_through);
                    dead |= u32::from(d) << j;
                }
                dead &= before;
                if dead != 0 {
                    reuse = Some((i, dead.trailing_zeros()));
                }
            }
            if free != 0 {
                return match reuse {
                    Some((bucket, j)) => Slot::Put {
                        bucket,
                        j,
                        fresh: false,
                    },
                    None => Slot::Put {
                        bucket: i,
                        j: free.trailing_zeros(),
                        fresh: true,
                    },
                };
            }
            i = (i + 1) & mask;
        }
    }

    /// Records `fp` with `expiry` where `probe` (with this `dead_through`, and no
    /// change to the table since) said it goes.
    #[inline]
    pub(crate) fn put(&mut self, at: Slot, fp: Fp, expiry: i64, dead_through: i64) {
        let Slot::Put { bucket, j, fresh } = at else {
            return;
        };
        let id = self.expiry_id(expiry);
        self.buckets[bucket].0[j as usize] = Entry {
            a: fp.a,
            b: fp.b,
            expiry: id,
        };
        if fresh {
            self.occupied += 1;
            if self.occupied * 4 > self.slots() * 3 {
                self.make_room(dead_through);
            }
        }
    }

    /// Looks `fp` up. If it is present with an expiry above `dead_through`, returns
    /// that expiry and changes nothing. Otherwise records it with `expiry` — over
    /// its own expired entry, or the first expired slot on its path, or a free
    /// slot — and returns `None`. `dead_through = i64::MIN` is an unconditional
    /// put: nothing is expired and an existing entry takes the new expiry.
    pub(crate) fn check_insert(&mut self, fp: Fp, expiry: i64, dead_through: i64) -> Option<i64> {
        match self.probe(fp, dead_through) {
            Slot::Live(current) => Some(current),
            at => {
                self.put(at, fp, expiry, dead_through);
                None
            }
        }
    }

    fn slots(&self) -> usize {
        self.buckets.len() * 4
    }

    fn slot(&self, s: usize) -> &Entry {
        &self.buckets[s / 4].0[s % 4]
    }

    fn slot_mut(&mut self, s: usize) -> &mut Entry {
        &mut self.buckets[s / 4].0[s % 4]
    }

    /// The first slot of `fp`'s probe path.
    fn home(&self, a: u64) -> usize {
        (a as usize & (self.buckets.len() - 1)) * 4
    }

    /// Drops the entries expiring at or below `dead_through`, leaving at most half
    /// of the slots occupied: in place when the table's size suits what is live
    /// (no allocation, two sequential passes), else into a table sized for it.
    fn make_room(&mut self, dead_through: i64) {
        // A slot free before the dead are freed: no probe path crosses it.
        let Some(start) = (0..self.slots()).find(|&s| self.slot(s).is_free()) else {
            return; // unreachable: at most 3/4 of the slots are occupied
        };
        let live = self.free_dead(dead_through);
        let slots = self.slots();
        if live * 2 <= slots && (live * 16 >= slots || slots <= 64) {
            self.replace_in_place(start);
        } else {
            self.rebuild(live);
        }
    }

    /// Inserts, keeping the larger expiry if present (restores).
    pub(crate) fn insert_max(&mut self, fp: Fp, expiry: i64) {
        if self.get(fp).is_some_and(|current| current >= expiry) {
            return;
        }
        self.check_insert(fp, expiry, i64::MIN);
    }

    /// Drops the entries expiring at or below `dead_through` if they hold at least
    /// half of the occupied slots (otherwise inserts reuse them as they come).
    pub(crate) fn compact(&mut self, dead_through: i64) {
        // Counting is a scan of the table: skipped when no expiry was passed
        // since the last count (its verdict stands: since then, entries were
        // only added, or dead ones reused) — so a drain costs O(expiries).
        let passed = |e: &i64| *e > self.counted_through && *e <= dead_through;
        if !self.expiries.iter().any(passed) {
            return;
        }
        self.counted_through = dead_through;
        let dead = self.iter().filter(|(_, e)| *e <= dead_through).count();
        if dead > 0 && dead * 2 >= self.occupied {
            self.make_room(dead_through);
        }
    }

    /// Frees every entry expiring at or below `dead_through` and renumbers the
    /// expiries of the rest; returns how many are left. Afterwards probe paths may
    /// cross free slots: `replace_in_place` or `rebuild` must follow.
    fn free_dead(&mut self, dead_through: i64) -> usize {
        let mut remap = ExpiryRemap::new(self.expiries.len());
        let mut live = 0;
        for s in 0..self.slots() {
            let e = *self.slot(s);
            if e.is_free() {
                continue;
            }
            let expiry = self.expiry_of(&e);
            *self.slot_mut(s) = if expiry > dead_through {
                live += 1;
                Entry {
                    expiry: remap.id(e.expiry, expiry),
                    ..e
                }
            } else {
                FREE
            };
        }
        self.occupied = live;
        remap.install(self);
        live
    }

    /// Moves every entry to the first free slot of its probe path, so every key
    /// is reachable again and no path crosses a free slot. Processing starts just
    /// after `start`, a slot that was free before `free_dead` (no path crosses it),
    /// in probe order: every slot between an entry's home and its new place holds
    /// an entry already placed, which never moves again.
    fn replace_in_place(&mut self, start: usize) {
        let n = self.slots();
        let mask = n - 1; // slots are a power of two
        for k in 1..=n {
            let p = (start + k) & mask;
            let e = *self.slot(p);
            if e.is_free() {
                continue;
            }
            let mut q = self.home(e.a);
            while q != p {
                if self.slot(q).is_free() {
                    *self.slot_mut(q) = e;
                    *self.slot_mut(p) = FREE;
                    break;
                }
                q = (q + 1) & mask;
            }
        }
    }

    /// Moves the entries (all live, after `free_dead`) into a new table with twice
    /// as many slots as there are entries (rounded up to a power of two),
    /// releasing the old one's pages as it goes.
    fn rebuild(&mut self, live: usize) {
        let mut old = std::mem::replace(self, Self::with_buckets((live * 2).div_ceil(4)));
        self.expiries = std::mem::take(&mut old.expiries);
        self.expiry_ids = std::mem::take(&mut old.expiry_ids);
        const CHUNK: usize = 32_768; // buckets: 2 MiB
        let mut from = 0;
        while from < old.buckets.len() {
            let to = (from + CHUNK).min(old.buckets.len());
            for i in from..to {
                for e in old.buckets[i].0 {
                    if e.is_free() {
                        continue;
                    }
                    // Keys are distinct: the first free slot is its place.
                    let mut q = self.home(e.a);
                    while !self.slot(q).is_free() {
                        q = (q + 1) & (self.slots() - 1);
                    }
                    *self.slot_mut(q) = e;
                    self.occupied += 1;
                }
            }
            old.buckets.release(from, to);
            from = to;
        }
    }

    /// Every occupied entry with its expiry, in table order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (Fp, i64)> + '_ {
        self.buckets
            .iter()
            .flat_map(|b| b.0.iter())
            .filter(|e| !e.is_free())
            .map(|e| (e.fp(), self.expiry_of(e)))
    }
}

/// Old expiry ids to new ones, for the expiries still live after a clean-up.
struct ExpiryRemap {
    ids: Vec<u32>,
    expiries: Vec<i64>,
}

impl ExpiryRemap {
    fn new(old: usize) -> Self {
        Self {
            ids: vec![u32::MAX; old],
            expiries: Vec::new(),
        }
    }

    fn id(&mut self, old: u32, expiry: i64) -> u32 {
        let id = &mut self.ids[old as usize];
        if *id == u32::MAX {
            *id = self.expiries.len() as u32;
            self.expiries.push(expiry);
        }
        *id
    }

    fn install(self, set: &mut FpSet) {
        set.expiry_ids = self
            .expiries
            .iter()
            .enumerate()
            .map(|(i, e)| (*e, i as u32))
            .collect();
        set.expiries = self.expiries;
        set.last = None;
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

    /// A key past a full home bucket of expired entries is found live, not
    /// shadowed by the expired slot an insert would reuse; a new key takes that
    /// slot; `probe` + `put` is `check_insert`.
    #[test]
    fn probe_finds_a_key_past_expired_slots_and_reuses_the_first_of_them() {
        let mut s = FpSet::default();
        let home = |b: u32| Fp { a: 64, b };
        for b in 1..=4 {
            assert_eq!(s.check_insert(home(b), 10, 0), None);
        }
        // The home bucket is full: this one lands in the next bucket.
        assert_eq!(s.check_insert(home(5), 100, 0), None);
        // At 50 the four are dead and the fifth is live.
        assert_eq!(s.probe(home(5), 50), Slot::Live(100));
        let at = s.probe(home(6), 50);
        let i = 64usize & (s.buckets.len() - 1);
        assert_eq!(
            at,
            Slot::Put {
                bucket: i,
                j: 0,
                fresh: false
            }
        );
        s.put(at, home(6), 200, 50);
        assert_eq!(s.get(home(6)), Some(200));
        assert_eq!(s.get(home(1)), None, "its expired slot was reused");
        assert_eq!(s.check_insert(home(6), 300, 50), Some(200));
        // A dead key is replaced in its own slot.
        assert!(matches!(
            s.probe(home(5), 150),
            Slot::Put { fresh: false, .. }
        ));
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

    /// Steady state, growth and shrinking: a sliding horizon of keys (clustered,
    /// so probe paths cross) makes the table clean itself in place many times
    /// (through `compact`, as at each drain), then grow, then shrink; every answer
    /// matches a model map.
    #[test]
    fn cleans_in_place_grows_and_shrinks_like_a_map() {
        let mut s = FpSet::default();
        let mut model = std::collections::HashMap::new();
        let key = |i: u64| Fp {
            // Homes only every eighth bucket: clusters whose paths cross.
            a: i.wrapping_mul(0x9E37_79B9_7F4A_7C15) & !7,
            b: i as u32 | 1 << 31,
        };
        // Clean-ups seen: (in place, into a new table).
        let mut cleanups = (0, 0);
        let mut note = |s: &FpSet, before: (usize, usize)| {
            if s.occupied < before.1 {
                if s.buckets.len() == before.0 {
                    cleanups.0 += 1;
                } else {
                    cleanups.1 += 1;
                }
            }
        };
        let mut i = 0u64;
        let mut largest = 0;
        for (phase, horizon) in [(0, 500u64), (1, 4_000), (2, 40)] {
            for _ in 0..30_000 {
                i += 1;
                let w = i as i64;
                // Mostly new keys; every 5th repeats one seen `horizon / 2` ago.
                let k = if i.is_multiple_of(5) && i > horizon {
                    key(i - horizon / 2)
                } else {
                    key(i)
                };
                let exp = w + horizon as i64;
                let want = model.get(&k).copied().filter(|e: &i64| *e > w);
                let before = (s.buckets.len(), s.occupied);
                assert_eq!(s.check_insert(k, exp, w), want, "phase {phase} step {i}");
                note(&s, before);
                if want.is_none() {
                    model.insert(k, exp);
                }
                if i.is_multiple_of(1_000) {
                    let before = (s.buckets.len(), s.occupied);
                    s.compact(w);
                    note(&s, before);
                    model.retain(|_, e| *e > w);
                    for (k, e) in &model {
                        assert_eq!(s.get(*k), Some(*e), "phase {phase} step {i}");
                    }
                    assert!(s.occupied * 4 <= s.slots() * 3);
                    largest = largest.max(s.slots());
                }
            }
        }
        let (in_place, resized) = cleanups;
        assert!(in_place >= 1, "in place {in_place}");
        assert!(resized >= 1, "resized {resized}");
        assert!(largest >= 8192, "grew: {largest} slots");
        assert!(s.slots() <= 512, "shrunk back: {} slots", s.slots());
    }

    /// In-place clean-up with long, crossing probe paths (keys homed on a few
    /// buckets, expiries interleaved): every live key stays reachable, every dead
    /// one is gone, and no path crosses a free slot.
    #[test]
    fn in_place_clean_up_keeps_every_live_key_reachable() {
        let mut s = FpSet::with_buckets(64);
        let key = |i: u64| Fp {
            a: (i % 5) * 13 + 60, // homes 60..124 wrap around a 64-bucket table
            b: i as u32 + 1,
        };
        for i in 0..190u64 {
            assert_eq!(s.check_insert(key(i), (i % 7) as i64 + 1, i64::MIN), None);
        }
        for dead_through in [0, 2, 3, 5] {
            let start = (0..s.slots()).find(|&q| s.slot(q).is_free()).unwrap();
            s.free_dead(dead_through);
            s.replace_in_place(start);
            for i in 0..190u64 {
                let want = Some((i % 7) as i64 + 1).filter(|e| *e > dead_through);
                assert_eq!(s.get(key(i)), want, "key {i} after {dead_through}");
            }
            assert_eq!(s.len(), s.iter().count());
            for (fp, _) in s.iter() {
                let mut q = s.home(fp.a);
                while !s.slot(q).is(fp) {
                    assert!(!s.slot(q).is_free(), "a free slot on {fp:?}'s path");
                    q = (q + 1) % s.slots();
                }
            }
        }
        assert_eq!(s.len(), (0..190).filter(|i| i % 7 + 1 > 5).count());
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
