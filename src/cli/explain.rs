//! `tally explain`: why a window is what it is. Two modes: `--finality` —
//! which input partitions hold a window back from being final, and why
//! (`metrics::finality`), read from the workers' `/status.json` or their
//! `report.json`; and `--tenant` — a tenant's window explained down to its
//! requests by replaying the logs through the engine (`crate::explain`,
//! `explain_requests`).
//!
//! Exit statuses: 0 with an answer (final or not: `is_final` in the JSON, the
//! last line of the table; agreeing with the sink or not: `agrees`), 2 for a
//! usage error or a report file that cannot be read, 4 when a worker's address
//! (or, for `--tenant`, the broker) does not answer.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgGroup, Args, CommandFactory};

use crate::base::error::{Classify, ErrorClass};
use crate::metrics::finality::{self, WindowRef};
use crate::metrics::WorkerReport;

#[derive(Args, Debug)]
#[command(group(ArgGroup::new("window").required(true).multiple(true).args(["window_start", "window_end", "at"])))]
#[command(group(ArgGroup::new("source").multiple(true).args(["from", "report"])))]
#[command(group(ArgGroup::new("mode").required(true).args(["finality", "tenant"])))]
pub struct ExplainArgs {
    /// Explain the window's finality: per input partition its watermark and
    /// progress, the records its lead rule holds, its idleness, the lateness
    /// still to run, and which partition holds the window back (needs --from
    /// or --report).
    #[arg(long)]
    pub finality: bool,
    /// Explain this tenant's window down to its requests: every request billed
    /// into it and every one routed elsewhere, re-derived from the input topic by
    /// the engine, joined with the late and dead-letter topics and the sink's
    /// rows (needs --config; --sink-url or --sink to compare with the sink).
    #[arg(long, value_name = "TENANT_ID", conflicts_with_all = ["from", "report"])]
    pub tenant: Option<String>,
    #[command(flatten)]
    pub config: super::ConfigArg,
    /// With --tenant: compare with the sink's rows in this PostgreSQL database.
    #[arg(long, value_name = "URL", requires = "tenant")]
    pub sink_url: Option<String>,
    /// With --tenant: compare with the sink's rows in the config's
    /// `sink.database_url`.
    #[arg(long, requires = "tenant", conflicts_with = "sink_url")]
    pub sink: bool,
    /// The window starting at this time (RFC 3339, e.g. 2026-01-01T10:00:00Z,
    /// or integer ms since the epoch). With --tenant and --window-end too: every
    /// window from this one up to --window-end (a calendar bucket: give its
    /// bounds with the zone's offset, e.g. 2026-01-01T00:00:00+01:00).
    #[arg(long, value_name = "TIME", value_parser = crate::time::utc::parse_utc_ms)]
    pub window_start: Option<i64>,
    /// The window ending at this time (exclusive; RFC 3339 or integer ms).
    #[arg(long, value_name = "TIME", value_parser = crate::time::utc::parse_utc_ms)]
    pub window_end: Option<i64>,
    /// With --tenant: explain every window of a calendar bucket of this IANA
    /// zone (e.g. Europe/Berlin), as the usage API buckets — its bounds are
    /// asked of the sink's database (needs --sink-url or --sink), with --bucket
    /// and --at.
    #[arg(long, value_name = "ZONE", requires_all = ["tenant", "bucket", "at"])]
    pub tz: Option<String>,
    /// With --tz: the bucket, `hour`, `day` or `month`.
    #[arg(long, value_name = "UNIT", requires = "tz", value_parser = ["hour", "day", "month"])]
    pub bucket: Option<String>,
    /// With --tz: a local date or date-time of the zone inside the bucket
    /// (e.g. 2026-03-29, or 2026-03-29T10:00 for an hour).
    #[arg(long, value_name = "LOCAL", requires = "tz", conflicts_with_all = ["window_start", "window_end"])]
    pub at: Option<String>,
    /// A worker's service address (`metrics.listen`, e.g. 127.0.0.1:9464 or
    /// http://host:9464): its `/status.json` is read. Repeat for each worker of
    /// the group.
    #[arg(long, value_name = "ADDR")]
    pub from: Vec<String>,
    /// A worker's `<state.dir>/report.json` (written at every checkpoint).
    /// Repeatable, and may be mixed with --from.
    #[arg(long, value_name = "FILE")]
    pub report: Vec<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Why `tally explain` could not answer.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    #[error("{0}")]
    Usage(String),
    #[error("{addr}: {why}")]
    Unreachable { addr: String, why: String },
    #[error("{0}")]
    Report(String),
}

