//! SIGTERM/SIGINT → a flag the loops check between records; SIGHUP → a reload
//! where a command reloads (`install_reload`: the Kafka worker reloads its price
//! table), a log line and nothing else everywhere else.
//!
//! Invariants:
//! - Every command installs the handlers first (`install`, from `cli::dispatch`),
//!   so no signal tally documents ever takes its default action: SIGHUP never
//!   ends a tally process (docs/operations/running.md).
//! - The handlers only store to atomics and write one byte to a pipe
//!   (async-signal-safe), keeping `errno`. A thread of its own (`sighup`) reads the
//!   pipe and logs each SIGHUP that no command takes as a reload; a loop never
//!   has to poll for it.
//! - The Kafka worker and the sink finish the record in hand, commit, and exit 0 on
//!   SIGTERM/SIGINT; the file mode, whose input was not read to its end,
//!   checkpoints and exits 128 + the signal's number (docs/reference/exit-codes.md).

#![allow(unsafe_code)] // FFI: signal handlers, the pipe they write to.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Once;

static REQUESTED: AtomicBool = AtomicBool::new(false);
/// A reload was asked for and not yet taken (`take_reload`).
static RELOAD: AtomicBool = AtomicBool::new(false);
/// A command that reloads on SIGHUP is running (`install_reload`).
static RELOADS: AtomicBool = AtomicBool::new(false);
/// The write end of the pipe the SIGHUP handler wakes the logging thread with.
static HANGUP_PIPE: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_hangup(_: libc::c_int) {
    if RELOADS.load(Ordering::SeqCst) {
        RELOAD.store(true, Ordering::SeqCst);
    }
    let fd = HANGUP_PIPE.load(Ordering::SeqCst);
    if fd >= 0 {
        // SAFETY: errno is this thread's; write(2) on a non-blocking pipe is
        // async-signal-safe (a full pipe drops the byte: the thread is behind anyway).
        unsafe {
            let errno = *libc::__errno_location();
            libc::write(fd, [1u8].as_ptr().cast(), 1);
            *libc::__errno_location() = errno;
        }
    }
}

/// Installs the SIGHUP handler and the thread that logs the SIGHUPs no command
/// reloads on (once per process).
fn install_hangup() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let mut fds = [-1; 2];
        // SAFETY: pipe2 fills the two descriptors, owned by this module from here on.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } == 0 {
            // The read end blocks: the thread sleeps in read(2) until a SIGHUP.
            // SAFETY: F_GETFL/F_SETFL on a descriptor just created.
            unsafe {
                let flags = libc::fcntl(fds[0], libc::F_GETFL);
                libc::fcntl(fds[0], libc::F_SETFL, flags & !libc::O_NONBLOCK);
            }
            let read_end = fds[0];
            let spawned = std::thread::Builder::new()
                .name("sighup".into())
                .spawn(move || log_hangups(read_end));
            if spawned.is_ok() {
                HANGUP_PIPE.store(fds[1], Ordering::SeqCst);
            }
        }
        let handler = on_hangup as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // SAFETY: `on_hangup` only uses atomics and write(2), async-signal-safe.
        unsafe {
            libc::signal(libc::SIGHUP, handler);
        }
    });
}

fn log_hangups(fd: libc::c_int) {
    let mut buf = [0u8; 64];
    loop {
        // SAFETY: reads into a buffer this function owns.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        if n <= 0 {
            return;
        }
        if !RELOADS.load(Ordering::SeqCst) {
            tracing::info!(
                "SIGHUP received: this command has nothing to reload, so it is ignored and \
                 keeps running (SIGTERM or SIGINT stops it; `tally run` against Kafka reloads \
                 its price table on SIGHUP)"
            );
        }
    }
}

/// SIGHUP asks for a reload (`take_reload`) from here on, instead of a log line.
pub fn install_reload() {
    install_hangup();
    RELOADS.store(true, Ordering::SeqCst);
}

/// Whether a reload was asked for since the last call.
pub fn take_reload() -> bool {
    RELOAD.swap(false, Ordering::SeqCst)
}

/// The number of the last signal received; 0 for none.
static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNAL.store(sig, Ordering::SeqCst);
    REQUESTED.store(true, Ordering::SeqCst);
}

/// Installs the handlers for SIGTERM and SIGINT, and for SIGHUP (a log line, or a
/// reload after `install_reload`).
pub fn install() {
    install_hangup();
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: `on_signal` only performs atomic stores, which are async-signal-safe.
    unsafe {
        libc::signal(libc::SIGTERM, handler);
        libc::signal(libc::SIGINT, handler);
    }
}

pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}

/// The signal that requested shutdown; `None` if none did (or `request` did).
pub fn signal() -> Option<i32> {
    Some(SIGNAL.load(Ordering::SeqCst)).filter(|s| *s != 0)
}

/// Requests shutdown from inside the process (tests, the demo).
pub fn request() {
    REQUESTED.store(true, Ordering::SeqCst);
}

/// Ends the process with `code` at once, from any thread: no exit handlers, no
/// static destructors. For a stop that hangs (a close that does not return):
/// `std::process::exit` from another thread runs C++ static destructors — the
/// storage engine's thread pools among them — while the hung thread still holds
/// what they wait for, and can hang too. Everything that matters is durable by
/// then (the caller says why); stderr is unbuffered, so the logs are whole.
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit(2) takes an integer and never returns; it is async-signal-safe.
    unsafe { libc::_exit(code) }
}
