//! The input file's bytes as lines read them: decompressed on the fly when its name
//! ends in `.gz` (gzip, members concatenated as `cat a.gz b.gz` makes them) or
//! `.zst` (zstd frames), as is; and counted as read from disk, for progress.
//!
//! Invariants:
//! - The count is of the file's own bytes (compressed ones for an archive), so it
//!   compares with the file's size.
//! - A corrupt archive is an I/O error naming the input (the records before it are
//!   applied); a stop request's error passes through the decoder unchanged.

use std::io::{self, BufReader, Read};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// How the input is compressed, by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

impl Compression {
    pub fn of(path: &Path) -> Self {
        match path.extension().and_then(|e| e.to_str()) {
            Some("gz") => Self::Gzip,
            Some("zst") => Self::Zstd,
            _ => Self::None,
        }
    }
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
pub struct BytesRead(Arc<AtomicU64>);

impl BytesRead {
    pub fn get(&self) -> u64 {
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
    let reader: Box<dyn Read + Send> = match c {
        Compression::None => Box::new(counted),
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(BufReader::with_capacity(
            1 << 16,
            counted,
        ))),
        Compression::Zstd => Box::new(zstd::stream::read::Decoder::new(counted)?),
    };
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
            Compression::None
        );
    }
}
