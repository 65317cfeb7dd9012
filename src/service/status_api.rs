//! The usage API's status page (`/status` on `api.listen`, and `/status.json`):
//! what the API itself knows — whether PostgreSQL answers, the schema version
//! against the one it needs, its requests in flight, the sink's progress per
//! input partition as the database holds it (`tally_progress`, DESIGN §6.1),
//! the partition holding finality back there, and the last warning and error
//! logged. Pure: an `ApiStatus` in, HTML out (`status_page`'s conventions: no
//! script, no external asset, escaped, figures under stable ids).
//!
//! Invariants: the database's progress is what the sink stored, a batch
//! behind the workers (their `/status` is the live view); `held_back_by` is the
//! source partition with the lowest progress, or one that has not reported to
//! every results partition — exactly what keeps `tally_final` where it is.

use std::fmt::Write;

use serde::{Deserialize, Serialize};

use super::status_page::{escape, figure, head, secs_text, Logged};
use crate::time::utc::format_utc_ms;

/// One input partition's progress as the sink stored it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceProgress {
    pub source_partition: i32,
    /// The lowest over the results partitions it reported to.
    pub final_through: i64,
    pub watermark: i64,
    /// How many results partitions it reported to, of `results_partitions`.
    pub reported: i64,
    pub results_partitions: i64,
    /// When the sink last stored it (wall clock, ms).
    pub updated_ms: i64,
}

/// What the API's status page shows.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ApiStatus {
    pub at_ms: i64,
    /// `None` when the database answered, else why not (masked).
    pub database_error: Option<String>,
    pub schema_version: Option<i32>,
    pub schema_needed: i32,
    pub in_flight: usize,
    pub max_concurrent: usize,
    /// `tally_final.final_through`: every window ending at or before it is final.
    pub final_through: Option<i64>,
    /// The input partition count the progress rows name (0: none yet).
    pub source_partitions: i64,
    pub progress: Vec<SourceProgress>,
    /// The input partition keeping `final_through` where it is (`held_back_by`).
    pub held_back_by: Option<i32>,
    pub last_warning: Option<Logged>,
    pub last_error: Option<Logged>,
}

/// The source partition keeping `tally_final` where it is: one of the
/// `source_partitions` missing or not reported to every results partition,
/// else the lowest progress.
pub fn held_back_by(source_partitions: i64, progress: &[SourceProgress]) -> Option<i32> {
    let missing = (0..source_partitions.clamp(0, i64::from(i32::MAX)) as i32).find(|p| {
        !progress
            .iter()
            .any(|s| s.source_partition == *p && s.reported >= s.results_partitions)
    });
    missing.or_else(|| {
        progress
            .iter()
            .min_by_key(|s| (s.final_through, s.source_partition))
            .map(|s| s.source_partition)
    })
}

/// The API's status page.
pub fn render(v: &ApiStatus) -> String {
    let mut s = head("tally usage API status");
    s.push_str("<h1>tally usage API status</h1>\n");
    let _ = writeln!(
        s,
        "<p>page made at <span id=\"at\" data-value=\"{}\">{}</span></p>",
        v.at_ms,
        format_utc_ms(v.at_ms)
    );
    s.push_str("<h2>Database</h2>\n<table id=\"database\"><tr><th class=\"l\">reachable</th>");
    match &v.database_error {
        None => s.push_str(&figure("database-reachable", 1, "yes")),
        Some(why) => s.push_str(&figure("database-reachable", 0, &format!("no: {why}"))),
    }
    s.push_str("</tr>\n<tr><th class=\"l\">schema version (needed)</th>");
    let version = v.schema_version.map_or("-".to_string(), |n| n.to_string());
    s.push_str(&figure(
        "schema-version",
        &version,
        &format!("{version} ({})", v.schema_needed),
    ));
    s.push_str("</tr>\n<tr><th class=\"l\">requests in flight (api.max_concurrent)</th>");
    s.push_str(&figure(
        "in-flight",
        v.in_flight,
        &format!("{} ({})", v.in_flight, v.max_concurrent),
    ));
    s.push_str("</tr></table>\n");
    progress_section(&mut s, v);
    for (id, title, e) in [
        ("last-error", "Last error", &v.last_error),
        ("last-warning", "Last warning", &v.last_warning),
    ] {
        let _ = writeln!(s, "<h2>{title}</h2>");
        match e {
            Some(e) => {
                let _ = writeln!(s, "<pre id=\"{id}\">{}</pre>", escape(&e.line));
            }
            None => {
                let _ = writeln!(s, "<p id=\"{id}\">none since the process started</p>");
            }
        }
    }
    s.push_str("</body></html>\n");
    s
}

