//! The usage API's reads of a rating's line items (docs/DESIGN.md §3.2): rows of
//! `tally_usage_quantity` (migration 4) per bucket and per value of each
//! dimension asked for — tenant, model, variant, plan, quantity — filtered by
//! any of them; and a month's lines per (model, variant, plan, quantity) for the
//! invoice.
//!
//! Invariants: the sums are `usage`'s (whole numbers of any size, money never a
//! float); rows come in `(window_start, tenant_id, model, variant, plan,
//! quantity)` order, ids by bytes, the order pages resume in. A row carries
//! `count` only when grouped by quantity (a sum over several quantities would
//! add tokens to calls), and never the token and request fields of the
//! windows' rows: a quantity row has none of its own. Windows priced by a price
//! table have no quantity rows, so none here.

use serde::Serialize;
use tokio_postgres::{Client, Row};

use super::params::{Cursor, UsageQuery};
use super::rows::UsageRow;
use super::whole::Whole;
use super::ReadError;
use crate::time::utc::format_rfc3339_ms;

/// The rows of a quantity query, `$1`–`$15`: `tally_usage_quantity`'s five
/// arguments; whether to keep the tenant, model, variant, plan and quantity as
/// dimensions; the tenants, models, variants, plans and quantities to read
/// (`TEXT[]`, or NULL: every one). A dimension left out is summed over here; a
/// bucket's clipped bounds and `final` depend on the bucket alone.
const ROWS: &str = "
WITH r AS (
    SELECT u.window_start, u.window_end,
           CASE WHEN $6 THEN u.tenant_id END AS tenant_id,
           CASE WHEN $7 THEN u.model END AS model,
           CASE WHEN $8 THEN u.variant END AS variant,
           CASE WHEN $9 THEN u.plan END AS plan,
           CASE WHEN $10 THEN u.quantity END AS quantity,
           sum(u.count) AS count, sum(u.cost_pico) AS cost_pico,
           bool_and(u.final) AS final, bool_and(u.aligned) AS aligned
    FROM tally_usage_quantity($1, $2, $3, $4, $5) u
    WHERE ($11::TEXT[] IS NULL OR u.tenant_id = ANY($11))
      AND ($12::TEXT[] IS NULL OR u.model = ANY($12))
      AND ($13::TEXT[] IS NULL OR u.variant = ANY($13))
      AND ($14::TEXT[] IS NULL OR u.plan = ANY($14))
      AND ($15::TEXT[] IS NULL OR u.quantity = ANY($15))
    GROUP BY 1, 2, 3, 4, 5, 6, 7
)";

const SELECT: &str = "
SELECT window_start, window_end, tenant_id, model, variant, plan, quantity,
       count::TEXT, cost_pico::TEXT, final, aligned
FROM r";

/// `""` for a dimension left out (NULL): every row of a query has the same ones.
const PAGE: &str = r#"
WHERE $16::BIGINT IS NULL
   OR (window_start, coalesce(tenant_id, '') COLLATE "C", coalesce(model, '') COLLATE "C",
       coalesce(variant, '') COLLATE "C", coalesce(plan, '') COLLATE "C",
       coalesce(quantity, '') COLLATE "C") > ($16, $17, $18, $19, $20, $21)
ORDER BY window_start, tenant_id COLLATE "C", model COLLATE "C", variant COLLATE "C",
         plan COLLATE "C", quantity COLLATE "C"
LIMIT $22"#;

const ORDER: &str = r#"ORDER BY window_start, tenant_id COLLATE "C", model COLLATE "C",
         variant COLLATE "C", plan COLLATE "C", quantity COLLATE "C""#;

type Param<'a> = &'a (dyn tokio_postgres::types::ToSql + Sync);

/// The values of `ROWS`'s fifteen parameters for `q`.
struct Args<'a> {
    unit: &'static str,
    /// One tenant goes to `tally_usage_quantity` itself.
    one: Option<&'a str>,
    lists: [Option<&'a [String]>; 5],
    q: &'a UsageQuery,
}

impl<'a> Args<'a> {
    fn of(q: &'a UsageQuery) -> Self {
        let list = |v: &'a [String]| (!v.is_empty()).then_some(v);
        Args {
            unit: q.unit.sql(),
            one: match q.tenants.as_slice() {
                [one] => Some(one.as_str()),
                _ => None,
            },
            lists: [
                list(&q.tenants),
                list(&q.models),
                list(&q.variants),
                list(&q.plans),
                list(&q.quantities),
            ],
            q,
        }
    }

