//! The replay: one input partition's records, in offset order, through a fresh
//! `PartitionTask` — the engine's own routing — keeping what happened to the
//! records of one (tenant, window).
//!
//! Pure: the records come in, the routes come out. A record's numbers (tokens,
//! price entry, plan, cost) come from `engine::validate`, the routes from
//! `PartitionTask::process`, so nothing here re-implements a rule. Invariant:
//! each record of the partition gets exactly one route (the task's counters
//! balance), and a record is reported when the engine assigns it to the window
//! (valid records) or when its tenant and event time can be read leniently
//! (dead letters, `attribute`).

use std::collections::HashMap;
use std::sync::Arc;

use super::{Billed, CheckpointStart, Elsewhere, InputRecord, PartitionRange, Quantity, Routed};
use crate::engine::{validate, EngineConfig, PartitionTask, RecordIn, Route, TimeSource};
use crate::model::input::{InputMapping, TimestampFormat, COMPLETED_TS, TENANT_ID};
use crate::model::{DeadLetterReason, Partition};

/// One input partition as read: `[log_start, log_end)`.
#[derive(Debug, Clone)]
pub struct PartitionLog {
    pub partition: i32,
    pub log_start: i64,
    pub log_end: i64,
    pub records: Vec<InputRecord>,
}

/// What the replay of one partition found for the (tenant, window).
#[derive(Debug, Clone)]
pub struct Replayed {
    pub billed: Vec<Billed>,
    pub elsewhere: Vec<Elsewhere>,
    pub range: PartitionRange,
}

/// Replays `log` through a fresh task under `cfg`, keeping the records of
/// `tenant` in the windows of `[start, end)` (one window, or a calendar bucket
/// of whole windows): `Replayer` over records held in memory.
pub fn replay(
    cfg: &Arc<EngineConfig>,
    tenant: &str,
    range: (i64, i64),
    log: &PartitionLog,
    now_ms: i64,
) -> Result<Replayed, String> {
    let bounds = (log.log_start, log.log_end);
    let mut r = Replayer::new(cfg, tenant, range, (log.partition, bounds), now_ms);
    for rec in &log.records {
        if r.push(rec)? {
            break;
        }
    }
    Ok(r.finish())
}

/// One partition's replay, fed a record at a time in offset order (so a reader
/// need not hold the partition): a fresh `PartitionTask` (or one restored from
/// a checkpoint, `resume`) routes each record, and the records of the tenant in
/// `[start, end)` are kept with their routes. It is done (`push` says so) once
/// the watermark is past the windows' dedup horizon — `end − 1 +
/// allowed_lateness + dedup.extra_horizon` —: from there on every record of the
/// windows is too late or a dead letter, and is on the late or dead-letter
/// topic (`outside`).
/// `now_ms` stands in for the ingest clock of a record without a Kafka
/// timestamp (the `max_future` guard reads it; with one, the record's
/// timestamp stands in).
pub struct Replayer<'a> {
    cfg: &'a Arc<EngineConfig>,
    tenant: &'a str,
    range: (i64, i64),
    now_ms: i64,
    task: PartitionTask,
    panes: Vec<crate::engine::ResultRecord>,
    /// Request id → the offset of its first billed or too-late record, for the
    /// tenant's records of the windows (what a duplicate repeats).
    first: HashMap<String, i64>,
    /// The watermark past which the replay is done.
    horizon: i64,
    out: Replayed,
}

impl<'a> Replayer<'a> {
    /// A replay of `partition`, whose log is `[log_start, log_end)`.
    pub fn new(
        cfg: &'a Arc<EngineConfig>,
        tenant: &'a str,
        range: (i64, i64),
        (partition, (log_start, log_end)): (i32, (i64, i64)),
        now_ms: i64,
    ) -> Self {
        Self {
            task: PartitionTask::new(Partition(partition), cfg.clone()),
            cfg,
            tenant,
            range,
            now_ms,
            panes: Vec::new(),
            first: HashMap::new(),
            horizon: (range.1 - 1)
                .saturating_add(cfg.allowed_lateness_ms)
                .saturating_add(cfg.dedup_extra_ms),
            out: Replayed {
                billed: Vec::new(),
                elsewhere: Vec::new(),
                range: PartitionRange {
                    partition,
                    from_offset: log_start,
                    to_offset: log_end,
                    log_start,
                    log_end,
                    checkpoint: None,
                    stopped_early: false,
                    watermark: None,
                    final_here: false,
                    unreadable_dead_letters: 0,
                },
            },
        }
    }

