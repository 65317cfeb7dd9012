//! Step 1 of the rules (docs/DESIGN.md §2; `task`'s header lists all four):
//! everything that makes a record a dead letter — size, parse, the time
//! source and the timestamp guards, the window, the price — and the request
//! id's dedup fingerprint. Pure and stateless: `PartitionTask` runs it per
//! record, `Prepared` runs it on a batch on another thread, and both then hand
//! steps 2–4 the same `Folding`.

use super::dedup::Fingerprint;
use super::{EngineConfig, RecordIn, TimeSource};
use crate::model::event::MIN_MILLIS_TS;
use crate::model::input::{COMPLETED_TS, STARTED_TS};
use crate::model::rating::{RateBook, Rated, Request, MAX_QUANTITIES};
use crate::model::{DeadLetterReason, Event, Pico, PriceError};
use crate::time::Window;

/// A record that passed step 1: the event, its event time, its cost, and the
/// fingerprint of its request id.
pub(super) struct Checked<'a> {
    pub(super) valid: Valid<'a>,
    pub(super) fp: Fingerprint,
}

impl Checked<'_> {
    /// What steps 2–4 read of it.
    pub(super) fn folding(&self) -> Folding<'_> {
        let Valid {
            ev,
            ts,
            window,
            cost,
            model_index,
            rated,
        } = &self.valid;
        Folding {
            request_id: &ev.request_id,
            tenant_id: &ev.tenant_id,
            prompt_tokens: ev.prompt_tokens,
            completion_tokens: ev.completion_tokens,
            completed_ts: ev.completed_ts,
            ts: *ts,
            window: *window,
            cost: *cost,
            model_index: *model_index,
            rated: rated.as_deref(),
            fp: self.fp,
        }
    }
}

/// What steps 2–4 of the rules read of a record that passed step 1: borrowed ids
/// and plain numbers, built from a `Checked` or straight from a `Prepared` batch.
#[derive(Debug, Clone, Copy)]
pub(super) struct Folding<'a> {
    pub(super) request_id: &'a str,
    pub(super) tenant_id: &'a str,
    pub(super) prompt_tokens: u64,
    pub(super) completion_tokens: u64,
    pub(super) completed_ts: i64,
    /// The event time (per the time source).
    pub(super) ts: i64,
    pub(super) window: Window,
    pub(super) cost: Pico,
    /// The model's index in the price table (`PriceTable::model_at`).
    pub(super) model_index: usize,
    /// The rated request, when a rate book priced it (then `model_index` is 0).
    pub(super) rated: Option<&'a Rated>,
    pub(super) fp: Fingerprint,
}

/// A record that passed `validate`: its event, event time, window and cost.
#[derive(Debug)]
pub(crate) struct Valid<'a> {
    pub ev: Event<'a>,
    pub ts: i64,
    pub window: Window,
    pub cost: Pico,
    /// The model's index in the price table (`PriceTable::model_at`).
    pub model_index: usize,
    /// Its line items, when a rate book priced it (`EngineConfig::rating`).
    pub rated: Option<Box<Rated>>,
}

/// Step 1 of the rules and the request id's dedup fingerprint: what a task, or
/// `Prepared` on another thread, decides before the record meets the task's state.
pub(super) fn check<'a>(
    cfg: &EngineConfig,
    rec: RecordIn<'a>,
) -> Result<Checked<'a>, DeadLetterReason> {
    let valid = validate(cfg, rec)?;
    let fp = Fingerprint::of(&valid.ev.request_id);
    Ok(Checked { valid, fp })
}

/// Step 1 of the rules: everything that makes a record a dead letter. Returns the
/// event, its event time (per the configured time source) and its cost.
#[inline(always)]
pub(crate) fn validate<'a>(
    cfg: &EngineConfig,
    rec: RecordIn<'a>,
) -> Result<Valid<'a>, DeadLetterReason> {
    if rec.payload.len() > cfg.max_record_bytes {
        return Err(DeadLetterReason::Oversized {
            bytes: rec.payload.len(),
            limit: cfg.max_record_bytes,
        });
    }
    let input = &cfg.input;
    let ev = input.parse(rec.payload)?;
    let guards = |slot| input.ts_format(slot).guards_scale();
    let (ts, guard) = match cfg.time_source {
        TimeSource::CompletedTs => (ev.completed_ts, guards(COMPLETED_TS)),
        TimeSource::StartedTs => (
            ev.started_ts
                .ok_or_else(|| DeadLetterReason::MissingField(input.field(STARTED_TS).clone()))?,
            guards(STARTED_TS),
        ),
        TimeSource::KafkaTimestamp => (rec.kafka_ts.ok_or(DeadLetterReason::NoTimestamp)?, true),
        TimeSource::ProcessingTime => (rec.now_ms, true),
    };
    // The payload's own completed_ts is checked whatever the time source: a
    // seconds value there is bad data either way (where its format can be wrong
    // by a factor of 1,000: integer ms or µs).
    for (t, guard) in [(ev.completed_ts, guards(COMPLETED_TS)), (ts, guard)] {
        if guard && t < MIN_MILLIS_TS {
            return Err(DeadLetterReason::NotMilliseconds(t));
        }
    }
    if let Some(max_future) = cfg.max_future_ms {
        if ts > rec.now_ms.saturating_add(max_future) {
            return Err(DeadLetterReason::TooFarInFuture {
                ts,
                now: rec.now_ms,
            });
        }
    }
    let window = cfg
        .window
        .assign(ts)
        .ok_or(DeadLetterReason::WindowOutOfRange(ts))?;
    // Prices are in effect by event time (the completed_ts of the request).
    if let Some(book) = &cfg.rating {
        let rated = rate(book, &ev)?;
        return Ok(Valid {
            cost: rated.total,
            ev,
            ts,
            window,
            model_index: 0,
            rated: Some(Box::new(rated)),
        });
    }
    let (model_index, cost) = cfg
        .prices
        .price(
            &ev.model,
            ev.prompt_tokens,
            ev.completion_tokens,
            ev.completed_ts,
        )
        .map_err(|e| match e {
            PriceError::UnknownModel => DeadLetterReason::UnknownModel(ev.model.to_string()),
            PriceError::NotYetPriced => DeadLetterReason::NoPriceInEffect(ev.model.to_string()),
            PriceError::Overflow => DeadLetterReason::Overflow,
        })?;
    Ok(Valid {
        ev,
        ts,
        window,
        cost,
        model_index,
        rated: None,
    })
}

/// The request rated by the book (`model::rating`): the default quantities, then
/// the declared ones in declaration order (the book's ids).
fn rate(book: &RateBook, ev: &Event<'_>) -> Result<Rated, DeadLetterReason> {
    let mut counts = [0u64; MAX_QUANTITIES];
    let n = 2 + ev.extra.counts.len();
    counts[0] = ev.prompt_tokens;
    counts[1] = ev.completion_tokens;
    counts[2..n].copy_from_slice(&ev.extra.counts);
    book.rate(&Request {
        tenant: &ev.tenant_id,
        at_ms: ev.completed_ts,
        model: &ev.model,
        variant: ev.extra.variant.as_deref(),
        counts: &counts[..n],
    })
    .map_err(DeadLetterReason::from)
}
