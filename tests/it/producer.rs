//! The producer side of the checkpoint barrier (docs/DESIGN.md §7.2, step 2): `Outputs::flush`
//! returns only once every record sent before it is acknowledged, and fails when
//! one could not be delivered — so the caller never commits past a lost result.

use std::time::Duration;

use crate::common::*;
use tally::config::{KafkaConfig, TopicsConfig};
use tally::engine::{PaneKind, ResultKind, ResultRecord};
use tally::kafka::outputs::Outputs;
use tally::model::Pico;

fn pane(i: u64) -> ResultRecord {
    let cost = Pico(u128::from(i) * 1_000_003);
    ResultRecord {
        kind: ResultKind::Window,
        tenant_id: format!("tenant-{:03}", i % 7),
        window_start: 1_767_261_600_000 + 60_000 * i as i64,
        window_end: 1_767_261_660_000 + 60_000 * i as i64,
        cost_pico: cost,
        usd: cost.usd_string(),
        requests: i + 1,
        prompt_tokens: 10 * i,
        completion_tokens: 3 * i,
        source_partition: 0,
        version: i + 1,
        pane: PaneKind::OnTime,
        pane_index: 0,
        generation: 1,
        lines: vec![],
    }
}

#[test]
fn flush_returns_once_every_record_is_acknowledged_and_readable() {
    let broker = DevBroker::start(&[("tenant-cost", 2)]);
    let outputs = Outputs::new(&broker.kafka(), &TopicsConfig::default()).unwrap();
    let sent: Vec<ResultRecord> = (0..2_000).map(pane).collect();
    for r in &sent {
        outputs.result(r).unwrap();
    }
    outputs.flush(Duration::from_secs(30)).unwrap();
    // Every delivery report was handled before flush returned.
    assert_eq!(outputs.delivered(), sent.len() as u64);
    let mut got = results(&broker, "tenant-cost");
    got.sort_by_key(|r| r.window_end);
    assert_eq!(got, sent, "what was acknowledged is what was sent, once");
}

#[test]
fn a_record_that_cannot_be_delivered_fails_the_flush() {
    // Nothing listens on port 1: the record expires in the local queue.
    let mut kafka = KafkaConfig {
        bootstrap_servers: "127.0.0.1:1".into(),
        ..KafkaConfig::default()
    };
    kafka
        .properties
        .insert("message.timeout.ms".into(), "1000".into());
    let outputs = Outputs::new(&kafka, &TopicsConfig::default()).unwrap();
    outputs.result(&pane(1)).unwrap();
    let err = outputs
        .flush(Duration::from_secs(30))
        .expect_err("a lost record must fail the barrier");
    assert!(
        err.to_string().contains("1 record(s) were not delivered"),
        "{err}"
    );
    assert_eq!(outputs.delivered(), 0);
}
