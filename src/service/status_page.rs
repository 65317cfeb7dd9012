//! The status page of the service endpoints (`/status`, and its figures as
//! `/status.json`): for the people on call, what Flink's web UI shows about
//! watermarks — each input partition's watermark, consumer lag, held records
//! and finality progress, the window finality waits for and the partition
//! holding it back, the last checkpoint and the last warning or error logged.
//! Pure: a `StatusView` in, HTML out.
//!
//! Invariants:
//! - One self-contained HTML document: an inline style sheet, no script, no
//!   external asset (no link, image or font to fetch); it reads the same without
//!   JavaScript.
//! - Every text from outside (topic, group, a log line, a reason) is escaped
//!   (`escape`); log lines were masked (`crate::secrets`) before they got here.
//! - Each figure has a stable `id` and its raw value in `data-value` (integer
//!   ms for times and durations, counts as they are), equal to the figure
//!   `/metrics` shows from the same report: tests compare the two.

use std::fmt::Write;

use serde::{Deserialize, Serialize};

use crate::metrics::finality::{self, WindowRef};
use crate::metrics::WorkerReport;
use crate::model::Partition;
use crate::time::utc::format_utc_ms;

/// A partition's consumer lag, computed when the page is asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionLag {
    pub partition: Partition,
    pub records: i64,
}

/// A warning or error the process logged (masked).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Logged {
    pub at_ms: i64,
    pub level: String,
    pub line: String,
}

/// What the status page shows.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatusView {
    /// Wall clock when the page was made, ms.
    pub at_ms: i64,
    /// `None` when ready, else why not (`/readyz`).
    pub not_ready: Option<String>,
    /// The worker's last published report (`None`: not a worker, or not yet).
    pub report: Option<WorkerReport>,
    /// The consumer lag, computed for this page.
    pub lags: Vec<PartitionLag>,
    pub last_warning: Option<Logged>,
    pub last_error: Option<Logged>,
}

