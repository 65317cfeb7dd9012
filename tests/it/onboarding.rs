//! A new consumer group on a log that no longer starts at 0 (issue 34, item 5;
//! docs/DESIGN.md §7.5): refused, naming both ways out; `--start-at-log-start`
//! is the one-time choice to bill from the log start, counted as the gap it is
//! and recorded in the checkpoint; it accepts no later gap.

use std::time::Duration;

use crate::common::*;

const BASE_TS: i64 = 1_767_225_600_000;

/// The cost of one `event` of the small model under `common::PRICES`, pico-USD.
const SMALL: u128 = 150_000_000 + 300_000_000;

struct Job {
    dir: TempDir,
    broker: DevBroker,
    cfg: std::path::PathBuf,
    produced: i64,
}

impl Job {
    fn cfg(&self) -> &str {
        self.cfg.to_str().unwrap()
    }

    /// `n` more distinct, in-order events, uncompressed: the dev broker keeps the
    /// newest 5 MiB of a partition, so enough of them move its log start.
    fn produce(&mut self, n: i64) {
        produce_filling(&self.broker, self.produced, n, BASE_TS);
        self.produced += n;
    }

    /// The broker's log start of the input partition.
    fn log_start(&self) -> i64 {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let c: BaseConsumer = tally::kafka::client_config(&self.broker.kafka(), &[])
            .create()
            .unwrap();
        let (low, high) = c
            .fetch_watermarks("requests", 0, Duration::from_secs(10))
            .unwrap();
        assert_eq!(high, self.produced);
        low
    }

    fn run(&self, flags: &[&str]) -> std::process::Output {
        let mut args = vec!["run", "--config", self.cfg(), "--until-end"];
        args.extend_from_slice(flags);
        tally(&args, &[], Duration::from_secs(300))
    }

    /// The newest complete checkpoint's entry for partition 0.
    fn checkpointed(&self) -> tally::checkpoint::PartitionEntry {
        let cfg = tally::config::CheckpointConfig {
            dir: self.dir.path().join("checkpoints"),
            ..Default::default()
        };
        let store =
            tally::checkpoint::store::CheckpointStore::open_existing(&cfg, "onboard").unwrap();
        store
            .list()
            .unwrap()
            .into_iter()
            .filter_map(|l| l.manifest.and_then(Result::ok))
            .filter_map(|m| m.entry(tally::model::Partition(0)).cloned())
            .max_by_key(|e| e.next_offset)
            .unwrap()
    }
}

/// Refused without a choice, naming both flags; with `--start-at-log-start` the
/// run bills exactly the records the broker still has, and logs, counts and
/// checkpoints the gap; a later run with the flag still given, after more
/// records were deleted, is refused (exit 3).
#[test]
fn a_new_group_on_a_truncated_log_starts_at_its_log_start_once() {
    let dir = TempDir::new("onboard");
    let broker = DevBroker::start(&[
        ("requests", 1),
        ("tenant-cost", 1),
        ("requests.late", 1),
        ("requests.dlq", 1),
    ]);
    let cfg = write_config(dir.path(), &broker, "onboard", "");
    let mut job = Job {
        dir,
        broker,
        cfg,
        produced: 0,
    };
    job.produce(120_000);
    let low = job.log_start();
    assert!(low > 0, "retention deleted nothing");

    // No choice made: refused, with both ways out.
    let out = job.run(&[]);
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{log}");
    assert!(
        log.contains(&format!(
            "partition requests/0: offsets 0..{low} ({low} records) were deleted"
        )) && log.contains("--start-at-log-start")
            && log.contains("--allow-truncated-log"),
        "{log}"
    );

    // The choice: billed from the log start, exactly; the gap logged and counted.
    let out = job.run(&["--start-at-log-start"]);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert!(
        log.contains("STARTED AT LOG START") && log.contains(&format!("to={low}")),
        "{log}"
    );
    let billable = 120_000 - low;
    let report = tally::worker::report::read(&job.dir.path().join("state-onboard")).unwrap();
    let p = &report.partitions[0];
    assert_eq!(p.next_offset.0, 120_000);
    assert_eq!(p.counters.consumed, billable as u64);
    assert_eq!(p.offsets.gap_offsets, low as u64);
    assert!(report.balanced());
    let entry = job.checkpointed();
    assert_eq!(entry.next_offset.0, 120_000);
    assert_eq!(
        entry
            .offsets
            .gaps
            .iter()
            .map(|g| (g.from, g.to))
            .collect::<Vec<_>>(),
        vec![(0, low)]
    );
    let (mut requests, mut cost) = (0u64, 0u128);
    for (_, (_, payload)) in final_payloads(&job.broker, "tenant-cost") {
        let r: tally::engine::ResultRecord = serde_json::from_slice(&payload).unwrap();
        requests += r.requests;
        cost += r.cost_pico.0;
    }
    assert_eq!(requests, billable as u64);
    assert_eq!(cost, billable as u128 * SMALL);

    // More records deleted before this group read them: the choice does not cover
    // them, whether or not the flag is still given.
    job.produce(120_000);
    let low2 = job.log_start();
    assert!(low2 > 120_000, "retention deleted too little: {low2}");
    let out = job.run(&["--start-at-log-start"]);
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{log}");
    assert!(
        log.contains(&format!(
            "partition requests/0: offsets 120000..{low2} ({} records) were deleted",
            low2 - 120_000
        )) && log.contains("the checkpoint resumes at offset 120000")
            && log.contains("--allow-truncated-log")
            && log.contains("`--start-at-log-start` does not cover it"),
        "{log}"
    );
    // Nothing was skipped: the checkpoint still resumes before the gap.
    assert_eq!(job.checkpointed().next_offset.0, 120_000);
}
