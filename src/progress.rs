//! Progress of a long bounded run (`reprocess-late`, `run --input-file`): a bar on
//! a terminal (stderr), a log line every 5 s otherwise.
//!
//! Invariants:
//! - The percentage and the ETA come from bytes when the total bytes are known (a
//!   file: its size on disk, compressed or not), else from records when their total
//!   is known (a topic's backlog); with neither (a pipe) there is neither.
//! - `show` costs one clock read unless it is time to print; the final call
//!   (`last`) always prints.
//! - What is printed (`line`) is pure, so it is tested without a terminal.

use std::cell::Cell;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

pub(crate) struct Progress {
    what: &'static str,
    total_records: Option<u64>,
    total_bytes: Option<u64>,
    started: Instant,
    tty: bool,
    last: Cell<Instant>,
}

/// A snapshot: how far, how fast, how long still.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Status {
    pub records: u64,
    pub bytes: Option<u64>,
    pub percent: Option<u64>,
    pub records_per_s: u64,
    pub bytes_per_s: Option<u64>,
    pub eta_s: Option<u64>,
}

impl Progress {
    pub fn new(what: &'static str, total_records: Option<u64>, total_bytes: Option<u64>) -> Self {
        let now = Instant::now();
        Self {
            what,
            total_records,
            total_bytes,
            started: now,
            tty: std::io::stderr().is_terminal(),
            last: Cell::new(now),
        }
    }

    pub(crate) fn status(&self, records: u64, bytes: Option<u64>) -> Status {
        status(
            self.started.elapsed(),
            records,
            bytes,
            self.total_records,
            self.total_bytes,
        )
    }

    pub(crate) fn show(&self, records: u64, bytes: Option<u64>, last: bool) {
        let every = if self.tty {
            Duration::from_millis(200)
        } else {
            Duration::from_secs(5)
        };
        if !last && self.last.get().elapsed() < every {
            return;
        }
        self.last.set(Instant::now());
        let s = self.status(records, bytes);
        if self.tty {
            eprint!("\r{} ", line(&s, self.total_bytes));
            if last {
                eprintln!();
            }
            let _ = std::io::stderr().flush();
        } else {
            tracing::info!(
                task = self.what,
                done = s.records,
                total = self.total_records,
                bytes = s.bytes,
                total_bytes = self.total_bytes,
                percent = s.percent,
                rate = s.records_per_s,
                bytes_per_s = s.bytes_per_s,
                eta_s = s.eta_s,
                "{} progress",
                self.what
            );
        }
    }
}

fn status(
    elapsed: Duration,
    records: u64,
    bytes: Option<u64>,
    total_records: Option<u64>,
    total_bytes: Option<u64>,
) -> Status {
    let secs = elapsed.as_secs_f64().max(1e-3);
    let (done, total) = match (bytes, total_bytes, total_records) {
        (Some(b), Some(t), _) => (b, Some(t)),
        (_, _, t) => (records, t),
    };
    let per_s = |n: u64| (n as f64 / secs) as u64;
    let percent = total.map(|t| (done.min(t) * 100).checked_div(t).unwrap_or(100));
    let eta_s = total.and_then(|t| {
        let rate = done as f64 / secs;
        (rate > 0.0).then(|| (t.saturating_sub(done) as f64 / rate).round() as u64)
    });
    Status {
        records,
        bytes,
        percent,
        records_per_s: per_s(records),
        bytes_per_s: bytes.map(per_s),
        eta_s,
    }
}

/// The terminal line: `[#########...........]  45%  2250000 records  394.9/877.5 MB
/// 1125000 records/s  197.4 MB/s  ETA 2s`.
fn line(s: &Status, total_bytes: Option<u64>) -> String {
    let mb = |b: u64| b as f64 / 1e6;
    let mut out = String::new();
    if let Some(p) = s.percent {
        let filled = (p / 5) as usize;
        out.push_str(&format!(
            "[{}{}] {p:>3}%  ",
            "#".repeat(filled),
            ".".repeat(20 - filled)
        ));
    }
    out.push_str(&format!("{} records", s.records));
    match (s.bytes, total_bytes) {
        (Some(b), Some(t)) => out.push_str(&format!("  {:.1}/{:.1} MB", mb(b), mb(t))),
        (Some(b), None) => out.push_str(&format!("  {:.1} MB", mb(b))),
        _ => {}
    }
    out.push_str(&format!("  {} records/s", s.records_per_s));
    if let Some(r) = s.bytes_per_s {
        out.push_str(&format!("  {:.1} MB/s", mb(r)));
    }
    if let Some(eta) = s.eta_s {
        out.push_str(&format!("  ETA {eta}s"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_and_eta_follow_bytes_when_known_else_records() {
        let s = status(
            Duration::from_secs(2),
            1_000,
            Some(250),
            Some(9_999),
            Some(1_000),
        );
        assert_eq!((s.percent, s.eta_s), (Some(25), Some(6)));
        assert_eq!((s.records_per_s, s.bytes_per_s), (500, Some(125)));
        assert_eq!(
            line(&s, Some(1_000)),
            "[#####...............]  25%  1000 records  0.0/0.0 MB  500 records/s  0.0 MB/s  ETA 6s"
        );
        let r = status(Duration::from_secs(4), 400, None, Some(1_000), None);
        assert_eq!((r.percent, r.eta_s), (Some(40), Some(6)));
        // A pipe: no total, so no bar and no ETA.
        let p = status(Duration::from_secs(1), 10, Some(3_000_000), None, None);
        assert_eq!((p.percent, p.eta_s), (None, None));
        assert_eq!(line(&p, None), "10 records  3.0 MB  10 records/s  3.0 MB/s");
        // Done: 100 %, nothing left.
        let d = status(Duration::from_secs(1), 5, Some(7), None, Some(7));
        assert_eq!((d.percent, d.eta_s), (Some(100), Some(0)));
    }
}
