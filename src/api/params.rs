//! The usage API's parameters: parsed and checked before any query (pure).
//!
//! Invariants: every refusal names the parameter (`ParamError`), and a parameter
//! the API does not know is refused rather than ignored (a typo must not widen a
//! query silently). Times are RFC 3339 with an offset; `[from, to)` is half-open.
//! A page token carries where the previous page ended and a fingerprint of the
//! other parameters, so a token is only good for the query that made it.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::time::utc::parse_utc_ms;

/// A bad parameter: answered with 400 `{"error": {"parameter", "message"}}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ParamError {
    pub parameter: String,
    pub message: String,
}

fn bad(parameter: &str, message: impl Into<String>) -> ParamError {
    ParamError {
        parameter: parameter.to_string(),
        message: message.into(),
    }
}

/// The calendar unit of a rollup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unit {
    Minute,
    Hour,
    Day,
    Month,
}

impl Unit {
    /// PostgreSQL's `date_trunc` name.
    pub(crate) fn sql(self) -> &'static str {
        match self {
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Month => "month",
        }
    }
}

pub(crate) const DEFAULT_LIMIT: usize = 1_000;
pub(crate) const MAX_LIMIT: usize = 100_000;

/// `GET /v1/usage`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UsageQuery {
    pub tenant_id: Option<String>,
    pub from_ms: i64,
    pub to_ms: i64,
    pub unit: Unit,
    pub tz: String,
    pub by_model: bool,
    pub limit: usize,
    /// Rows after this one (from `page`).
    pub after: Option<Cursor>,
}

/// Where a page ended: the last row's `(window_start, tenant_id, model)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Cursor {
    pub window_start: i64,
    pub tenant_id: String,
    /// `""` when not grouped by model.
    pub model: String,
}

#[derive(Serialize, Deserialize)]
struct Token {
    /// Fingerprint of the other parameters.
    q: String,
    c: Cursor,
}

/// `GET /v1/invoices/{tenant}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InvoiceQuery {
    pub tenant_id: String,
    /// `(year, month)`.
    pub period: (i32, u32),
    pub tz: String,
}

/// A zone name as IANA spells them (`UTC`, `Europe/Berlin`, `America/Argentina/Salta`,
/// `Etc/GMT+5`); whether the zone exists is the database's answer (`tz` is then
/// refused by name too).
fn check_tz(tz: &str) -> Result<(), ParamError> {
    let ok = !tz.is_empty()
        && tz.len() <= 64
        && tz.split('/').all(|part| {
            !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_+-".contains(c))
        })
        && tz.starts_with(|c: char| c.is_ascii_alphabetic());
    if ok {
        Ok(())
    } else {
        Err(bad(
            "tz",
            format!("{tz:?} is not an IANA time zone name like \"Europe/Berlin\""),
        ))
    }
}

fn time(name: &str, v: &str) -> Result<i64, ParamError> {
    // An offset's `+` sent unencoded arrives as a space (form encoding):
    // `…T10:00:00 05:30` is taken as `…T10:00:00+05:30`.
    let fixed;
    let v = match v.len().checked_sub(6) {
        Some(i) if v.as_bytes()[i] == b' ' && v[i + 1..].contains(':') => {
            fixed = format!("{}+{}", &v[..i], &v[i + 1..]);
            fixed.as_str()
        }
        _ => v,
    };
    if v.trim().parse::<i64>().is_ok() || v.trim() != v {
        return Err(bad(
            name,
            format!("{v:?} is not an RFC 3339 time like \"2026-01-01T00:00:00Z\""),
        ));
    }
    parse_utc_ms(v).map_err(|e| bad(name, e))
}

