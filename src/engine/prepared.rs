//! Step 1 of the rules done ahead, on another thread: a batch of records validated,
//! priced and fingerprinted, owning nothing of the bytes they were read from.
//!
//! `Prepared::push` runs exactly the task's `check` (validate, fingerprint) on a record and
//! keeps what the rest of the rules need: the outcome (a dead-letter reason, or the
//! event's numbers), with the request id and the tenant id copied into one string
//! of the batch. `PartitionTask::process_prepared` then applies steps 2–4 to it,
//! deciding exactly what `process_batch` decides on the same records: the same
//! routes, panes and state (a property test holds the two equal).
//!
//! Invariant: a batch is applied by a task running the configuration it was
//! prepared with (the model's index refers to that price table). The file mode
//! has one configuration for the whole run; the Kafka worker compares the two
//! (`Arc::ptr_eq`) and runs step 1 again on the records of a batch prepared under
//! a price table a reload has replaced since.

use std::borrow::Cow;
use std::ops::Range;

use super::dedup::Fingerprint;
use super::task::{check, Checked, Valid};
use super::{EngineConfig, RecordIn};
use crate::model::{DeadLetterReason, Event, Pico};
use crate::time::Window;

/// A record that passed step 1, by its numbers; its ids are ranges of `Prepared::strs`.
#[derive(Debug, Clone)]
struct Fields {
    fp: Fingerprint,
    ts: i64,
    window: Window,
    cost: Pico,
    model_index: usize,
    prompt_tokens: u64,
    completion_tokens: u64,
    started_ts: Option<i64>,
    completed_ts: i64,
    request_id: Range<usize>,
    tenant_id: Range<usize>,
}

/// A batch of records after step 1, in input order (reused: `clear`).
#[derive(Debug, Default)]
pub struct Prepared {
    /// The request and tenant ids of the valid records, back to back.
    strs: String,
    items: Vec<Result<Fields, DeadLetterReason>>,
}

impl Prepared {
    pub fn clear(&mut self) {
        self.strs.clear();
        self.items.clear();
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Step 1 of the rules on `rec`, appended to the batch.
    pub fn push(&mut self, cfg: &EngineConfig, rec: RecordIn<'_>) {
        let item = check(cfg, rec).map(|Checked { valid: v, fp }| {
            let mut keep = |s: &str| {
                let start = self.strs.len();
                self.strs.push_str(s);
                start..self.strs.len()
            };
            let request_id = keep(&v.ev.request_id);
            let tenant_id = keep(&v.ev.tenant_id);
            Fields {
                fp,
                ts: v.ts,
                window: v.window,
                cost: v.cost,
                model_index: v.model_index,
                prompt_tokens: v.ev.prompt_tokens,
                completion_tokens: v.ev.completion_tokens,
                started_ts: v.ev.started_ts,
                completed_ts: v.ev.completed_ts,
                request_id,
                tenant_id,
            }
        });
        self.items.push(item);
    }

    /// The `i`-th record's fingerprint, if it passed step 1.
    pub(super) fn fingerprint(&self, i: usize) -> Option<Fingerprint> {
        self.items[i].as_ref().ok().map(|f| f.fp)
    }

    /// The `i`-th record as `PartitionTask` checks it; the model's name is the
    /// price table's (the fold finds the model by its index).
    pub(super) fn checked<'a>(
        &'a self,
        cfg: &'a EngineConfig,
        i: usize,
    ) -> Result<Checked<'a>, &'a DeadLetterReason> {
        let f = self.items[i].as_ref()?;
        Ok(Checked {
            valid: Valid {
                ev: Event {
                    request_id: Cow::Borrowed(&self.strs[f.request_id.clone()]),
                    tenant_id: Cow::Borrowed(&self.strs[f.tenant_id.clone()]),
                    model: Cow::Borrowed(&**cfg.prices.model_at(f.model_index)),
                    prompt_tokens: f.prompt_tokens,
                    completion_tokens: f.completion_tokens,
                    started_ts: f.started_ts,
                    completed_ts: f.completed_ts,
                },
                ts: f.ts,
                window: f.window,
                cost: f.cost,
                model_index: f.model_index,
            },
            fp: f.fp,
        })
    }
}
