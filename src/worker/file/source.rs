//! The input file as a `Read` that a stop request interrupts, even while it waits.
//!
//! Invariants:
//! - Before every read the stop predicate is asked; once it holds, every read fails
//!   with the `Stopped` error (`is_stop`), and nothing more is read.
//! - A regular file is read directly: a read never waits for long, and the check is
//!   one atomic load per read (the reader above reads 1 MiB at a time).
//! - Anything else (a FIFO, a pipe, a terminal, a character device) could block a read
//!   forever, so a read waits in poll(2) first, for at most `POLL_MS` at a time, and
//!   asks the predicate again whenever poll returns: on data, on hang-up, on a timeout,
//!   or when a signal interrupts it (EINTR; `SA_RESTART` never restarts poll).
//! - A FIFO is opened with `O_NONBLOCK` (a blocking open would wait, unstoppable, for a
//!   writer), which is then cleared: reads are blocking, but only after poll said the
//!   FIFO is readable. A FIFO that never had a writer is not readable, so the run waits
//!   for one; after the last writer closes, a read returns end of file.

#![allow(unsafe_code)] // FFI: poll(2) and fcntl(2) on the input's descriptor.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// How long one poll waits before the stop predicate is asked again (a signal
/// delivered to another thread does not interrupt this thread's poll).
const POLL_MS: libc::c_int = 100;

pub(crate) struct Source {
    file: File,
    /// Wait in poll(2) before each read: the input is not a regular file.
    poll: bool,
    stop: fn() -> bool,
}

/// The error of a read after a stop request.
#[derive(Debug)]
struct Stopped;

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("stopped by a shutdown request")
    }
}

impl std::error::Error for Stopped {}

/// Whether `e` is the error of a read after a stop request.
pub(crate) fn is_stop(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<Stopped>())
}

impl Source {
    pub fn open(path: &Path, stop: fn() -> bool) -> io::Result<Self> {
        let kind = std::fs::metadata(path)?.file_type();
        let file = if kind.is_fifo() {
            let file = OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(path)?;
            let fd = file.as_raw_fd();
            // SAFETY: F_GETFL/F_SETFL on a descriptor this function owns.
            let cleared = unsafe {
                let flags = libc::fcntl(fd, libc::F_GETFL);
                flags != -1 && libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) != -1
            };
            if !cleared {
                return Err(io::Error::last_os_error());
            }
            file
        } else {
            File::open(path)?
        };
        Ok(Self {
            poll: !kind.is_file(),
            file,
            stop,
        })
    }

    /// Waits until the input is readable (or hung up): `false` after a timeout or a
    /// signal, to ask the stop predicate again.
    fn readable(&self) -> io::Result<bool> {
        let mut fd = libc::pollfd {
            fd: self.file.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, which outlives the call.
        match unsafe { libc::poll(&mut fd, 1, POLL_MS) } {
            -1 => {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    Ok(false)
                } else {
                    Err(e)
                }
            }
            0 => Ok(false),
            _ => Ok(true),
        }
    }
}

impl Read for Source {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if (self.stop)() {
                return Err(io::Error::other(Stopped));
            }
            if !self.poll || self.readable()? {
                return self.file.read(buf);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[test]
    fn a_regular_file_reads_until_a_stop_is_requested() {
        static STOP: AtomicBool = AtomicBool::new(false);
        let path = std::env::temp_dir().join(format!("tally-source-{}", std::process::id()));
        std::fs::write(&path, b"abc").unwrap();
        let mut s = Source::open(&path, || STOP.load(Ordering::SeqCst)).unwrap();
        assert!(!s.poll);
        let mut buf = [0u8; 2];
        assert_eq!(s.read(&mut buf).unwrap(), 2);
        STOP.store(true, Ordering::SeqCst);
        let e = s.read(&mut buf).unwrap_err();
        assert!(is_stop(&e), "{e}");
        assert!(!is_stop(&io::Error::other("other")));
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_fifo_without_a_writer_neither_blocks_the_open_nor_a_stop() {
        static STOP: AtomicBool = AtomicBool::new(false);
        let path = std::env::temp_dir().join(format!("tally-fifo-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let mut s = Source::open(&path, || STOP.load(Ordering::SeqCst)).unwrap();
        assert!(s.poll);
        let stopper = std::thread::spawn(|| {
            std::thread::sleep(std::time::Duration::from_millis(200));
            STOP.store(true, Ordering::SeqCst);
        });
        let started = std::time::Instant::now();
        let e = s.read(&mut [0u8; 16]).unwrap_err();
        assert!(is_stop(&e), "{e}");
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        stopper.join().unwrap();
        std::fs::remove_file(&path).unwrap();
    }
}
