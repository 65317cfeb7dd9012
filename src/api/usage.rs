//! The usage API's reads: rows of `tally_usage` (migration 2) as JSON pages or a
//! CSV stream, grouped by the dimensions asked for and filtered by tenants and
//! models — or, for a dimension or filter of the rating's line items (variant,
//! plan, quantity), rows of `tally_usage_quantity` (`quantities`); a month's
//! invoice; the tenants listing.
//!
//! Invariants: money and counts are read as text and kept whole numbers of any size
//! (`Whole`: a month of sums can pass `u64` and `u128`) to the output — `cost_pico` a
//! string of digits, `usd` exactly 12 places — never a float, never a fixed width
//! that one tenant's sums could overflow for every tenant's answer. Rows
//! come in `(window_start, tenant_id, model[, variant, plan, quantity])` order,
//! the order pages resume in.
//! The buckets are PostgreSQL's: `date_trunc` in the IANA zone of its own tzdata.

use serde::Serialize;
use tokio_postgres::{Client, Row};

use super::params::{
    next_page, next_tenants_page, Cursor, Group, InvoiceQuery, TenantsQuery, UsageQuery,
};
use super::quantities::{self, QuantityLine};
use super::rows::UsageRow;
use super::whole::Whole;
use super::ReadError;
use crate::time::utc::format_rfc3339_ms;

/// A page of `/v1/usage`.
#[derive(Debug, Serialize)]
pub(crate) struct Page {
    pub data: Vec<UsageRow>,
    pub next_page: Option<String>,
}

/// The rows of a usage query, `$1`–`$10`: `tally_usage`'s six arguments, the
/// tenants (`TEXT[]`, or NULL: every tenant), the models (likewise), and whether
/// to keep the tenant and the model as dimensions. `tally_usage` groups by
/// tenant (and model); a dimension left out is summed over here. A bucket's
/// clipped bounds and `final` depend on the bucket alone, so the rows summed
/// into one agree on them.
const ROWS: &str = "
WITH r AS (
    SELECT u.window_start, u.window_end,
           CASE WHEN $9 THEN u.tenant_id END AS tenant_id,
           CASE WHEN $10 THEN u.model END AS model,
           sum(u.cost_pico) AS cost_pico, sum(u.requests) AS requests,
           sum(u.prompt_tokens) AS prompt_tokens, sum(u.completion_tokens) AS completion_tokens,
           bool_and(u.final) AS final, bool_and(u.aligned) AS aligned
    FROM tally_usage($1, $2, $3, $4, $5, $6) u
    WHERE ($7::TEXT[] IS NULL OR u.tenant_id = ANY($7))
      AND ($8::TEXT[] IS NULL OR u.model = ANY($8))
    GROUP BY 1, 2, 3, 4
)";

const SELECT: &str = "
SELECT window_start, window_end, tenant_id, model, cost_pico::TEXT, requests::TEXT,
       prompt_tokens::TEXT, completion_tokens::TEXT, final, aligned
FROM r";

