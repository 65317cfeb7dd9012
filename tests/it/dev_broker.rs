//! `tally dev-broker --brokers N`: a mock cluster of N brokers, every topic with
//! a replica on each, whose partition leadership a `leader` line of the control
//! file moves (the chaos campaign's leader change) — with every record kept, and
//! clients that follow the new leader, `tally::kafka::watermarks` among them.

use std::ffi::OsStr;
use std::path::Path;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Message, Offset, TopicPartitionList};

use crate::common::*;
use tally::devtools::support::leader;
use tally::kafka::watermarks;

fn send(p: &BaseProducer, range: std::ops::Range<i32>) {
    for i in range {
        let payload = format!("record-{i}");
        p.send(
            BaseRecord::to("requests")
                .partition(0)
                .key("k")
                .payload(&payload),
        )
        .unwrap();
    }
    p.flush(Duration::from_secs(30)).unwrap();
}

#[test]
fn a_leader_change_moves_a_partition_and_keeps_its_records() {
    let dir = TempDir::new("leader");
    let ctl = dir.path().join("broker.ctl");
    let args: [&OsStr; 4] = [
        "--brokers".as_ref(),
        "3".as_ref(),
        "--control-file".as_ref(),
        ctl.as_os_str(),
    ];
    let broker = Broker::start_with(Path::new(tally_bin()), &[("requests", 2)], &args)
        .expect("tally dev-broker --brokers 3");
    let kafka = broker.kafka();
    let producer: BaseProducer =
        tally::kafka::client_config(&kafka, tally::kafka::PRODUCER_DEFAULTS)
            .create()
            .unwrap();
    send(&producer, 0..50);

    // A consumer that knows the leader before the move, as a worker does.
    let watcher: BaseConsumer = tally::kafka::client_config(&kafka, &[]).create().unwrap();
    let ten = Duration::from_secs(10);
    assert_eq!(watermarks(&watcher, "requests", 0, ten).unwrap(), (0, 50));
    let before = leader(&kafka, "requests", 0).unwrap();
    assert!((1..=3).contains(&before), "leader {before}");
    let to = before % 3 + 1;
    std::fs::write(&ctl, format!("leader requests 0 {to}\n")).unwrap();
    wait_until(
        "the new leader in the metadata",
        Duration::from_secs(10),
        || (leader(&kafka, "requests", 0).ok() == Some(to)).then_some(()),
    );
    // The old leader answers NOT_LEADER_FOR_PARTITION to the consumer that knew
    // it; asked again after the metadata refresh, the new one answers.
    assert_eq!(watermarks(&watcher, "requests", 0, ten).unwrap(), (0, 50));
    // The same producer finds the new leader, idempotence and all.
    send(&producer, 50..100);
    // A line naming no broker of the cluster is refused; the leader stays.
    std::fs::write(&ctl, "leader requests 0 4\n").unwrap();
    wait_until("the control file taken", Duration::from_secs(10), || {
        (!ctl.exists()).then_some(())
    });
    assert_eq!(leader(&kafka, "requests", 0).unwrap(), to);

    let consumer: BaseConsumer = tally::kafka::client_config(&kafka, &[])
        .set("group.id", "leader-test")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset("requests", 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&tpl).unwrap();
    let mut got = Vec::new();
    wait_until("all 100 records", Duration::from_secs(30), || {
        while let Some(m) = consumer.poll(Duration::from_millis(100)) {
            let m = m.unwrap();
            got.push((
                m.offset(),
                String::from_utf8_lossy(m.payload().unwrap()).into_owned(),
            ));
        }
        (got.len() >= 100).then_some(())
    });
    let want: Vec<(i64, String)> = (0..100)
        .map(|i| (i64::from(i), format!("record-{i}")))
        .collect();
    assert_eq!(got, want);
}
