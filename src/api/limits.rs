//! What one client may ask of the usage API at once (`[api]`): a time range of
//! at most `max_range`, at most `max_concurrent` requests in flight in the
//! process, and `rate_limit` requests per second per key (bursts of twice that).
//! Over a limit: 400 naming `from`/`to` for the range, 429 with `Retry-After`
//! for the others (docs/API.md#limits).
//!
//! Invariants: the per-key bucket is an integer token bucket (thousandths of a
//! request), refilled by elapsed milliseconds — no float, no drift; a key's
//! bucket starts full. Pure but for the clock the caller passes in.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// One key's bucket: thousandths of a request, and when it was last refilled.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    milli: u64,
    at_ms: u64,
}

pub(crate) struct Limits {
    pub(crate) max_range_ms: i64,
    in_flight: Arc<Semaphore>,
    max_concurrent: usize,
    /// Requests per second per key; 0: no limit.
    rate: u64,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl Limits {
    pub(crate) fn new(max_range_ms: i64, max_concurrent: usize, rate: u64) -> Limits {
        let max_concurrent = max_concurrent.max(1);
        Limits {
            max_range_ms,
            in_flight: Arc::new(Semaphore::new(max_concurrent)),
            max_concurrent,
            rate,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// A place among the requests in flight, or `None` (429).
    pub(crate) fn enter(&self) -> Option<OwnedSemaphorePermit> {
        self.in_flight.clone().try_acquire_owned().ok()
    }

    pub(crate) fn max_concurrent(&self) -> usize {
        self.max_concurrent
    }

    /// Requests in flight now.
    pub(crate) fn in_flight(&self) -> usize {
        self.max_concurrent - self.in_flight.available_permits()
    }

    /// Returns once no request is in flight (a CSV stream counts until it ends).
    pub(crate) async fn drained(&self) {
        let _ = self
            .in_flight
            .acquire_many(self.max_concurrent as u32)
            .await;
    }

    /// Takes one request from `key`'s bucket at `now_ms` (a monotonic clock);
    /// `Err(seconds)`: empty, retry after that many seconds.
    pub(crate) fn take(&self, key: &str, now_ms: u64) -> Result<(), u64> {
        if self.rate == 0 {
            return Ok(());
        }
        let capacity = 2 * self.rate * 1000;
        let Ok(mut buckets) = self.buckets.lock() else {
            return Ok(());
        };
        let b = buckets.entry(key.to_string()).or_insert(Bucket {
            milli: capacity,
            at_ms: now_ms,
        });
        let elapsed = now_ms.saturating_sub(b.at_ms);
        b.milli = capacity.min(b.milli.saturating_add(elapsed.saturating_mul(self.rate)));
        b.at_ms = now_ms;
        if b.milli >= 1000 {
            b.milli -= 1000;
            return Ok(());
        }
        // Milliseconds until a whole request is back, rounded up to seconds.
        let wait_ms = (1000 - b.milli).div_ceil(self.rate);
        Err(wait_ms.div_ceil(1000).max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_gets_its_burst_then_its_rate_and_keys_are_apart() {
        let l = Limits::new(0, 4, 5);
        for i in 0..10 {
            assert_eq!(l.take("a", 0), Ok(()), "request {i} of the burst");
        }
        assert_eq!(l.take("a", 0), Err(1));
        assert_eq!(l.take("b", 0), Ok(()), "another key has its own bucket");
        // 5 per second: one more every 200 ms.
        assert_eq!(l.take("a", 199), Err(1));
        assert_eq!(l.take("a", 200), Ok(()));
        assert_eq!(l.take("a", 200), Err(1));
        // A long pause refills to the burst, not beyond.
        for _ in 0..10 {
            assert_eq!(l.take("a", 100_000), Ok(()));
        }
        assert_eq!(l.take("a", 100_000), Err(1));
        assert_eq!(Limits::new(0, 1, 0).take("a", 0), Ok(()), "0: no limit");
    }

    #[test]
    fn requests_in_flight_are_bounded() {
        let l = Limits::new(0, 2, 0);
        let a = l.enter().unwrap();
        let _b = l.enter().unwrap();
        assert!(l.enter().is_none());
        drop(a);
        assert!(l.enter().is_some());
    }
}
