//! `tally sink`: results topic → PostgreSQL, idempotently (docs/DESIGN.md §6).
//!
//! - `migrate`: embedded schema migrations, run automatically at start.
//! - `check`: what the sink stores (ids, integer ranges, records that agree with
//!   their totals); anything else is rejected into `sink_rejected`, never retried.
//! - `apply`: the upsert rule and the applied-offsets table, in one transaction;
//!   `panes` writes a batch's panes in multi-row statements.
//! - `run`: the consume loop.

pub mod apply;
pub(crate) mod check;
pub mod connect;
pub mod migrate;
mod panes;
mod quantities;
pub(crate) mod run;

#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error("postgres: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    #[error("migration: {0}")]
    Migration(String),
    #[error(transparent)]
    Kafka(#[from] crate::kafka::KafkaIoError),
    #[error("{0}")]
    Other(String),
    /// Continuing would skip or double-apply results: an operator must act.
    #[error(transparent)]
    Refused(#[from] crate::base::error::Refusal),
    /// `sink.database_url` cannot be used as given (a configuration error).
    #[error("{0}")]
    Url(String),
}

impl crate::base::error::Classify for SinkError {
    fn class(&self) -> crate::base::error::ErrorClass {
        use crate::base::error::ErrorClass;
        match self {
            SinkError::Postgres(e) => postgres_class(e),
            SinkError::Kafka(e) => e.class(),
            SinkError::Refused(e) => e.class(),
            SinkError::Url(_) => ErrorClass::Config,
            SinkError::Migration(_) | SinkError::Other(_) => ErrorClass::Internal,
        }
    }
}

/// The class of a PostgreSQL error: without a SQLSTATE the connection itself
/// failed (refused, closed, timed out); with one, by its class (`sqlstate_class`).
pub(crate) fn postgres_class(e: &tokio_postgres::Error) -> crate::base::error::ErrorClass {
    match e.code() {
        None => crate::base::error::ErrorClass::Unavailable,
        Some(c) => sqlstate_class(c.code()),
    }
}

/// The class of a PostgreSQL error by its SQLSTATE: what to do about it.
pub(crate) fn sqlstate_class(code: &str) -> crate::base::error::ErrorClass {
    use crate::base::error::ErrorClass;
    match code.get(..2) {
        // The server is unreachable, going away or out of resources (disk, memory,
        // connections): a restart may succeed once it is back.
        Some("08" | "53" | "57") => ErrorClass::Unavailable,
        // Credentials refused (28), no such database (3D), a privilege missing
        // (42501): `sink.database_url` or the role must change.
        Some("28" | "3D") => ErrorClass::Config,
        _ if code == "42501" => ErrorClass::Config,
        _ => ErrorClass::Internal,
    }
}

/// Connects (with libpq's TLS parameters, `connect`) and drives the connection
/// on the current runtime.
pub async fn connect(url: &str) -> Result<tokio_postgres::Client, SinkError> {
    let (url, tls) = connect::split_tls(url).map_err(SinkError::Url)?;
    let tls = connect::connector(&tls).map_err(SinkError::Url)?;
    let config: tokio_postgres::Config = url
        .parse()
        .map_err(|e| SinkError::Url(format!("database URL: {e}")))?;
    let (client, conn) = config.connect(tls).await?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::error!(error = %e, "postgres connection closed");
        }
    });
    Ok(client)
}
