//! Keyed window state in RocksDB, written in batches (never per event).
//!
//! ## Key layout (all integers big-endian; `p` = partition as `i32` with the sign
//! bit flipped, `end` = window end as `i64` with the sign bit flipped, so byte
//! order equals numeric order):
//!
//! | key                              | value (postcard; the structs of `stored`) |
//! |----------------------------------|------------------------------------------|
//! | `M` `p`                          | `StoredMeta` (next offset, watermark, audit counters) |
//! | `T` `p`                          | `StoredTime` (high-water `completed_ts`, the watermark's lead state); format 5 |
//! | `W` `p` `end` `tenant_id bytes`  | `StoredWindow` (accumulator, whether the on-time pane fired, line items per model since format 6) |
//! | `D` `p` `expiry` `seq`            | the ids expiring then, packed (`dedup::pack`) |
//! | `F` `p` `fp.a` `fp.b`             | a cold dedup id's expiry (`i64` BE); working copy only |
//!
//! ## Rules
//! - The engine keeps active windows in memory; `commit` writes only what changed
//!   since the last commit (dirty windows, the purge as one range delete over window
//!   ends, dedup chunks and expiries) plus every partition's meta, in write batches
//!   of at most `COMMIT_BATCH` entries. Once `commit` returns, the store holds one
//!   consistent cut: for each partition, the state after exactly the records before
//!   `next_offset`. Nobody reads it mid-commit: the exporter starts after, and a crash
//!   mid-commit wipes the working copy anyway.
//! - Dedup ids are stored in chunks per expiry (`expiry` encoded like `end`;
//!   `seq` = the commit's next offset, `u64` BE, so chunks of one expiry written by
//!   different commits never collide). Expired chunks go in one range delete
//!   (`D p ..= watermark`) per commit.
//! - The store is written at checkpoint barriers, at spills (memory pressure: a
//!   commit without an export) and at restores — never while an export reads it (the
//!   worker waits for the exporter before writing again), so the exporter reads the
//!   cut of its barrier.
//! - Windows evicted from memory under the budget exist only here; `SpillStore`
//!   reads them back (one point read, or one prefix scan per window end).
//! - It is a working copy, opened empty at start (`open_fresh`) and filled from the
//!   checkpoint store (`import_partition`); its writes skip the WAL. The checkpoint
//!   files are the durable truth.
//! - A partition without an `M` key has no state: it starts from the log start.
//! - `F` is the index of the dedup ids a task moved out of memory (`engine::cold`):
//!   written in sorted runs as SST files ingested whole (no memtable, no WAL),
//!   never exported (the `D` chunks are the durable form; a restore starts with
//!   every id in memory again) and dropped with its partition. An entry whose
//!   expiry is at or below its partition's last dedup range delete is dead: a
//!   compaction filter drops it, so the index does not grow with time.
//! - Every commit records the keys it put and its range deletes per partition
//!   (`changes`), so a checkpoint can write only what changed (a delta); a
//!   restore or a drop makes the partition's changes unknown.
//!
//! ## Compatibility
//! The layout and the values are copied byte for byte into checkpoint parts, so
//! they are part of the checkpoint format (`checkpoint::format`, version 4): a
//! change to a key or a stored struct (`stored`) is a new checkpoint format. The
//! working copy itself is wiped at every start, so it has no compatibility of its
//! own.

pub mod bounded;
pub mod changes;
pub mod config;
pub mod memory;
pub mod stored;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use rocksdb::compaction_filter::Decision;
use rocksdb::{
    Direction, IngestExternalFileOptions, IteratorMode, Options, SstFileWriter, WriteBatch,
    WriteOptions, DB,
};
use serde::Deserialize;

