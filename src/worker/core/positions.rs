//! Offsets the consumer passes with no record after them: a partition whose log
//! ends in a transaction marker, or in an aborted transaction and its marker.
//! A `read_committed` consumer never hands these over, so no record's offset
//! shows them; librdkafka's position does (it moves past every control record it
//! consumes). The poll thread reads the positions after a poll that found
//! nothing (`kafka::poller::Positions`), so every record before them has been
//! applied by the time they are: the offsets from a partition's next offset up to
//! its position carry no record, and go through the offset ledger like any jump
//! (`ledger::passed`, `ledger::classify`). Without this, a bounded run whose
//! partition ends in a marker would never reach the log end.
//!
//! A position never covers a record this worker did not apply: it is read after
//! the records before it were queued, and applied only under the assignment it
//! was read in (like runs, `kafka::poller`). librdkafka forgets a partition's
//! position when its fetcher stops (an unassign or a seek) and starts a new
//! assignment only once the old fetchers stopped, so a position read under an
//! assignment comes from that assignment's fetch (librdkafka 2.12.1,
//! `rd_kafka_toppar_fetch_stopped`, `rd_kafka_assignment_serve`). The one
//! assignment tally makes itself, after an offset out of range, raises no epoch:
//! no run is dropped, so every record a position covers is applied before it.

use super::{accept_gap, Core};
use crate::checkpoint::ledger;
use crate::kafka::now_ms;
use crate::kafka::source::cached_log_start;
use crate::state::NextOffset;
use crate::worker::kafka::poller::Positions;
use crate::worker::rebalance::Source;
use crate::worker::WorkerError;

impl Core {
    /// Moves each partition's next offset to the consumer's position where the
    /// offsets between carry no record (only under the assignment the positions
    /// were read in, and never past a bounded run's end).
    pub(super) fn pass_positions(
        &mut self,
        consumer: &Source,
        positions: &Positions,
    ) -> Result<(), WorkerError> {
        for (p, position) in &positions.at {
            let Some(slot) = self.slots.get_mut(p) else {
                continue;
            };
            if positions.epoch < slot.assigned_at {
                continue;
            }
            let end = self.bounded.then_some(slot.end);
            let Some(to) = ledger::passed(slot.next.0, *position, end) else {
                continue;
            };
            let low = cached_log_start(consumer, &self.job.topic, *p);
            let skip = ledger::classify(slot.next.0, to, low, now_ms());
            if let Some(gap) = skip.deleted {
                let how = "the consumer's position passed them with no record";
                accept_gap(
                    self.policy,
                    &self.job.topic,
                    *p,
                    gap,
                    &mut slot.offsets,
                    how,
                )?;
            }
            slot.offsets.empty(skip.empty);
            slot.next = NextOffset(to);
        }
        Ok(())
    }
}
