//! The usage API's parameters: parsed and checked before any query (pure). Here
//! what the routes share (times, zones, limits) and the invoice's and the tenants
//! listing's parameters; `/v1/usage`'s in `usage`, page tokens in `page`.
//!
//! Invariants: every refusal names the parameter (`ParamError`), and a parameter
//! the API does not know is refused rather than ignored (a typo must not widen a
//! query silently). Times are RFC 3339 with an offset; `[from, to)` is half-open.

mod explain;
mod page;
mod usage;

pub(crate) use explain::{explain, ExplainQuery};
pub(crate) use page::{next_tenants_page, Cursor};
pub(crate) use usage::{next_page, usage, Group, UsageQuery};

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

/// `limit`: rows per page.
fn limit_of(limit: Option<&str>) -> Result<usize, ParamError> {
    match limit {
        None => Ok(DEFAULT_LIMIT),
        Some(l) => match l.parse::<usize>() {
            Ok(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
            _ => Err(bad(
                "limit",
                format!("{l:?} is not a whole number from 1 to {MAX_LIMIT}"),
            )),
        },
    }
}

/// `GET /v1/tenants`: a page of the tenant ids the database knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TenantsQuery {
    pub limit: usize,
    /// Ids after this one (from `page`).
    pub after: Option<String>,
}