use crate::engine::cold::DedupStore;
use crate::engine::dedup::{unpack, Fingerprint};
use crate::engine::spill::SpillStore;
use crate::engine::{StateDelta, TaskSnapshot, WindowAcc, WindowPhase};
use crate::model::Partition;
use changes::Tracker;
pub(crate) use changes::{Changes, KnownChanges};
pub(crate) use stored::PartitionMeta;
use stored::{encode, Models, StoredMeta, StoredTime, StoredWindow};

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("state store {path}: {source}")]
    Open {
        path: String,
        source: rocksdb::Error,
    },
    /// Another process holds the store's lock.
    #[error(
        "state store {path} is in use by another process (RocksDB's lock is held): each \
         worker needs its own `state.dir` — stop the other tally, or give this one another \
         directory (TALLY_STATE__DIR)"
    )]
    Locked { path: String },
    /// The working copy's directory could not be created or cleared (a read-only
    /// or full file system, a file in its place).
    #[error(
        "state.dir: cannot {doing} the working copy {path}: {source}; point `state.dir` (or \
         TALLY_STATE__DIR) at a writable directory"
    )]
    Dir {
        doing: &'static str,
        path: String,
        source: std::io::Error,
    },
    #[error("state store write: {0}")]
    Write(rocksdb::Error),
    #[error("state store read: {0}")]
    Read(rocksdb::Error),
    #[error("state store: corrupt entry ({key}): {msg}")]
    Corrupt { key: String, msg: String },
}

impl crate::base::error::Classify for StateError {
    fn class(&self) -> crate::base::error::ErrorClass {
        use crate::base::error::ErrorClass;
        match self {
            // Another process holds the store: an operator must stop it or move one.
            StateError::Locked { .. } => ErrorClass::Refused,
            // Local I/O (a full or read-only disk) or damage: restart.
            StateError::Open { .. }
            | StateError::Dir { .. }
            | StateError::Write(_)
            | StateError::Read(_)
            | StateError::Corrupt { .. } => ErrorClass::Internal,
        }
    }
}

/// Domain vocabulary (`model::partition`), named here too for the state's callers.
pub use crate::model::NextOffset;

/// One partition's part of a commit.
pub(crate) struct PartitionCommit {
    pub partition: Partition,
    pub next_offset: NextOffset,
    pub delta: StateDelta,
}

pub struct StateStore {
    db: DB,
    dir: PathBuf,
    /// Per partition, the last dedup range delete's bound: cold ids expiring at
    /// or below it are dead (read by the compaction filter).
    dead_through: Arc<RwLock<HashMap<i32, i64>>>,
    /// Cold-id SST files written so far (their names).
    ssts: AtomicU64,
    /// The keys written since each partition's last checkpoint (`changes`).
    changes: Mutex<Tracker>,
}

/// The most key bytes `changes` holds (about 300,000 changed windows between
/// two checkpoints); past it, every partition's next checkpoint is a base. Part
/// of a worker's fixed memory overhead (docs/DESIGN.md §7.7).
pub(crate) const CHANGES_LIMIT: usize = 16 << 20;

fn p_bytes(p: i32) -> [u8; 4] {
    ((p as u32) ^ 0x8000_0000).to_be_bytes()
}

fn end_bytes(end: i64) -> [u8; 8] {
    ((end as u64) ^ 0x8000_0000_0000_0000).to_be_bytes()
}

fn end_from(b: &[u8]) -> i64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    (u64::from_be_bytes(a) ^ 0x8000_0000_0000_0000) as i64
}

fn key(kind: u8, p: i32, rest: &[&[u8]]) -> Vec<u8> {
    let mut k = Vec::with_capacity(5 + rest.iter().map(|r| r.len()).sum::<usize>());
    k.push(kind);
    k.extend_from_slice(&p_bytes(p));
    for r in rest {
        k.extend_from_slice(r);
    }
    k
}

fn decode<T: for<'de> Deserialize<'de>>(k: &[u8], v: &[u8]) -> Result<T, StateError> {
    stored::decode(v).map_err(|msg| StateError::Corrupt {
        key: describe_key(k),
        msg,
    })
}

/// A `W` value, of format 6 or 5 (`StoredWindow::decode`).
fn decode_window(k: &[u8], v: &[u8]) -> Result<StoredWindow, StateError> {
    StoredWindow::decode(v).map_err(|msg| StateError::Corrupt {
        key: describe_key(k),
        msg,
    })
}