const PAGE: &str = "
WHERE $11::BIGINT IS NULL
   OR (window_start, coalesce(tenant_id, '') COLLATE \"C\", coalesce(model, '') COLLATE \"C\") > ($11, $12, $13)
ORDER BY window_start, tenant_id COLLATE \"C\", model COLLATE \"C\"
LIMIT $14";

/// Byte order of the ids (the "C" collation), whatever the database's locale.
const ORDER: &str = r#"ORDER BY window_start, tenant_id COLLATE "C", model COLLATE "C""#;

/// A month's lines per model of one tenant (the invoice).
const INVOICE_LINES: &str = r#"
SELECT window_start, window_end, tenant_id, model, cost_pico::TEXT, requests::TEXT,
       prompt_tokens::TEXT, completion_tokens::TEXT, final, aligned
FROM tally_usage('month', $1, $2, $3, true, $4)
ORDER BY model COLLATE "C""#;

fn unaligned(q: &UsageQuery) -> ReadError {
    ReadError::Unaligned(format!(
        "a window of the job crosses a {} boundary in {}: the window size must divide the {} in that zone's offsets",
        q.unit.sql(),
        q.tz,
        q.unit.sql()
    ))
}

fn row(r: &Row) -> Result<(UsageRow, bool), ReadError> {
    let start: i64 = r.get(0);
    let cost = Whole::parse(r.get(4), "cost_pico")?;
    Ok((
        UsageRow {
            tenant_id: r.get(2),
            window_start: format_rfc3339_ms(start),
            window_end: format_rfc3339_ms(r.get(1)),
            model: r.get(3),
            variant: None,
            plan: None,
            quantity: None,
            count: None,
            usd: cost.usd(),
            cost_pico: cost.to_string(),
            requests: Some(Whole::parse(r.get(5), "requests")?),
            prompt_tokens: Some(Whole::parse(r.get(6), "prompt_tokens")?),
            completion_tokens: Some(Whole::parse(r.get(7), "completion_tokens")?),
            is_final: r.get(8),
            start_ms: start,
        },
        r.get(9),
    ))
}

type Param<'a> = &'a (dyn tokio_postgres::types::ToSql + Sync);

/// The values of `ROWS`'s ten parameters for `q`.
struct Args<'a> {
    unit: &'static str,
    /// One tenant goes to `tally_usage` itself (its first version's path).
    one: Option<&'a str>,
    tenants: Option<&'a [String]>,
    models: Option<&'a [String]>,
    by_model: bool,
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
            tenants: list(&q.tenants),
            models: list(&q.models),
            by_model: q.by_model(),
            q,
        }
    }

    fn params(&'a self) -> [Param<'a>; 10] {
        let q = self.q;
        [
            &self.unit,
            &q.tz,
            &q.from_ms,
            &q.to_ms,
            &self.by_model,
            &self.one,
            &self.tenants,
            &self.models,
            &q.group.tenant,
            &q.group.model,
        ]
    }
}

/// One page of `q`.
pub(crate) async fn page(client: &Client, q: &UsageQuery) -> Result<Page, ReadError> {
    let after = q.after.as_ref();
    let limit = (q.limit + 1) as i64;
    if q.by_quantity() {
        let rows = quantities::page(client, q, after, limit).await?;
        return paged(q, &rows, |r| quantities::row(r, q));
    }
    let args = Args::of(q);
    let [a1, a2, a3, a4, a5, a6, a7, a8, a9, a10] = args.params();
    let rows = client
        .query(
            &format!("{ROWS} {SELECT} {PAGE}"),
            &[
                a1,
                a2,
                a3,
                a4,
                a5,
                a6,
                a7,
                a8,
                a9,
                a10,
                &after.map(|c| c.window_start),
                &after.map(|c| c.tenant_id.as_str()),
                &after.map(|c| c.model.as_str()),
                &limit,
            ],
        )
        .await?;
    paged(q, &rows, row)
}

/// A page of `rows` (one more than `q.limit` when there is a next page).
fn paged(
    q: &UsageQuery,
    rows: &[Row],
    read: impl Fn(&Row) -> Result<(UsageRow, bool), ReadError>,
) -> Result<Page, ReadError> {
    let mut data = Vec::with_capacity(rows.len());
    for r in rows {
        let (row, aligned) = read(r)?;
        if !aligned {
            return Err(unaligned(q));
        }
        data.push(row);
    }
    let next_page = if data.len() > q.limit {
        data.truncate(q.limit);
        data.last().map(|last| {
            let text = |v: &Option<String>| v.clone().unwrap_or_default();
            let c = Cursor {
                window_start: last.start_ms,
                tenant_id: text(&last.tenant_id),
                model: text(&last.model),
                variant: text(&last.variant),
                plan: text(&last.plan),
                quantity: text(&last.quantity),
            };
            next_page(q, c)
        })
    } else {
        None
    };
    Ok(Page { data, next_page })
}

