//! `tally explain --tenant … --window-start …`: one (tenant, window) of a bill
//! explained down to its requests (docs/DESIGN.md §6.2).
//!
//! The answer is re-derived from the logs by the engine's own code: every input
//! partition is replayed, in offset order, through a `PartitionTask` (`replay`)
//! — restored from the newest checkpoint taken before any record of the windows
//! (`start`), else fresh at the log start — until its watermark leaves the
//! windows' dedup horizon or the log ends; the route it gives each record of
//! the tenant and window is kept, with the watermark it met. The records of the
//! windows outside the offsets read are on the late and dead-letter topics
//! (`outside`). Then the topics and the sink's rows are joined to it (`join`),
//! and the totals are compared with the sink's line, every difference named.
//!
//! Invariants: no second implementation of a rule — routes come from
//! `PartitionTask::process`, prices and quantities from `engine::validate`; an
//! explanation whose replay of a partition starts at a log start above offset
//! 0 without a checkpoint is marked `exact: false` and says which offsets are
//! gone, never presented as exact. Everything here but `source`, `start` and
//! `run` is pure (no I/O).

pub mod bucket;
pub mod finality;
pub mod join;
pub mod outside;
mod render;
mod replay;
pub mod rows;
pub mod run;
pub mod source;
pub mod start;

pub use join::{join, Sides};
pub use replay::{replay, PartitionLog, Replayed, Replayer};

use serde::{Deserialize, Serialize};

/// One record as read from the input topic.
#[derive(Debug, Clone)]
pub struct InputRecord {
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Vec<u8>,
    /// The Kafka record timestamp.
    pub kafka_ts: Option<i64>,
}

/// A request the engine billed into the window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Billed {
    pub request_id: String,
    /// The end of the window it is billed into.
    pub window_end: i64,
    pub partition: i32,
    pub offset: i64,
    pub model: String,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub completed_ts: i64,
    /// The price entry that priced it: `effective_from` of the model's entry
    /// (under a rating, of its list price) in effect at `completed_ts`.
    pub price_effective_from: Option<i64>,
    /// Under a rating: the plan and variant that priced it (`None`: the list
    /// price; the variant's default value), the tier that priced it (its
    /// `above`), and its quantities, its fee (if any) as the quantity `fee`
    /// counting 1 — as the sink's `tenant_cost_minute_quantity` counts it.
    pub plan: Option<String>,
    pub variant: Option<String>,
    #[serde(default)]
    pub tier_above: Option<u64>,
    pub quantities: Vec<Quantity>,
    pub cost_pico: String,
    /// `on_time`, or `late` (folded after the window's on-time pane, within the
    /// allowed lateness).
    pub pane: String,
    /// The partition's watermark when the record arrived (`None`: none yet).
    pub watermark: Option<i64>,
}

/// One quantity of a rated request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quantity {
    pub quantity: String,
    pub count: u64,
    pub cost_pico: String,
}

/// A record of the tenant and window that the engine did not bill into it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Elsewhere {
    /// `None` for a dead letter whose request id cannot be read.
    pub request_id: Option<String>,
    /// The end of the window it belongs to.
    pub window_end: i64,
    pub partition: i32,
    pub offset: i64,
    #[serde(flatten)]
    pub route: Routed,
}

/// Where such a record went, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "route", rename_all = "snake_case")]
pub enum Routed {
    /// A repeat of the request id within the dedup horizon; `of_offset`: the
    /// first record of that id in the partition (`None`: not of this tenant
    /// and window, or before the replay's start); `before_offset`: when the
    /// replay started from a checkpoint and `of_offset` is `None`, the offset
    /// it started at — the first record is before it.
    Duplicate {
        of_offset: Option<i64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        before_offset: Option<i64>,
    },
    /// Too late: the window was purged at this watermark. `adjustment`: whether
    /// the sink holds its `reprocess-late` adjustment (`None`: no sink given);
    /// `on_late_topic`: whether the late topic holds it.
    TooLate {
        watermark: i64,
        cost_pico: String,
        on_late_topic: bool,
        adjustment: Option<bool>,
    },
    /// A dead letter, with its stable code; `on_dead_letter_topic`: whether the
    /// dead-letter topic holds it.
    DeadLetter {
        code: String,
        detail: String,
        on_dead_letter_topic: bool,
    },
}