    /// The same replay, from `task` — the partition's state at `start`, restored
    /// from a checkpoint taken before any record of the windows — instead of a
    /// fresh task at the log start.
    pub fn resume(mut self, task: PartitionTask, start: CheckpointStart) -> Self {
        self.task = task;
        self.out.range.from_offset = start.next_offset;
        self.out.range.checkpoint = Some(start);
        self
    }

    /// Where reading starts.
    pub fn from_offset(&self) -> i64 {
        self.out.range.from_offset
    }

    /// Whether the watermark has left the windows' dedup horizon.
    fn done(&self) -> bool {
        self.task.watermark().0 > self.horizon
    }

    fn inside(&self, w: crate::time::Window) -> bool {
        w.start >= self.range.0 && w.end <= self.range.1
    }

    /// The next record of the partition; `Ok(true)`: the replay is done, read
    /// no more of the partition.
    pub fn push(&mut self, r: &InputRecord) -> Result<bool, String> {
        let (cfg, partition) = (self.cfg, self.out.range.partition);
        let rec = RecordIn {
            payload: &r.payload,
            kafka_ts: r.kafka_ts,
            now_ms: r.kafka_ts.unwrap_or(self.now_ms),
        };
        let w = self.task.watermark().0;
        let valid = validate(cfg, rec);
        let route = self
            .task
            .process(rec, &mut self.panes)
            .map_err(|e| format!("replaying partition {partition}: {e:?}"))?;
        self.panes.clear();
        let at = Here {
            partition,
            offset: r.offset,
            watermark: (w != i64::MIN).then_some(w),
        };
        match valid {
            Ok(v) if v.ev.tenant_id == self.tenant && self.inside(v.window) => {
                self.kept(Kept { cfg, valid: &v, at }, route, w);
            }
            Ok(_) => {}
            Err(reason) => match attribute(cfg, r) {
                (Some(t), Some(win)) if t == self.tenant && self.inside(win) => {
                    self.out.elsewhere.push(Elsewhere {
                        request_id: request_id(&cfg.input, &r.payload),
                        window_end: win.end,
                        partition,
                        offset: r.offset,
                        route: dead_letter(&reason),
                    });
                }
                (Some(t), None) if t == self.tenant => self.out.range.unreadable_dead_letters += 1,
                _ => {}
            },
        }
        let done = self.done();
        if done && r.offset + 1 < self.out.range.log_end {
            self.out.range.to_offset = r.offset + 1;
            self.out.range.stopped_early = true;
        }
        Ok(done)
    }

    /// A valid record of the windows asked, by the route it took (`w`: the
    /// watermark it met).
    fn kept(&mut self, kept: Kept<'_, '_>, route: Route, w: i64) {
        let v = kept.valid;
        let id = v.ev.request_id.to_string();
        let offset = kept.at.offset;
        let out = &mut self.out;
        match route {
            Route::Window => {
                self.first.entry(id).or_insert(offset);
                out.billed.push(kept.billed(w >= v.window.end - 1));
            }
            Route::TooLate { watermark, .. } => {
                self.first.entry(id.clone()).or_insert(offset);
                out.elsewhere
                    .push(kept.elsewhere(Some(id), too_late(watermark, v)));
            }
            Route::Duplicate => {
                let of_offset = self.first.get(&id).copied();
                let before_offset = match (&out.range.checkpoint, of_offset) {
                    (Some(c), None) => Some(c.next_offset),
                    _ => None,
                };
                let route = Routed::Duplicate {
                    of_offset,
                    before_offset,
                };
                out.elsewhere.push(kept.elsewhere(Some(id), route));
            }
            Route::DeadLetter(reason) => {
                out.elsewhere
                    .push(kept.elsewhere(Some(id), dead_letter(&reason)));
            }
        }
    }

    /// What the replay found, with the partition's watermark at its end.
    pub fn finish(mut self) -> Replayed {
        let w = self.task.watermark().0;
        self.out.range.watermark = (w != i64::MIN).then_some(w);
        self.out.range.final_here = self.task.final_through().is_some_and(|f| f >= self.range.1);
        self.out
    }
}

/// Where a record was met.
#[derive(Debug, Clone, Copy)]
struct Here {
    partition: i32,
    offset: i64,
    watermark: Option<i64>,
}

/// A record of the window, validated.
struct Kept<'a, 'v> {
    cfg: &'a EngineConfig,
    valid: &'a crate::engine::Valid<'v>,
    at: Here,
}