fn progress_section(s: &mut String, v: &ApiStatus) {
    s.push_str("<h2>Finality (as the sink stored it)</h2>\n");
    match v.final_through {
        Some(f) => s.push_str(&format!(
            "<p>final through <span id=\"final-through\" data-value=\"{f}\">{}</span></p>\n",
            format_utc_ms(f)
        )),
        None => s.push_str("<p id=\"final-through\">nothing final yet</p>\n"),
    }
    if let Some(p) = v.held_back_by {
        let _ = writeln!(
            s,
            "<p>held back by input partition <b id=\"held-back-by\" data-value=\"{p}\">{p}</b> \
             (<code>tally explain --finality</code> against the workers tells why)</p>"
        );
    }
    s.push_str(
        "<table id=\"progress\"><thead><tr><th>input partition</th><th class=\"l\">final through</th>\
         <th class=\"l\">watermark</th><th>results partitions reported</th><th>stored</th>\
         </tr></thead><tbody>\n",
    );
    for p in &v.progress {
        let n = p.source_partition;
        let _ = write!(s, "<tr id=\"s{n}\"><td>{n}</td>");
        s.push_str(&figure(
            &format!("s{n}-final-through"),
            p.final_through,
            &format_utc_ms(p.final_through),
        ));
        s.push_str(&figure(
            &format!("s{n}-watermark"),
            p.watermark,
            &format_utc_ms(p.watermark),
        ));
        s.push_str(&figure(
            &format!("s{n}-reported"),
            p.reported,
            &format!("{} of {}", p.reported, p.results_partitions),
        ));
        let ago = (v.at_ms - p.updated_ms).max(0);
        s.push_str(&figure(
            &format!("s{n}-stored"),
            p.updated_ms,
            &format!("{} ago", secs_text(ago)),
        ));
        s.push_str("</tr>\n");
    }
    s.push_str("</tbody></table>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(p: i32, f: i64, reported: i64) -> SourceProgress {
        SourceProgress {
            source_partition: p,
            final_through: f,
            watermark: f + 30_000,
            reported,
            results_partitions: 2,
            updated_ms: 1_000,
        }
    }

    fn status(progress: Vec<SourceProgress>) -> ApiStatus {
        ApiStatus {
            held_back_by: held_back_by(3, &progress),
            at_ms: 61_000,
            database_error: None,
            schema_version: Some(4),
            schema_needed: 4,
            in_flight: 1,
            max_concurrent: 64,
            final_through: Some(60_000),
            source_partitions: 3,
            progress,
            last_warning: None,
            last_error: None,
        }
    }

    #[test]
    fn names_the_partition_keeping_finality_back() {
        // Partition 2 has not reported: it holds finality back.
        let s = status(vec![progress(0, 120_000, 2), progress(1, 60_000, 2)]);
        assert_eq!(s.held_back_by, Some(2));
        // Every one reported: the lowest progress; one results partition short counts as missing.
        let s = status(vec![
            progress(0, 120_000, 2),
            progress(1, 60_000, 2),
            progress(2, 180_000, 2),
        ]);
        assert_eq!(s.held_back_by, Some(1));
        let s = status(vec![
            progress(0, 120_000, 1),
            progress(1, 60_000, 2),
            progress(2, 180_000, 2),
        ]);
        assert_eq!(s.held_back_by, Some(0));
        let html = render(&s);
        assert!(
            html.contains("id=\"held-back-by\" data-value=\"0\""),
            "{html}"
        );
        assert!(
            html.contains("id=\"s1-final-through\" data-value=\"60000\""),
            "{html}"
        );
        assert!(html.contains("1 of 2"), "{html}");
    }

    #[test]
    fn an_unreachable_database_is_said_escaped() {
        let mut s = status(vec![]);
        s.database_error = Some("connection <refused>".into());
        s.source_partitions = 0;
        s.final_through = None;
        s.held_back_by = held_back_by(0, &s.progress);
        let html = render(&s);
        assert!(html.contains("no: connection &lt;refused&gt;"), "{html}");
        assert!(html.contains("nothing final yet"));
        assert!(!html.to_lowercase().contains("<script"));
        assert_eq!(s.held_back_by, None);
    }
}
