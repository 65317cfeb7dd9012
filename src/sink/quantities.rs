//! The rated line items of results in PostgreSQL (migration 0004, docs/DESIGN.md
//! §3.2 and §6): one row per `(model, variant, plan, quantity)` of a pane, and per
//! quantity of an adjustment; a line's fees are the quantity `fee`, counting the
//! requests charged one.
//!
//! Invariants: rows are written only for results a rating priced (a line with
//! quantities); a pane's rows carry its `(generation, version)` and are written in
//! the transaction that replaces the partial, only when it did (the view reads only
//! the rows of the partial's current version); an adjustment's rows are replaced
//! whole when the adjustment row is (a higher generation). `variant` and `plan` are
//! `''` when absent.

use tokio_postgres::Transaction;

use super::SinkError;
use crate::engine::{AdjustmentRecord, QuantityItem, ResultRecord};
use crate::model::Pico;

const DELETE_ADJUSTMENT_QUANTITIES: &str =
    "DELETE FROM tenant_cost_adjustment_quantity WHERE request_id = $1";

const INSERT_ADJUSTMENT_QUANTITIES: &str = "
INSERT INTO tenant_cost_adjustment_quantity (request_id, quantity, count, cost_pico, generation)
SELECT $1, q.quantity, q.count::NUMERIC, q.cost::NUMERIC, $2
FROM unnest($3::TEXT[], $4::TEXT[], $5::TEXT[]) AS q(quantity, count, cost)";

const SET_ADJUSTMENT_KEY: &str =
    "UPDATE tenant_cost_adjustment SET variant = $2, plan = $3 WHERE request_id = $1";

/// Columns of quantity rows, built up row by row.
#[derive(Default)]
pub(super) struct Rows<'a> {
    pub model: Vec<&'a str>,
    pub variant: Vec<&'a str>,
    pub plan: Vec<&'a str>,
    pub quantity: Vec<&'a str>,
    pub count: Vec<String>,
    pub cost: Vec<String>,
}

impl<'a> Rows<'a> {
    /// A line's quantities, then its fee (when it has one) as the quantity `fee`.
    fn line(
        &mut self,
        key: (&'a str, &'a str, &'a str),
        items: &'a [QuantityItem],
        fee: Pico,
        requests: u64,
    ) {
        let fee_row = (!fee.is_zero()).then_some(("fee", requests, fee));
        let rows = items
            .iter()
            .map(|q| (&*q.quantity, q.count, q.cost_pico))
            .chain(fee_row);
        for (quantity, count, cost) in rows {
            self.model.push(key.0);
            self.variant.push(key.1);
            self.plan.push(key.2);
            self.quantity.push(quantity);
            self.count.push(count.to_string());
            self.cost.push(cost.to_string());
        }
    }
}

/// The quantity rows of a pane (`apply`'s `UPSERT_PANE` writes them when it
/// replaces the partial); none for a pane without rated lines.
pub(super) fn pane_rows(r: &ResultRecord) -> Rows<'_> {
    let mut rows = Rows::default();
    for l in r.lines.iter().filter(|l| !l.quantities.is_empty()) {
        let key = (
            &*l.model,
            l.variant.as_deref().unwrap_or(""),
            l.plan.as_deref().unwrap_or(""),
        );
        rows.line(key, &l.quantities, l.fee_pico, l.fee_requests);
    }
    rows
}

/// An adjustment's variant, plan and quantity rows, after its row was written
/// (`written`: the insert or the higher generation's update changed it).
pub(super) async fn adjustment(
    tx: &Transaction<'_>,
    a: &AdjustmentRecord,
    generation: i64,
) -> Result<(), SinkError> {
    if a.quantities.is_empty() && a.variant.is_none() && a.plan.is_none() {
        return Ok(());
    }
    let (variant, plan) = (
        a.variant.as_deref().unwrap_or(""),
        a.plan.as_deref().unwrap_or(""),
    );
    tx.execute(SET_ADJUSTMENT_KEY, &[&a.request_id, &variant, &plan])
        .await?;
    tx.execute(DELETE_ADJUSTMENT_QUANTITIES, &[&a.request_id])
        .await?;
    let mut rows = Rows::default();
    rows.line((&a.model, variant, plan), &a.quantities, a.fee_pico, 1);
    tx.execute(
        INSERT_ADJUSTMENT_QUANTITIES,
        &[
            &a.request_id,
            &generation,
            &rows.quantity,
            &rows.count,
            &rows.cost,
        ],
    )
    .await?;
    Ok(())
}