impl Kept<'_, '_> {
    fn billed(&self, late_pane: bool) -> Billed {
        let v = self.valid;
        let ev = &v.ev;
        let model = ev.model.to_string();
        let at = |es: &mut dyn Iterator<Item = (&str, i64)>| {
            es.filter(|(m, from)| *m == model.as_str() && *from <= ev.completed_ts)
                .map(|(_, from)| from)
                .max()
        };
        let price_effective_from = match &self.cfg.rating {
            Some(book) if v.rated.is_some() => {
                at(&mut book.list_entries().map(|(m, from, _)| (m, from)))
            }
            _ => at(&mut self
                .cfg
                .prices
                .entries()
                .map(|(m, e)| (m, e.effective_from_ms))),
        };
        let rated = v.rated.as_deref();
        Billed {
            request_id: ev.request_id.to_string(),
            window_end: v.window.end,
            partition: self.at.partition,
            offset: self.at.offset,
            model,
            prompt_tokens: ev.prompt_tokens,
            completion_tokens: ev.completion_tokens,
            completed_ts: ev.completed_ts,
            price_effective_from,
            plan: rated.and_then(|r| r.plan.as_deref().map(str::to_string)),
            variant: rated.and_then(|r| r.variant.as_deref().map(str::to_string)),
            tier_above: rated.and_then(|r| r.tier_above),
            quantities: rated.map(quantities).unwrap_or_default(),
            cost_pico: v.cost.0.to_string(),
            pane: if late_pane { "late" } else { "on_time" }.into(),
            watermark: self.at.watermark,
        }
    }

    fn elsewhere(&self, request_id: Option<String>, route: Routed) -> Elsewhere {
        Elsewhere {
            request_id,
            window_end: self.valid.window.end,
            partition: self.at.partition,
            offset: self.at.offset,
            route,
        }
    }
}

/// A rated request's quantities, then its fee (when it has one) as the quantity
/// `fee` counting 1, as the sink's quantity rows hold them.
fn quantities(r: &crate::model::rating::Rated) -> Vec<Quantity> {
    let fee = (!r.fee.is_zero()).then(|| Quantity {
        quantity: "fee".into(),
        count: 1,
        cost_pico: r.fee.0.to_string(),
    });
    r.lines
        .iter()
        .map(|l| Quantity {
            quantity: l.name.to_string(),
            count: l.count,
            cost_pico: l.cost.0.to_string(),
        })
        .chain(fee)
        .collect()
}

pub(super) fn too_late(watermark: i64, v: &crate::engine::Valid<'_>) -> Routed {
    Routed::TooLate {
        watermark,
        cost_pico: v.cost.0.to_string(),
        on_late_topic: false,
        adjustment: None,
    }
}

pub(super) fn dead_letter(reason: &DeadLetterReason) -> Routed {
    Routed::DeadLetter {
        code: reason.code().to_string(),
        detail: reason.to_string(),
        on_dead_letter_topic: false,
    }
}

/// The value of `slot` in a payload read as any JSON.
fn lookup<'j>(
    input: &InputMapping,
    json: &'j serde_json::Value,
    slot: usize,
) -> Option<&'j serde_json::Value> {
    let f = input.field(slot);
    match &f.pointer {
        Some(p) => json.pointer(p),
        None => json.get(f.name),
    }
}

pub(super) fn request_id(input: &InputMapping, payload: &[u8]) -> Option<String> {
    let json: serde_json::Value = serde_json::from_slice(payload).ok()?;
    lookup(input, &json, crate::model::input::REQUEST_ID)?
        .as_str()
        .map(str::to_string)
}

/// A dead letter's tenant and window, read leniently: the tenant from the
/// payload, else the record key; the window from `completed_ts` when it is the
/// time source and an integer in milliseconds (`None` when unreadable).
pub(super) fn attribute(
    cfg: &EngineConfig,
    r: &InputRecord,
) -> (Option<String>, Option<crate::time::Window>) {
    let json: Option<serde_json::Value> = serde_json::from_slice(&r.payload).ok();
    let input = &cfg.input;
    let tenant = json
        .as_ref()
        .and_then(|j| lookup(input, j, TENANT_ID))
        .and_then(|t| t.as_str().map(str::to_string))
        .or_else(|| {
            r.key
                .as_deref()
                .and_then(|k| std::str::from_utf8(k).ok())
                .map(str::to_string)
        });
    let readable = cfg.time_source == TimeSource::CompletedTs
        && input.ts_format(COMPLETED_TS) == TimestampFormat::EpochMs;
    let window = json
        .as_ref()
        .filter(|_| readable)
        .and_then(|j| lookup(input, j, COMPLETED_TS))
        .and_then(serde_json::Value::as_i64)
        .and_then(|ts| cfg.window.assign(ts));
    (tenant, window)
}

#[cfg(test)]
#[path = "replay_tests.rs"]
pub(super) mod tests;