impl Classify for ExplainError {
    fn class(&self) -> ErrorClass {
        match self {
            ExplainError::Usage(_) | ExplainError::Report(_) => ErrorClass::Config,
            ExplainError::Unreachable { .. } => ErrorClass::Unavailable,
        }
    }
}

const TIMEOUT: Duration = Duration::from_secs(10);

/// `host:port` and the path of `/status.json` at `addr`.
fn target(addr: &str) -> Result<(String, String), ExplainError> {
    if addr.starts_with("https://") {
        return Err(ExplainError::Usage(format!(
            "{addr}: the service endpoints are plain HTTP; give host:port"
        )));
    }
    let rest = addr.strip_prefix("http://").unwrap_or(addr);
    let (host, base) = rest.split_once('/').unwrap_or((rest, ""));
    let base = base.trim_end_matches('/');
    let path = if base.is_empty() {
        "/status.json".to_string()
    } else {
        format!("/{base}/status.json")
    };
    Ok((host.to_string(), path))
}

/// `GET /status.json` on `addr`: the report it carries.
fn fetch(addr: &str) -> Result<WorkerReport, ExplainError> {
    let (host, path) = target(addr)?;
    let unreachable = |why: String| ExplainError::Unreachable {
        addr: addr.to_string(),
        why,
    };
    let sock = std::net::ToSocketAddrs::to_socket_addrs(&host)
        .map_err(|e| unreachable(e.to_string()))?
        .next()
        .ok_or_else(|| unreachable("no address".into()))?;
    let mut s = std::net::TcpStream::connect_timeout(&sock, TIMEOUT)
        .map_err(|e| unreachable(format!("{e} (is a worker serving metrics.listen there?)")))?;
    s.set_read_timeout(Some(TIMEOUT))
        .map_err(|e| unreachable(e.to_string()))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| unreachable(e.to_string()))?;
    let mut text = String::new();
    s.read_to_string(&mut text)
        .map_err(|e| unreachable(e.to_string()))?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| unreachable("not an HTTP answer".into()))?;
    let status = head.split(' ').nth(1).unwrap_or("?");
    if status != "200" {
        return Err(unreachable(format!("{path} answered {status}")));
    }
    let view: crate::service::status_page::StatusView = serde_json::from_str(body)
        .map_err(|e| unreachable(format!("{path} is not a status: {e}")))?;
    view.report.ok_or_else(|| {
        unreachable(
            "no worker report there yet (not a worker, or it has not restored its partitions)"
                .into(),
        )
    })
}

fn read(path: &PathBuf) -> Result<WorkerReport, ExplainError> {
    let bytes = std::fs::read(path)
        .map_err(|e| ExplainError::Report(format!("{}: {e}", path.display())))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ExplainError::Report(format!("{}: not a worker report: {e}", path.display())))
}

/// `--tenant`: the window explained down to its requests.
fn requests(tenant: &str, a: &ExplainArgs) -> anyhow::Result<()> {
    use crate::explain::run::{explain, Asked, Failure};
    let cfg = a.config.load()?;
    let url = match (&a.sink_url, a.sink) {
        (Some(u), _) => Some(u.clone()),
        (None, true) => Some(cfg.sink.database_url.clone()),
        (None, false) => None,
    };
    let asked = match (a.window_start, a.window_end) {
        (Some(s), Some(e)) => Asked::Range(s, e),
        (Some(s), None) => Asked::Start(s),
        (None, Some(e)) => Asked::End(e),
        (None, None) => bucket(a, url.as_deref())?,
    };
    let x = explain(&cfg, tenant, asked, url.as_deref(), None).map_err(|e| match e {
        Failure::Usage(m) | Failure::TooLarge(m) => ExplainError::Usage(m),
        Failure::Kafka(why) => ExplainError::Unreachable {
            addr: cfg.kafka.bootstrap_servers.clone(),
            why,
        },
        Failure::Replay(m) => ExplainError::Report(m),
        Failure::Sink(why) => ExplainError::Unreachable {
            addr: "the sink's database".into(),
            why,
        },
    })?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&x)?);
    } else {
        print!("{}", x.render_table());
    }
    Ok(())
}

