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

#![allow(unsafe_code)] // FFI: mimalloc's option table.

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

#[cfg(test)]
mod tests {
    use super::*;

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
