//! The liveness rule (docs/DESIGN.md §4.3, `time::liveness`): a caught-up
//! partition silent for `idle_timeout` follows the wall clock. Forced only when
//! that fires or purges something, or moves the partition's progress (finality,
//! DESIGN §6.1); the forced value is part of the checkpointed watermark.
//!
//! A forced watermark may leave a window end firing in steps (`engine::task`'s
//! `firing`): the driver resumes it (`resume_firings`), spilling between steps
//! when the memory check says so, before anything else is applied or cut.

use tracing::{debug, info};

use super::apply::send_panes;
use super::{clock, Outputs, Partitions, Slot};
use crate::model::Partition;
use crate::time::liveness::{self, Quiet};
use crate::time::EventTime;
use crate::worker::WorkerError;

impl<O: Outputs> Partitions<O> {
    /// Applies the liveness rule; `log_end` is each partition's log end as the
    /// reader last saw it (`None`: not known, so not caught up).
    pub(crate) fn advance_idle(
        &mut self,
        log_end: impl Fn(Partition) -> Option<i64>,
    ) -> Result<(), WorkerError> {
        let Some(idle) = self.settings.idle_ms else {
            return Ok(());
        };
        let now = clock::mono_ms();
        // A partition is looked at when it had records since the last look (held
        // ones may be trusted now) or has been silent for `idle`.
        let due = |s: &Slot| s.last_record >= s.checked_at || now - s.last_record >= idle;
        if !self.slots.values().any(due) {
            return Ok(());
        }
        let wall = clock::wall_ms();
        let bound = self.settings.engine.max_out_of_orderness_ms;
        let generation = self.settings.engine.generation;
        for (p, slot) in self.slots.iter_mut() {
            if !due(slot) {
                continue;
            }
            slot.checked_at = now;
            let silence = now - slot.last_record;
            // `next` passes offsets without a record (a trailing transaction
            // marker) once a poll comes back empty (`Partitions::pass`).
            let caught_up = log_end(*p).is_some_and(|end| slot.next.0 >= end);
            if !caught_up {
                continue;
            }
            let state = slot.task.watermark_state();
            let quiet = Quiet {
                caught_up,
                silence_ms: silence,
                max_ts: state.max_ts(),
                latest: state.latest(),
            };
            let Some(forced) = liveness::forced(quiet, idle, wall, bound).map(EventTime) else {
                continue;
            };
            let fires = slot.task.next_deadline().is_some_and(|d| forced >= d);
            // Finality: a silent partition's progress follows the clock too.
            let progresses = self.progress_to.is_some() && slot.task.progress_at(forced);
            if !(fires || progresses) {
                continue;
            }
            slot.task.force_watermark(forced, &mut self.panes)?;
            let to = self.progress_to;
            send_panes(&mut self.outputs, slot, &mut self.panes, to, generation)?;
            let why = if silence >= idle {
                "quiet partition: watermark advanced by wall clock"
            } else {
                "caught-up partition: held event times trusted up to the wall clock"
            };
            if fires {
                info!(
                    partition = p.0,
                    silence_ms = silence,
                    watermark = forced.0,
                    "{why}"
                );
            } else {
                debug!(
                    partition = p.0,
                    silence_ms = silence,
                    watermark = forced.0,
                    "{why} (finality)"
                );
            }
        }
        Ok(())
    }

    /// Whether a partition has a window end firing in steps.
    pub(crate) fn firing(&self) -> bool {
        self.slots.values().any(|s| s.task.firing())
    }

    /// One step of every partition's pending firing: its panes sent, then the
    /// memory check. Returns whether one is still firing.
    pub(crate) fn resume_firings(&mut self) -> Result<bool, WorkerError> {
        let generation = self.settings.engine.generation;
        let mut firing = false;
        for slot in self.slots.values_mut().filter(|s| s.task.firing()) {
            firing |= !slot.task.resume_firing(&mut self.panes)?;
            let to = self.progress_to;
            send_panes(&mut self.outputs, slot, &mut self.panes, to, generation)?;
            self.panes.shrink_to(super::apply::PANES_KEPT);
        }
        self.count_for_memory(0, true);
        Ok(firing)
    }
}
