use super::*;
use crate::checkpoint::OffsetLedger;
use crate::engine::Counters;
use crate::metrics::CheckpointStats;
use crate::model::NextOffset;
use crate::model::Partition;
use crate::time::EventTime;

fn report() -> WorkerReport {
    let mut delay = Histogram::default();
    for ms in [3, 40, 40, 700, 20_000] {
        delay.record(ms);
    }
    WorkerReport {
        at_ms: 1_767_261_700_000,
        topic: "requests".into(),
        group: "g".into(),
        bound_ms: 5_000,
        allowed_lateness_ms: 30_000,
        window_size_ms: 60_000,
        window_offset_ms: 0,
        checkpoint_interval_ms: 10_000,
        checkpoint: CheckpointStats {
            completed: 4,
            last_success_ms: Some(1_767_261_690_000),
            last_duration_ms: 250,
            last_bytes: 4096,
            state_bytes: 65536,
        },
        idle_ms: None,
        partitions: vec![PartitionReport {
            partition: Partition(2),
            watermark: Some(EventTime(1_767_261_600_000)),
            max_ts: Some(EventTime(1_767_261_605_000)),
            next_offset: NextOffset(90),
            idle_ms: 0,
            idle_advances: 0,
            held: 0,
            counters: Counters {
                consumed: 5,
                folded: 5,
                ..Default::default()
            },
            offsets: OffsetLedger::default(),
            open_windows: 1,
            spilled_windows: 0,
            dedup_ids: 5,
            dedup_cold_ids: 0,
            dedup_cold_reads: 0,
            delay,
            disorder: Histogram::default(),
            log_end: Some(100),
            final_through: Some(1_767_261_600_000),
        }],
        pane_ack_us: Histogram::default(),
    }
}

fn families(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split(' ').next().unwrap().to_string())
        .collect()
}

/// `EXPORTED` is exactly what the worker and the sink render (the alert
/// rules and the dashboard are checked against it).
#[test]
fn exported_is_what_is_rendered() {
    let sink = super::sink(&SinkFigures {
        applied_records: 3,
        rows_changed: 2,
        rejected: 1,
        lag: vec![(0, 4)],
        last_apply_ms: Some(1_767_261_690_000),
    });
    let reprocess = super::reprocess(&ReprocessFigures {
        backlog: vec![(0, 7)],
        adjusted: 3,
        ..Default::default()
    });
    assert!(reprocess.contains("tally_reprocess_backlog_records{partition=\"0\"} 7.0"));
    assert!(reprocess.contains("tally_reprocess_records_total{outcome=\"adjusted\"} 3"));
    let lag = super::consumer_lag(&[(Partition(2), 10)]);
    let mut seen = families(&worker(&report()));
    seen.extend(families(&lag));
    seen.extend(families(&sink));
    seen.extend(families(&reprocess));
    seen.sort();
    seen.dedup();
    let mut want: Vec<String> = EXPORTED.iter().map(|s| s.to_string()).collect();
    want.sort();
    assert_eq!(seen, want);
}

#[test]
fn units_counters_and_histograms_follow_prometheus() {
    let text = worker(&report());
    for line in [
        "# TYPE tally_records_total counter",
        "tally_records_total{partition=\"2\",route=\"folded\"} 5",
        "tally_partition_watermark_timestamp_seconds{partition=\"2\"} 1767261600.0",
        "tally_finality_lag_seconds{partition=\"2\"} 100.0",
        "tally_checkpoint_last_bytes 4096.0",
        "tally_checkpoint_state_bytes 65536.0",
        "tally_checkpoint_last_duration_seconds 0.25",
        "# TYPE tally_event_delay_seconds histogram",
        // 3 ms, then 40 and 40 (≤ 50 ms), 700 ms (≤ 1 s), 20 s (≤ 30 s): cumulative.
        "tally_event_delay_seconds_bucket{partition=\"2\",le=\"0.005\"} 1",
        "tally_event_delay_seconds_bucket{partition=\"2\",le=\"0.05\"} 3",
        "tally_event_delay_seconds_bucket{partition=\"2\",le=\"1\"} 4",
        "tally_event_delay_seconds_bucket{partition=\"2\",le=\"30\"} 5",
        "tally_event_delay_seconds_bucket{partition=\"2\",le=\"+Inf\"} 5",
        "tally_event_delay_seconds_sum{partition=\"2\"} 20.783",
        "tally_event_delay_seconds_count{partition=\"2\"} 5",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    assert!(text.contains("tally_build_info{version=\""), "{text}");
}

/// The consumer lag has one home: rendered alone when scraped, never in the
/// worker's report (a family twice in one scrape is invalid text).
#[test]
fn the_consumer_lag_is_rendered_alone() {
    let text = super::consumer_lag(&[(Partition(2), 10), (Partition(5), 0)]);
    assert_eq!(
        text,
        "# HELP tally_consumer_lag_records Input log end (librdkafka's last fetch, or the \
         assignment) minus this worker's position, when scraped.\n\
         # TYPE tally_consumer_lag_records gauge\n\
         tally_consumer_lag_records{partition=\"2\"} 10.0\n\
         tally_consumer_lag_records{partition=\"5\"} 0.0\n"
    );
    assert!(!worker(&report()).contains("tally_consumer_lag"));
}
