//! `tally sink`: results topic → PostgreSQL, idempotently (docs/DESIGN.md §6).
//!
//! - `migrate`: embedded schema migrations, run automatically at start.
//! - `apply`: the upsert rule and the applied-offsets table, in one transaction.
//! - `run`: the consume loop.

pub mod apply;
pub mod migrate;
pub mod run;

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
}

/// Connects and drives the connection on the current runtime.
pub async fn connect(url: &str) -> Result<tokio_postgres::Client, SinkError> {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::error!(error = %e, "postgres connection closed");
        }
    });
    Ok(client)
}