/// A key as a person reads it: its kind, partition and window end or expiry
/// (see the layout in the module header), not raw bytes.
pub(crate) fn describe_key(k: &[u8]) -> String {
    let p = k
        .get(1..5)
        .and_then(|b| b.try_into().ok())
        .map(|b: [u8; 4]| (u32::from_be_bytes(b) ^ 0x8000_0000) as i32);
    let t = k.get(5..13).map(end_from);
    match (k.first(), p, t) {
        (Some(b'M'), Some(p), _) => format!("partition meta of partition {p}"),
        (Some(b'T'), Some(p), _) => format!("event-time facts of partition {p}"),
        (Some(b'W'), Some(p), Some(end)) => format!(
            "window of partition {p} ending at {end}, tenant {:?}",
            String::from_utf8_lossy(&k[13..])
        ),
        (Some(b'D'), Some(p), Some(expiry)) => {
            format!("dedup chunk of partition {p} expiring at {expiry}")
        }
        (Some(b'F'), Some(p), _) => format!("cold dedup id of partition {p}"),
        _ => {
            let hex: Vec<String> = k.iter().take(16).map(|b| format!("{b:02x}")).collect();
            let more = if k.len() > 16 { " …" } else { "" };
            format!(
                "unrecognised key of {} bytes ({}{more}; a key starts with M, T, W or D and \
                 its partition)",
                k.len(),
                hex.join(" ")
            )
        }
    }
}

/// Deletes every window of partition `p` ending at or below `through`.
fn delete_windows_through(batch: &mut WriteBatch, p: i32, through: i64) {
    batch.delete_range(
        key(b'W', p, &[]),
        key(b'W', p, &[&end_bytes(through.saturating_add(1))]),
    );
}

/// Deletes every dedup chunk of partition `p` expiring at or below `through`.
fn delete_dedup_through(batch: &mut WriteBatch, p: i32, through: i64) {
    batch.delete_range(
        key(b'D', p, &[]),
        key(b'D', p, &[&end_bytes(through.saturating_add(1))]),
    );
}

/// Entries per write batch of a commit. The store is a working copy read only by
/// this worker and its exporter (which starts after the commit returns), so a
/// commit need not be one atomic batch.
const COMMIT_BATCH: usize = 65_536;

/// The RocksDB version the `rocksdb` crate bundles (`librocksdb-sys`'s version
/// suffix; a test checks it against Cargo.lock). Reported in `tally_build_info`.
pub(crate) const ROCKSDB_VERSION: &str = "11.8.1";

impl SpillStore for StateStore {
    fn window(&self, p: Partition, end: i64, tenant: &str) -> Result<Option<WindowAcc>, String> {
        let k = key(b'W', p.0, &[&end_bytes(end), tenant.as_bytes()]);
        match self.db.get_pinned(&k).map_err(|e| e.to_string())? {
            Some(v) => decode_window(&k, &v)
                .map(|w| Some(w.acc(&mut Models::default())))
                .map_err(|e| e.to_string()),
            None => Ok(None),
        }
    }

    fn windows_ending(&self, p: Partition, end: i64) -> Result<Vec<(Box<str>, WindowAcc)>, String> {
        self.windows_ending_after(p, end, None, usize::MAX)
    }

