//! A window's accumulator: its totals and its line items per model.
//!
//! Invariants: the totals (`cost`, tokens, `version` = requests) are the sums of
//! the window's lines. The line of the model of the window's first record is not
//! stored: it is the totals minus the other lines (`others`), so a window of one
//! model — the common case — costs a shared name and an empty vector, and folding
//! into it updates the totals alone. `lines()` gives every line, sorted by model.
//! A line is found by the address of the price table's shared name (no string
//! compare); by name only after a restore or a price reload, when the line then
//! takes the current table's name. No line can overflow: each is at most its total.

use std::sync::Arc;

use super::acc_rated::RatedLine;
use super::LineItem;
use crate::model::rating::Rated;
use crate::model::Pico;

/// The accumulator of one `(tenant, window)`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WindowAcc {
    pub cost: Pico,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// Events folded in (also the request count).
    pub version: u64,
    /// Panes emitted so far.
    pub panes: u32,
    /// Changed since the state store last saw it.
    pub dirty: bool,
    /// The model of the window's first record (`""` for a window of checkpoint
    /// format 5, folded before line items): its line is the totals minus `others`.
    pub first_model: Arc<str>,
    /// The lines of the other models, in the order they first came.
    pub others: Vec<Line>,
    /// The lines, when a rate book prices the window's records (`acc_rated`):
    /// then every line is here, whole, and `first_model`/`others` are unused.
    // Boxed: 8 bytes in every window (of today's pricing too) instead of 24.
    #[allow(clippy::box_collection)]
    pub rated: Option<Box<Vec<RatedLine>>>,
}

/// One model's share of a window: the invoice line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// Shared with the price table (`PriceTable::model_at`).
    pub model: Arc<str>,
    pub requests: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cost: Pico,
}

/// What a line beyond the first adds to a window in memory (`state.memory_budget`).
pub(crate) const LINE_BYTES: usize = std::mem::size_of::<Line>();

impl WindowAcc {
    /// Folds one rated request in (its gross default counts are `tokens`);
    /// `None` on overflow (then nothing changed), else the bytes its lines grew by.
    pub(super) fn fold_rated(&mut self, r: &Rated, tokens: (u64, u64)) -> Option<usize> {
        let total_cost = self.cost.checked_add(r.total).ok()?;
        let prompt = self.prompt_tokens.checked_add(tokens.0)?;
        let completion = self.completion_tokens.checked_add(tokens.1)?;
        let added =
            super::acc_rated::fold(self.rated.get_or_insert_with(Default::default), r, tokens)?;
        self.cost = total_cost;
        self.prompt_tokens = prompt;
        self.completion_tokens = completion;
        self.version += 1;
        self.dirty = true;
        Some(added)
    }

    /// What the window's lines hold in memory beyond the window itself.
    pub(crate) fn lines_bytes(&self) -> usize {
        self.others.len() * LINE_BYTES
            + self
                .rated
                .as_ref()
                .map_or(0, |ls| ls.iter().map(RatedLine::bytes).sum())
    }

    /// The pane's line items: the rated lines, or today's lines by model.
    pub(crate) fn line_items(&self) -> Vec<LineItem> {
        match &self.rated {
            Some(lines) => lines.iter().map(LineItem::of_rated).collect(),
            None => self.map_lines(LineItem::of),
        }
    }

    /// Folds one priced request of `model` (the price table's shared name) in;
    /// `None` on overflow (then nothing changed). Returns whether a line was added
    /// to `others`.
    pub(super) fn fold(
        &mut self,
        model: &Arc<str>,
        (prompt_tokens, completion_tokens): (u64, u64),
        cost: Pico,
    ) -> Option<bool> {
        let total_cost = self.cost.checked_add(cost).ok()?;
        let prompt = self.prompt_tokens.checked_add(prompt_tokens)?;
        let completion = self.completion_tokens.checked_add(completion_tokens)?;
        let mut added = false;
        if self.version == 0 {
            self.first_model = model.clone();
        } else if !Arc::ptr_eq(&self.first_model, model) {
            if *self.first_model == **model {
                self.first_model = model.clone();
            } else {
                added = self.fold_other(model, (prompt_tokens, completion_tokens), cost);
            }
        }
        self.cost = total_cost;
        self.prompt_tokens = prompt;
        self.completion_tokens = completion;
        self.version += 1;
        self.dirty = true;
        Some(added)
    }

    fn fold_other(
        &mut self,
        model: &Arc<str>,
        (prompt_tokens, completion_tokens): (u64, u64),
        cost: Pico,
    ) -> bool {
        let found = self
            .others
            .iter()
            .position(|l| Arc::ptr_eq(&l.model, model))
            .or_else(|| {
                let i = self.others.iter().position(|l| *l.model == **model)?;
                self.others[i].model = model.clone();
                Some(i)
            });
        match found {
            Some(i) => {
                let l = &mut self.others[i];
                l.requests += 1;
                l.prompt_tokens += prompt_tokens;
                l.completion_tokens += completion_tokens;
                l.cost = Pico(l.cost.0 + cost.0);
                false
            }
            None => {
                self.others.push(Line {
                    model: model.clone(),
                    requests: 1,
                    prompt_tokens,
                    completion_tokens,
                    cost,
                });
                true
            }
        }
    }

    /// Every line, sorted by model (none before the first record).
    #[cfg(test)]
    pub(crate) fn lines(&self) -> Vec<Line> {
        self.map_lines(Line::clone)
    }

    /// Every line as `f` makes it, sorted by model: one allocation, the result.
    pub(crate) fn map_lines<T>(&self, f: impl Fn(&Line) -> T) -> Vec<T> {
        if self.version == 0 {
            return Vec::new();
        }
        let mut first = Line {
            model: self.first_model.clone(),
            requests: self.version,
            prompt_tokens: self.prompt_tokens,
            completion_tokens: self.completion_tokens,
            cost: self.cost,
        };
        for l in &self.others {
            first.requests -= l.requests;
            first.prompt_tokens -= l.prompt_tokens;
            first.completion_tokens -= l.completion_tokens;
            first.cost = Pico(first.cost.0 - l.cost.0);
        }
        let mut all = Vec::with_capacity(1 + self.others.len());
        if self.others.is_empty() {
            all.push(f(&first));
            return all;
        }
        let mut refs: Vec<&Line> = self.others.iter().collect();
        refs.push(&first);
        refs.sort_unstable_by(|a, b| a.model.cmp(&b.model));
        all.extend(refs.into_iter().map(f));
        all
    }
}
