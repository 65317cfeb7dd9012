//! The partition task: dedup, windows, panes, purge — pure logic, no I/O.
//!
//! One `PartitionTask` owns every window, watermark and dedup entry of one input
//! partition (docs/DESIGN.md §2). Feed it record payloads in partition order; it returns
//! each record's `Route` and appends the panes that record caused. Everything it
//! decides is a function of the payloads, their order and the configuration —
//! except the `max_future` guard and processing-time modes, which read the `now_ms`
//! the caller passes in.
//!
//! Under a memory budget, windows and dedup ids move to a store behind ports
//! (`spill`, `cold`); every task call that may read or move through them returns
//! the store's failure (`SpillError`) with the output it voids.

mod acc;
mod acc_rated;
pub mod bloom;
pub mod cold;
pub mod config;
pub mod dedup;
pub mod fpset;
mod prepared;
mod result;
pub mod spill;
mod spill_error;
mod step1;
mod task;

pub(crate) use acc::{Line, WindowAcc, LINE_BYTES};
pub use acc_rated::{QuantityLine, RatedLine};
pub use dedup::DedupDelta;
pub(crate) use prepared::Prepared;
pub use result::{
    AdjustmentRecord, LineItem, PaneKind, ProgressRecord, QuantityItem, ResultKind, ResultRecord,
    SinkRecord,
};
pub(crate) use spill_error::SpillError;
pub(crate) use step1::{validate, Valid};
pub use task::{
    window_bytes, PartitionTask, Progress, StateDelta, TaskSnapshot, WindowKey, WindowPhase,
};

use serde::{Deserialize, Serialize};

use crate::model::input::InputMapping;
use crate::model::{DeadLetterReason, PriceTable};
use crate::time::WindowSpec;

/// Where an event's timestamp comes from (docs/DESIGN.md §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimeSource {
    /// The payload's `completed_ts` (default; the only choice fit for billing).
    CompletedTs,
    /// The payload's `started_ts`.
    StartedTs,
    /// The Kafka record timestamp (CreateTime or LogAppendTime). Not for billing:
    /// a retry burst lands in the minute it was re-sent.
    KafkaTimestamp,
    /// The wall clock at ingest. Not for billing: replays are not reproducible.
    ProcessingTime,
}

/// Everything the engine needs to decide, fixed for a job's lifetime.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub window: WindowSpec,
    pub allowed_lateness_ms: i64,
    pub max_out_of_orderness_ms: i64,
    /// Events more than this far ahead of the wall clock are dead letters.
    pub max_future_ms: Option<i64>,
    pub time_source: TimeSource,
    /// The watermark's lead limit (`time::watermark`); `None` = off.
    pub max_lead_ms: Option<i64>,
    /// How long after a window's purge its request ids are still remembered.
    pub dedup_extra_ms: i64,
    pub max_record_bytes: usize,
    pub generation: u64,
    pub prices: PriceTable,
    /// The rating (issue 36) when the config declares one; then it prices every
    /// record and `prices` is not read. `None`: `prices` prices, as before.
    pub rating: Option<std::sync::Arc<crate::model::rating::RateBook>>,
    /// The rating's tables as canonical TOML (`""` without one): what the config
    /// fingerprint holds of it (`checkpoint::evolution`).
    pub rating_source: String,
    /// Where a record's fields are and what they mean (`[input]`).
    pub input: InputMapping,
}

/// The outcome for one input record: exactly one per record (docs/DESIGN.md §1.4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Folded into a window.
    Window,
    /// Too late: its window was already purged. Goes to the late-events topic.
    TooLate {
        window_end: i64,
        watermark: i64,
    },
    DeadLetter(DeadLetterReason),
    /// A repeated `request_id` within the dedup horizon; counted, not billed.
    Duplicate,
}

/// Conservation audit: `consumed == folded + too_late + dead_letter + duplicate`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    pub consumed: u64,
    pub folded: u64,
    pub too_late: u64,
    pub dead_letter: u64,
    pub duplicate: u64,
    pub panes: u64,
    /// Watermark advances forced by idleness (wall clock), recorded so a restore
    /// reproduces them.
    pub idle_advances: u64,
}

impl Counters {
    pub fn balanced(&self) -> bool {
        self.consumed == self.folded + self.too_late + self.dead_letter + self.duplicate
    }

    pub fn add(&mut self, o: &Counters) {
        self.consumed += o.consumed;
        self.folded += o.folded;
        self.too_late += o.too_late;
        self.dead_letter += o.dead_letter;
        self.duplicate += o.duplicate;
        self.panes += o.panes;
        self.idle_advances += o.idle_advances;
    }
}

/// One record as the engine sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecordIn<'a> {
    pub payload: &'a [u8],
    /// The Kafka record timestamp, if any.
    pub kafka_ts: Option<i64>,
    /// Wall clock at ingest, ms.
    pub now_ms: i64,
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod proptests;