    fn windows_ending_after(
        &self,
        p: Partition,
        end: i64,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(Box<str>, WindowAcc)>, String> {
        let prefix = key(b'W', p.0, &[&end_bytes(end)]);
        // The first key past `after`: `after` itself followed by a zero byte.
        let from = match after {
            Some(t) => key(b'W', p.0, &[&end_bytes(end), t.as_bytes(), &[0]]),
            None => prefix.clone(),
        };
        let mut out = Vec::new();
        let mut models = Models::default();
        for item in self
            .db
            .iterator(IteratorMode::From(&from, Direction::Forward))
        {
            if out.len() >= limit {
                break;
            }
            let (k, v) = item.map_err(|e| e.to_string())?;
            if !k.starts_with(&prefix) {
                break;
            }
            let tenant = std::str::from_utf8(&k[prefix.len()..]).map_err(|e| e.to_string())?;
            let w = decode_window(&k, &v).map_err(|e| e.to_string())?;
            out.push((tenant.into(), w.acc(&mut models)));
        }
        Ok(out)
    }
}

fn cold_key(p: i32, fp: Fingerprint) -> Vec<u8> {
    key(b'F', p, &[&fp.a.to_be_bytes(), &fp.b.to_be_bytes()])
}

impl DedupStore for StateStore {
    fn cold_expiry(&self, Partition(p): Partition, fp: Fingerprint) -> Result<Option<i64>, String> {
        let k = cold_key(p, fp);
        match self.db.get_pinned(&k).map_err(|e| e.to_string())? {
            Some(v) => match <[u8; 8]>::try_from(&v[..]) {
                Ok(b) => Ok(Some(i64::from_be_bytes(b))),
                Err(_) => Err(format!(
                    "{}: a value of {} bytes",
                    describe_key(&k),
                    v.len()
                )),
            },
            None => Ok(None),
        }
    }

    /// One SST file per call, ingested whole (moved into the store).
    fn put_cold(
        &self,
        Partition(p): Partition,
        entries: &[(Fingerprint, i64)],
    ) -> Result<(), String> {
        if entries.is_empty() {
            return Ok(());
        }
        let n = self.ssts.fetch_add(1, Ordering::Relaxed);
        let path = self.dir.join(format!("cold-{p}-{n}.sst"));
        let opts = Options::default();
        let mut w = SstFileWriter::create(&opts);
        let written = (|| {
            w.open(&path)?;
            for (fp, expiry) in entries {
                w.put(cold_key(p, *fp), expiry.to_be_bytes())?;
            }
            w.finish()?;
            let mut ingest = IngestExternalFileOptions::default();
            ingest.set_move_files(true);
            self.db.ingest_external_file_opts(&ingest, vec![&path])
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&path);
        }
        written.map_err(|e| format!("moving {} dedup ids to the state store: {e}", entries.len()))
    }
}

impl StateStore {
    pub fn open(dir: &Path) -> Result<Self, StateError> {
        let path = dir.display().to_string();
        // Created here, not by RocksDB, whose error would be Rust debug output.
        std::fs::create_dir_all(dir).map_err(|source| StateError::Dir {
            doing: "create",
            path: path.clone(),
            source,
        })?;
        // A working copy: what a shutdown would flush is in the checkpoint store
        // (or belongs to no checkpoint), and the next start wipes the store anyway.
        let mut opts = Options::default()
            .get_options_from_string("avoid_flush_during_shutdown=true")
            .map_err(|source| StateError::Open {
                path: path.clone(),
                source,
            })?;
        opts.create_if_missing(true);
        opts.set_compression_type(rocksdb::DBCompressionType::Lz4);
        opts.set_max_open_files(256);
        // A fixed amount of memory, whatever the state's size (`memory`).
        memory::bound(&mut opts);
        let dead_through: Arc<RwLock<HashMap<i32, i64>>> = Arc::default();
        let dead = dead_through.clone();
        opts.set_compaction_filter("tally-dead-cold-ids", move |_: u32, k: &[u8], v: &[u8]| {
            if k.first() != Some(&b'F') || k.len() < 5 || v.len() != 8 {
                return Decision::Keep;
            }
            let p = (u32::from_be_bytes([k[1], k[2], k[3], k[4]]) ^ 0x8000_0000) as i32;
            let expiry = i64::from_be_bytes(v.try_into().unwrap_or([0; 8]));
            let dead = dead.read().unwrap_or_else(|e| e.into_inner());
            match dead.get(&p) {
                Some(&through) if expiry <= through => Decision::Remove,
                _ => Decision::Keep,
            }
        });
        let db = DB::open(&opts, dir).map_err(|source| {
            if source.kind() == rocksdb::ErrorKind::IOError && source.as_ref().contains("lock") {
                StateError::Locked { path }
            } else {
                StateError::Open { path, source }
            }
        })?;
        Ok(Self {
            db,
            dir: dir.to_path_buf(),
            dead_through,
            ssts: AtomicU64::new(0),
            changes: Mutex::new(Tracker::new(CHANGES_LIMIT)),
        })
    }

