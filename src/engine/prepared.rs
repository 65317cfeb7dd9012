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

use super::dedup::Fingerprint;
use super::step1::{check, Checked, Folding};
use super::{EngineConfig, RecordIn};
use crate::model::rating::Rated;
use crate::model::{DeadLetterReason, Pico};
use crate::time::Window;

/// A record that passed step 1, by the numbers steps 2–4 read; its ids are
/// ranges of `Prepared::strs`.
#[derive(Debug, Clone)]
struct Fields {
    fp: Fingerprint,
    ts: i64,
    window: Window,
    cost: Pico,
    prompt_tokens: u64,
    completion_tokens: u64,
    completed_ts: i64,
    model_index: u32,
    /// Its line items, when a rate book priced it.
    rated: Option<Box<Rated>>,
    /// The request id is `strs[ids.0..ids.1]`, the tenant id `strs[ids.1..ids.2]`.
    ids: (u32, u32, u32),
}

/// A batch of records after step 1, in input order (reused: `clear`).
#[derive(Debug, Default)]
pub(crate) struct Prepared {
    /// The request and tenant ids of the valid records, back to back.
    strs: String,
    /// A record that failed step 1 is the index of its reason in `reasons` (kept
    /// apart: the valid records, nearly all, stay small to copy).
    items: Vec<Result<Fields, u32>>,
    reasons: Vec<DeadLetterReason>,
}

impl Prepared {
    pub(crate) fn clear(&mut self) {
        self.strs.clear();
        self.items.clear();
        self.reasons.clear();
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Step 1 of the rules on `rec`, appended to the batch.
    pub(crate) fn push(&mut self, cfg: &EngineConfig, rec: RecordIn<'_>) {
        let item = match check(cfg, rec) {
            Ok(Checked { valid: v, fp }) => {
                let request_start = self.strs.len();
                self.strs.push_str(&v.ev.request_id);
                let request_end = self.strs.len();
                self.strs.push_str(&v.ev.tenant_id);
                // A batch holds at most a few thousand records of bounded size.
                let offset = |n: usize| u32::try_from(n).expect("a batch's ids fit in u32");
                Ok(Fields {
                    fp,
                    ts: v.ts,
                    window: v.window,
                    cost: v.cost,
                    prompt_tokens: v.ev.prompt_tokens,
                    completion_tokens: v.ev.completion_tokens,
                    completed_ts: v.ev.completed_ts,
                    model_index: offset(v.model_index),
                    rated: v.rated,
                    ids: (
                        offset(request_start),
                        offset(request_end),
                        offset(self.strs.len()),
                    ),
                })
            }
            Err(reason) => {
                self.reasons.push(reason);
                Err(self.reasons.len() as u32 - 1)
            }
        };
        self.items.push(item);
    }

    /// The `i`-th record's fingerprint, if it passed step 1.
    pub(super) fn fingerprint(&self, i: usize) -> Option<Fingerprint> {
        self.items[i].as_ref().ok().map(|f| f.fp)
    }

    /// The `i`-th record as steps 2–4 of `PartitionTask` read it, or why it
    /// failed step 1.
    pub(super) fn folding(&self, i: usize) -> Result<Folding<'_>, &DeadLetterReason> {
        let f = match &self.items[i] {
            Ok(f) => f,
            Err(r) => return Err(&self.reasons[*r as usize]),
        };
        let (start, mid, end) = (f.ids.0 as usize, f.ids.1 as usize, f.ids.2 as usize);
        let (request_id, tenant_id) = (&self.strs[start..mid], &self.strs[mid..end]);
        Ok(Folding {
            request_id,
            tenant_id,
            prompt_tokens: f.prompt_tokens,
            completion_tokens: f.completion_tokens,
            completed_ts: f.completed_ts,
            ts: f.ts,
            window: f.window,
            cost: f.cost,
            model_index: f.model_index as usize,
            rated: f.rated.as_deref(),
            fp: f.fp,
        })
    }
}
