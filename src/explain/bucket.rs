//! A calendar bucket — an hour, a day or a month in an IANA zone — as the
//! usage API buckets (`tally_usage`, migrations/0002 and 0005): its bounds are
//! asked of PostgreSQL, whose tzdata and rules the usage API sums by, so an
//! explained bucket is exactly the windows the usage API's bucket sums
//! (DESIGN §6.2). No tz crate: the API always has the database, the CLI when
//! given `--sink-url`/`--sink`.
//!
//! Invariant: the start is `date_trunc(unit, anchor, tz)` and the end the start
//! plus one unit in local time (an hour: plus an hour of elapsed time) — the
//! expressions of `tally_usage`; a day of a DST change is 23 or 25 hours.

use std::str::FromStr;

/// The bucket's unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Hour,
    Day,
    Month,
}

impl Unit {
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Month => "month",
        }
    }
}

impl FromStr for Unit {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "hour" => Ok(Unit::Hour),
            "day" => Ok(Unit::Day),
            "month" => Ok(Unit::Month),
            _ => Err(format!("{s:?} is not a bucket: hour, day or month")),
        }
    }
}

/// What a bucket is anchored at: a local date or date-time of the zone
/// (`2026-03-29`, `2026-03-29T10:00`), or an instant (ms) inside it.
#[derive(Debug, Clone)]
pub enum Anchor {
    Local(String),
    Instant(i64),
}

/// `[start, end)` of the bucket from `start_ts` ($1 unit, $2 zone): `tally_usage`'s.
const BOUNDS: &str = "SELECT (extract(epoch FROM s) * 1000)::BIGINT, \
     (extract(epoch FROM CASE WHEN $1::TEXT = 'hour' THEN s + INTERVAL '1 hour' \
      ELSE ((s AT TIME ZONE $2::TEXT) + ('1 ' || $1::TEXT)::INTERVAL) AT TIME ZONE $2::TEXT END) \
      * 1000)::BIGINT FROM (SELECT date_trunc($1::TEXT, ANCHOR, $2::TEXT) AS s) b";
const LOCAL: &str = "($3::TEXT::TIMESTAMP AT TIME ZONE $2::TEXT)";
const INSTANT: &str = "(TIMESTAMPTZ 'epoch' + $3::BIGINT * INTERVAL '1 millisecond')";
const KNOWN: &str = "SELECT EXISTS (SELECT 1 FROM pg_timezone_names WHERE name = $1::TEXT)";

/// Why no bounds.
#[derive(Debug, thiserror::Error)]
pub enum BucketError {
    /// The zone or the local time is not one PostgreSQL reads.
    #[error("{0}")]
    Usage(String),
    /// The database does not answer.
    #[error("{0}")]
    Database(String),
}

impl From<tokio_postgres::Error> for BucketError {
    fn from(e: tokio_postgres::Error) -> Self {
        BucketError::Database(e.to_string())
    }
}

/// The bounds of the `unit` bucket of `tz` holding `anchor`. The zone must be
/// one of the database's (`pg_timezone_names`: the API checks it first).
pub async fn bounds(
    c: &tokio_postgres::Client,
    unit: Unit,
    tz: &str,
    anchor: &Anchor,
) -> Result<(i64, i64), BucketError> {
    let unit = unit.as_str();
    let row = match anchor {
        Anchor::Local(text) => {
            let known: bool = c.query_one(KNOWN, &[&tz]).await?.get(0);
            if !known {
                return Err(BucketError::Usage(format!(
                    "{tz:?} is not a time zone of the IANA database"
                )));
            }
            c.query_one(&BOUNDS.replace("ANCHOR", LOCAL), &[&unit, &tz, text])
                .await
                .map_err(|e| match e.code() {
                    Some(_) => BucketError::Usage(format!(
                        "{text:?} is not a local date or date-time (like 2026-03-29 or \
                         2026-03-29T10:00): {}",
                        e.as_db_error().map_or("", |d| d.message())
                    )),
                    None => e.into(),
                })?
        }
        Anchor::Instant(ms) => {
            c.query_one(&BOUNDS.replace("ANCHOR", INSTANT), &[&unit, &tz, ms])
                .await?
        }
    };
    Ok((row.get(0), row.get(1)))
}

/// `bounds` over a connection of its own to `url` (the CLI's).
pub fn bounds_at(
    url: &str,
    unit: Unit,
    tz: &str,
    anchor: &Anchor,
) -> Result<(i64, i64), BucketError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| BucketError::Database(e.to_string()))?;
    rt.block_on(async {
        let db = crate::sink::connect(url)
            .await
            .map_err(|e| BucketError::Database(e.to_string()))?;
        bounds(&db, unit, tz, anchor).await
    })
}