/// Parses the query string of `/v1/usage`.
pub(crate) fn usage(query: &str) -> Result<UsageQuery, ParamError> {
    let mut tenant_id = None;
    let (mut from, mut to, mut window, mut tz, mut group_by, mut limit, mut page) =
        (None, None, None, None, None, None, None);
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        let slot = match &*k {
            "tenant_id" => &mut tenant_id,
            "from" => &mut from,
            "to" => &mut to,
            "window" => &mut window,
            "tz" => &mut tz,
            "group_by" => &mut group_by,
            "limit" => &mut limit,
            "page" => &mut page,
            other => return Err(bad(
                other,
                "unknown parameter (known: tenant_id, from, to, window, tz, group_by, limit, page)",
            )),
        };
        if slot.replace(v.into_owned()).is_some() {
            return Err(bad(&k, "given more than once"));
        }
    }
    let from_ms = time(
        "from",
        from.as_deref().ok_or_else(|| bad("from", "required"))?,
    )?;
    let to_ms = time("to", to.as_deref().ok_or_else(|| bad("to", "required"))?)?;
    if to_ms <= from_ms {
        return Err(bad("to", "must be after `from` ([from, to) is half-open)"));
    }
    let unit = match window.as_deref().unwrap_or("minute") {
        "minute" => Unit::Minute,
        "hour" => Unit::Hour,
        "day" => Unit::Day,
        "month" => Unit::Month,
        other => {
            return Err(bad(
                "window",
                format!("{other:?} is not one of minute, hour, day, month"),
            ))
        }
    };
    let tz = tz.unwrap_or_else(|| "UTC".into());
    check_tz(&tz)?;
    let by_model = match group_by.as_deref() {
        None => false,
        Some("model") => true,
        Some(other) => {
            return Err(bad(
                "group_by",
                format!("{other:?}: the only grouping is \"model\""),
            ))
        }
    };
    let limit = match limit.as_deref() {
        None => DEFAULT_LIMIT,
        Some(l) => match l.parse::<usize>() {
            Ok(n) if (1..=MAX_LIMIT).contains(&n) => n,
            _ => {
                return Err(bad(
                    "limit",
                    format!("{l:?} is not a whole number from 1 to {MAX_LIMIT}"),
                ))
            }
        },
    };
    if let Some(t) = &tenant_id {
        if t.is_empty() {
            return Err(bad("tenant_id", "empty"));
        }
    }
    let mut q = UsageQuery {
        tenant_id,
        from_ms,
        to_ms,
        unit,
        tz,
        by_model,
        limit,
        after: None,
    };
    if let Some(p) = page {
        q.after = Some(decode_token(&p, &q)?);
    }
    Ok(q)
}

/// What a page token must match: every parameter but `limit` and `page`.
fn fingerprint(q: &UsageQuery) -> String {
    let text = format!(
        "{:?}|{}|{}|{}|{}|{}",
        q.tenant_id,
        q.from_ms,
        q.to_ms,
        q.unit.sql(),
        q.tz,
        q.by_model
    );
    let d = Sha256::digest(text.as_bytes());
    URL_SAFE_NO_PAD.encode(&d[..9])
}

/// The `next_page` token after `last`.
pub(crate) fn next_page(q: &UsageQuery, last: Cursor) -> String {
    let t = Token {
        q: fingerprint(q),
        c: last,
    };
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(&t).unwrap_or_default())
}

fn decode_token(p: &str, q: &UsageQuery) -> Result<Cursor, ParamError> {
    let t: Token = URL_SAFE_NO_PAD
        .decode(p)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| {
            bad(
                "page",
                "not a page token of this API (use `next_page` as given)",
            )
        })?;
    if t.q != fingerprint(q) {
        return Err(bad(
            "page",
            "the token belongs to a query with other parameters: repeat the request that gave it, adding only `page`",
        ));
    }
    Ok(t.c)
}

