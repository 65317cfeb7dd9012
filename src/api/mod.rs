//! `tally api`: the usage API over the sink's PostgreSQL (docs/API.md,
//! docs/openapi.yaml), on `api.listen`.
//!
//! - `GET /v1/usage` — rows per window (minute) or calendar bucket (hour, day,
//!   month in an IANA zone), grouped by tenant, model, and a rating's variant,
//!   plan and quantity, for some of each, paged; CSV with `Accept: text/csv` (the
//!   whole range, streamed);
//! - `GET /v1/invoices/{tenant_id}?period=YYYY-MM&tz=` — a month's lines per model
//!   and per (model, variant, plan, quantity);
//! - `GET /v1/tenants` — the tenants the database knows (of the key's scope);
//! - `/healthz` (the process serves), `/readyz` (the database answers and has the
//!   schema), `/metrics` (requests by route and status), `/status` and
//!   `/status.json` (for the people on call: the database, the sink's progress
//!   per input partition, the last error; `status`), authorized like `/metrics`.
//!
//! Invariants: the API only reads (a role with `SELECT` is enough); a parameter is
//! checked before any query (`params`), a bad one answers 400 naming it; the
//! database being unreachable answers 503 and `/readyz` says so; the connection
//! is re-made on the next request after it broke. Nothing here holds a secret
//! beyond the URL, which is never logged or answered.

pub(crate) mod access;
mod explain;
pub(crate) mod keys;
pub(crate) mod limits;
pub(crate) mod negotiate;
pub(crate) mod params;
pub(crate) mod pool;
mod quantities;
mod routes;
mod rows;
mod server;
mod status;
pub(crate) mod tls;

pub use server::run;
pub(crate) use server::spawn_local;
pub(crate) mod usage;
pub(crate) mod whole;

use std::collections::HashSet;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Request, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde_json::json;
use tokio::sync::Mutex;
use tracing::warn;

use params::ParamError;

/// What a read can fail on.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// A window crosses a bucket boundary: the window size does not divide the
    /// bucket in that zone's offsets (answered 400, naming `window`).
    Unaligned(String),
    Db(tokio_postgres::Error),
    /// A value the schema should not hold.
    Data(String),
}

impl From<tokio_postgres::Error> for ReadError {
    fn from(e: tokio_postgres::Error) -> Self {
        ReadError::Db(e)
    }
}

type Body = BoxBody<Bytes, std::io::Error>;

const JSON: &str = "application/json";
const PROBLEM: &str = "application/problem+json";
const CSV: &str = "text/csv; charset=utf-8";
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Beyond `api.query_timeout` (PostgreSQL's `statement_timeout`, which cancels
/// the query cleanly), how long a request waits before it gives up itself.
const QUERY_SLACK: Duration = Duration::from_secs(5);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: &'static str,
    status: u16,
}

/// The API's shared state: the database connections (made on demand), the
/// limits and metrics.
pub(crate) struct Api {
    pool: pool::Pool,
    limits: limits::Limits,
    query_timeout: Duration,
    /// The database's zone names (`pg_timezone_names`), read once.
    zones: Mutex<Option<Arc<HashSet<String>>>>,
    requests: Family<RequestLabels, Counter>,
    /// Who may read what (`access`).
    access: access::Access,
    /// HTTPS (`api.tls`), or plain HTTP.
    tls: Option<tls::Tls>,
    registry: Registry,
    /// What `/v1/explain` runs with (`None`: answered 503).
    explainer: Option<explain::Explainer>,
}

impl Api {
    pub fn new(
        cfg: &crate::config::ApiConfig,
        database_url: &str,
        access: access::Access,
        tls: Option<tls::Tls>,
    ) -> Self {
        let query_timeout = Duration::from_millis(cfg.query_timeout.0.max(1) as u64);
        let requests = Family::<RequestLabels, Counter>::default();
        let mut registry = Registry::default();
        registry.register(
            "tally_api_requests",
            "Usage API requests, by route and HTTP status",
            requests.clone(),
        );
        access.register(&mut registry);
        Self {
            pool: pool::Pool::new(database_url, cfg.pool_size as usize, query_timeout),
            limits: limits::Limits::new(
                cfg.max_range.0,
                cfg.max_concurrent as usize,
                cfg.rate_limit,
            ),
            query_timeout,
            zones: Mutex::new(None),
            requests,
            access,
            tls,
            registry,
            explainer: None,
        }
    }

