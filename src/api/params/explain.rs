//! `GET /v1/explain/{tenant_id}`'s parameters (pure): the window (or the
//! windows of a calendar bucket), the page size and the page token.
//!
//! Invariants: `window_start` is required, `window_end` optional (given, every
//! window of `[window_start, window_end)`); `tz` or `bucket` (`tz` defaulting
//! to UTC as on `/v1/usage`, `bucket` to `day`) exclude `window_end`: the bucket
//! of the zone holding `window_start`, its bounds the database's, as
//! `/v1/usage` buckets; each parameter at most once; a page
//! token resumes after `(partition, offset)` and only for the tenant and windows
//! that made it.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::{Deserialize, Serialize};

use super::{bad, check_tz, limit_of, time, ParamError};
use crate::explain::bucket::Unit;

/// `GET /v1/explain/{tenant_id}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ExplainQuery {
    pub tenant_id: String,
    pub window_start: i64,
    pub window_end: Option<i64>,
    /// `bucket` and `tz`: the calendar bucket holding `window_start`.
    pub bucket: Option<(Unit, String)>,
    pub limit: usize,
    /// Rows after this `(partition, offset)` (from `page`).
    pub after: Option<(i32, i64)>,
}

#[derive(Serialize, Deserialize)]
struct Token {
    q: String,
    p: i32,
    o: i64,
}

impl ExplainQuery {
    fn fingerprint(&self) -> String {
        format!(
            "explain {} {} {:?} {:?}",
            self.tenant_id, self.window_start, self.window_end, self.bucket
        )
    }

    /// The `next_page` token after the row at `(partition, offset)`.
    pub(crate) fn next_page(&self, (p, o): (i32, i64)) -> String {
        let t = Token {
            q: self.fingerprint(),
            p,
            o,
        };
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(&t).unwrap_or_default())
    }
}

/// Parses `/v1/explain/{tenant}`'s tenant (percent-decoded) and query string.
pub(crate) fn explain(tenant: &str, query: &str) -> Result<ExplainQuery, ParamError> {
    let tenant_id = crate::percent::decode_utf8(tenant)
        .ok_or_else(|| bad("tenant_id", "not valid percent-encoded UTF-8"))?;
    if tenant_id.is_empty() {
        return Err(bad("tenant_id", "empty"));
    }
    let (mut start, mut end, mut limit, mut page) = (None, None, None, None);
    let (mut tz, mut unit) = (None, None);
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        let slot =
            match &*k {
                "window_start" => &mut start,
                "window_end" => &mut end,
                "limit" => &mut limit,
                "page" => &mut page,
                "tz" => &mut tz,
                "bucket" => &mut unit,
                other => return Err(bad(
                    other,
                    "unknown parameter (known: window_start, window_end, tz, bucket, limit, page)",
                )),
            };
        if slot.replace(v.into_owned()).is_some() {
            return Err(bad(&k, "given more than once"));
        }
    }
    let start = start.ok_or_else(|| bad("window_start", "required"))?;
    let mut q = ExplainQuery {
        tenant_id,
        window_start: time("window_start", &start)?,
        window_end: end.as_deref().map(|e| time("window_end", e)).transpose()?,
        bucket: bucket(tz, unit, end.is_some())?,
        limit: limit_of(limit.as_deref())?,
        after: None,
    };
    if let Some(p) = page {
        let t: Token = URL_SAFE_NO_PAD
            .decode(&p)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or_else(|| {
                bad(
                    "page",
                    "not a page token of this API (use `next_page` as given)",
                )
            })?;
        if t.q != q.fingerprint() {
            return Err(bad(
                "page",
                "the token belongs to another tenant or window: repeat the request that gave \
                 it, adding only `page`",
            ));
        }
        q.after = Some((t.p, t.o));
    }
    Ok(q)
}

/// `tz` (default UTC) and `bucket` (default `day`), either naming a bucket,
/// without `window_end`.
fn bucket(
    tz: Option<String>,
    unit: Option<String>,
    end: bool,
) -> Result<Option<(Unit, String)>, ParamError> {
    match (tz, unit) {
        (None, None) => Ok(None),
        _ if end => Err(bad(
            "window_end",
            "not with `bucket`: the bucket holding `window_start` is explained",
        )),
        (tz, u) => {
            let tz = tz.unwrap_or_else(|| "UTC".into());
            check_tz(&tz)?;
            let unit = u.as_deref().unwrap_or("day");
            let unit = unit.parse().map_err(|m: String| bad("bucket", m))?;
            Ok(Some((unit, tz)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_explain_query_parses_pages_and_refuses_by_name() {
        let q = explain("a%20b", "window_start=2026-01-01T10:00:00Z&limit=2").unwrap();
        assert_eq!(q.tenant_id, "a b");
        assert_eq!(q.window_start, 1_767_261_600_000);
        assert_eq!((q.window_end, q.limit, q.after), (None, 2, None));
        let token = q.next_page((1, 42));
        let next = explain(
            "a%20b",
            &format!("window_start=2026-01-01T10:00:00Z&limit=2&page={token}"),
        )
        .unwrap();
        assert_eq!(next.after, Some((1, 42)));
        let day = explain("t", "window_start=2026-03-29T12:00:00Z&tz=Europe/Berlin").unwrap();
        assert_eq!(day.bucket, Some((Unit::Day, "Europe/Berlin".into())));
        let hour = explain("t", "window_start=2026-03-29T12:00:00Z&bucket=hour").unwrap();
        assert_eq!(hour.bucket, Some((Unit::Hour, "UTC".into())));
        let other = explain(
            "c",
            &format!("window_start=2026-01-01T10:00:00Z&page={token}"),
        );
        assert_eq!(other.unwrap_err().parameter, "page");
        for (query, parameter) in [
            ("", "window_start"),
            ("window_start=x", "window_start"),
            (
                "window_start=2026-01-01T10:00:00Z&window_end=0",
                "window_end",
            ),
            ("window_start=2026-01-01T10:00:00Z&limit=0", "limit"),
            ("window_start=2026-01-01T10:00:00Z&tz=UTC&bucket=week", "bucket"),
            ("window_start=2026-01-01T10:00:00Z&tz=Europe/../x&bucket=day", "tz"),
            (
                "window_start=2026-01-01T10:00:00Z&tz=UTC&bucket=day&window_end=2026-01-02T00:00:00Z",
                "window_end",
            ),
            (
                "window_start=2026-01-01T10:00:00Z&window_start=2026-01-01T10:00:00Z",
                "window_start",
            ),
        ] {
            assert_eq!(
                explain("t", query).unwrap_err().parameter,
                parameter,
                "{query}"
            );
        }
    }
}