    fn tracker(&self) -> std::sync::MutexGuard<'_, Tracker> {
        // A panic elsewhere cannot leave the tracker half-updated in a way that
        // matters: at worst a partition is taken as known one time too many —
        // and a panicking worker exits anyway.
        self.changes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Partition `p`'s changes since they were last taken (`changes`).
    pub(crate) fn take_changes(&self, Partition(p): Partition) -> Changes {
        self.tracker().take(p)
    }

    /// Writes every partition's changes and meta, in batches of at most
    /// `COMMIT_BATCH` entries (bounded memory however much changed).
    pub(crate) fn commit(&self, parts: Vec<PartitionCommit>) -> Result<(), StateError> {
        let mut batch = WriteBatch::default();
        let mut tracker = self.tracker();
        for PartitionCommit {
            partition: Partition(p),
            next_offset,
            delta,
        } in parts
        {
            if let Some(through) = delta.purged_through {
                delete_windows_through(&mut batch, p, through);
                tracker.purge_windows(p, through);
            }
            for ((end, tenant), acc, phase) in delta.changed {
                let k = key(b'W', p, &[&end_bytes(end), tenant.as_bytes()]);
                tracker.put(p, &k);
                batch.put(k, stored::encode_window(&acc, phase));
                if batch.len() >= COMMIT_BATCH {
                    self.write(std::mem::take(&mut batch))?;
                }
            }
            let dead_through = delta.dedup.dead_through;
            if dead_through > i64::MIN {
                delete_dedup_through(&mut batch, p, dead_through);
                tracker.purge_dedup(p, dead_through);
                self.dead_through
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(p, dead_through);
            }
            let seq = (next_offset.0 as u64).to_be_bytes();
            for (expiry, ids) in delta.dedup.chunks {
                let k = key(b'D', p, &[&end_bytes(expiry), &seq]);
                tracker.put(p, &k);
                batch.put(k, ids);
            }
            let meta = PartitionMeta {
                next_offset,
                watermark: delta.watermark,
                counters: delta.counters,
                high_water: Some(delta.high_water),
            };
            let (stored, time) = meta.stored();
            let k = key(b'M', p, &[]);
            tracker.put(p, &k);
            batch.put(k, encode(&stored));
            let k = key(b'T', p, &[]);
            tracker.put(p, &k);
            batch.put(k, encode(&time));
        }
        drop(tracker);
        // Not synced, no WAL: durability comes from the checkpoint files (docs/DESIGN.md §7).
        self.write(batch)
    }

    /// Opens an empty store: the local store is a working copy; the durable truth
    /// is the checkpoint store, which every partition is restored from.
    pub fn open_fresh(dir: &Path) -> Result<Self, StateError> {
        if dir.exists() {
            // Opening first fails if another process holds the store's lock.
            drop(Self::open(dir)?);
            std::fs::remove_dir_all(dir).map_err(|source| StateError::Dir {
                doing: "clear",
                path: dir.display().to_string(),
                source,
            })?;
        }
        Self::open(dir)
    }