    fn params(&'a self) -> Vec<Param<'a>> {
        let (q, g) = (self.q, &self.q.group);
        let mut p: Vec<Param<'a>> = vec![
            &self.unit,
            &q.tz,
            &q.from_ms,
            &q.to_ms,
            &self.one,
            &g.tenant,
            &g.model,
            &g.variant,
            &g.plan,
            &g.quantity,
        ];
        p.extend(self.lists.iter().map(|l| l as Param<'a>));
        p
    }
}

/// A row of `SELECT`, and whether its bucket is aligned.
pub(super) fn row(r: &Row, q: &UsageQuery) -> Result<(UsageRow, bool), ReadError> {
    let start: i64 = r.get(0);
    let cost = Whole::parse(r.get(8), "cost_pico")?;
    let count = if q.group.quantity {
        Some(Whole::parse(r.get(7), "count")?)
    } else {
        None
    };
    Ok((
        UsageRow {
            tenant_id: r.get(2),
            window_start: format_rfc3339_ms(start),
            window_end: format_rfc3339_ms(r.get(1)),
            model: r.get(3),
            variant: r.get(4),
            plan: r.get(5),
            quantity: r.get(6),
            count,
            usd: cost.usd(),
            cost_pico: cost.to_string(),
            requests: None,
            prompt_tokens: None,
            completion_tokens: None,
            is_final: r.get(9),
            start_ms: start,
        },
        r.get(10),
    ))
}

/// Up to `limit` rows of `q` after `after`.
pub(super) async fn page(
    client: &Client,
    q: &UsageQuery,
    after: Option<&Cursor>,
    limit: i64,
) -> Result<Vec<Row>, ReadError> {
    let start = after.map(|c| c.window_start);
    let text = |f: fn(&Cursor) -> &String| after.map(|c| f(c).as_str());
    let ids = [
        text(|c| &c.tenant_id),
        text(|c| &c.model),
        text(|c| &c.variant),
        text(|c| &c.plan),
        text(|c| &c.quantity),
    ];
    let args = Args::of(q);
    let mut params = args.params();
    params.push(&start);
    params.extend(ids.iter().map(|i| i as Param<'_>));
    params.push(&limit);
    Ok(client
        .query(&format!("{ROWS} {SELECT} {PAGE}"), &params)
        .await?)
}

/// Every row of `q`, after checking the whole range's alignment (`usage::all`).
pub(super) async fn all(
    client: &Client,
    q: &UsageQuery,
) -> Result<(bool, tokio_postgres::RowStream), ReadError> {
    let args = Args::of(q);
    let params = args.params();
    let aligned: Option<bool> = client
        .query_one(&format!("{ROWS} SELECT bool_and(aligned) FROM r"), &params)
        .await?
        .get(0);
    let sql = format!("{ROWS} {SELECT} {ORDER}");
    let rows = client.query_raw(&sql, params).await?;
    Ok((aligned != Some(false), rows))
}

/// An invoice line per (model, variant, plan, quantity) of the month: what a
/// provider's invoice reads as "large — cached input".
#[derive(Debug, Serialize)]
pub(crate) struct QuantityLine {
    /// `"o-large — cached_tokens"`, with the variant and plan when set:
    /// `"o-large (batch; plan enterprise) — cached_tokens"`.
    pub description: String,
    pub model: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
    pub quantity: String,
    pub count: Whole,
    pub cost_pico: String,
    pub usd: String,
}

/// The readable name of a line (`QuantityLine::description`).
pub(crate) fn description(model: &str, variant: &str, plan: &str, quantity: &str) -> String {
    let tags: Vec<String> = [
        (!variant.is_empty()).then(|| variant.to_string()),
        (!plan.is_empty()).then(|| format!("plan {plan}")),
    ]
    .into_iter()
    .flatten()
    .collect();
    if tags.is_empty() {
        format!("{model} — {quantity}")
    } else {
        format!("{model} ({}) — {quantity}", tags.join("; "))
    }
}

const INVOICE_LINES: &str = r#"
SELECT model, variant, plan, quantity, sum(count)::TEXT, sum(cost_pico)::TEXT, bool_and(aligned)
FROM tally_usage_quantity('month', $1, $2, $3, $4)
GROUP BY model, variant, plan, quantity
ORDER BY model COLLATE "C", variant COLLATE "C", plan COLLATE "C", quantity COLLATE "C""#;

/// The month `[from, to)` of `tenant` in `tz`, per (model, variant, plan,
/// quantity); `Err(Unaligned)` as the lines per model.
pub(super) async fn invoice_lines(
    client: &Client,
    tz: &str,
    from: i64,
    to: i64,
    tenant: &str,
) -> Result<(Vec<QuantityLine>, bool), ReadError> {
    let rows = client
        .query(INVOICE_LINES, &[&tz, &from, &to, &tenant])
        .await?;
    let mut aligned = true;
    let mut lines = Vec::with_capacity(rows.len());
    for r in &rows {
        let (model, variant, plan, quantity): (String, String, String, String) =
            (r.get(0), r.get(1), r.get(2), r.get(3));
        let cost = Whole::parse(r.get(5), "cost_pico")?;
        aligned &= r.get::<_, bool>(6);
        lines.push(QuantityLine {
            description: description(&model, &variant, &plan, &quantity),
            variant: (!variant.is_empty()).then_some(variant),
            plan: (!plan.is_empty()).then_some(plan),
            model,
            quantity,
            count: Whole::parse(r.get(4), "count")?,
            usd: cost.usd(),
            cost_pico: cost.to_string(),
        });
    }
    Ok((lines, aligned))
}

#[cfg(test)]
mod tests {
    use super::description;

    #[test]
    fn a_line_reads_as_a_providers_invoice() {
        assert_eq!(
            description("o-large", "", "", "cached_tokens"),
            "o-large — cached_tokens"
        );
        assert_eq!(
            description("o-large", "batch", "", "prompt_tokens"),
            "o-large (batch) — prompt_tokens"
        );
        assert_eq!(
            description("o-large", "batch", "enterprise", "fee"),
            "o-large (batch; plan enterprise) — fee"
        );
        assert_eq!(
            description("o-large", "", "enterprise", "fee"),
            "o-large (plan enterprise) — fee"
        );
    }
}