/// `--tz --bucket --at`: the bucket's windows, its bounds asked of the sink's
/// database (PostgreSQL's tzdata, as the usage API buckets).
fn bucket(a: &ExplainArgs, url: Option<&str>) -> anyhow::Result<crate::explain::run::Asked> {
    use crate::explain::bucket::{bounds_at, Anchor, BucketError};
    let (Some(tz), Some(unit), Some(at)) = (&a.tz, &a.bucket, &a.at) else {
        unreachable!("clap requires a window, or --tz with --bucket and --at")
    };
    let Some(url) = url else {
        return Err(ExplainError::Usage(
            "--tz computes the bucket's bounds with the sink's database (PostgreSQL's time zone \
             rules, as the usage API buckets): give --sink-url URL or --sink, or give the \
             bounds with the zone's offset (--window-start 2026-03-29T00:00:00+01:00 \
             --window-end 2026-03-30T00:00:00+02:00)"
                .into(),
        )
        .into());
    };
    let unit = unit.parse().map_err(ExplainError::Usage)?;
    match bounds_at(url, unit, tz, &Anchor::Local(at.clone())) {
        Ok((s, e)) => Ok(crate::explain::run::Asked::Range(s, e)),
        Err(BucketError::Usage(m)) => Err(ExplainError::Usage(m).into()),
        Err(BucketError::Database(why)) => Err(ExplainError::Unreachable {
            addr: "the sink's database".into(),
            why,
        }
        .into()),
    }
}

pub(crate) fn run(a: ExplainArgs) -> anyhow::Result<()> {
    if let Some(tenant) = &a.tenant {
        return requests(tenant, &a);
    }
    if a.from.is_empty() && a.report.is_empty() {
        let mut cli = super::Cli::command();
        cli.build();
        cli.find_subcommand_mut("explain")
            .expect("tally explain is a subcommand")
            .error(
                clap::error::ErrorKind::MissingRequiredArgument,
                "tally explain --finality needs --from or --report",
            )
            .exit();
    }
    let window = match (a.window_start, a.window_end) {
        (Some(_), Some(_)) => {
            return Err(ExplainError::Usage(
                "--finality explains one window: give --window-start or --window-end".into(),
            )
            .into())
        }
        (Some(s), None) => WindowRef::Start(s),
        (None, Some(e)) => WindowRef::End(e),
        (None, None) => unreachable!("clap requires one of them"),
    };
    let mut reports = Vec::new();
    for addr in &a.from {
        reports.push(fetch(addr)?);
    }
    for path in &a.report {
        reports.push(read(path)?);
    }
    let report = finality::merge(reports).map_err(ExplainError::Report)?;
    let f = finality::explain(&report, window).map_err(ExplainError::Usage)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&f)?);
    } else {
        print!("{}", f.render_table());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_name_the_status_json() {
        let t = |a: &str| target(a).unwrap();
        assert_eq!(
            t("127.0.0.1:9464"),
            ("127.0.0.1:9464".into(), "/status.json".into())
        );
        assert_eq!(
            t("http://w1:9464/"),
            ("w1:9464".into(), "/status.json".into())
        );
        assert_eq!(
            t("http://w1:80/tally"),
            ("w1:80".into(), "/tally/status.json".into())
        );
        assert!(target("https://w1").is_err());
        assert_eq!(
            ExplainError::Unreachable {
                addr: "a".into(),
                why: "b".into()
            }
            .class(),
            ErrorClass::Unavailable
        );
    }
}
