//! The data routes: `/v1/usage` (JSON pages or a CSV stream), `/v1/invoices/{id}`
//! and `/v1/tenants`, each under the key's scope.
//!
//! Invariants: the parameters are checked (400) and the scope applied (a tenant
//! outside it answers 404 as unknown, before any query) before a connection is
//! taken; a CSV stream holds its connection and its place in flight until it
//! ends, and a failure after its first line aborts the body (no terminating
//! chunk), so a client can tell an incomplete answer from a complete one.

use futures_util::StreamExt;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Bytes, Frame};
use hyper::Response;

use super::{
    access, error, keys, params, pool, read_error, reply, usage, Api, Body, CSV, JSON, QUERY_SLACK,
};

/// The connection, once the zone is known to the database's tzdata: else 503
/// (no database) or 400 naming `tz`.
pub(super) async fn client_for(api: &Api, tz: &str) -> Result<pool::Conn, Response<Body>> {
    let client = api
        .pool
        .get()
        .await
        .map_err(|e| error(503, None, &format!("database unavailable: {e}")))?;
    match api.known_zone(&client, tz).await {
        Ok(true) => Ok(client),
        Ok(false) => Err(error(
            400,
            Some("tz"),
            &format!("{tz:?} is not a time zone of the IANA database"),
        )),
        Err(e) => Err(read_error(e)),
    }
}

pub(super) async fn get_usage(
    api: &Api,
    scope: &keys::Scope,
    query: &str,
    csv: bool,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
) -> Response<Body> {
    let q = match params::usage(query) {
        Ok(q) => q,
        Err(e) => return super::param_error(e),
    };
    if q.to_ms - q.from_ms > api.limits.max_range_ms {
        return error(
            400,
            Some("to"),
            &format!(
                "from and to span {} days, more than api.max_range ({} days): ask in parts",
                (q.to_ms - q.from_ms) / 86_400_000,
                api.limits.max_range_ms / 86_400_000
            ),
        );
    }
    let q = match access::scoped_usage(scope, q) {
        Ok(q) => q,
        Err(outside) => return access::unknown_tenant(&outside),
    };
    let client = match client_for(api, &q.tz).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    if !csv {
        return match tokio::time::timeout(api.query_timeout + QUERY_SLACK, usage::page(&client, &q))
            .await
        {
            Ok(Ok(page)) => reply(200, JSON, serde_json::to_vec(&page).unwrap_or_default()),
            Ok(Err(e)) => read_error(e),
            Err(_) => error(
                503,
                None,
                "the query did not finish within api.query_timeout",
            ),
        };
    }
    let rows = match usage::all(&client, &q).await {
        Ok(rows) => rows,
        Err(e) => return read_error(e),
    };
    let shape = usage::CsvShape::of(&q);
    let header =
        futures_util::stream::once(async move { Ok(Frame::data(Bytes::from(shape.header()))) });
    // The connection and the place in flight are held until the stream ends.
    let held = (client, permit);
    let lines = rows.map(move |r| {
        let _ = &held;
        r.map_err(|e| std::io::Error::other(e.to_string()))
            .and_then(|r| {
                shape
                    .line(&r, &q)
                    .map_err(|e| std::io::Error::other(format!("{e:?}")))
            })
            .map(|line| Frame::data(Bytes::from(line)))
    });
    Response::builder()
        .status(200)
        .header("content-type", CSV)
        .body(BodyExt::boxed(StreamBody::new(header.chain(lines))))
        .expect("a valid status and header")
}

pub(super) async fn get_invoice(
    api: &Api,
    scope: &keys::Scope,
    tenant: &str,
    query: &str,
) -> Response<Body> {
    let q = match params::invoice(tenant, query) {
        Ok(q) => q,
        Err(e) => return super::param_error(e),
    };
    if !scope.allows(&q.tenant_id) {
        return access::unknown_tenant(&q.tenant_id);
    }
    let client = match client_for(api, &q.tz).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    match tokio::time::timeout(api.query_timeout + QUERY_SLACK, usage::invoice(&client, &q)).await {
        Ok(Ok(inv)) => reply(200, JSON, serde_json::to_vec(&inv).unwrap_or_default()),
        Ok(Err(e)) => read_error(e),
        Err(_) => error(
            503,
            None,
            "the query did not finish within api.query_timeout",
        ),
    }
}

pub(super) async fn get_tenants(api: &Api, scope: &keys::Scope, query: &str) -> Response<Body> {
    let q = match params::tenants(query) {
        Ok(q) => q,
        Err(e) => return super::param_error(e),
    };
    let only: Option<Vec<String>> = match scope {
        keys::Scope::Admin => None,
        keys::Scope::Tenants(t) => Some(t.iter().cloned().collect()),
    };
    let client = match api.pool.get().await {
        Ok(c) => c,
        Err(e) => return error(503, None, &format!("database unavailable: {e}")),
    };
    match tokio::time::timeout(
        api.query_timeout + QUERY_SLACK,
        usage::tenants(&client, &q, only.as_deref()),
    )
    .await
    {
        Ok(Ok(page)) => reply(200, JSON, serde_json::to_vec(&page).unwrap_or_default()),
        Ok(Err(e)) => read_error(e),
        Err(_) => error(
            503,
            None,
            "the query did not finish within api.query_timeout",
        ),
    }
}
