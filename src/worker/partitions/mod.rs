//! The worker's partitions, whichever driver feeds them — the Kafka worker
//! (`worker::kafka`) or the file run (`worker::file`) — and their one port to the
//! world (`Outputs`). This unit owns applying a run of records (offset ledger →
//! engine → routes → outputs, `apply`), the liveness rule (`idle`), the memory
//! policy and the cut a checkpoint takes (`memory`), and the audit and the report
//! (`audit`). It makes no I/O of its own but through `Outputs` and the state store
//! the tasks spill to: what it needs from the consumer (the log start seen with a
//! run, the log ends) is handed to it, so every decision here is a function of
//! what it was given and a test drives it with a `Vec` of records.
//!
//! Invariants:
//! - A run is applied only while its partition is assigned under the epoch it was
//!   read in or an earlier one (`Run::epoch`, `kafka::poller`), and only from the
//!   partition's next offset on; a bounded run applies nothing at or past the log
//!   end seen at assignment.
//! - Every offset a partition's next offset moves over is a record (consumed), an
//!   empty offset or an accepted gap (`checkpoint::ledger`): both audits — each
//!   record consumed has one route; `consumed + empty + gaps == next` — hold after
//!   every call (`balanced`). A gap is refused unless the start policy accepts it.
//! - Every record applied takes exactly one route, and what that route sends goes to
//!   `Outputs` in the engine's order: a run's panes (with their progress records)
//!   before its too-late records and dead letters.
//! - The memory budget is checked every 4,096 records applied (and after a run
//!   with panes), against the tasks' state plus the checkpoint delta in flight;
//!   over it, `spill_due` says so until the next eviction, which a driver runs
//!   through `spill` (or a checkpoint). Windows are evicted only when every window equals its stored copy
//!   (right after a spill or a settled checkpoint).
//! - A window end firing in steps (`engine::task`'s `firing`) stops its run after
//!   the record that started it; the driver spills when due and applies the run
//!   again, which resumes the firing a step at a time, then the rest of the run
//!   (the offsets it skips are accounted once, `Slot::skips_through`). A checkpoint
//!   finishes every firing before its cut.
//! - A crash anywhere replays from the newest complete checkpoint; replayed outputs
//!   are byte-identical to the originals (same versions).

mod apply;
mod audit;
mod idle;
mod memory;
mod outputs;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

pub(crate) use outputs::{NoGroup, OutputPorts, Outputs, Record};

use super::lag;
use super::WorkerError;
use crate::base::clock;
use crate::checkpoint::OffsetLedger;
use crate::engine::{EngineConfig, PartitionTask, Prepared, RecordIn, ResultRecord, Route};
use crate::kafka::source::StartPolicy;
use crate::model::Partition;
use crate::state::NextOffset;

pub(crate) use apply::{log_accepted_gap, log_onboarded};

/// Consecutive records of one partition, in increasing offsets, through step 1 of
/// the rules (`Prepared`), as a driver read them.
pub(crate) trait Run {
    fn partition(&self) -> Partition;
    /// The assignment epoch the records were read under (a file run: 0).
    fn epoch(&self) -> u64;
    /// The partition's log start as the reader last saw it when it read these
    /// records (`None`: not known; then no skipped offset is taken as deleted).
    fn log_start(&self) -> Option<i64>;
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn offset(&self, i: usize) -> i64;
    /// Step 1 of every record, in order.
    fn prepared(&self) -> &Prepared;
    /// The `i`-th record as the engine reads it, ingested at `now_ms` (step 1 again,
    /// when the configuration changed since).
    fn record_in(&self, i: usize, now_ms: i64) -> RecordIn<'_>;
    /// The `i`-th record as an output carries it.
    fn record(&self, i: usize) -> Record<'_>;
}