/// Parses `/v1/invoices/{tenant}`'s tenant (percent-decoded) and query string.
pub(crate) fn invoice(tenant: &str, query: &str) -> Result<InvoiceQuery, ParamError> {
    let tenant_id = crate::percent::decode_utf8(tenant)
        .ok_or_else(|| bad("tenant_id", "not valid percent-encoded UTF-8"))?;
    if tenant_id.is_empty() {
        return Err(bad("tenant_id", "empty"));
    }
    let (mut period, mut tz) = (None, None);
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        let slot = match &*k {
            "period" => &mut period,
            "tz" => &mut tz,
            other => return Err(bad(other, "unknown parameter (known: period, tz)")),
        };
        if slot.replace(v.into_owned()).is_some() {
            return Err(bad(&k, "given more than once"));
        }
    }
    let period = period.ok_or_else(|| bad("period", "required, as YYYY-MM"))?;
    let parsed = period
        .split_once('-')
        .filter(|(y, m)| y.len() == 4 && m.len() == 2)
        .and_then(|(y, m)| Some((y.parse::<i32>().ok()?, m.parse::<u32>().ok()?)))
        .filter(|(y, m)| (1970..=9998).contains(y) && (1..=12).contains(m))
        .ok_or_else(|| {
            bad(
                "period",
                format!("{period:?} is not a month like \"2026-01\""),
            )
        })?;
    let tz = tz.unwrap_or_else(|| "UTC".into());
    check_tz(&tz)?;
    Ok(InvoiceQuery {
        tenant_id,
        period: parsed,
        tz,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const Q: &str = "from=2026-01-01T00:00:00Z&to=2026-01-02T00:00:00%2B01:00";

    #[test]
    fn a_usage_query_parses_with_its_defaults() {
        let q = usage(Q).unwrap();
        assert_eq!((q.from_ms, q.to_ms), (1_767_225_600_000, 1_767_308_400_000));
        assert_eq!(
            (q.unit, q.tz.as_str(), q.by_model),
            (Unit::Minute, "UTC", false)
        );
        assert_eq!((q.limit, q.tenant_id, q.after), (DEFAULT_LIMIT, None, None));
        let q = usage(&format!(
            "{Q}&window=month&tz=Asia/Kolkata&group_by=model&tenant_id=a%20b&limit=7"
        ))
        .unwrap();
        assert_eq!(
            (q.unit, q.tz.as_str(), q.by_model, q.limit),
            (Unit::Month, "Asia/Kolkata", true, 7)
        );
        assert_eq!(q.tenant_id.as_deref(), Some("a b"));
        // An unencoded `+` of an offset (a space once decoded) is read as `+`.
        let q = usage("from=2026-01-01T01:00:00+01:00&to=2026-01-02T00:00:00Z").unwrap();
        assert_eq!(q.from_ms, 1_767_225_600_000);
    }

    #[test]
    fn every_refusal_names_its_parameter() {
        for (query, parameter) in [
            ("to=2026-01-01T00:00:00Z", "from"),
            ("from=2026-01-01T00:00:00Z", "to"),
            ("from=yesterday&to=2026-01-01T00:00:00Z", "from"),
            ("from=1767225600000&to=2026-01-01T00:00:00Z", "from"),
            ("from=1767225600000+&to=2026-01-01T00:00:00Z", "from"),
            ("from=+2026-01-01T00:00:00Z&to=2026-01-02T00:00:00Z", "from"),
            ("from=2026-01-02T00:00:00Z&to=2026-01-01T00:00:00Z", "to"),
            ("from=2026-02-30T00:00:00Z&to=2026-03-01T00:00:00Z", "from"),
            (&format!("{Q}&window=week"), "window"),
            (&format!("{Q}&tz=Mars/Olympus%20Mons"), "tz"),
            (&format!("{Q}&tz=%2B05:30"), "tz"),
            (&format!("{Q}&group_by=tenant"), "group_by"),
            (&format!("{Q}&limit=0"), "limit"),
            (&format!("{Q}&limit=-1"), "limit"),
            (&format!("{Q}&limit=100001"), "limit"),
            (&format!("{Q}&tenant="), "tenant"),
            (&format!("{Q}&tz=UTC&tz=UTC"), "tz"),
            (&format!("{Q}&page=garbage"), "page"),
        ] {
            let e = usage(query).unwrap_err();
            assert_eq!(e.parameter, parameter, "{query}: {e:?}");
            assert!(!e.message.is_empty());
        }
    }

    #[test]
    fn a_page_token_resumes_only_its_own_query() {
        let q = usage(&format!("{Q}&group_by=model&limit=2")).unwrap();
        let last = Cursor {
            window_start: 5,
            tenant_id: "acme".into(),
            model: "small".into(),
        };
        let token = next_page(&q, last.clone());
        // Same query (limit may differ): resumes after `last`.
        let again = usage(&format!("{Q}&group_by=model&limit=9&page={token}")).unwrap();
        assert_eq!(again.after, Some(last));
        // Another query: refused, naming `page`.
        let e = usage(&format!("{Q}&page={token}")).unwrap_err();
        assert_eq!(e.parameter, "page");
    }

    #[test]
    fn an_invoice_query_parses_and_refuses_by_name() {
        let q = invoice("acme%2Fcorp", "period=2026-03&tz=Europe/Berlin").unwrap();
        assert_eq!(
            (q.tenant_id.as_str(), q.period, q.tz.as_str()),
            ("acme/corp", (2026, 3), "Europe/Berlin")
        );
        assert_eq!(invoice("acme", "period=2026-12").unwrap().tz, "UTC");
        for (tenant, query, parameter) in [
            ("acme", "", "period"),
            ("acme", "period=2026-13", "period"),
            ("acme", "period=2026-1", "period"),
            ("acme", "period=26-01", "period"),
            ("acme", "period=2026-01&tz=", "tz"),
            ("acme", "period=2026-01&x=1", "x"),
            ("%ff", "period=2026-01", "tenant_id"),
        ] {
            assert_eq!(
                invoice(tenant, query).unwrap_err().parameter,
                parameter,
                "{tenant} {query}"
            );
        }
    }
}