/// Every row of `q` (no paging), for the CSV answer: checks the alignment of the
/// whole range first (a stream cannot turn into a 400 halfway).
pub(crate) async fn all(
    client: &Client,
    q: &UsageQuery,
) -> Result<tokio_postgres::RowStream, ReadError> {
    if q.by_quantity() {
        return match quantities::all(client, q).await? {
            (true, rows) => Ok(rows),
            (false, _) => Err(unaligned(q)),
        };
    }
    let args = Args::of(q);
    let params = args.params();
    let aligned: Option<bool> = client
        .query_one(&format!("{ROWS} SELECT bool_and(aligned) FROM r"), &params)
        .await?
        .get(0);
    if aligned == Some(false) {
        return Err(unaligned(q));
    }
    let sql = format!("{ROWS} {SELECT} {ORDER}");
    Ok(client.query_raw(&sql, params).await?)
}

/// What a CSV line of a query holds: its dimensions, and whether its rows are
/// quantity rows (`count` when grouped by quantity; no token fields).
#[derive(Debug, Clone, Copy)]
pub(crate) struct CsvShape {
    group: Group,
    by_quantity: bool,
}

impl CsvShape {
    pub(crate) fn of(q: &UsageQuery) -> Self {
        CsvShape {
            group: q.group,
            by_quantity: q.by_quantity(),
        }
    }

    /// The CSV header line.
    pub(crate) fn header(self) -> String {
        let g = self.group;
        let mut h = String::new();
        let mut col = |on: bool, name: &str| {
            if on {
                h.push_str(name);
                h.push(',');
            }
        };
        col(g.tenant, "tenant_id");
        col(true, "window_start");
        col(true, "window_end");
        col(g.model, "model");
        col(g.variant, "variant");
        col(g.plan, "plan");
        col(g.quantity, "quantity");
        col(self.by_quantity && g.quantity, "count");
        col(true, "cost_pico");
        col(true, "usd");
        col(!self.by_quantity, "requests");
        col(!self.by_quantity, "prompt_tokens");
        col(!self.by_quantity, "completion_tokens");
        h.push_str("final\r\n");
        h
    }

    /// One CSV line of a row of `q` (RFC 4180: fields with a comma, quote or
    /// line break are quoted; text that would start a formula is neutralised,
    /// `negotiate::csv_text`).
    pub(crate) fn line(self, r: &Row, q: &UsageQuery) -> Result<String, ReadError> {
        let (u, _) = if self.by_quantity {
            quantities::row(r, q)?
        } else {
            row(r)?
        };
        let g = self.group;
        let mut out = String::new();
        let mut text = |on: bool, v: &Option<String>| {
            if on {
                out.push_str(&super::negotiate::csv_text(v.as_deref().unwrap_or("")));
                out.push(',');
            }
        };
        text(g.tenant, &u.tenant_id);
        text(true, &Some(u.window_start));
        text(true, &Some(u.window_end));
        text(g.model, &u.model);
        text(g.variant, &u.variant);
        text(g.plan, &u.plan);
        text(g.quantity, &u.quantity);
        let number = |v: &Option<Whole>| v.as_ref().map(|w| format!("{w},"));
        out.push_str(&number(&u.count).unwrap_or_default());
        out.push_str(&format!("{},{},", u.cost_pico, u.usd));
        for n in [&u.requests, &u.prompt_tokens, &u.completion_tokens] {
            out.push_str(&number(n).unwrap_or_default());
        }
        out.push_str(&format!("{}\r\n", u.is_final));
        Ok(out)
    }
}

/// `/v1/invoices/{tenant}`.
#[derive(Debug, Serialize)]
pub(crate) struct Invoice {
    pub tenant_id: String,
    pub period: String,
    pub tz: String,
    pub lines: Vec<InvoiceLine>,
    /// The lines per (model, variant, plan, quantity) of the windows a rating
    /// billed (none for a price table's): they sum to those windows' cost.
    pub quantity_lines: Vec<QuantityLine>,
    pub total: Total,
    #[serde(rename = "final")]
    pub is_final: bool,
}

#[derive(Debug, Serialize)]
pub(crate) struct InvoiceLine {
    pub model: String,
    pub requests: Whole,
    pub prompt_tokens: Whole,
    pub completion_tokens: Whole,
    pub cost_pico: String,
    pub usd: String,
}

#[derive(Debug, Serialize)]
pub(crate) struct Total {
    pub requests: Whole,
    pub cost_pico: String,
    pub usd: String,
}

