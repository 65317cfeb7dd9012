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

use crate::engine::{
    validate, AdjustmentRecord, EngineConfig, QuantityItem, RecordIn, ResultKind, Valid,
};
use crate::model::{DeadLetterReason, Pico};

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
            rated,
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
            variant: rated.as_ref().and_then(|r| r.variant.clone()),
            plan: rated.as_ref().and_then(|r| r.plan.clone()),
            fee_pico: rated.as_ref().map_or(Pico::ZERO, |r| r.fee),
            quantities: rated.map_or_else(Vec::new, |r| {
                r.lines
                    .iter()
                    .map(|l| QuantityItem {
                        quantity: l.name.clone(),
                        count: l.count,
                        cost_pico: l.cost,
                    })
                    .collect()
            }),
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

    /// Under a rating an adjustment carries what a pane's line would: its plan,
    /// variant, fee and quantities, priced at the event time.
    #[test]
    fn an_adjustment_under_a_rating_carries_its_plan_and_quantities() {
        let text = include_str!("config/rating/openai.toml");
        let c = crate::config::Config::from_toml_with_env(text, Vec::new())
            .and_then(|c| c.engine())
            .unwrap();
        let ev = r#"{"request_id":"a","tenant_id":"acme","model":"o-large","completed_ts":1769904000000,"usage":{"prompt_tokens":10000,"prompt_tokens_details":{"cached_tokens":8000},"completion_tokens":500,"completion_tokens_details":{"reasoning_tokens":200}}}"#;
        let late = RecordIn {
            now_ms: 1_770_000_000_000,
            ..rec(ev)
        };
        let out = Reprocessor::default().process(&c, late, "requests/0/3");
        let Outcome::Adjusted(a) = out else {
            panic!("{out:?}")
        };
        assert_eq!(a.cost_pico, Pico(11_000_000_000));
        assert_eq!(
            (a.plan.as_deref(), a.variant.as_deref()),
            (Some("enterprise"), None)
        );
        let q: Vec<_> = a
            .quantities
            .iter()
            .map(|q| (&*q.quantity, q.count, q.cost_pico.0))
            .collect();
        assert_eq!(
            q,
            [
                ("prompt_tokens", 2_000, 3_000_000_000),
                ("completion_tokens", 300, 2_400_000_000),
                ("cached_tokens", 8_000, 4_000_000_000),
                ("reasoning_tokens", 200, 1_600_000_000),
            ]
        );
    }
}
