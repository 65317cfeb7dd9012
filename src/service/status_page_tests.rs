use super::*;
use crate::base::histogram::Histogram;
use crate::metrics::tests::part;
use crate::metrics::CheckpointStats;

const MIN: i64 = 60_000;
const T10: i64 = 1_767_261_600_000;

fn view() -> StatusView {
    let mut p0 = part(0, Some(T10 + 5 * MIN), 10, &[]);
    p0.final_through = Some(T10 + 4 * MIN);
    p0.held = 3;
    let mut p1 = part(1, Some(T10 + 20_000), 90_000, &[]);
    p1.final_through = Some(T10 - MIN);
    p1.log_end = Some(p1.next_offset.0);
    let report = WorkerReport {
        at_ms: T10 + 10 * MIN,
        topic: "requests<script>".into(),
        group: "g&\"x\"".into(),
        bound_ms: 5_000,
        allowed_lateness_ms: 30_000,
        window_size_ms: MIN,
        window_offset_ms: 0,
        checkpoint_interval_ms: 1_000,
        checkpoint: CheckpointStats {
            completed: 9,
            last_success_ms: Some(T10 + 9 * MIN),
            last_duration_ms: 120,
            last_bytes: 4096,
            state_bytes: 8192,
        },
        idle_ms: None,
        partitions: vec![p0, p1],
        pane_ack_us: Histogram::default(),
    };
    StatusView {
        at_ms: T10 + 10 * MIN + 5,
        not_ready: None,
        report: Some(report),
        lags: vec![PartitionLag {
            partition: Partition(1),
            records: 17,
        }],
        last_warning: None,
        last_error: Some(Logged {
            at_ms: T10,
            level: "ERROR".into(),
            line: "checkpoint failed: <b>disk</b> full".into(),
        }),
    }
}

/// The `data-value` of the element with `id`.
fn value(html: &str, id: &str) -> Option<String> {
    let at = html.find(&format!("id=\"{id}\" data-value=\""))?;
    let rest = &html[at + id.len() + 18..];
    Some(rest[..rest.find('"')?].to_string())
}

#[test]
fn shows_each_figure_under_its_id_with_its_raw_value() {
    let html = render(&view());
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert_eq!(value(&html, "ready").as_deref(), Some("1"));
    assert_eq!(
        value(&html, "p0-watermark"),
        Some((T10 + 5 * MIN).to_string())
    );
    assert_eq!(
        value(&html, "p0-watermark-lag"),
        Some((5 * MIN).to_string())
    );
    assert_eq!(value(&html, "p0-held").as_deref(), Some("3"));
    assert_eq!(value(&html, "p0-finality-lag"), Some((6 * MIN).to_string()));
    assert_eq!(value(&html, "p1-consumer-lag").as_deref(), Some("17"));
    // No lag known for partition 0: no figure, not a made-up 0.
    assert_eq!(value(&html, "p0-consumer-lag"), None);
    assert_eq!(
        value(&html, "job-watermark-partition").as_deref(),
        Some("1")
    );
    assert_eq!(value(&html, "checkpoints-completed").as_deref(), Some("9"));
    assert_eq!(
        value(&html, "checkpoint-last-duration").as_deref(),
        Some("120")
    );
    // The lowest progress, and the partition holding the next window back.
    assert_eq!(value(&html, "final-through"), Some((T10 - MIN).to_string()));
    assert_eq!(value(&html, "next-window"), Some((T10 - MIN).to_string()));
    assert_eq!(value(&html, "held-back-by").as_deref(), Some("1"));
    assert!(html.contains("silent for 90 s and idleness off"), "{html}");
}

#[test]
fn escapes_what_comes_from_outside_and_needs_nothing_else() {
    let html = render(&view());
    assert!(html.contains("requests&lt;script&gt;"), "{html}");
    assert!(html.contains("g&amp;&quot;x&quot;"), "{html}");
    assert!(html.contains("checkpoint failed: &lt;b&gt;disk&lt;/b&gt; full"));
    let lower = html.to_lowercase();
    for external in [
        "<script", "<link", "<img", "src=", "href=", "@import", "url(",
    ] {
        assert!(!lower.contains(external), "{external} in {html}");
    }
    assert!(html.contains("<p id=\"last-warning\">none since the process started</p>"));
}

#[test]
fn a_process_without_a_report_says_so() {
    let mut v = view();
    v.report = None;
    v.not_ready = Some("restoring 2 partition(s)".into());
    let html = render(&v);
    assert_eq!(value(&html, "ready").as_deref(), Some("0"));
    assert!(html.contains("not ready: restoring 2 partition(s)"));
    assert!(html.contains("id=\"no-report\""));
    assert_eq!(escape("<&>\"'"), "&lt;&amp;&gt;&quot;&#39;");
    let human: Vec<String> = [250, 250_000, 10_920_000, 29_212_107_188]
        .iter()
        .map(|ms| secs_text(*ms))
        .collect();
    assert_eq!(human, ["0.250 s", "4 m 10 s", "3 h 2 m", "338 d 2 h"]);
}