    /// Serves `/v1/explain` with the explainer of `cfg` (its `[kafka]`,
    /// `[topics]` and engine settings).
    pub(crate) fn with_explainer(mut self, cfg: &crate::config::Config) -> Self {
        self.explainer = explain::Explainer::from_config(cfg);
        self
    }

    /// Whether `tz` is a zone of the database's tzdata.
    async fn known_zone(
        &self,
        client: &tokio_postgres::Client,
        tz: &str,
    ) -> Result<bool, ReadError> {
        let mut slot = self.zones.lock().await;
        if slot.is_none() {
            let rows = client
                .query("SELECT name FROM pg_timezone_names", &[])
                .await?;
            *slot = Some(Arc::new(
                rows.iter().map(|r| r.get::<_, String>(0)).collect(),
            ));
        }
        Ok(slot.as_ref().is_some_and(|z| z.contains(tz)))
    }

    async fn ready(&self) -> Result<(), String> {
        let c = self.pool.get().await?;
        let version: Option<i32> = tokio::time::timeout(
            CONNECT_TIMEOUT,
            c.query_one("SELECT max(version) FROM tally_migrations", &[]),
        )
        .await
        .map_err(|_| "the database did not answer in time".to_string())?
        .map_err(|e| format!("reading the schema version: {e}"))?
        .get(0);
        // The newest migration: the usage, invoice and quantity queries read its
        // functions (5: they read only the windows of their range).
        let needed = crate::sink::migrate::MIGRATIONS
            .last()
            .map_or(0, |(version, ..)| *version);
        match version {
            Some(v) if v >= needed => Ok(()),
            v => Err(format!(
                "schema version {v:?}, the usage API needs {needed}: run `tally migrate` (or `tally \
                 sink`) with a role that may"
            )),
        }
    }
}

fn reply(status: u16, content_type: &str, body: impl Into<Bytes>) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(
            Full::new(body.into())
                .map_err(|never: Infallible| match never {})
                .boxed(),
        )
        .expect("a valid status and header")
}

/// An error as RFC 9457 problem details (`application/problem+json`): `type`
/// (`about:blank`: the status says it), `title`, `status`, `detail`, and the
/// parameter at fault; `error` keeps the fields of the API's first version.
fn error(status: u16, parameter: Option<&str>, message: &str) -> Response<Body> {
    let title = hyper::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Error");
    let body = json!({
        "type": "about:blank",
        "title": title,
        "status": status,
        "detail": message,
        "parameter": parameter,
        "error": {"parameter": parameter, "message": message},
    });
    reply(status, PROBLEM, body.to_string())
}

fn param_error(e: ParamError) -> Response<Body> {
    error(400, Some(&e.parameter), &e.message)
}

/// A database failure: 503 when it cannot be reached or lacks the schema (an
/// operator's matter), 500 otherwise.
fn read_error(e: ReadError) -> Response<Body> {
    match e {
        ReadError::Unaligned(m) => error(400, Some("window"), &m),
        ReadError::Data(m) => error(500, None, &m),
        ReadError::Db(e) => {
            use tokio_postgres::error::SqlState;
            let code = e.code();
            if code == Some(&SqlState::UNDEFINED_FUNCTION)
                || code == Some(&SqlState::UNDEFINED_TABLE)
            {
                return error(
                    503,
                    None,
                    "the database lacks the usage schema: run `tally migrate`",
                );
            }
            if code == Some(&SqlState::QUERY_CANCELED) {
                return error(
                    503,
                    None,
                    "the query ran over api.query_timeout and was cancelled: ask for less",
                );
            }
            if e.is_closed() || code.is_none() {
                return error(503, None, &format!("database unavailable: {e}"));
            }
            warn!(error = %e, "usage API query failed");
            error(500, None, &format!("query failed: {e}"))
        }
    }
}

/// The representation `req` accepts among `offers`; `None`: answer
/// `not_acceptable`.
fn negotiated(
    req: &Request<hyper::body::Incoming>,
    offers: &[negotiate::Offer],
) -> Option<negotiate::Offer> {
    let accept: Vec<&str> = req
        .headers()
        .get_all("accept")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    negotiate::choose(&accept, offers)
}