    /// Streams every key of partition `p` (meta, windows, dedup) to `visit`, in key order.
    pub(crate) fn export_partition(
        &self,
        Partition(p): Partition,
        mut visit: impl FnMut(&[u8], &[u8]) -> std::io::Result<()>,
    ) -> Result<u64, StateError> {
        let mut n = 0;
        for kind in [b'D', b'M', b'T', b'W'] {
            let prefix = key(kind, p, &[]);
            for item in self
                .db
                .iterator(IteratorMode::From(&prefix, Direction::Forward))
            {
                let (k, v) = item.map_err(StateError::Read)?;
                if !k.starts_with(&prefix) {
                    break;
                }
                visit(&k, &v).map_err(|e| StateError::Corrupt {
                    key: "export".into(),
                    msg: e.to_string(),
                })?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// Streams the entries of partition `p` that `changes` names and that still
    /// exist to `visit`, in key order (a delta segment's entries).
    pub(crate) fn export_changes(
        &self,
        Partition(p): Partition,
        changes: &KnownChanges,
        mut visit: impl FnMut(&[u8], &[u8]) -> std::io::Result<()>,
    ) -> Result<u64, StateError> {
        let mut n = 0;
        for k in &changes.keys {
            if k.get(1..5) != Some(&p_bytes(p)[..]) {
                return Err(StateError::Corrupt {
                    key: describe_key(k),
                    msg: format!("tracked as a change of partition {p}"),
                });
            }
            if let Some(v) = self.db.get_pinned(k).map_err(StateError::Read)? {
                visit(k, &v).map_err(|e| StateError::Corrupt {
                    key: "export".into(),
                    msg: e.to_string(),
                })?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// Applies a delta segment to partition `p`: the range deletes, then
    /// `entries` written over (`checkpoint::SegmentKind::Delta`).
    pub(crate) fn apply_delta<'a>(
        &self,
        Partition(p): Partition,
        windows_through: Option<i64>,
        dedup_through: Option<i64>,
        entries: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
    ) -> Result<(), StateError> {
        let mut batch = WriteBatch::default();
        if let Some(through) = windows_through {
            delete_windows_through(&mut batch, p, through);
        }
        if let Some(through) = dedup_through {
            delete_dedup_through(&mut batch, p, through);
        }
        self.put_all(p, batch, entries)?;
        self.tracker().forget(p);
        Ok(())
    }

    /// Replaces everything of partition `p` with `entries` (from a checkpoint file).
    pub(crate) fn import_partition<'a>(
        &self,
        Partition(p): Partition,
        entries: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
    ) -> Result<(), StateError> {
        self.drop_partition(Partition(p))?;
        self.put_all(p, WriteBatch::default(), entries)
    }

    /// Writes `batch`, then `entries` of partition `p` (refusing any other's).
    fn put_all<'a>(
        &self,
        p: i32,
        mut batch: WriteBatch,
        entries: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
    ) -> Result<(), StateError> {
        for (k, v) in entries {
            // Only what `decode_partition` reads back (never `F`, never exported).
            let known = matches!(k.first(), Some(b'M' | b'T' | b'W' | b'D'));
            if !known || k.get(1..5) != Some(&p_bytes(p)[..]) {
                return Err(StateError::Corrupt {
                    key: describe_key(k),
                    msg: if known {
                        format!("a key of another partition in the state of partition {p}")
                    } else {
                        format!("an unknown key in the state of partition {p}")
                    },
                });
            }
            batch.put(k, v);
            if batch.len() >= 50_000 {
                self.write(std::mem::take(&mut batch))?;
            }
        }
        self.write(batch)
    }

    /// Writes without the WAL: this store is a working copy (see the module header).
    fn write(&self, batch: WriteBatch) -> Result<(), StateError> {
        let mut wo = WriteOptions::default();
        wo.disable_wal(true);
        self.db.write_opt(batch, &wo).map_err(StateError::Write)
    }

    /// Deletes every key of partition `p`.
    pub(crate) fn drop_partition(&self, Partition(p): Partition) -> Result<(), StateError> {
        self.tracker().forget(p);
        // A restore may go back in time: an old bound must not kill its ids.
        self.dead_through
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&p);
        let mut batch = WriteBatch::default();
        for kind in [b'D', b'F', b'M', b'T', b'W'] {
            let (from, to) = (key(kind, p, &[]), key(kind, p.wrapping_add(1), &[]));
            if p == i32::MAX {
                batch.delete_range(from, vec![kind + 1]);
            } else {
                batch.delete_range(from, to);
            }
        }
        self.write(batch)
    }

    pub(crate) fn meta(
        &self,
        Partition(p): Partition,
    ) -> Result<Option<PartitionMeta>, StateError> {
        let k = key(b'M', p, &[]);
        let Some(v) = self.db.get_pinned(&k).map_err(StateError::Read)? else {
            return Ok(None);
        };
        let m = decode::<StoredMeta>(&k, &v)?;
        let t = key(b'T', p, &[]);
        let time = match self.db.get_pinned(&t).map_err(StateError::Read)? {
            Some(v) => Some(decode::<StoredTime>(&t, &v)?),
            None => None,
        };
        Ok(Some(PartitionMeta::from_stored(m, time)))
    }

    /// Loads partition `p`: its snapshot and next offset, or `None` if it has no state.
    pub fn load(&self, p: Partition) -> Result<Option<(TaskSnapshot, NextOffset)>, StateError> {
        let mut entries: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        for kind in [b'D', b'M', b'T', b'W'] {
            self.scan(kind, p.0, |_, v, k| {
                entries.push((k.to_vec(), v.to_vec()));
                Ok(())
            })?;
        }
        decode_partition(p, entries.iter().map(|(k, v)| (k.as_slice(), v.as_slice())))
    }

    fn scan(
        &self,
        kind: u8,
        p: i32,
        mut f: impl FnMut(&[u8], &[u8], &[u8]) -> Result<(), StateError>,
    ) -> Result<(), StateError> {
        let prefix = key(kind, p, &[]);
        for item in self
            .db
            .iterator(IteratorMode::From(&prefix, Direction::Forward))
        {
            let (k, v) = item.map_err(StateError::Read)?;
            if !k.starts_with(&prefix) {
                break;
            }
            f(&k[prefix.len()..], &v, &k)?;
        }
        Ok(())
    }
}

/// Builds partition `p`'s snapshot and next offset from its state-store entries
/// (as stored in RocksDB or in a checkpoint file); `None` without a meta entry.
pub(crate) fn decode_partition<'a>(
    Partition(p): Partition,
    entries: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
) -> Result<Option<(TaskSnapshot, NextOffset)>, StateError> {
    let corrupt = |k: &[u8], msg: String| StateError::Corrupt {
        key: describe_key(k),
        msg,
    };
    let mut meta: Option<StoredMeta> = None;
    let mut time: Option<StoredTime> = None;
    let mut snap = TaskSnapshot::default();
    let mut models = Models::default();
    for (k, v) in entries {
        if k.len() < 5 || k[1..5] != p_bytes(p) {
            return Err(corrupt(k, format!("not a key of partition {p}")));
        }
        let rest = &k[5..];
        match k[0] {
            b'M' => meta = Some(decode::<StoredMeta>(k, v)?),
            b'T' => time = Some(decode::<StoredTime>(k, v)?),
            b'W' if rest.len() >= 8 => {
                let tenant =
                    std::str::from_utf8(&rest[8..]).map_err(|e| corrupt(k, e.to_string()))?;
                let w = decode_window(k, v)?;
                let entry = ((end_from(rest), tenant.into()), w.acc(&mut models));
                match w.phase() {
                    WindowPhase::Open => snap.open.push(entry),
                    WindowPhase::Fired => snap.fired.push(entry),
                }
            }
            b'D' if rest.len() == 16 => {
                let expiry = end_from(rest);
                let ids = unpack(v).ok_or_else(|| corrupt(k, "malformed dedup chunk".into()))?;
                snap.dedup
                    .extend(ids.into_iter().map(|id| (Fingerprint::of(id), expiry)));
            }
            _ => return Err(corrupt(k, "unknown key kind".into())),
        }
    }
    Ok(meta.map(|m| {
        let m = PartitionMeta::from_stored(m, time);
        // Chunks may repeat an id (re-inserted after expiring): the largest expiry
        // wins; entries dead at the watermark are dropped. Sorted, like a snapshot.
        let w = m.watermark.current();
        snap.dedup
            .sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        snap.dedup.dedup_by(|later, first| later.0 == first.0);
        snap.dedup.retain(|(_, exp)| *exp > w);
        snap.watermark = Some(m.watermark);
        snap.counters = m.counters;
        snap.high_water = m.high_water;
        (snap, m.next_offset)
    }))
}

#[cfg(test)]
mod tests;
