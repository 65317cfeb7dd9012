//! The partition snapshot file.
//!
//! ```text
//! "TALLYPS2"                     8-byte magic (format 2: dedup ids in expiry chunks;
//!                                format 1 files are refused by name)
//! partition                      i32 big-endian
//! { key_len u32 BE, key, val_len u32 BE, val }*   the partition's state-store entries, key order
//! 0xFFFF_FFFF                    end marker
//! ```
//! The file's sha256 is in the manifest; a reader checks it before trusting a byte.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;

use sha2::{Digest, Sha256};

use super::{hex, io_err, CheckpointError};
use crate::model::Partition;

const MAGIC: &[u8; 8] = b"TALLYPS2";
const MAGIC_V1: &[u8; 8] = b"TALLYPS1";

/// One state-store entry, borrowed from a snapshot buffer: `(key, value)`.
pub type EntryRef<'b> = (&'b [u8], &'b [u8]);
const END: u32 = u32::MAX;

/// Writes while hashing and counting.
pub struct HashingWriter<W: Write> {
    inner: W,
    hasher: Sha256,
    bytes: u64,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

pub struct SnapshotWriter {
    w: HashingWriter<BufWriter<File>>,
}

impl SnapshotWriter {
    pub fn create(path: &Path, partition: Partition) -> Result<Self, CheckpointError> {
        let f = File::create(path).map_err(io_err(path))?;
        let mut w = HashingWriter {
            inner: BufWriter::with_capacity(1 << 20, f),
            hasher: Sha256::new(),
            bytes: 0,
        };
        w.write_all(MAGIC)
            .and_then(|_| w.write_all(&partition.0.to_be_bytes()))
            .map_err(io_err(path))?;
        Ok(Self { w })
    }

    pub fn entry(&mut self, k: &[u8], v: &[u8]) -> std::io::Result<()> {
        self.w.write_all(&(k.len() as u32).to_be_bytes())?;
        self.w.write_all(k)?;
        self.w.write_all(&(v.len() as u32).to_be_bytes())?;
        self.w.write_all(v)
    }

    /// Ends, flushes and fsyncs the file; returns `(bytes, sha256 hex)`.
    pub fn finish(mut self, path: &Path) -> Result<(u64, String), CheckpointError> {
        self.w.write_all(&END.to_be_bytes()).map_err(io_err(path))?;
        self.w.flush().map_err(io_err(path))?;
        let HashingWriter {
            inner,
            hasher,
            bytes,
        } = self.w;
        let file = inner
            .into_inner()
            .map_err(|e| io_err(path)(e.into_error()))?;
        file.sync_all().map_err(io_err(path))?;
        Ok((bytes, hex(&hasher.finalize())))
    }
}

/// Opens a file of the store for reading: it must be a regular file (a symlink to
/// a device, a FIFO or a directory is damage, not something to read without end)
/// of at most `limit` bytes. Returns the file and its size.
pub fn open_bounded(path: &Path, limit: u64) -> Result<(File, u64), CheckpointError> {
    let corrupt = |msg: String| CheckpointError::Corrupt {
        path: path.display().to_string(),
        msg,
    };
    let f = File::open(path).map_err(io_err(path))?;
    let md = f.metadata().map_err(io_err(path))?;
    if !md.is_file() {
        return Err(corrupt(format!(
            "not a regular file ({:?}); a checkpoint holds only regular files",
            md.file_type()
        )));
    }
    if md.len() > limit {
        return Err(corrupt(format!(
            "{} bytes, more than the {limit} this file can be",
            md.len()
        )));
    }
    Ok((f, md.len()))
}

/// Reads a whole file of at most `limit` bytes (see `open_bounded`); a file that
/// grows while being read is cut at `limit + 1` bytes, so the caller's size check
/// fails instead of the allocation.
pub fn read_bounded(path: &Path, limit: u64) -> Result<Vec<u8>, CheckpointError> {
    let (f, len) = open_bounded(path, limit)?;
    let mut buf = Vec::with_capacity(len as usize);
    f.take(limit.saturating_add(1))
        .read_to_end(&mut buf)
        .map_err(io_err(path))?;
    Ok(buf)
}

/// sha256 (hex) and size of a file of at most `limit` bytes.
pub fn hash_file(path: &Path, limit: u64) -> Result<(u64, String), CheckpointError> {
    let (f, _) = open_bounded(path, limit)?;
    let mut f = BufReader::with_capacity(1 << 20, f.take(limit.saturating_add(1)));
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut bytes = 0u64;
    loop {
        let n = f.read(&mut buf).map_err(io_err(path))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        bytes += n as u64;
    }
    Ok((bytes, hex(&hasher.finalize())))
}

/// Parses a snapshot held in memory (the caller verified its checksum); the
/// entries borrow from `buf`.
pub fn parse_snapshot<'b>(
    buf: &'b [u8],
    partition: Partition,
    path: &Path,
) -> Result<Vec<EntryRef<'b>>, CheckpointError> {
    let corrupt = |msg: &str| CheckpointError::Corrupt {
        path: path.display().to_string(),
        msg: msg.to_string(),
    };
    if buf.len() >= 8 && &buf[..8] == MAGIC_V1 {
        return Err(corrupt(
            "snapshot format 1 (written before dedup chunks); this tally reads format 2 — \
             rebuild with `tally run --reset-state earliest`",
        ));
    }
    if buf.len() < 12 || &buf[..8] != MAGIC {
        return Err(corrupt("not a tally partition snapshot"));
    }
    if buf[8..12] != partition.0.to_be_bytes() {
        return Err(corrupt("snapshot of another partition"));
    }
    let mut at = 12;
    let mut take = |n: usize| -> Result<&'b [u8], CheckpointError> {
        let s = buf.get(at..at + n).ok_or_else(|| corrupt("truncated"))?;
        at += n;
        Ok(s)
    };
    let mut out = Vec::new();
    loop {
        let klen = u32::from_be_bytes(take(4)?.try_into().map_err(|_| corrupt("truncated"))?);
        if klen == END {
            return Ok(out);
        }
        let k = take(klen as usize)?;
        let vlen = u32::from_be_bytes(take(4)?.try_into().map_err(|_| corrupt("truncated"))?);
        out.push((k, take(vlen as usize)?));
    }
}

/// Reads a whole file of at most `limit` bytes and its sha256 (hex).
pub fn read_hashed(path: &Path, limit: u64) -> Result<(Vec<u8>, String), CheckpointError> {
    let buf = read_bounded(path, limit)?;
    let sha = hex(&Sha256::digest(&buf));
    Ok((buf, sha))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_it_writes_and_refuses_format_one_by_name() {
        let dir = std::env::temp_dir().join(format!("tally-snapshot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("p-000003.state");
        let mut w = SnapshotWriter::create(&path, Partition(3)).unwrap();
        w.entry(b"k1", b"v1").unwrap();
        w.entry(b"k2", b"").unwrap();
        w.finish(&path).unwrap();
        let buf = std::fs::read(&path).unwrap();
        let entries = parse_snapshot(&buf, Partition(3), &path).unwrap();
        assert_eq!(
            entries,
            vec![(&b"k1"[..], &b"v1"[..]), (&b"k2"[..], &b""[..])]
        );
        assert!(
            parse_snapshot(&buf, Partition(4), &path).is_err(),
            "another partition"
        );

        let mut old = buf.clone();
        old[..8].copy_from_slice(MAGIC_V1);
        let err = parse_snapshot(&old, Partition(3), &path)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("format 1") && err.contains("--reset-state earliest"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
