//! SIGTERM/SIGINT → a flag the worker loops check between records.
//!
//! Invariant: the handler only stores to an atomic (async-signal-safe); the loops
//! finish the record in hand, commit, and exit 0.

#![allow(unsafe_code)] // FFI: signal handlers.

use std::sync::atomic::{AtomicBool, Ordering};

static REQUESTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    REQUESTED.store(true, Ordering::SeqCst);
}

/// Installs the handlers for SIGTERM and SIGINT.
pub fn install() {
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: `on_signal` only performs an atomic store, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGTERM, handler);
        libc::signal(libc::SIGINT, handler);
    }
}

pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}

/// Requests shutdown from inside the process (tests, the demo).
pub fn request() {
    REQUESTED.store(true, Ordering::SeqCst);
}