/// The offsets replayed of one input partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionRange {
    pub partition: i32,
    /// Where the replay started: the log start, or the offset the checkpoint it
    /// restored resumes at (`checkpoint`).
    pub from_offset: i64,
    /// Where the replay stopped (exclusive): the log end, or earlier once the
    /// partition's watermark left the windows' dedup horizon (`stopped_early`).
    pub to_offset: i64,
    /// The log start: offsets below it were deleted by retention.
    #[serde(default)]
    pub log_start: i64,
    /// The log end read at the start of the explanation (`read_committed`).
    #[serde(default)]
    pub log_end: i64,
    /// The checkpoint whose state of the partition the replay started from
    /// (`None`: a fresh task at the log start).
    #[serde(default)]
    pub checkpoint: Option<CheckpointStart>,
    /// Whether reading stopped before the log end: every later record of the
    /// windows is on the late or dead-letter topic, and is taken from there.
    #[serde(default)]
    pub stopped_early: bool,
    /// The partition's watermark at the end of the replay.
    pub watermark: Option<i64>,
    /// Whether the partition has purged the window (nothing but an adjustment
    /// can change its share).
    pub final_here: bool,
    /// Dead letters keyed by the tenant whose window cannot be read (malformed
    /// JSON, an unreadable time): counted, not attributed to a window.
    pub unreadable_dead_letters: u64,
}

/// A checkpoint a partition's replay started from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointStart {
    /// Its name in the checkpoint store (`chk-<id>-<worker>`).
    pub name: String,
    /// The offset it resumes the partition at.
    pub next_offset: i64,
    /// The partition's greatest `completed_ts` priced before that offset
    /// (`None`: none): before the windows' start, so no earlier record is theirs.
    pub high_water: Option<i64>,
}

/// The sink's rows for the tenant's windows asked, summed over them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SinkRows {
    /// The invoice line (`tenant_cost_minute`); `None`: no row.
    pub cost_pico: Option<String>,
    pub requests: u64,
    /// `tenant_cost_minute_line`: model → (cost, requests).
    pub lines: Vec<SinkLine>,
    /// Per source partition: the stored partials (`version`: their versions
    /// summed, the events folded).
    pub partials: Vec<SinkPartial>,
    pub adjustments: Vec<SinkAdjustment>,
    /// `tenant_cost_minute_quantity`, summed over the windows (empty unless a
    /// rating billed them).
    #[serde(default)]
    pub quantities: Vec<QuantityLine>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SinkLine {
    pub model: String,
    pub cost_pico: String,
    pub requests: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SinkPartial {
    pub source_partition: i32,
    pub cost_pico: String,
    pub requests: u64,
    pub version: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SinkAdjustment {
    pub request_id: String,
    pub model: String,
    pub cost_pico: String,
    pub source: String,
    /// Under a rating: its variant and plan (`""`: none) and its quantity rows
    /// (`tenant_cost_adjustment_quantity`, the fee as `fee`); empty otherwise.
    #[serde(default)]
    pub variant: String,
    #[serde(default)]
    pub plan: String,
    #[serde(default)]
    pub quantities: Vec<Quantity>,
}

/// One line item of a rating, per `(model, variant, plan, quantity)` (`""` for
/// no variant or plan; a line's fees are the quantity `fee`, counting the
/// requests charged one): the key and sums of `tenant_cost_minute_quantity`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct QuantityLine {
    pub model: String,
    pub variant: String,
    pub plan: String,
    pub quantity: String,
    pub count: u64,
    pub cost_pico: String,
}

/// What the explanation adds up to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    /// Billed by the engine (on time and late panes).
    pub requests: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cost_pico: String,
    /// Per model: what the sink's line items should hold of the engine's share.
    pub lines: Vec<SinkLine>,
    /// Too-late records the sink holds an adjustment for, and their cost.
    pub adjusted_requests: u64,
    pub adjusted_cost_pico: String,
    /// `cost_pico + adjusted_cost_pico`: what the sink's line should be.
    pub expected_line_cost_pico: String,
    /// Under a rating: what the sink's quantity line items should hold — the
    /// billed requests' quantities and the sink's adjustments', per
    /// `(model, variant, plan, quantity)`; empty without a rating.
    #[serde(default)]
    pub quantities: Vec<QuantityLine>,
}

/// The whole answer, for the tenant's windows in `[window_start, window_end)`:
/// one window, or a calendar bucket of whole windows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Explanation {
    pub tenant_id: String,
    pub window_start: i64,
    pub window_end: i64,
    pub partitions: Vec<PartitionRange>,
    pub billed: Vec<Billed>,
    pub elsewhere: Vec<Elsewhere>,
    pub totals: Totals,
    /// `None`: no sink was given to compare with.
    pub sink: Option<SinkRows>,
    /// Whether every record that can bear on the window was read (no input
    /// partition starts above offset 0).
    pub exact: bool,
    /// Whether the totals equal the sink's line and line items (`None`: no sink).
    pub agrees: Option<bool>,
    /// Every difference and caveat, named.
    pub notes: Vec<String>,
    /// Whether the windows are final, as the sink's database holds it (`None`:
    /// no sink given).
    #[serde(default)]
    pub finality: Option<finality::StoredFinality>,
}

impl Explanation {
    pub fn render_table(&self) -> String {
        render::table(self)
    }
}
