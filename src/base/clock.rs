//! Clocks in milliseconds. `now_ms` is the precise wall clock. The coarse clocks
//! are for the per-record path: the kernel's tick-resolution clocks (1–4 ms) read
//! without touching the hardware counter — about 5 ns a read here, against 23 ns
//! for the precise ones (measured; see docs/BENCHMARKS.md). Good for event delays
//! and idleness (milliseconds and seconds), not for latency measurement.

#![allow(unsafe_code)] // FFI: clock_gettime (coarse clocks).

fn read(clock: libc::clockid_t) -> i64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a valid out-pointer.
    unsafe { libc::clock_gettime(clock, &mut t) };
    t.tv_sec * 1_000 + t.tv_nsec / 1_000_000
}

/// Wall clock, Unix milliseconds (tick resolution).
pub fn wall_ms() -> i64 {
    read(libc::CLOCK_REALTIME_COARSE)
}

/// A monotonic clock in milliseconds (tick resolution), for intervals.
pub fn mono_ms() -> i64 {
    read(libc::CLOCK_MONOTONIC_COARSE)
}

/// Wall clock, Unix milliseconds (precise; 0 if the clock is before 1970).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