/// `s` safe in HTML text and in a double- or single-quoted attribute.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "body{font-family:sans-serif;margin:1.5em;color:#111}\
table{border-collapse:collapse}th,td{border:1px solid #bbb;padding:.25em .6em;text-align:right;white-space:nowrap}\
th{background:#eee;white-space:normal;vertical-align:bottom;min-width:5em}td.l,th.l{text-align:left}.bad{color:#a00;font-weight:bold}.ok{color:#060}\
pre{white-space:pre-wrap;background:#f6f6f6;padding:.5em}";

/// The head of a page titled `title`, up to its `<body>`.
pub fn head(title: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width\">\
         <title>{}</title><style>{STYLE}</style></head><body>\n",
        escape(title)
    )
}

/// A figure: `text` shown, `value` its raw value, under a stable `id`.
pub fn figure(id: &str, value: impl std::fmt::Display, text: &str) -> String {
    format!(
        "<td id=\"{}\" data-value=\"{}\">{}</td>",
        escape(id),
        escape(&value.to_string()),
        escape(text)
    )
}

fn time_text(ms: i64) -> String {
    format_utc_ms(ms)
}

/// A duration for people: `0.250 s`, `4 m 10 s`, `3 h 2 m`, `338 d 2 h`.
pub fn secs_text(ms: i64) -> String {
    let s = ms / 1000;
    match s.abs() {
        0..=59 => format!("{:.3} s", ms as f64 / 1000.0),
        60..=3_599 => format!("{} m {} s", s / 60, s % 60),
        3_600..=86_399 => format!("{} h {} m", s / 3_600, s % 3_600 / 60),
        _ => format!("{} d {} h", s / 86_400, s % 86_400 / 3_600),
    }
}

/// The worker's status page.
pub fn render(v: &StatusView) -> String {
    let mut s = head("tally status");
    let _ = writeln!(s, "<h1>tally status</h1>");
    match &v.not_ready {
        None => {
            let _ = writeln!(s, "<p id=\"ready\" data-value=\"1\" class=\"ok\">ready</p>");
        }
        Some(why) => {
            let _ = writeln!(
                s,
                "<p id=\"ready\" data-value=\"0\" class=\"bad\">not ready: {}</p>",
                escape(why)
            );
        }
    }
    let _ = writeln!(
        s,
        "<p>page made at <span id=\"at\" data-value=\"{}\">{}</span></p>",
        v.at_ms,
        time_text(v.at_ms)
    );
    match &v.report {
        Some(r) => {
            report_sections(&mut s, r, &v.lags);
        }
        None => {
            let _ = writeln!(
                s,
                "<p id=\"no-report\">No worker report here (not a worker, or it has not \
                 published one yet): the figures of this process are on <code>/metrics</code>.</p>"
            );
        }
    }
    logged_section(&mut s, "last-error", "Last error", v.last_error.as_ref());
    logged_section(
        &mut s,
        "last-warning",
        "Last warning",
        v.last_warning.as_ref(),
    );
    s.push_str("</body></html>\n");
    s
}

fn report_sections(s: &mut String, r: &WorkerReport, lags: &[PartitionLag]) {
    let _ = writeln!(
        s,
        "<p>topic <b id=\"topic\">{}</b>, group <b id=\"group\">{}</b>; report of \
         <span id=\"report-at\" data-value=\"{}\">{}</span>; watermark bound {} ms, allowed \
         lateness {} ms, idleness {}</p>",
        escape(&r.topic),
        escape(&r.group),
        r.at_ms,
        time_text(r.at_ms),
        r.bound_ms,
        r.allowed_lateness_ms,
        r.idle_ms.map_or("off".to_string(), |t| format!("{t} ms")),
    );
    partitions_table(s, r, lags);
    finality_section(s, r);
    checkpoint_section(s, r);
}

fn partitions_table(s: &mut String, r: &WorkerReport, lags: &[PartitionLag]) {
    s.push_str(
        "<h2>Partitions</h2>\n<table id=\"partitions\"><thead><tr><th>partition</th>\
         <th class=\"l\">watermark</th><th>watermark lag</th><th>consumer lag (records)</th>\
         <th>held (lead rule)</th><th class=\"l\">final through</th><th>finality lag</th>\
         <th>idle</th><th>records read</th></tr></thead><tbody>\n",
    );
    for p in &r.partitions {
        let n = p.partition.0;
        let _ = write!(s, "<tr id=\"p{n}\" data-partition=\"{n}\"><td>{n}</td>");
        match p.watermark {
            Some(w) => {
                s.push_str(&figure(&format!("p{n}-watermark"), w.0, &time_text(w.0)));
                let lag = r.at_ms - w.0;
                s.push_str(&figure(
                    &format!("p{n}-watermark-lag"),
                    lag,
                    &secs_text(lag),
                ));
            }
            None => s.push_str("<td>none yet</td><td>-</td>"),
        }
        match lags.iter().find(|l| l.partition == p.partition) {
            Some(l) => s.push_str(&figure(
                &format!("p{n}-consumer-lag"),
                l.records,
                &l.records.to_string(),
            )),
            None => s.push_str("<td>-</td>"),
        }
        s.push_str(&figure(&format!("p{n}-held"), p.held, &p.held.to_string()));
        match p.final_through {
            Some(f) => {
                s.push_str(&figure(&format!("p{n}-final-through"), f, &time_text(f)));
                let lag = (r.at_ms - f).max(0);
                s.push_str(&figure(&format!("p{n}-finality-lag"), lag, &secs_text(lag)));
            }
            None => s.push_str("<td>none yet</td><td>-</td>"),
        }
        s.push_str(&figure(
            &format!("p{n}-idle"),
            p.idle_ms,
            &secs_text(p.idle_ms as i64),
        ));
        s.push_str(&figure(
            &format!("p{n}-records"),
            p.counters.consumed,
            &p.counters.consumed.to_string(),
        ));
        s.push_str("</tr>\n");
    }
    s.push_str("</tbody></table>\n");
    match r.job_watermark() {
        Some((w, p)) => {
            let _ = writeln!(
                s,
                "<p>job watermark <span id=\"job-watermark\" data-value=\"{}\">{}</span>, held by \
                 partition <span id=\"job-watermark-partition\" data-value=\"{p}\">{p}</span></p>",
                w.0,
                time_text(w.0)
            );
        }
        None => s.push_str("<p id=\"job-watermark\">no job watermark yet</p>\n"),
    }
}

/// The oldest window not final yet here: the one after the lowest progress.
fn finality_section(s: &mut String, r: &WorkerReport) {
    s.push_str("<h2>Finality</h2>\n");
    let lowest = r.partitions.iter().filter_map(|p| p.final_through).min();
    let Some(lowest) = lowest.filter(|_| r.window_size_ms > 0) else {
        s.push_str("<p id=\"finality\">No partition has made progress yet.</p>\n");
        return;
    };
    let _ = writeln!(
        s,
        "<p>final through <span id=\"final-through\" data-value=\"{lowest}\">{}</span> \
         on every partition here.</p>",
        time_text(lowest)
    );
    let end = lowest.saturating_add(r.window_size_ms);
    let Ok(f) = finality::explain(r, WindowRef::End(end)) else {
        return;
    };
    let by = f.held_back_by.map_or("-".to_string(), |p| p.to_string());
    let _ = writeln!(
        s,
        "<p>The next window, <span id=\"next-window\" data-value=\"{}\">[{}, {})</span>, is held \
         back by partition <b id=\"held-back-by\" data-value=\"{by}\">{by}</b> \
         (<code>tally explain --finality</code> tells why):</p><ul>",
        f.window_start,
        time_text(f.window_start),
        time_text(f.window_end),
    );
    for p in f.partitions.iter().filter(|p| !p.passed) {
        let why: Vec<String> = p.reasons.iter().map(|r| r.text()).collect();
        let _ = writeln!(
            s,
            "<li id=\"why-p{}\">partition {}: {}</li>",
            p.partition,
            p.partition,
            escape(&why.join("; "))
        );
    }
    s.push_str("</ul>\n");
}

fn checkpoint_section(s: &mut String, r: &WorkerReport) {
    let c = &r.checkpoint;
    s.push_str(
        "<h2>Checkpoints</h2>\n<table id=\"checkpoints\"><tr><th class=\"l\">completed</th>",
    );
    s.push_str(&figure(
        "checkpoints-completed",
        c.completed,
        &c.completed.to_string(),
    ));
    s.push_str("</tr>\n<tr><th class=\"l\">last completed at</th>");
    match c.last_success_ms {
        Some(at) => {
            s.push_str(&figure("checkpoint-last-success", at, &time_text(at)));
            s.push_str("</tr>\n<tr><th class=\"l\">its duration</th>");
            s.push_str(&figure(
                "checkpoint-last-duration",
                c.last_duration_ms,
                &secs_text(c.last_duration_ms),
            ));
            s.push_str("</tr>\n<tr><th class=\"l\">bytes written / state</th>");
            s.push_str(&figure(
                "checkpoint-last-bytes",
                c.last_bytes,
                &format!("{} / {}", c.last_bytes, c.state_bytes),
            ));
        }
        None => s.push_str("<td id=\"checkpoint-last-success\">none yet</td>"),
    }
    s.push_str("</tr></table>\n");
}

fn logged_section(s: &mut String, id: &str, title: &str, e: Option<&Logged>) {
    let _ = writeln!(s, "<h2>{title}</h2>");
    match e {
        Some(e) => {
            let _ = writeln!(
                s,
                "<p>at <span id=\"{id}-at\" data-value=\"{}\">{}</span></p><pre id=\"{id}\">{}</pre>",
                e.at_ms,
                time_text(e.at_ms),
                escape(&e.line)
            );
        }
        None => {
            let _ = writeln!(s, "<p id=\"{id}\">none since the process started</p>");
        }
    }
}

#[cfg(test)]
#[path = "status_page_tests.rs"]
mod tests;
