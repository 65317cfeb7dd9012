//! A window's lines when a rate book prices its records (issue 36): one line per
//! `(model, variant, plan)`, each with its fee and, per quantity billed, the net
//! count and its cost.
//!
//! Invariants: lines are sorted by `(model, variant, plan)` and each line's items
//! by quantity id, whatever order the records came in, so panes are a pure
//! function of the window's content. A line's cost is `sum(items' cost) + fee`; the
//! window's `cost` is the sum of its lines' costs, and its `version` their
//! requests. A fold that would overflow any sum changes nothing (`None`): the
//! record is a dead letter (`overflow`), as on today's path.

use std::cmp::Ordering;
use std::sync::Arc;

use crate::model::rating::{QuantityId, Rated};
use crate::model::Pico;

/// One `(model, variant, plan)` of a window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RatedLine {
    pub model: Arc<str>,
    pub variant: Option<Arc<str>>,
    pub plan: Option<Arc<str>>,
    pub requests: u64,
    /// The gross counts of the two default quantities (as in the window's totals).
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// The fees per request, summed (zero when the price has none).
    pub fee: Pico,
    /// The requests charged a fee (a tier or a plan may charge none).
    pub fee_requests: u64,
    /// `sum(items' cost) + fee`.
    pub cost: Pico,
    pub items: Vec<QuantityLine>,
}

/// One quantity of a line: its net count billed and what it cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuantityLine {
    pub quantity: QuantityId,
    pub name: Arc<str>,
    pub count: u64,
    pub cost: Pico,
}

/// What a line adds to a window in memory, and each of its items.
pub(crate) const RATED_LINE_BYTES: usize = std::mem::size_of::<RatedLine>();
pub(crate) const QUANTITY_LINE_BYTES: usize = std::mem::size_of::<QuantityLine>();

impl RatedLine {
    fn key_cmp(&self, r: &Rated) -> Ordering {
        fn opt(o: &Option<Arc<str>>) -> Option<&[u8]> {
            o.as_deref().map(str::as_bytes)
        }
        (self.model.as_bytes(), opt(&self.variant), opt(&self.plan)).cmp(&(
            r.model.as_bytes(),
            opt(&r.variant),
            opt(&r.plan),
        ))
    }

    /// The memory the line holds beyond its window.
    pub(crate) fn bytes(&self) -> usize {
        RATED_LINE_BYTES + self.items.len() * QUANTITY_LINE_BYTES
    }
}

