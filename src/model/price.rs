//! The price table: per model, effective-dated prices in nano-USD per 1k tokens.
//!
//! Invariants: the price applied to an event is the one in effect at the event's
//! time (never the wall clock), so a replay bills identically; entries per model
//! are sorted by `effective_from` and unique; models are sorted by name and unique.
//! A price table holds a handful of models, so a lookup is a scan (string
//! equality compares lengths first; cheaper per event than a tree or a hash).
//! Model names are shared (`Arc<str>`): a window's line items point at them
//! instead of copying the name per window.

use std::sync::Arc;

use super::money::{NanoPer1k, Overflow, Pico};

/// One model's price from `effective_from_ms` (inclusive) until the next entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PriceEntry {
    pub effective_from_ms: i64,
    pub input: NanoPer1k,
    pub output: NanoPer1k,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PriceTable {
    models: Vec<(Arc<str>, Vec<PriceEntry>)>,
}

/// Why an event could not be priced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PriceError {
    UnknownModel,
    /// The model exists but has no price in effect at the event time.
    NotYetPriced,
    Overflow,
}

impl From<Overflow> for PriceError {
    fn from(_: Overflow) -> Self {
        PriceError::Overflow
    }
}

impl PriceTable {
    /// Adds a price entry; entries may come in any order.
    pub fn insert(&mut self, model: &str, entry: PriceEntry) {
        let i = match self.models.binary_search_by(|(m, _)| (**m).cmp(model)) {
            Ok(i) => i,
            Err(i) => {
                self.models.insert(i, (model.into(), Vec::new()));
                i
            }
        };
        let entries = &mut self.models[i].1;
        entries.retain(|e| e.effective_from_ms != entry.effective_from_ms);
        entries.push(entry);
        entries.sort_by_key(|e| e.effective_from_ms);
    }

    /// The shared name of the model at `index` (from `price`).
    pub fn model_at(&self, index: usize) -> &Arc<str> {
        &self.models[index].0
    }

    pub fn models(&self) -> impl Iterator<Item = &str> {
        self.models.iter().map(|(m, _)| &**m)
    }

    pub fn entries(&self) -> impl Iterator<Item = (&str, &PriceEntry)> {
        self.models
            .iter()
            .flat_map(|(m, es)| es.iter().map(move |e| (&**m, e)))
    }

    /// The cost of one request, priced at `at_ms`.
    pub fn cost(
        &self,
        model: &str,
        prompt: u64,
        completion: u64,
        at_ms: i64,
    ) -> Result<Pico, PriceError> {
        self.price(model, prompt, completion, at_ms).map(|(_, c)| c)
    }

    /// `cost`, and the model's index in this table (`model_at`).
    pub fn price(
        &self,
        model: &str,
        prompt: u64,
        completion: u64,
        at_ms: i64,
    ) -> Result<(usize, Pico), PriceError> {
        let (index, (_, entries)) = self
            .models
            .iter()
            .enumerate()
            .find(|(_, (m, _))| super::same(m.as_bytes(), model.as_bytes()))
            .ok_or(PriceError::UnknownModel)?;
        let idx = entries.partition_point(|e| e.effective_from_ms <= at_ms);
        let entry = idx
            .checked_sub(1)
            .map(|i| entries[i])
            .ok_or(PriceError::NotYetPriced)?;
        let cost = entry
            .input
            .cost(prompt)
            .checked_add(entry.output.cost(completion))?;
        Ok((index, cost))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> PriceTable {
        let mut t = PriceTable::default();
        t.insert(
            "small",
            PriceEntry {
                effective_from_ms: i64::MIN,
                input: NanoPer1k(150_000),
                output: NanoPer1k(600_000),
            },
        );
        t.insert(
            "small",
            PriceEntry {
                effective_from_ms: 1_000,
                input: NanoPer1k(100_000),
                output: NanoPer1k(400_000),
            },
        );
        t
    }

    #[test]
    fn prices_by_event_time() {
        let t = table();
        // 1200 * 150_000 + 350 * 600_000
        assert_eq!(
            t.cost("small", 1200, 350, 999),
            Ok(Pico(180_000_000 + 210_000_000))
        );
        assert_eq!(
            t.cost("small", 1200, 350, 1_000),
            Ok(Pico(120_000_000 + 140_000_000))
        );
    }

    #[test]
    fn unknown_and_not_yet_priced_models_are_errors() {
        let mut t = table();
        assert_eq!(t.cost("huge", 1, 1, 0), Err(PriceError::UnknownModel));
        t.insert(
            "new",
            PriceEntry {
                effective_from_ms: 500,
                input: NanoPer1k(1),
                output: NanoPer1k(1),
            },
        );
        assert_eq!(t.cost("new", 1, 1, 499), Err(PriceError::NotYetPriced));
        assert_eq!(t.cost("new", 1, 1, 500), Ok(Pico(2)));
    }

    #[test]
    fn overflow_is_reported() {
        let mut t = PriceTable::default();
        t.insert(
            "x",
            PriceEntry {
                effective_from_ms: 0,
                input: NanoPer1k(u64::MAX),
                output: NanoPer1k(u64::MAX),
            },
        );
        assert_eq!(
            t.cost("x", u64::MAX, u64::MAX, 0),
            Err(PriceError::Overflow)
        );
    }
}
