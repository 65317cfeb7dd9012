//! Behaving like a service (issue 13): librdkafka's own log lines reach tally's
//! log, filtered by `TALLY_LOG` under the target `librdkafka`.

use std::time::Duration;

use crate::common::*;

#[test]
fn librdkafka_logs_reach_the_log_and_kafka_debug_works() {
    let dir = TempDir::new("rdlog");
    let cfg = dir.path().join("c.toml");
    // Nothing listens on port 1: every connection attempt is refused.
    std::fs::write(
        &cfg,
        format!(
            "[kafka]\nbootstrap_servers = \"127.0.0.1:1\"\n\"message.timeout.ms\" = \"1500\"\n\"debug\" = \"broker\"\n{PRICES}"
        ),
    )
    .unwrap();
    let c = cfg.to_str().unwrap();
    let args = ["gen", "--config", c, "--count", "1", "--partitions", "1"];
    let debug = tally(
        &args,
        &[("TALLY_LOG", "warn,librdkafka=debug")],
        Duration::from_secs(60),
    );
    let log = String::from_utf8_lossy(&debug.stderr);
    assert!(!debug.status.success(), "{log}");
    assert!(
        log.contains("librdkafka: BROKER"),
        "kafka.\"debug\" lines missing:\n{log}"
    );
    assert!(log.contains("Connection refused"), "{log}");
    // Without the debug filter, librdkafka's debug lines stay out.
    let quiet = tally(&args, &[("TALLY_LOG", "warn")], Duration::from_secs(60));
    let log = String::from_utf8_lossy(&quiet.stderr);
    assert!(!log.contains("librdkafka: BROKER"), "{log}");
}