/// The month of `q` in its zone: its line per model and per quantity, the
/// total, and whether every minute of it is final.
pub(crate) async fn invoice(client: &Client, q: &InvoiceQuery) -> Result<Invoice, ReadError> {
    let (year, month) = q.period;
    let bounds = client
        .query_one(
            "WITH m AS (SELECT make_timestamp($1, $2, 1, 0, 0, 0) AS local)
             SELECT (extract(epoch FROM local AT TIME ZONE $3) * 1000)::BIGINT,
                    (extract(epoch FROM (local + INTERVAL '1 month') AT TIME ZONE $3) * 1000)::BIGINT,
                    coalesce((extract(epoch FROM (local + INTERVAL '1 month') AT TIME ZONE $3) * 1000)::BIGINT
                             <= (SELECT final_through FROM tally_final), false)
             FROM m",
            &[&year, &(month as i32), &q.tz],
        )
        .await?;
    let (from, to, is_final): (i64, i64, bool) = (bounds.get(0), bounds.get(1), bounds.get(2));
    let rows = client
        .query(INVOICE_LINES, &[&q.tz, &from, &to, &q.tenant_id])
        .await?;
    let unaligned = || {
        ReadError::Unaligned(format!(
            "a window of the job crosses a month boundary in {}: the window size must divide the month in that zone's offsets",
            q.tz
        ))
    };
    let mut lines = Vec::with_capacity(rows.len());
    let (mut requests, mut cost) = (Whole::zero(), Whole::zero());
    for r in &rows {
        let (u, aligned) = row(r)?;
        if !aligned {
            return Err(unaligned());
        }
        let whole = |w: Option<Whole>| w.unwrap_or_else(Whole::zero);
        let line_requests = whole(u.requests);
        requests = requests.add(&line_requests);
        cost = cost.add(&Whole::parse(&u.cost_pico, "cost_pico")?);
        lines.push(InvoiceLine {
            model: u.model.unwrap_or_default(),
            requests: line_requests,
            prompt_tokens: whole(u.prompt_tokens),
            completion_tokens: whole(u.completion_tokens),
            cost_pico: u.cost_pico,
            usd: u.usd,
        });
    }
    let (quantity_lines, aligned) =
        quantities::invoice_lines(client, &q.tz, from, to, &q.tenant_id).await?;
    if !aligned {
        return Err(unaligned());
    }
    Ok(Invoice {
        tenant_id: q.tenant_id.clone(),
        period: format!("{year:04}-{month:02}"),
        tz: q.tz.clone(),
        lines,
        quantity_lines,
        total: Total {
            requests,
            usd: cost.usd(),
            cost_pico: cost.to_string(),
        },
        is_final,
    })
}

/// A page of `/v1/tenants`.
#[derive(Debug, Serialize)]
pub(crate) struct TenantsPage {
    pub data: Vec<TenantEntry>,
    pub next_page: Option<String>,
}

#[derive(Debug, Serialize)]
pub(crate) struct TenantEntry {
    pub tenant_id: String,
}

/// The tenants with stored windows or adjustments, by bytes, after `q.after`;
/// only those of `scope` (`None`: every tenant).
pub(crate) async fn tenants(
    client: &Client,
    q: &TenantsQuery,
    scope: Option<&[String]>,
) -> Result<TenantsPage, ReadError> {
    let limit = (q.limit + 1) as i64;
    let rows = client
        .query(
            r#"
SELECT tenant_id FROM (
    SELECT tenant_id FROM tenant_cost_partial
    UNION
    SELECT tenant_id FROM tenant_cost_adjustment
) t
WHERE ($1::TEXT IS NULL OR tenant_id COLLATE "C" > $1)
  AND ($2::TEXT[] IS NULL OR tenant_id = ANY($2))
ORDER BY tenant_id COLLATE "C"
LIMIT $3"#,
            &[&q.after, &scope, &limit],
        )
        .await?;
    let mut data: Vec<TenantEntry> = rows
        .iter()
        .map(|r| TenantEntry {
            tenant_id: r.get(0),
        })
        .collect();
    let next_page = if data.len() > q.limit {
        data.truncate(q.limit);
        data.last().map(|t| next_tenants_page(&t.tenant_id))
    } else {
        None
    };
    Ok(TenantsPage { data, next_page })
}