/// The records of `run` with offsets in `[from, to)`: a range, offsets increasing.
pub(crate) fn within(run: &impl Run, from: i64, to: i64) -> Range<usize> {
    let first_at_or_past = |o: i64| {
        let (mut lo, mut hi) = (0, run.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if run.offset(mid) < o {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    };
    let start = first_at_or_past(from);
    start..first_at_or_past(to).max(start)
}

/// One owned partition.
struct Slot {
    task: PartitionTask,
    next: NextOffset,
    /// Log end when the partition was assigned (for a bounded run).
    end: i64,
    /// `clock::mono_ms()` of this partition's last record.
    last_record: i64,
    /// `clock::mono_ms()` when the liveness rule last looked at it.
    checked_at: i64,
    /// Where the offsets before `next` went (checkpointed with the state).
    offsets: OffsetLedger,
    /// The assignment epoch that assigned the partition.
    assigned_at: u64,
    /// The offsets skipped before this one are accounted (a run stopped by a
    /// window end firing in steps is applied again from `next`).
    skips_through: i64,
}

/// What a partition starts from when it is assigned.
pub(crate) struct Start {
    pub next: NextOffset,
    /// The log end seen at assignment (a bounded run stops there; `i64::MAX`: none).
    pub end: i64,
    pub offsets: OffsetLedger,
    /// The assignment epoch.
    pub epoch: u64,
}

/// What every partition shares.
#[derive(Clone)]
pub(crate) struct Settings {
    pub engine: Arc<EngineConfig>,
    /// The input, as refusals name it.
    pub topic: String,
    pub policy: StartPolicy,
    /// A bounded run (`--until-end`): records at or past a partition's log end as
    /// seen at assignment are not applied.
    pub bounded: bool,
    /// `watermark.idle_timeout`, ms.
    pub idle_ms: Option<i64>,
    /// Bytes of state these partitions may hold in memory (`state.memory_budget`).
    pub memory_budget: Option<usize>,
}

/// The memory policy's state (see the module header).
#[derive(Default)]
struct Memory {
    /// Records since the last check.
    since_check: u32,
    /// Over the budget: spill now.
    spill_due: bool,
    /// Windows evicted so far.
    evicted: u64,
    /// The bytes of the last checkpoint's deltas its export has not written yet
    /// (`checkpoint::export`; 0 once written).
    in_flight: Option<std::sync::Arc<std::sync::atomic::AtomicUsize>>,
}

/// The partitions a worker owns, generic over where their outputs go.
pub(crate) struct Partitions<O> {
    settings: Settings,
    slots: BTreeMap<Partition, Slot>,
    /// The panes of the run being applied (reused).
    panes: Vec<ResultRecord>,
    /// The routes of the run being applied (reused).
    routes: Vec<Route>,
    outputs: O,
    memory: Memory,
    /// Partitions of the input and of the results topic, for progress records
    /// (finality); `None`: not known, no progress records.
    progress_to: Option<(i32, i32)>,
}

impl<O: Outputs> Partitions<O> {
    pub(crate) fn new(settings: Settings, outputs: O) -> Self {
        Self {
            settings,
            slots: BTreeMap::new(),
            panes: Vec::new(),
            routes: Vec::new(),
            outputs,
            memory: Memory::default(),
            progress_to: None,
        }
    }

    pub(crate) fn outputs(&self) -> &O {
        &self.outputs
    }

    pub(crate) fn outputs_mut(&mut self) -> &mut O {
        &mut self.outputs
    }

    pub(crate) fn engine(&self) -> &Arc<EngineConfig> {
        &self.settings.engine
    }

    pub(crate) fn policy(&self) -> StartPolicy {
        self.settings.policy
    }

    /// `watermark.idle_timeout`, ms.
    pub(crate) fn idle_ms(&self) -> Option<i64> {
        self.settings.idle_ms
    }

    /// Progress records go to `(input partitions, results partitions)`.
    pub(crate) fn send_progress_to(&mut self, to: (i32, i32)) {
        self.progress_to = Some(to);
    }

    /// Takes `p` over from `start` with its task (restored or new).
    pub(crate) fn assign(&mut self, p: Partition, task: PartitionTask, start: Start) {
        let slot = Slot {
            task,
            next: start.next,
            end: start.end,
            last_record: clock::mono_ms(),
            checked_at: i64::MIN,
            offsets: start.offsets,
            assigned_at: start.epoch,
            skips_through: i64::MIN,
        };
        self.slots.insert(p, slot);
    }

    /// Lets `p` go (its state stays wherever it was committed).
    pub(crate) fn remove(&mut self, p: Partition) {
        self.slots.remove(&p);
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The owned partitions, in order.
    pub(crate) fn owned(&self) -> impl Iterator<Item = Partition> + '_ {
        self.slots.keys().copied()
    }

    /// Each owned partition's next offset.
    pub(crate) fn next_offsets(&self) -> impl Iterator<Item = (Partition, NextOffset)> + '_ {
        self.slots.iter().map(|(p, s)| (*p, s.next))
    }

    /// Each owned partition's position, for the consumer lag (`worker::lag`).
    pub(crate) fn lag_positions(&self) -> impl Iterator<Item = (Partition, lag::Position)> + '_ {
        self.slots.iter().map(|(p, s)| {
            let at = lag::Position {
                next: s.next,
                end_at_assign: s.end,
            };
            (*p, at)
        })
    }

    /// A partition's share of the memory budget once `more` partitions join.
    pub(crate) fn share_with(&self, more: usize) -> Option<usize> {
        let n = (self.slots.len() + more).max(1);
        self.settings.memory_budget.map(|b| b / n)
    }

    /// Every owned partition is read to the log end seen at its assignment
    /// (`ledger::drained`).
    pub(crate) fn drained(&self) -> bool {
        let drained = |s: &Slot| crate::checkpoint::ledger::drained(s.next, s.end);
        self.slots.values().all(drained)
    }

    /// Each owned partition's high-water `completed_ts` (a price reload's rule).
    pub(crate) fn high_waters(&self) -> impl Iterator<Item = (Partition, Option<i64>)> + '_ {
        let hw = |s: &Slot| s.task.high_water().map(|t| t.0);
        self.slots.iter().map(move |(p, s)| (*p, hw(s)))
    }

    /// Applies records from now on under `engine` (a price reload).
    pub(crate) fn set_engine(&mut self, engine: Arc<EngineConfig>) {
        for s in self.slots.values_mut() {
            s.task.set_config(engine.clone());
        }
        self.settings.engine = engine;
    }

    /// End of input: every open window emits its panes (not checkpointed; see
    /// `PartitionTask::end_of_input`), partition by partition, a step at a time:
    /// each step's panes are sent before the next is read (its windows are
    /// dropped, so no spill is needed between steps).
    pub(crate) fn end_of_input(&mut self) -> Result<(), WorkerError> {
        for slot in self.slots.values_mut() {
            loop {
                let done = slot.task.end_of_input_step(&mut self.panes)?;
                for pane in self.panes.drain(..) {
                    self.outputs.result(&pane)?;
                }
                if done {
                    break;
                }
            }
            self.panes.shrink_to(apply::PANES_KEPT);
        }
        Ok(())
    }
}
