//! The allocator's one setting (mimalloc, the global allocator of both
//! binaries): memory a thread frees goes back to the OS at once, not a second
//! later. A worker's peak RSS is its state budget plus a fixed overhead
//! (docs/DESIGN.md §7.7); with mimalloc's default delay, pages freed by an
//! eviction, a spill or an export stayed resident while the next ones were
//! faulted in: 27–73 MiB more at the peak in `tally-dev bench-memory` and
//! the Kafka benchmark, for no measurable CPU there and in the file mode, and
//! about a sixth more CPU (system time) where a budget evicts windows all the
//! time (docs/BENCHMARKS.md §4.2).
//!
//! An operator's own `MIMALLOC_PURGE_DELAY` wins (mimalloc reads it at start).
//!
//! The C and C++ libraries (RocksDB, librdkafka) allocate with the system's
//! allocator, glibc's, which by default gives each thread that allocates at the
//! same time as another an arena of its own (up to eight a core), and an arena
//! keeps what its thread freed. Two arenas in all: the Kafka worker at 400,000
//! tenants under a 16 MiB budget peaked at 119–127 MiB against 151–159 MiB
//! with glibc's default, for the same seconds (docs/BENCHMARKS.md §4.2). An
//! operator's own `MALLOC_ARENA_MAX` wins.

#![allow(unsafe_code)] // FFI: mimalloc's option table, glibc's mallopt.

/// mimalloc's `mi_option_purge_delay` (the index in `mi_option_e` of the
/// mimalloc v3 that `libmimalloc-sys` builds; its default there is 1,000 ms,
/// which the test below checks, so a renumbering is caught).
const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Makes mimalloc purge freed memory at once, unless `MIMALLOC_PURGE_DELAY` is
/// set. Call first thing in `main`.
pub fn purge_freed_memory_at_once() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    // SAFETY: `mi_option_set` stores an integer in mimalloc's option table; it
    // takes any option and value, from any thread, before or after allocating.
    unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, 0) }
}

/// Arenas of the system allocator (glibc's `M_ARENA_MAX`).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const SYSTEM_ARENAS: libc::c_int = 2;

/// Bounds the system allocator's arenas to `SYSTEM_ARENAS`, unless
/// `MALLOC_ARENA_MAX` is set; returns whether it did. Call first thing in `main`,
/// before any thread starts. A no-op (false) where the C library is not glibc.
pub fn bound_system_arenas() -> bool {
    if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
        return false;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `mallopt` sets one integer parameter of glibc's allocator; it
        // returns 1 on success, 0 for an unknown parameter or value.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, SYSTEM_ARENAS) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn glibc_takes_the_arena_bound() {
        if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
            assert!(bound_system_arenas(), "glibc refused M_ARENA_MAX");
        }
    }

    fn get() -> std::os::raw::c_long {
        // SAFETY: reads one integer of mimalloc's option table.
        unsafe { libmimalloc_sys::mi_option_get(PURGE_DELAY) }
    }

    #[test]
    fn the_option_is_the_purge_delay_and_is_set_to_zero() {
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            assert_eq!(
                get(),
                1000,
                "option {PURGE_DELAY} is not the purge delay (1 s)"
            );
            purge_freed_memory_at_once();
            assert_eq!(get(), 0);
        }
    }
}
