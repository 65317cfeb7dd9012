//! `/status` and `/status.json` of the usage API: gathers what the API knows
//! (`service::status_api` renders it). Reads only: the schema version, the
//! sink's progress rows and `tally_final` (`service::stored_progress`), each
//! under `CONNECT_TIMEOUT`. A database error is shown masked
//! (`crate::secrets`), never the URL.

use super::{reply, Api, Body, CONNECT_TIMEOUT, JSON};
use crate::service::logged;
use crate::service::status_api::{self, ApiStatus, SourceProgress};

/// The database's part: schema version, progress, `tally_final`, source count.
type Db = (Option<i32>, Vec<SourceProgress>, Option<i64>, i64);

async fn database(api: &Api) -> Result<Db, String> {
    let c = api.pool.get().await?;
    let read = async {
        let version: Option<i32> = c
            .query_one("SELECT max(version) FROM tally_migrations", &[])
            .await?
            .get(0);
        let stored = crate::service::stored_progress::read(&c).await?;
        Ok::<_, tokio_postgres::Error>((
            version,
            stored.progress,
            stored.final_through,
            stored.source_partitions,
        ))
    };
    match tokio::time::timeout(CONNECT_TIMEOUT, read).await {
        Ok(Ok(db)) => Ok(db),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("the database did not answer in time".into()),
    }
}

async fn gather(api: &Api) -> ApiStatus {
    let (database_error, (schema_version, progress, final_through, source_partitions)) =
        match database(api).await {
            Ok(db) => (None, db),
            Err(why) => (
                Some(crate::secrets::redact(&why).into_owned()),
                (None, Vec::new(), None, 0),
            ),
        };
    ApiStatus {
        at_ms: crate::base::clock::now_ms(),
        database_error,
        schema_version,
        schema_needed: crate::sink::migrate::MIGRATIONS
            .last()
            .map_or(0, |(version, ..)| *version),
        in_flight: api.limits.in_flight(),
        max_concurrent: api.limits.max_concurrent(),
        final_through,
        source_partitions,
        held_back_by: status_api::held_back_by(source_partitions, &progress),
        progress,
        last_warning: logged::last_warning(),
        last_error: logged::last_error(),
    }
}

/// `/status` (HTML) or, with `json`, `/status.json`.
pub(super) async fn get_status(api: &Api, json: bool) -> hyper::Response<Body> {
    let status = gather(api).await;
    if json {
        reply(200, JSON, serde_json::to_vec(&status).unwrap_or_default())
    } else {
        reply(200, crate::service::HTML, status_api::render(&status))
    }
}