/// Parses the query string of `/v1/tenants`.
pub(crate) fn tenants(query: &str) -> Result<TenantsQuery, ParamError> {
    let (mut limit, mut page) = (None, None);
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        let slot = match &*k {
            "limit" => &mut limit,
            "page" => &mut page,
            other => return Err(bad(other, "unknown parameter (known: limit, page)")),
        };
        if slot.replace(v.into_owned()).is_some() {
            return Err(bad(&k, "given more than once"));
        }
    }
    let limit = limit_of(limit.as_deref())?;
    let after = match page {
        Some(p) => Some(page::decode_token(&p, page::TENANTS)?.tenant_id),
        None => None,
    };
    Ok(TenantsQuery { limit, after })
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
        let by_tenant = Group::TENANT;
        assert_eq!(
            (q.unit, q.tz.as_str(), q.group),
            (Unit::Minute, "UTC", by_tenant)
        );
        assert_eq!((q.limit, q.after.as_ref()), (DEFAULT_LIMIT, None));
        assert!(q.tenants.is_empty() && q.models.is_empty() && !q.by_model());
        let q = usage(&format!(
            "{Q}&window=month&tz=Asia/Kolkata&group_by=model&tenant_id=a%20b&limit=7"
        ))
        .unwrap();
        let by_model = Group {
            model: true,
            ..Group::default()
        };
        assert_eq!(
            (q.unit, q.tz.as_str(), q.group, q.limit),
            (Unit::Month, "Asia/Kolkata", by_model, 7)
        );
        assert_eq!(q.tenants, ["a b"]);
        // An unencoded `+` of an offset (a space once decoded) is read as `+`.
        let q = usage("from=2026-01-01T01:00:00+01:00&to=2026-01-02T00:00:00Z").unwrap();
        assert_eq!(q.from_ms, 1_767_225_600_000);
    }

    #[test]
    fn tenants_models_and_dimensions_repeat_as_sets() {
        let q = usage(&format!(
            "{Q}&tenant_id=b&tenant_id=a&tenant_id=b&model=m2&model=m1&group_by=model&group_by=tenant&group_by=model"
        ))
        .unwrap();
        assert_eq!(
            (q.tenants, q.models),
            (
                vec!["a".to_string(), "b".into()],
                vec!["m1".to_string(), "m2".into()]
            )
        );
        assert_eq!(
            q.group,
            Group {
                tenant: true,
                model: true,
                ..Group::default()
            }
        );
        // A filter by model alone reads the lines, summed over the models.
        let q = usage(&format!("{Q}&model=m1")).unwrap();
        assert!(q.by_model() && !q.group.model);
        // The same sets in another order are the same query: one page token.
        let a = usage(&format!(
            "{Q}&tenant_id=a&tenant_id=b&group_by=tenant&group_by=model"
        ))
        .unwrap();
        let t = next_page(
            &a,
            Cursor {
                window_start: 1,
                tenant_id: "a".into(),
                model: "m".into(),
                ..Cursor::default()
            },
        );
        assert!(usage(&format!(
            "{Q}&group_by=model&group_by=tenant&tenant_id=b&tenant_id=a&page={t}"
        ))
        .is_ok());
        assert_eq!(
            usage(&format!(
                "{Q}&tenant_id=a&group_by=tenant&group_by=model&page={t}"
            ))
            .unwrap_err()
            .parameter,
            "page"
        );
    }

    #[test]
    fn variant_plan_and_quantity_read_the_quantity_rows() {
        let q = usage(Q).unwrap();
        assert!(!q.by_quantity());
        let q = usage(&format!(
            "{Q}&group_by=quantity&group_by=model&quantity=prompt_tokens&quantity=cached_tokens&plan=enterprise&variant=batch&variant=batch"
        ))
        .unwrap();
        assert!(q.by_quantity());
        assert_eq!(
            q.group,
            Group {
                model: true,
                quantity: true,
                ..Group::default()
            }
        );
        assert_eq!(q.quantities, ["cached_tokens", "prompt_tokens"]);
        assert_eq!(
            (q.plans, q.variants),
            (vec!["enterprise".to_string()], vec!["batch".to_string()])
        );
        for one in [
            "group_by=variant",
            "group_by=plan",
            "group_by=quantity",
            "variant=v",
            "plan=p",
            "quantity=fee",
        ] {
            assert!(usage(&format!("{Q}&{one}")).unwrap().by_quantity(), "{one}");
        }
        // A filter is part of the query a page token belongs to.
        let a = usage(&format!("{Q}&group_by=quantity&plan=p")).unwrap();
        let last = Cursor {
            window_start: 1,
            quantity: "fee".into(),
            ..Cursor::default()
        };
        let t = next_page(&a, last.clone());
        assert_eq!(
            usage(&format!("{Q}&group_by=quantity&plan=p&page={t}"))
                .unwrap()
                .after,
            Some(last)
        );
        for other in [
            "&group_by=quantity",
            "&group_by=quantity&plan=q",
            "&group_by=quantity&plan=p&variant=v",
            "&group_by=plan&plan=p",
        ] {
            let e = usage(&format!("{Q}{other}&page={t}")).unwrap_err();
            assert_eq!(e.parameter, "page", "{other}");
        }
    }

    #[test]
    fn a_tenants_listing_pages_by_its_own_tokens() {
        assert_eq!(
            tenants("").unwrap(),
            TenantsQuery {
                limit: DEFAULT_LIMIT,
                after: None
            }
        );
        let t = next_tenants_page("acme");
        assert_eq!(
            tenants(&format!("limit=2&page={t}"))
                .unwrap()
                .after
                .as_deref(),
            Some("acme")
        );
        let usage_token = next_page(
            &usage(Q).unwrap(),
            Cursor {
                window_start: 0,
                tenant_id: "acme".into(),
                model: String::new(),
                ..Cursor::default()
            },
        );
        for (query, parameter) in [
            ("limit=0", "limit"),
            ("tenant_id=acme", "tenant_id"),
            ("limit=1&limit=2", "limit"),
            (&format!("page={usage_token}") as &str, "page"),
        ] {
            assert_eq!(tenants(query).unwrap_err().parameter, parameter, "{query}");
        }
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
            (&format!("{Q}&group_by=week"), "group_by"),
            (&format!("{Q}&quantity="), "quantity"),
            (&format!("{Q}&plan="), "plan"),
            (&format!("{Q}&variant="), "variant"),
            (&format!("{Q}&group_by=tenant,model"), "group_by"),
            (&format!("{Q}&group_by="), "group_by"),
            (&format!("{Q}&tenant_id="), "tenant_id"),
            (&format!("{Q}&model="), "model"),
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
        let q = usage(&format!("{Q}&group_by=tenant&group_by=model&limit=2")).unwrap();
        let last = Cursor {
            window_start: 5,
            tenant_id: "acme".into(),
            model: "small".into(),
            ..Cursor::default()
        };
        let token = next_page(&q, last.clone());
        // Same query (limit may differ): resumes after `last`.
        let again = usage(&format!(
            "{Q}&group_by=tenant&group_by=model&limit=9&page={token}"
        ))
        .unwrap();
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
