//! `GET /v1/explain/{tenant_id}?window_start=…`: a tenant's window (or the
//! windows of a calendar bucket) explained down to its requests, as `tally
//! explain --tenant` does (docs/DESIGN.md §6.2): the API runs the same
//! explainer on its own config's `[kafka]`, `[topics]`, `[checkpoint]` and engine settings, and
//! compares with the database it serves.
//!
//! Invariants: the scope is applied (a tenant outside it answers 404) before
//! anything is read; one explanation runs at a time (another answers 429), on a
//! blocking thread, reading at most `api.explain_max_records` input records
//! (more: 422, `tally explain` has no bound) and for at most `TIMEOUT` (then 503; the
//! replay finishes in the background and still holds the one place).

use std::sync::Arc;
use std::time::Duration;

use hyper::Response;
use serde::Serialize;
use tokio::sync::Semaphore;

use super::negotiate::Offer;
use super::{access, error, keys, params, reply, too_many, Api, Body, CSV, JSON};
use crate::config::Config;
use crate::explain::bucket::{bounds, Anchor, BucketError, Unit};
use crate::explain::finality::StoredFinality;
use crate::explain::rows::{Row, CSV_HEADER};
use crate::explain::run::{explain, Asked, Failure};
use crate::explain::{Explanation, PartitionRange, SinkRows, Totals};

/// How long the API waits for one.
const TIMEOUT: Duration = Duration::from_secs(120);

/// What the API explains with: its config, and the one place.
pub(crate) struct Explainer {
    cfg: Arc<Config>,
    busy: Arc<Semaphore>,
}

impl Explainer {
    /// `None` when the config cannot price (no `[prices]` or `[rating]`): then
    /// the route answers 503.
    pub(crate) fn from_config(cfg: &Config) -> Option<Self> {
        cfg.engine().ok()?;
        Some(Self {
            cfg: Arc::new(cfg.clone()),
            busy: Arc::new(Semaphore::new(1)),
        })
    }
}

/// One page of an explanation: everything but the requests, and a page of them.
#[derive(Serialize)]
struct Page<'a> {
    tenant_id: &'a str,
    window_start: i64,
    window_end: i64,
    exact: bool,
    agrees: Option<bool>,
    totals: &'a Totals,
    sink: &'a Option<SinkRows>,
    partitions: &'a [PartitionRange],
    notes: &'a [String],
    finality: &'a Option<StoredFinality>,
    data: &'a [Row],
    next_page: Option<String>,
}

fn failed(f: Failure) -> Response<Body> {
    match f {
        Failure::Usage(m) => error(400, Some("window_start"), &m),
        Failure::TooLarge(m) => error(
            422,
            None,
            &format!("{m}: too large to explain online; use `tally explain --tenant`"),
        ),
        Failure::Kafka(m) => error(503, None, &format!("the input cannot be read: {m}")),
        Failure::Sink(m) => error(503, None, &m),
        Failure::Replay(m) => error(503, None, &format!("the explanation failed: {m}")),
    }
}

/// Runs the explainer for `q` on a blocking thread, within `TIMEOUT`.
async fn run(
    ex: &Explainer,
    q: &params::ExplainQuery,
    asked: Asked,
) -> Result<Explanation, Response<Body>> {
    let Ok(permit) = ex.busy.clone().try_acquire_owned() else {
        return Err(too_many(5, "an explanation is running (one at a time)"));
    };
    let (cfg, tenant) = (ex.cfg.clone(), q.tenant_id.clone());
    let task = tokio::task::spawn_blocking(move || {
        let _held = permit;
        let url = cfg.sink.database_url.clone();
        let bound = cfg.api.explain_max_records;
        explain(&cfg, &tenant, asked, Some(&url), Some(bound))
    });
    match tokio::time::timeout(TIMEOUT, task).await {
        Err(_) => Err(error(
            503,
            None,
            "the explanation did not finish within 120 s",
        )),
        Ok(Err(e)) => Err(error(503, None, &format!("the explanation failed: {e}"))),
        Ok(Ok(Err(f))) => Err(failed(f)),
        Ok(Ok(Ok(x))) => Ok(x),
    }
}

/// The windows of the `unit` bucket of `tz` holding `at`, its bounds the
/// database's (the zone checked as `/v1/usage` checks it).
async fn bucket(api: &Api, unit: Unit, tz: &str, at: i64) -> Result<Asked, Response<Body>> {
    let client = super::routes::client_for(api, tz).await?;
    match bounds(&client, unit, tz, &Anchor::Instant(at)).await {
        Ok((s, e)) => Ok(Asked::Range(s, e)),
        Err(BucketError::Usage(m)) => Err(error(400, Some("tz"), &m)),
        Err(BucketError::Database(m)) => {
            Err(error(503, None, &format!("database unavailable: {m}")))
        }
    }
}

/// `/v1/explain/{tenant}`: its answer, negotiated (JSON or CSV), and the
/// route's name for the metrics.
pub(super) async fn route(
    api: &Api,
    req: &hyper::Request<hyper::body::Incoming>,
    scope: &keys::Scope,
    path: &str,
    query: &str,
) -> (&'static str, Response<Body>) {
    let tenant = &path["/v1/explain/".len()..];
    if tenant.contains('/') {
        return ("other", error(404, None, "not found"));
    }
    let offers = [Offer::Json, Offer::Csv];
    match super::negotiated(req, &offers) {
        Some(offer) => (
            "explain",
            get_explain(api, scope, tenant, query, offer == Offer::Csv).await,
        ),
        None => ("explain", super::not_acceptable()),
    }
}

async fn get_explain(
    api: &Api,
    scope: &keys::Scope,
    tenant: &str,
    query: &str,
    csv: bool,
) -> Response<Body> {
    let q = match params::explain(tenant, query) {
        Ok(q) => q,
        Err(e) => return super::param_error(e),
    };
    if !scope.allows(&q.tenant_id) {
        return access::unknown_tenant(&q.tenant_id);
    }
    let Some(ex) = &api.explainer else {
        return error(
            503,
            None,
            "this API's config has no engine settings ([prices] or [rating]) to explain with",
        );
    };
    let asked = match (&q.bucket, q.window_end) {
        (Some((unit, tz)), _) => match bucket(api, *unit, tz, q.window_start).await {
            Ok(range) => range,
            Err(r) => return r,
        },
        (None, Some(e)) => Asked::Range(q.window_start, e),
        (None, None) => Asked::Start(q.window_start),
    };
    let x = match run(ex, &q, asked).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let rows = x.rows();
    if csv {
        let mut body = format!("{CSV_HEADER}\r\n");
        for r in &rows {
            body.push_str(&r.csv_line(super::negotiate::csv_text));
        }
        return reply(200, CSV, body);
    }
    let from = q.after.map_or(0, |a| {
        rows.partition_point(|r| (r.partition, r.offset) <= a)
    });
    let page = &rows[from..(from + q.limit).min(rows.len())];
    let next_page = (from + q.limit < rows.len())
        .then(|| page.last().map(|r| q.next_page((r.partition, r.offset))))
        .flatten();
    let body = Page {
        tenant_id: &x.tenant_id,
        window_start: x.window_start,
        window_end: x.window_end,
        exact: x.exact,
        agrees: x.agrees,
        totals: &x.totals,
        sink: &x.sink,
        partitions: &x.partitions,
        notes: &x.notes,
        finality: &x.finality,
        data: page,
        next_page,
    };
    reply(200, JSON, serde_json::to_vec(&body).unwrap_or_default())
}
