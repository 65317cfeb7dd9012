//! SIGTERM/SIGINT → a flag the worker loops check between records; SIGHUP (only
//! where `install_reload` ran: the Kafka worker) → a flag asking it to reload its
//! price table.
//!
//! Invariant: the handler only stores to atomics (async-signal-safe): first the
//! signal's number, then the flag. The Kafka worker and the sink finish the record
//! in hand, commit, and exit 0; the file mode, whose input was not read to its end,
//! checkpoints and exits 128 + the signal's number (docs/reference/exit-codes.md).

#![allow(unsafe_code)] // FFI: signal handlers.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

static REQUESTED: AtomicBool = AtomicBool::new(false);
static RELOAD: AtomicBool = AtomicBool::new(false);

extern "C" fn on_hangup(_: libc::c_int) {
    RELOAD.store(true, Ordering::SeqCst);
}

/// SIGHUP asks for a reload (`take_reload`) instead of ending the process.
pub fn install_reload() {
    let handler = on_hangup as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: `on_hangup` only performs an atomic store, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGHUP, handler);
    }
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

/// Installs the handlers for SIGTERM and SIGINT.
pub fn install() {
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
