//! `tally sink`: results topic → PostgreSQL, idempotently (docs/DESIGN.md §6).
//!
//! - `migrate`: embedded schema migrations, run automatically at start.
//! - `check`: what the sink stores (ids, integer ranges, records that agree with
//!   their totals); anything else is rejected into `sink_rejected`, never retried.
//! - `apply`: the upsert rule and the applied-offsets table, in one transaction.
//! - `run`: the consume loop.

pub mod apply;
pub(crate) mod check;
pub mod connect;
pub mod migrate;
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
    #[error("{0}")]
    Refused(String),
    /// `sink.database_url` cannot be used as given (a configuration error).
    #[error("{0}")]
    Url(String),
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
