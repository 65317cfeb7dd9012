//! Reprocessing the late-events topic into adjustments (docs/DESIGN.md §8). Pure: one late
//! record in, one adjustment or one dead-letter reason out.
//!
//! Invariants:
//! - An adjustment is priced and windowed exactly as the main path would have
//!   (same validation, time source and effective-dated prices), so running the
//!   reprocessing any number of times yields byte-identical adjustments.
//! - Within one run, a `request_id` is adjusted once (`Seen`); across runs, the
//!   sink keeps one adjustment per `request_id`: a copy of a greater `generation`
//!   (a re-bill) replaces it, an equal or lower one is ignored.
//! - A request billed on the main path is not billed again: its copies within the
//!   dedup horizon are duplicates on the main path and never reach the late topic
//!   (the ids of too-late events enter the dedup set too). Copies arriving after
//!   the horizon are indistinguishable from new requests — size `dedup.extra_horizon`
//!   to cover the longest producer retry.

use std::collections::HashSet;

use crate::engine::{validate, AdjustmentRecord, EngineConfig, RecordIn, ResultKind, Valid};
use crate::model::DeadLetterReason;

/// What happened to one late record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    Adjusted(AdjustmentRecord),
    /// Its `request_id` was already adjusted in this run.
    Duplicate,
    DeadLetter(DeadLetterReason),
}

#[derive(Default)]
pub(crate) struct Reprocessor {
    seen: HashSet<String>,
}

impl Reprocessor {
    /// `source` is the original event's coordinates (the late record's `tally.source`).
    pub(crate) fn process(
        &mut self,
        cfg: &EngineConfig,
        rec: RecordIn<'_>,
        source: &str,
    ) -> Outcome {
        let Valid {
            ev,
            window: w,
            cost,
            ..
        } = match validate(cfg, rec) {
            Ok(v) => v,
            Err(reason) => return Outcome::DeadLetter(reason),
        };
        if !self.seen.insert(ev.request_id.to_string()) {
            return Outcome::Duplicate;
        }
        Outcome::Adjusted(AdjustmentRecord {
            kind: ResultKind::Adjustment,
            request_id: ev.request_id.into_owned(),
            tenant_id: ev.tenant_id.into_owned(),
            model: ev.model.into_owned(),
            window_start: w.start,
            window_end: w.end,
            cost_pico: cost,
            usd: cost.usd_string(),
            prompt_tokens: ev.prompt_tokens,
            completion_tokens: ev.completion_tokens,
            generation: cfg.generation,
            source: source.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::TimeSource;
    use crate::model::{NanoPer1k, PriceEntry, PriceTable};
    use crate::time::WindowSpec;

    fn cfg() -> EngineConfig {
        let mut prices = PriceTable::default();
        prices.insert(
            "m",
            PriceEntry {
                effective_from_ms: i64::MIN,
                input: NanoPer1k(150_000),
                output: NanoPer1k(600_000),
            },
        );
        prices.insert(
            "m",
            PriceEntry {
                effective_from_ms: 1_767_261_660_000,
                input: NanoPer1k(1),
                output: NanoPer1k(1),
            },
        );
        EngineConfig {
            window: WindowSpec::new(60_000, 0),
            allowed_lateness_ms: 0,
            max_out_of_orderness_ms: 5_000,
            max_future_ms: None,
            time_source: TimeSource::CompletedTs,
            max_lead_ms: None,
            dedup_extra_ms: 0,
            max_record_bytes: 1 << 10,
            generation: 3,
            prices,
            rating: None,
            rating_source: String::new(),
            input: Default::default(),
        }
    }

    fn rec(payload: &str) -> RecordIn<'_> {
        RecordIn {
            payload: payload.as_bytes(),
            kafka_ts: None,
            now_ms: 0,
        }
    }

    #[test]
    fn prices_by_event_time_and_adjusts_each_request_once() {
        let c = cfg();
        let mut r = Reprocessor::default();
        let ev = r#"{"request_id":"a","tenant_id":"acme","model":"m","prompt_tokens":1000,"completion_tokens":100,"completed_ts":1767261644000}"#;
        let Outcome::Adjusted(a) = r.process(&c, rec(ev), "requests/0/3") else {
            panic!()
        };
        assert_eq!(
            (a.window_end, a.cost_pico.0, a.generation),
            (1_767_261_660_000, 150_000_000 + 60_000_000, 3)
        );
        assert_eq!(a.source, "requests/0/3");
        assert_eq!(r.process(&c, rec(ev), "requests/0/9"), Outcome::Duplicate);
        let later = ev
            .replace("\"a\"", "\"b\"")
            .replace("1767261644000", "1767261670000");
        let Outcome::Adjusted(b) = r.process(&c, rec(&later), "x") else {
            panic!()
        };
        assert_eq!(
            b.cost_pico.0, 1_100,
            "the price in effect at the event time"
        );
        assert!(matches!(
            r.process(&c, rec("{"), "x"),
            Outcome::DeadLetter(_)
        ));
    }
}
