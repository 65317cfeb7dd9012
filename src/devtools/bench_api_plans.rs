//! The plans of the usage API's queries for `bench-api`: a query path run through
//! the API's own code (`api::usage`: the same statements, the same parameters) on
//! a connection where `auto_explain` logs every statement's plan, with `ANALYZE`
//! and `BUFFERS`, as a notice this module collects.
//!
//! Invariants: the connection is the benchmark's own (superuser, `LOAD`), never the
//! API's pool; the text returned is every notice of the query, in order.

use std::sync::{Arc, Mutex};

use anyhow::Context;
use futures_util::StreamExt;
use tokio_postgres::AsyncMessage;

use crate::api::{params, usage};

const AUTO_EXPLAIN: &str = "
LOAD 'auto_explain';
SET auto_explain.log_min_duration = 0;
SET auto_explain.log_analyze = on;
SET auto_explain.log_buffers = on;
SET auto_explain.log_nested_statements = on;
SET auto_explain.log_level = notice;
SET client_min_messages = notice;";

/// The plans of every statement `path` (`/v1/usage?…` or `/v1/invoices/<id>?…`) runs.
pub(crate) async fn explain(url: &str, path: &str) -> anyhow::Result<String> {
    let config: tokio_postgres::Config = url.parse()?;
    let (client, mut conn) = config.connect(tokio_postgres::NoTls).await?;
    let notices = Arc::new(Mutex::new(Vec::<String>::new()));
    let sink = notices.clone();
    let driver = tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(Ok(m)) = messages.next().await {
            if let AsyncMessage::Notice(n) = m {
                sink.lock()
                    .expect("not poisoned")
                    .push(n.message().to_string());
            }
        }
    });
    client.batch_execute(AUTO_EXPLAIN).await?;
    notices.lock().expect("not poisoned").clear();
    let (route, query) = path.split_once('?').unwrap_or((path, ""));
    if let Some(tenant) = route.strip_prefix("/v1/invoices/") {
        let q = params::invoice(tenant, query).map_err(|e| anyhow::anyhow!("{e:?}"))?;
        usage::invoice(&client, &q)
            .await
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    } else {
        let q = params::usage(query).map_err(|e| anyhow::anyhow!("{e:?}"))?;
        usage::page(&client, &q)
            .await
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    }
    drop(client);
    driver.await.context("the connection's driver")?;
    let text = notices.lock().expect("not poisoned").join("\n\n");
    Ok(text)
}
