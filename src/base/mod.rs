//! The ground floor: small utilities every layer may import, and that import
//! nothing of tally's own (docs/DEVELOPING.md#layers).
//!
//! - `alloc`: the global allocator's setting (freed memory back to the OS at once);
//! - `clock`: wall and monotonic milliseconds, precise (`now_ms`) and coarse;
//! - `cpus`: the CPUs this process may run on, and whether the file mode runs
//!   step 1 on a thread of its own (`Pipeline`);
//! - `shutdown`: the signal flags the loops check (SIGTERM, SIGINT, SIGHUP);
//! - `histogram`: a log-linear histogram of milliseconds;
//! - `error`: the class of an error (what to do about it), typed refusals, bugs;
//! - `tls`: a TLS acceptor from PEM files and a bounded handshake (OpenSSL);
//! - `duration`, `size`: human durations and byte sizes as the config writes them;
//! - `InvalidKey`: a config value a section's own check refuses, named by its key.

pub mod alloc;
pub mod clock;
pub mod cpus;
pub mod duration;
pub mod error;
pub mod histogram;
pub mod shutdown;
pub mod size;
pub mod tls;

/// A config value that a subsystem's check of its own section refuses: the key,
/// dotted from the top of the file (`checkpoint.retain`), and why. The config tree
/// turns it into its `ConfigError::Invalid`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidKey {
    pub key: String,
    pub msg: String,
}

impl InvalidKey {
    pub fn new(key: impl Into<String>, msg: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            msg: msg.into(),
        }
    }
}

/// Test cases of a property test: `PROPTEST_CASES` when set (a long run, e.g.
/// `scripts/fuzz.sh`), else `default`. proptest's own variable sets only the
/// default config, which a test that names its count overrides.
#[cfg(test)]
pub(crate) fn proptest_cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
