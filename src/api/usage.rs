//! The usage API's reads: rows of `tally_usage` (migration 2) as JSON pages or a
//! CSV stream, and a month's invoice.
//!
//! Invariants: money and counts are read as text and kept whole numbers of any size
//! (`Whole`: a month of sums can pass `u64` and `u128`) to the output — `cost_pico` a
//! string of digits, `usd` exactly 12 places — never a float, never a fixed width
//! that one tenant's sums could overflow for every tenant's answer. Rows
//! come in `(window_start, tenant_id, model)` order, the order pages resume in.
//! The buckets are PostgreSQL's: `date_trunc` in the IANA zone of its own tzdata.

use serde::Serialize;
use tokio_postgres::{Client, Row};

use super::params::{next_page, Cursor, InvoiceQuery, UsageQuery};
use super::whole::Whole;
use super::ReadError;
use crate::time::utc::format_rfc3339_ms;

/// One row of `/v1/usage`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct UsageRow {
    pub tenant_id: String,
    pub window_start: String,
    pub window_end: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    pub cost_pico: String,
    pub usd: String,
    pub requests: Whole,
    pub prompt_tokens: Whole,
    pub completion_tokens: Whole,
    #[serde(rename = "final")]
    pub is_final: bool,
    #[serde(skip)]
    start_ms: i64,
}

/// A page of `/v1/usage`.
#[derive(Debug, Serialize)]
pub(crate) struct Page {
    pub data: Vec<UsageRow>,
    pub next_page: Option<String>,
}

const SELECT: &str = "
SELECT window_start, window_end, tenant_id, model, cost_pico::TEXT, requests::TEXT,
       prompt_tokens::TEXT, completion_tokens::TEXT, final, aligned
FROM tally_usage($1, $2, $3, $4, $5, $6)";

const PAGE: &str = "
WHERE $7::BIGINT IS NULL
   OR (window_start, tenant_id COLLATE \"C\", coalesce(model, '') COLLATE \"C\") > ($7, $8, $9)
ORDER BY window_start, tenant_id COLLATE \"C\", model COLLATE \"C\"
LIMIT $10";

/// Byte order of the ids (the "C" collation), whatever the database's locale.
const ORDER: &str = r#"ORDER BY window_start, tenant_id COLLATE "C", model COLLATE "C""#;

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
            usd: cost.usd(),
            cost_pico: cost.to_string(),
            requests: Whole::parse(r.get(5), "requests")?,
            prompt_tokens: Whole::parse(r.get(6), "prompt_tokens")?,
            completion_tokens: Whole::parse(r.get(7), "completion_tokens")?,
            is_final: r.get(8),
            start_ms: start,
        },
        r.get(9),
    ))
}

type Param<'a> = &'a (dyn tokio_postgres::types::ToSql + Sync);

/// The six arguments of `tally_usage` for `q` (`unit` is `q.unit.sql()`).
fn usage_args<'a>(q: &'a UsageQuery, unit: &'a &'static str) -> [Param<'a>; 6] {
    [unit, &q.tz, &q.from_ms, &q.to_ms, &q.by_model, &q.tenant_id]
}

/// One page of `q`.
pub(crate) async fn page(client: &Client, q: &UsageQuery) -> Result<Page, ReadError> {
    let after = q.after.as_ref();
    let limit = (q.limit + 1) as i64;
    let unit = q.unit.sql();
    let [a1, a2, a3, a4, a5, a6] = usage_args(q, &unit);
    let rows = client
        .query(
            &format!("{SELECT} {PAGE}"),
            &[
                a1,
                a2,
                a3,
                a4,
                a5,
                a6,
                &after.map(|c| c.window_start),
                &after.map(|c| c.tenant_id.as_str()),
                &after.map(|c| c.model.as_str()),
                &limit,
            ],
        )
        .await?;
    let mut data = Vec::with_capacity(rows.len());
    for r in &rows {
        let (row, aligned) = row(r)?;
        if !aligned {
            return Err(unaligned(q));
        }
        data.push(row);
    }
    let next_page = if data.len() > q.limit {
        data.truncate(q.limit);
        data.last().map(|last| {
            let c = Cursor {
                window_start: last.start_ms,
                tenant_id: last.tenant_id.clone(),
                model: last.model.clone().unwrap_or_default(),
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
    let unit = q.unit.sql();
    let args = usage_args(q, &unit);
    let aligned: Option<bool> = client
        .query_one(
            "SELECT bool_and(aligned) FROM tally_usage($1, $2, $3, $4, $5, $6)",
            &args,
        )
        .await?
        .get(0);
    if aligned == Some(false) {
        return Err(unaligned(q));
    }
    let sql = format!("{SELECT} {ORDER}");
    Ok(client.query_raw(&sql, args).await?)
}

/// The CSV header of `q`'s rows.
pub(crate) fn csv_header(q: &UsageQuery) -> String {
    let model = if q.by_model { "model," } else { "" };
    format!("tenant_id,window_start,window_end,{model}cost_pico,usd,requests,prompt_tokens,completion_tokens,final\r\n")
}

/// One CSV line (RFC 4180: fields with a comma, quote or line break are quoted;
/// text that would start a formula is neutralised, `negotiate::csv_text`).
pub(crate) fn csv_line(r: &Row, by_model: bool) -> Result<String, ReadError> {
    let (u, _) = row(r)?;
    let field = super::negotiate::csv_text;
    let model = match (by_model, &u.model) {
        (true, Some(m)) => format!("{},", field(m)),
        (true, None) => ",".to_string(),
        (false, _) => String::new(),
    };
    Ok(format!(
        "{},{},{},{model}{},{},{},{},{},{}\r\n",
        field(&u.tenant_id),
        u.window_start,
        u.window_end,
        u.cost_pico,
        u.usd,
        u.requests,
        u.prompt_tokens,
        u.completion_tokens,
        u.is_final
    ))
}

/// `/v1/invoices/{tenant}`.
#[derive(Debug, Serialize)]
pub(crate) struct Invoice {
    pub tenant_id: String,
    pub period: String,
    pub tz: String,
    pub lines: Vec<InvoiceLine>,
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

/// The month of `q` in its zone: its line per model, the total, and whether
/// every minute of it is final.
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
        .query(
            &format!("{SELECT} ORDER BY model COLLATE \"C\""),
            &[&"month", &q.tz, &from, &to, &true, &q.tenant_id],
        )
        .await?;
    let mut lines = Vec::with_capacity(rows.len());
    let (mut requests, mut cost) = (Whole::zero(), Whole::zero());
    for r in &rows {
        let (u, aligned) = row(r)?;
        if !aligned {
            return Err(ReadError::Unaligned(format!(
                "a window of the job crosses a month boundary in {}: the window size must divide the month in that zone's offsets",
                q.tz
            )));
        }
        requests = requests.add(&u.requests);
        cost = cost.add(&Whole::parse(&u.cost_pico, "cost_pico")?);
        lines.push(InvoiceLine {
            model: u.model.unwrap_or_default(),
            requests: u.requests,
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            cost_pico: u.cost_pico,
            usd: u.usd,
        });
    }
    Ok(Invoice {
        tenant_id: q.tenant_id.clone(),
        period: format!("{year:04}-{month:02}"),
        tz: q.tz.clone(),
        lines,
        total: Total {
            requests,
            usd: cost.usd(),
            cost_pico: cost.to_string(),
        },
        is_final,
    })
}