/// 429 with `Retry-After` (seconds).
fn too_many(after_s: u64, what: &str) -> Response<Body> {
    let mut resp = error(
        429,
        None,
        &format!("too many requests: {what}; retry after {after_s} s"),
    );
    resp.headers_mut().insert(
        hyper::header::RETRY_AFTER,
        hyper::header::HeaderValue::from(after_s),
    );
    resp
}

fn not_acceptable() -> Response<Body> {
    error(
        406,
        None,
        "nothing this route answers with is acceptable (Accept): it offers application/json, \
         and text/csv on /v1/usage and /v1/explain",
    )
}

/// Routes one request; returns the route's name (for metrics) and the answer.
async fn route(api: &Api, req: Request<hyper::body::Incoming>) -> (&'static str, Response<Body>) {
    if req.method() != hyper::Method::GET && req.method() != hyper::Method::HEAD {
        let mut resp = error(405, None, "only GET");
        resp.headers_mut().insert(
            hyper::header::ALLOW,
            hyper::header::HeaderValue::from_static("GET, HEAD"),
        );
        return ("other", resp);
    }
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let (scope, key) = match path.as_str() {
        "/healthz" | "/readyz" => (keys::Scope::Admin, None),
        p => match api
            .access
            .authorize(&req, matches!(p, "/metrics" | "/status" | "/status.json"))
        {
            Ok(granted) => granted,
            Err(why) => return ("auth", access::unauthorized(why)),
        },
    };
    // The routes that query: bounded in flight and per key.
    let data = path == "/v1/usage"
        || path == "/v1/tenants"
        || path.starts_with("/v1/invoices/")
        || path.starts_with("/v1/explain/");
    let permit = if data {
        if let Some(key) = &key {
            if let Err(after) = api
                .limits
                .take(key, crate::base::clock::mono_ms().max(0) as u64)
            {
                return (
                    "limited",
                    too_many(after, "this key's rate (api.rate_limit)"),
                );
            }
        }
        match api.limits.enter() {
            Some(p) => Some(p),
            None => {
                return (
                    "limited",
                    too_many(
                        1,
                        &format!(
                            "{} requests in flight (api.max_concurrent)",
                            api.limits.max_concurrent()
                        ),
                    ),
                )
            }
        }
    } else {
        None
    };
    match path.as_str() {
        "/healthz" => ("healthz", reply(200, "text/plain", "ok\n")),
        "/readyz" => match api.ready().await {
            Ok(()) => ("readyz", reply(200, "text/plain", "ready\n")),
            Err(why) => (
                "readyz",
                reply(503, "text/plain", format!("not ready: {why}\n")),
            ),
        },
        "/metrics" => {
            let mut text = String::new();
            let _ = prometheus_client::encoding::prometheus_text::encode(&mut text, &api.registry);
            ("metrics", reply(200, crate::service::PROMETHEUS, text))
        }
        "/status" => ("status", status::get_status(api, false).await),
        "/status.json" => ("status", status::get_status(api, true).await),
        "/v1/usage" => match negotiated(&req, &[negotiate::Offer::Json, negotiate::Offer::Csv]) {
            Some(offer) => (
                "usage",
                routes::get_usage(api, &scope, &query, offer == negotiate::Offer::Csv, permit)
                    .await,
            ),
            None => ("usage", not_acceptable()),
        },
        p if p.starts_with("/v1/invoices/") => {
            let tenant = &p["/v1/invoices/".len()..];
            if tenant.contains('/') {
                return ("other", error(404, None, "not found"));
            }
            if negotiated(&req, &[negotiate::Offer::Json]).is_none() {
                return ("invoices", not_acceptable());
            }
            (
                "invoices",
                routes::get_invoice(api, &scope, tenant, &query).await,
            )
        }
        p if p.starts_with("/v1/explain/") => explain::route(api, &req, &scope, p, &query).await,
        "/v1/tenants" => match negotiated(&req, &[negotiate::Offer::Json]) {
            Some(_) => ("tenants", routes::get_tenants(api, &scope, &query).await),
            None => ("tenants", not_acceptable()),
        },
        _ => ("other", error(404, None, "not found")),
    }
}