/// Folds a rated request (whose gross default counts are `tokens`) into `lines`;
/// returns the bytes it added, or `None` on overflow (then nothing changed).
pub(crate) fn fold(lines: &mut Vec<RatedLine>, r: &Rated, tokens: (u64, u64)) -> Option<usize> {
    let (i, inserted) = match lines.binary_search_by(|l| l.key_cmp(r)) {
        Ok(i) => (i, false),
        Err(i) => {
            lines.insert(
                i,
                RatedLine {
                    model: r.model.clone(),
                    variant: r.variant.clone(),
                    plan: r.plan.clone(),
                    requests: 0,
                    prompt_tokens: 0,
                    completion_tokens: 0,
                    fee: Pico::ZERO,
                    fee_requests: 0,
                    cost: Pico::ZERO,
                    items: Vec::new(),
                },
            );
            (i, true)
        }
    };
    // Every sum is checked before any changes.
    let l = &lines[i];
    let fits = l.requests.checked_add(1).is_some()
        && l.prompt_tokens.checked_add(tokens.0).is_some()
        && l.completion_tokens.checked_add(tokens.1).is_some()
        && l.fee.checked_add(r.fee).is_ok()
        && l.cost.checked_add(r.total).is_ok()
        && r.lines.iter().all(|item| {
            match l.items.binary_search_by(|q| q.quantity.cmp(&item.quantity)) {
                Ok(j) => {
                    l.items[j].count.checked_add(item.count).is_some()
                        && l.items[j].cost.checked_add(item.cost).is_ok()
                }
                Err(_) => true,
            }
        });
    if !fits {
        if inserted {
            lines.remove(i);
        }
        return None;
    }
    let line = &mut lines[i];
    let before = line.items.len();
    line.requests += 1;
    line.prompt_tokens += tokens.0;
    line.completion_tokens += tokens.1;
    line.fee = Pico(line.fee.0 + r.fee.0);
    line.fee_requests += u64::from(!r.fee.is_zero());
    line.cost = Pico(line.cost.0 + r.total.0);
    for item in &r.lines {
        match line
            .items
            .binary_search_by(|q| q.quantity.cmp(&item.quantity))
        {
            Ok(j) => {
                let q = &mut line.items[j];
                q.count += item.count;
                q.cost = Pico(q.cost.0 + item.cost.0);
            }
            Err(j) => line.items.insert(
                j,
                QuantityLine {
                    quantity: item.quantity,
                    name: item.name.clone(),
                    count: item.count,
                    cost: item.cost,
                },
            ),
        }
    }
    let added = (line.items.len() - before) * QUANTITY_LINE_BYTES;
    Some(added + if inserted { RATED_LINE_BYTES } else { 0 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::rating::LineItem;

    fn rated(model: &str, plan: Option<&str>, items: &[(u16, u64, u128)], fee: u128) -> Rated {
        let lines: Vec<LineItem> = items
            .iter()
            .map(|&(q, count, cost)| LineItem {
                quantity: QuantityId(q),
                name: format!("q{q}").into(),
                count,
                cost: Pico(cost),
            })
            .collect();
        let total = lines.iter().map(|l| l.cost.0).sum::<u128>() + fee;
        Rated {
            model: model.into(),
            variant: None,
            plan: plan.map(Into::into),
            tier_above: None,
            lines,
            fee: Pico(fee),
            total: Pico(total),
        }
    }

    #[test]
    fn lines_sort_by_key_and_items_by_quantity_whatever_the_order() {
        let a = rated("b", None, &[(2, 5, 50), (0, 1, 10)], 3);
        let b = rated("a", Some("p"), &[(1, 2, 20)], 0);
        let c = rated("a", None, &[(0, 4, 40)], 0);
        let mut one = Vec::new();
        let mut two = Vec::new();
        for r in [&a, &b, &c, &a] {
            fold(&mut one, r, (1, 2)).unwrap();
        }
        for r in [&c, &a, &a, &b] {
            fold(&mut two, r, (1, 2)).unwrap();
        }
        assert_eq!(one, two);
        let keys: Vec<_> = one.iter().map(|l| (&*l.model, l.plan.as_deref())).collect();
        assert_eq!(keys, [("a", None), ("a", Some("p")), ("b", None)]);
        let b_line = &one[2];
        assert_eq!(b_line.requests, 2);
        assert_eq!(b_line.fee, Pico(6));
        assert_eq!(b_line.cost, Pico(2 * (50 + 10 + 3)));
        let items: Vec<_> = b_line
            .items
            .iter()
            .map(|q| (q.quantity.0, q.count))
            .collect();
        assert_eq!(items, [(0, 2), (2, 10)]);
        // Each line's cost is its items' plus its fee.
        for l in &one {
            let sum: u128 = l.items.iter().map(|q| q.cost.0).sum::<u128>() + l.fee.0;
            assert_eq!(l.cost.0, sum);
        }
    }

    #[test]
    fn an_overflowing_fold_changes_nothing() {
        let mut lines = Vec::new();
        fold(
            &mut lines,
            &rated("m", None, &[(0, u64::MAX, 1)], 0),
            (0, 0),
        )
        .unwrap();
        let before = lines.clone();
        assert_eq!(
            fold(&mut lines, &rated("m", None, &[(0, 1, 1)], 0), (0, 0)),
            None
        );
        assert_eq!(lines, before);
    }
}
