//! Named crash points for fault-injection tests.
//!
//! `TALLY_CRASH_AT=<name>[:<n>]` makes the process abort like SIGKILL (no
//! unwinding, no flush, no destructor) the `n`-th time (default 1st) execution
//! reaches `hit("<name>")`. Unset, `hit` costs one relaxed atomic load.
//!
//! `TALLY_PANIC_AT=<name>[:<n>]` makes the `n`-th `hit("<name>")` panic instead,
//! in whatever thread reached it: the exit status of a bug (1, `ErrorClass::
//! Internal`). Every crash point is also a pause point (below).
//!
//! `TALLY_PAUSE_AT=<name>:<ms>` makes every `pause("<name>")` sleep `ms`
//! milliseconds (0 without `:<ms>`): a test slows one step down to hold a race
//! window open (the Kafka loop's `apply_chunk`, so that a rebalance finds chunks
//! queued). Unset, `pause` costs the same load. Each armed pause logs its start
//! and its end (`pause point: sleeping`, `pause point: resumed`), so a test can
//! tell when the step is held.

#![allow(unsafe_code)] // FFI: raise(SIGKILL) at a crash point.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

static TARGET: OnceLock<Option<(String, u64)>> = OnceLock::new();
static HITS: AtomicU64 = AtomicU64::new(0);
static PAUSE: OnceLock<Option<(String, u64)>> = OnceLock::new();
static PANIC: OnceLock<Option<(String, u64)>> = OnceLock::new();
static PANIC_HITS: AtomicU64 = AtomicU64::new(0);

/// `<name>[:<n>]` from the environment variable `var`; `n` is `default` when
/// absent or not a number.
fn armed(var: &str, default: u64) -> Option<(String, u64)> {
    let v = std::env::var(var).ok()?;
    Some(match v.split_once(':') {
        Some((name, n)) => (name.to_string(), n.parse().unwrap_or(default)),
        None => (v, default),
    })
}

fn target() -> &'static Option<(String, u64)> {
    TARGET.get_or_init(|| armed("TALLY_CRASH_AT", 1).map(|(name, n)| (name, n.max(1))))
}

/// Aborts the process if this crash point is armed and its count is reached;
/// panics if it is armed as a panic point; sleeps if it is armed as a pause
/// point.
pub fn hit(name: &str) {
    if let Some((armed, n)) = PANIC.get_or_init(|| armed("TALLY_PANIC_AT", 1)) {
        if armed == name && PANIC_HITS.fetch_add(1, Ordering::Relaxed) + 1 == (*n).max(1) {
            panic!("panic point {name} reached (TALLY_PANIC_AT)");
        }
    }
    pause(name);
    if let Some((armed, n)) = target() {
        if armed == name && HITS.fetch_add(1, Ordering::Relaxed) + 1 == *n {
            eprintln!("tally: crash point {name} reached; aborting");
            // SIGKILL ourselves: the same as `kill -9` from outside.
            // SAFETY: plain syscall with our own pid.
            unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
            std::process::abort();
        }
    }
}

/// Sleeps if this pause point is armed (`TALLY_PAUSE_AT`).
pub fn pause(name: &str) {
    if let Some((armed, ms)) = PAUSE.get_or_init(|| armed("TALLY_PAUSE_AT", 0)) {
        if armed == name {
            tracing::info!(point = name, ms, "pause point: sleeping");
            std::thread::sleep(std::time::Duration::from_millis(*ms));
            tracing::info!(point = name, "pause point: resumed");
        }
    }
}
