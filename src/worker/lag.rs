//! The consumer lag, true when scraped: `tally_consumer_lag_records` is computed
//! by the `/metrics` handler on the service thread (`service::LiveFamilies`; the
//! `/status` page's lag the same way, `service::LiveLags`), not
//! by the worker loop, so it stays right while the loop is held — a large chunk,
//! a spill, a checkpoint barrier, a pause point — when an operator needs it most.
//!
//! The worker publishes each owned partition's position (its next offset: the next
//! offset it has not applied) into `Applied` whenever it moves one or the
//! assignment changes: after every chunk, an offset-out-of-range recovery, an
//! assignment and a revoke. A scrape reads those positions and each partition's
//! log end from librdkafka's cache (the last fetch response, no network round
//! trip), or before the first fetch the log end read at assignment:
//! lag = log end − position, never below 0. librdkafka stops fetching a
//! partition whose fetch queue is full (`queued.max.messages.kbytes`), so through
//! a long hold under a large backlog the cached log end stays as of then: the lag
//! is then a lower bound.
//!
//! Invariants:
//! - `Applied` holds exactly the partitions the worker owned at its last
//!   publish: a revoked partition leaves the metric at its revoke.
//! - A scrape never takes the worker's lock: `Applied` has its own, held only to
//!   copy a few pairs in or out.
//! - The hook holds the consumer weakly, and `Hook` removes it before the
//!   worker drops the consumer (`service::State::set_live_metrics` waits for a
//!   running scrape): the consumer is never closed on the service thread.

use std::sync::{Arc, Mutex, Weak};

use super::rebalance::Source;
use crate::kafka::source::cached_log_end;
use crate::metrics::exposition;
use crate::model::NextOffset;
use crate::model::Partition;
use crate::service::State;

/// A partition's position and what its log end was at assignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Position {
    pub next: NextOffset,
    /// The log end read at assignment: the lag's log end before the first fetch.
    pub end_at_assign: i64,
}

/// Each owned partition's position, as the worker last published them.
#[derive(Debug, Default)]
pub(crate) struct Applied(Mutex<Vec<(Partition, Position)>>);

impl Applied {
    /// Replaces the positions with `owned` (every partition the worker owns).
    pub(crate) fn publish(&self, owned: impl Iterator<Item = (Partition, Position)>) {
        let mut at = self.0.lock().unwrap_or_else(|e| e.into_inner());
        at.clear();
        at.extend(owned);
    }

    pub fn snapshot(&self) -> Vec<(Partition, Position)> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Each partition's lag: its log end (`log_end`, else the one read at
/// assignment) minus its position, never below 0.
pub(crate) fn lags(
    positions: &[(Partition, Position)],
    log_end: impl Fn(Partition) -> Option<i64>,
) -> Vec<(Partition, i64)> {
    positions
        .iter()
        .map(|(p, at)| {
            let end = log_end(*p).unwrap_or(at.end_at_assign);
            (*p, (end - at.next.0).max(0))
        })
        .collect()
}

/// The consumer lag family on `service` while it lives; removed when dropped
/// (drop it before the consumer).
pub(crate) struct Hook {
    service: Arc<State>,
}

impl Hook {
    /// Renders the lag of `topic`'s partitions in `applied` at every scrape.
    pub(crate) fn install(
        service: Arc<State>,
        applied: Arc<Applied>,
        consumer: &Arc<Source>,
        topic: &str,
    ) -> Self {
        let consumer: Weak<Source> = Arc::downgrade(consumer);
        let topic: Arc<str> = topic.into();
        let now = move || {
            let positions = applied.snapshot();
            match consumer.upgrade() {
                Some(c) => lags(&positions, |p| cached_log_end(&c, &topic, p)),
                None => lags(&positions, |_| None),
            }
        };
        let now = Arc::new(now);
        let for_status = now.clone();
        service.set_live_metrics(Some(Box::new(move || exposition::consumer_lag(&now()))));
        service.set_live_lags(Some(Box::new(move || for_status())));
        Self { service }
    }
}

impl Drop for Hook {
    fn drop(&mut self) {
        self.service.set_live_metrics(None);
        self.service.set_live_lags(None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(next: i64, end_at_assign: i64) -> Position {
        Position {
            next: NextOffset(next),
            end_at_assign,
        }
    }

    #[test]
    fn lag_is_the_fetched_log_end_minus_the_position() {
        let applied = Applied::default();
        applied.publish([(Partition(0), at(3, 10)), (Partition(1), at(0, 40))].into_iter());
        // Partition 0 fetched (log end 25); partition 1 not yet: its end at assignment.
        let fetched = |p: Partition| (p == Partition(0)).then_some(25);
        assert_eq!(
            lags(&applied.snapshot(), fetched),
            vec![(Partition(0), 22), (Partition(1), 40)]
        );
        // Never below 0 (a cached log end older than the position).
        assert_eq!(
            lags(&[(Partition(2), at(9, 0))], |_| Some(7)),
            vec![(Partition(2), 0)]
        );
    }

    #[test]
    fn a_partition_no_longer_owned_leaves_the_metric() {
        let applied = Applied::default();
        applied.publish([(Partition(0), at(0, 5)), (Partition(1), at(0, 5))].into_iter());
        applied.publish([(Partition(1), at(2, 5))].into_iter());
        let text = exposition::consumer_lag(&lags(&applied.snapshot(), |_| None));
        assert!(!text.contains("partition=\"0\""), "{text}");
        assert!(
            text.contains("tally_consumer_lag_records{partition=\"1\"} 3.0"),
            "{text}"
        );
        applied.publish(std::iter::empty());
        assert!(applied.snapshot().is_empty());
    }
}
