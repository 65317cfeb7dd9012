//! Schema migrations, embedded in the binary and applied in order.
//!
//! Invariants: each migration runs once, in its own transaction, recorded in
//! `tally_migrations`; a session-level advisory lock serialises concurrent
//! runners (two sinks starting at once); a recorded migration whose checksum no
//! longer matches the embedded file is an error, never silently re-run.

use sha2::{Digest, Sha256};
use tokio_postgres::Client;

use super::SinkError;

/// `(version, name, sql)` — append only; never edit a released migration.
pub(crate) const MIGRATIONS: &[(i32, &str, &str)] = &[
    (
        1,
        "partials_and_view",
        include_str!("../../migrations/0001_partials_and_view.sql"),
    ),
    (
        2,
        "lines_finality_rollups",
        include_str!("../../migrations/0002_lines_finality_rollups.sql"),
    ),
    (
        3,
        "rejected_and_unbounded_sums",
        include_str!("../../migrations/0003_rejected_and_unbounded_sums.sql"),
    ),
    (
        4,
        "rated_quantities",
        include_str!("../../migrations/0004_rated_quantities.sql"),
    ),
    (
        5,
        "usage_range_pushdown",
        include_str!("../../migrations/0005_usage_range_pushdown.sql"),
    ),
];

const LOCK_ID: i64 = 0x7461_6c6c_7921; // "tally!"

fn checksum(sql: &str) -> String {
    Sha256::digest(sql.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Applies every pending migration; returns how many were applied.
pub async fn run(client: &mut Client) -> Result<usize, SinkError> {
    client
        .execute("SELECT pg_advisory_lock($1)", &[&LOCK_ID])
        .await?;
    let result = apply(client).await;
    client
        .execute("SELECT pg_advisory_unlock($1)", &[&LOCK_ID])
        .await?;
    result
}

async fn apply(client: &mut Client) -> Result<usize, SinkError> {
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS tally_migrations (
                 version INTEGER PRIMARY KEY, name TEXT NOT NULL, checksum TEXT NOT NULL,
                 applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
        )
        .await?;
    let mut applied = 0;
    for (version, name, sql) in MIGRATIONS {
        let sum = checksum(sql);
        let row = client
            .query_opt(
                "SELECT checksum FROM tally_migrations WHERE version = $1",
                &[version],
            )
            .await?;
        match row {
            Some(r) if r.get::<_, String>(0) == sum => continue,
            Some(_) => {
                return Err(SinkError::Migration(format!(
                    "migration {version} ({name}) was applied with different contents; refusing to continue"
                )))
            }
            None => {}
        }
        let tx = client.transaction().await?;
        tx.batch_execute(sql).await?;
        tx.execute(
            "INSERT INTO tally_migrations (version, name, checksum) VALUES ($1, $2, $3)",
            &[version, name, &sum],
        )
        .await?;
        tx.commit().await?;
        tracing::info!(version, name, "applied migration");
        applied += 1;
    }
    Ok(applied)
}
