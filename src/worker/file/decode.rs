//! The input file's bytes as lines read them: decompressed on the fly when its name
//! ends in `.gz` (gzip, members concatenated as `cat a.gz b.gz` makes them) or
//! `.zst` (zstd frames), in any case (`.GZ`), or, whatever its name, when it starts
//! with gzip's or zstd's magic bytes; as is otherwise; and counted as read from
//! disk, for progress.
//!
//! Invariants:
//! - A JSON line cannot start with either magic (`1f 8b`, `28 b5 2f fd`: a control
//!   character, or `(` and a byte that is not UTF-8), so sniffing never takes a
//!   file of records for an archive. The first bytes are sniffed on the first read
//!   (on the reading thread, so a FIFO that waits for a writer blocks nothing).
//! - The count is of the file's own bytes (compressed ones for an archive), so it
//!   compares with the file's size.
//! - A corrupt archive is an I/O error naming the input (the records before it are
//!   applied); a stop request's error passes through the decoder unchanged.

use std::io::{self, BufReader, Read};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// How the input is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Compression {
    None,
    Gzip,
    Zstd,
    /// Not named by the file: decided by its first bytes.
    ByMagic,
}

const GZIP_MAGIC: &[u8] = &[0x1f, 0x8b];
const ZSTD_MAGIC: &[u8] = &[0x28, 0xb5, 0x2f, 0xfd];

impl Compression {
    /// By the name's suffix, in any case; `ByMagic` without one.
    pub(crate) fn of(path: &Path) -> Self {
        let ext = path.extension().and_then(|e| e.to_str());
        match ext.map(str::to_ascii_lowercase).as_deref() {
            Some("gz" | "gzip") => Self::Gzip,
            Some("zst" | "zstd") => Self::Zstd,
            _ => Self::ByMagic,
        }
    }

    fn of_magic(head: &[u8]) -> Self {
        if head.starts_with(GZIP_MAGIC) {
            Self::Gzip
        } else if head.starts_with(ZSTD_MAGIC) {
            Self::Zstd
        } else {
            Self::None
        }
    }
}

/// A reader that decides its decompression by the first bytes it reads.
enum Sniffed<R> {
    Undecided(Option<R>),
    Decided(Box<dyn Read + Send>),
}

impl<R: Read + Send + 'static> Read for Sniffed<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Sniffed::Undecided(raw) = self {
            let Some(mut raw) = raw.take() else {
                return Err(io::Error::other("input lost after an error"));
            };
            let mut head = Vec::with_capacity(ZSTD_MAGIC.len());
            let mut chunk = [0u8; 4];
            while head.len() < ZSTD_MAGIC.len() {
                match raw.read(&mut chunk[..ZSTD_MAGIC.len() - head.len()]) {
                    Ok(0) => break,
                    Ok(n) => head.extend_from_slice(&chunk[..n]),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        // Keep the input (a stop request's error is not the end).
                        *self = Sniffed::Undecided(Some(raw));
                        return Err(e);
                    }
                }
            }
            let c = Compression::of_magic(&head);
            // Boxed: one reader type whatever `R`, so `decoder` is not instantiated
            // for ever longer chains.
            let raw: Box<dyn Read + Send> = Box::new(io::Cursor::new(head).chain(raw));
            *self = Sniffed::Decided(decoder(raw, c)?);
        }
        match self {
            Sniffed::Decided(r) => r.read(buf),
            Sniffed::Undecided(_) => Err(io::Error::other("input lost after an error")),
        }
    }
}

fn decoder<R: Read + Send + 'static>(raw: R, c: Compression) -> io::Result<Box<dyn Read + Send>> {
    Ok(match c {
        Compression::None => Box::new(raw),
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(BufReader::with_capacity(
            1 << 16,
            raw,
        ))),
        Compression::Zstd => Box::new(zstd::stream::read::Decoder::new(raw)?),
        Compression::ByMagic => Box::new(Sniffed::Undecided(Some(raw))),
    })
}

/// Counts the bytes read through it.
struct Counted<R> {
    inner: R,
    read: BytesRead,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read.0.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// The bytes of the file read so far (shared with the reader that counts them).
/// The bytes of the file read so far (shared with the thread that reads it).
#[derive(Debug, Clone, Default)]
pub(crate) struct BytesRead(Arc<AtomicU64>);

impl BytesRead {
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The decompressed bytes of `raw`, and the count of its own bytes read so far.
pub fn open<R: Read + Send + 'static>(
    raw: R,
    c: Compression,
) -> io::Result<(Box<dyn Read + Send>, BytesRead)> {
    let read = BytesRead::default();
    let counted = Counted {
        inner: raw,
        read: read.clone(),
    };
    let reader = decoder(counted, c)?;
    Ok((reader, read))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const TEXT: &[u8] = b"{\"a\":1}\n{\"b\":2}\n";

    fn read_all(bytes: Vec<u8>, c: Compression) -> io::Result<(Vec<u8>, u64)> {
        let len = bytes.len() as u64;
        let (mut r, n) = open(io::Cursor::new(bytes), c)?;
        let mut out = Vec::new();
        r.read_to_end(&mut out)?;
        assert_eq!(n.get(), len, "every byte of the file counted");
        Ok((out, n.get()))
    }

    #[test]
    fn archives_are_decompressed_and_their_own_bytes_counted() {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(TEXT).unwrap();
        let one = gz.finish().unwrap();
        // Two members, as `cat a.gz b.gz` writes them.
        let two = [one.clone(), one].concat();
        assert_eq!(
            read_all(two, Compression::Gzip).unwrap().0,
            [TEXT, TEXT].concat()
        );
        let zst = zstd::encode_all(TEXT, 1).unwrap();
        assert_eq!(read_all(zst, Compression::Zstd).unwrap().0, TEXT);
        assert_eq!(read_all(TEXT.to_vec(), Compression::None).unwrap().0, TEXT);
        // Not an archive: an error, not garbage.
        assert!(read_all(TEXT.to_vec(), Compression::Gzip).is_err());
        assert!(read_all(TEXT.to_vec(), Compression::Zstd).is_err());
        assert_eq!(
            Compression::of(Path::new("d/events.jsonl.gz")),
            Compression::Gzip
        );
        assert_eq!(Compression::of(Path::new("events.zst")), Compression::Zstd);
        assert_eq!(
            Compression::of(Path::new("events.jsonl")),
            Compression::ByMagic
        );
    }

    /// Issue 33: a suffix in another case (`.GZ`) is still an archive, and so is
    /// an archive under any name (its magic bytes); records are never taken for one.
    #[test]
    fn archives_are_known_by_any_case_of_their_suffix_or_by_their_magic() {
        for (name, c) in [
            ("events.jsonl.GZ", Compression::Gzip),
            ("events.Gz", Compression::Gzip),
            ("events.ZST", Compression::Zstd),
            ("events.jsonl.Zstd", Compression::Zstd),
        ] {
            assert_eq!(Compression::of(Path::new(name)), c, "{name}");
        }
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(TEXT).unwrap();
        let gz = gz.finish().unwrap();
        assert_eq!(read_all(gz, Compression::ByMagic).unwrap().0, TEXT);
        let zst = zstd::encode_all(TEXT, 1).unwrap();
        assert_eq!(read_all(zst, Compression::ByMagic).unwrap().0, TEXT);
        for plain in [TEXT, b"", b"{", b"(x)\n"] {
            assert_eq!(
                read_all(plain.to_vec(), Compression::ByMagic).unwrap().0,
                plain
            );
        }
    }
}
