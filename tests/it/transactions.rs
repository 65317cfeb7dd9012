//! Transactional input (issue 34, item 4; docs/DESIGN.md §7.5): committed
//! transactions billed once, transaction markers counted as empty offsets (never
//! gaps), and a bounded run drains a partition whose log ends in a marker.
//!
//! The dev broker is librdkafka's mock cluster, which implements transactions
//! only as far as a producer needs to get through them: the first test pins down
//! exactly what it does and does not do. It writes no markers, so this file
//! appends the marker a real broker writes at each commit itself, as a control
//! batch through the Kafka protocol (`append_marker`): the consumer then meets
//! the log a real broker would serve. It hands aborted records to a
//! `read_committed` consumer, so aborted transactions are covered by the model
//! test of the offset ledger (`checkpoint::ledger::model_tests`), not here.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::Message;

use crate::common::*;

const T: Duration = Duration::from_secs(30);

/// A transactional producer on `broker`.
fn transactional(broker: &DevBroker, id: &str) -> BaseProducer {
    let p: BaseProducer = tally::kafka::client_config(&broker.kafka(), &[])
        .set("transactional.id", id)
        .create()
        .unwrap();
    p.init_transactions(T).unwrap();
    p
}

fn send(p: &BaseProducer, partition: i32, key: &str, payload: &str) {
    p.send(
        BaseRecord::to("requests")
            .partition(partition)
            .key(key)
            .payload(payload),
    )
    .unwrap();
}

/// Zigzag varint, as record fields are encoded.
fn varint(buf: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        buf.push((z as u8) | 0x80);
        z >>= 7;
    }
    buf.push(z as u8);
}

/// CRC-32C (Castagnoli), as a record batch's checksum.
fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for b in data {
        crc ^= u32::from(*b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A record batch (v2) holding one control record: the marker that ends a
/// transaction of producer `pid` (`commit`, or abort).
fn marker_batch(pid: i64, commit: bool) -> Vec<u8> {
    let mut record = vec![0u8]; // attributes
    varint(&mut record, 0); // timestamp delta
    varint(&mut record, 0); // offset delta
    varint(&mut record, 4); // key: version 0, type (0 abort, 1 commit)
    record.extend_from_slice(&0i16.to_be_bytes());
    record.extend_from_slice(&i16::from(commit).to_be_bytes());
    varint(&mut record, 6); // value: version 0, coordinator epoch
    record.extend_from_slice(&0i16.to_be_bytes());
    record.extend_from_slice(&0i32.to_be_bytes());
    varint(&mut record, 0); // headers
    let mut body = Vec::new(); // from attributes on: what the CRC covers
    body.extend_from_slice(&0x30i16.to_be_bytes()); // transactional | control
    body.extend_from_slice(&0i32.to_be_bytes()); // last offset delta
    let now = tally::base::clock::now_ms();
    body.extend_from_slice(&now.to_be_bytes());
    body.extend_from_slice(&now.to_be_bytes());
    body.extend_from_slice(&pid.to_be_bytes());
    body.extend_from_slice(&0i16.to_be_bytes()); // producer epoch
    body.extend_from_slice(&(-1i32).to_be_bytes()); // base sequence
    body.extend_from_slice(&1i32.to_be_bytes()); // records
    varint(&mut body, record.len() as i64);
    body.extend_from_slice(&record);
    let mut batch = Vec::new();
    batch.extend_from_slice(&0i64.to_be_bytes()); // base offset (the broker's)
    batch.extend_from_slice(&((4 + 1 + 4 + body.len()) as i32).to_be_bytes());
    batch.extend_from_slice(&(-1i32).to_be_bytes()); // partition leader epoch
    batch.push(2); // magic
    batch.extend_from_slice(&crc32c(&body).to_be_bytes());
    batch.extend_from_slice(&body);
    batch
}

/// Appends the marker a real broker writes when a transaction ends to
/// `requests`/`partition`, with a Produce request (v3) of its own; returns its
/// offset.
fn append_marker(broker: &DevBroker, partition: i32, commit: bool) -> i64 {
    let batch = marker_batch(4242, commit);
    let topic = b"requests";
    let mut req = Vec::new();
    req.extend_from_slice(&0i16.to_be_bytes()); // Produce
    req.extend_from_slice(&3i16.to_be_bytes()); // version
    req.extend_from_slice(&7i32.to_be_bytes()); // correlation id
    req.extend_from_slice(&(-1i16).to_be_bytes()); // client id: null
    req.extend_from_slice(&(-1i16).to_be_bytes()); // transactional id: null
    req.extend_from_slice(&(-1i16).to_be_bytes()); // acks: all
    req.extend_from_slice(&5000i32.to_be_bytes());
    req.extend_from_slice(&1i32.to_be_bytes()); // topics
    req.extend_from_slice(&(topic.len() as i16).to_be_bytes());
    req.extend_from_slice(topic);
    req.extend_from_slice(&1i32.to_be_bytes()); // partitions
    req.extend_from_slice(&partition.to_be_bytes());
    req.extend_from_slice(&(batch.len() as i32).to_be_bytes());
    req.extend_from_slice(&batch);
    let mut s = TcpStream::connect(&broker.bootstrap).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    s.write_all(&(req.len() as i32).to_be_bytes()).unwrap();
    s.write_all(&req).unwrap();
    let mut len = [0u8; 4];
    s.read_exact(&mut len).unwrap();
    let mut resp = vec![0u8; i32::from_be_bytes(len) as usize];
    s.read_exact(&mut resp).unwrap();
    // correlation id, topics, topic name, partitions, partition, then:
    let at = 4 + 4 + 2 + topic.len() + 4 + 4;
    let error = i16::from_be_bytes(resp[at..at + 2].try_into().unwrap());
    assert_eq!(error, 0, "the broker refused the marker");
    i64::from_be_bytes(resp[at + 2..at + 10].try_into().unwrap())
}

/// A consumer as the worker configures it (`read_committed`), without a group.
fn reader(broker: &DevBroker, group: &str) -> BaseConsumer {
    let mut kafka = broker.kafka();
    kafka.group_id = group.into();
    tally::kafka::consumer_config(&kafka).create().unwrap()
}

/// Every record `c` hands over from `partition` starting at `from`, until a
/// second passes without one; and the consumer's position then.
fn read_all(c: &BaseConsumer, partition: i32, from: i64) -> (Vec<i64>, Option<i64>) {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset("requests", partition, Offset::Offset(from))
        .unwrap();
    c.assign(&tpl).unwrap();
    let mut offsets = Vec::new();
    let mut quiet = std::time::Instant::now();
    while quiet.elapsed() < Duration::from_secs(1) {
        if let Some(m) = c.poll(Duration::from_millis(100)) {
            offsets.push(m.unwrap().offset());
            quiet = std::time::Instant::now();
        }
    }
    let position = c.position().unwrap();
    let position = match position
        .find_partition("requests", partition)
        .map(|e| e.offset())
    {
        Some(Offset::Offset(o)) => Some(o),
        _ => None,
    };
    (offsets, position)
}

fn log_end(broker: &DevBroker, partition: i32) -> i64 {
    reader(broker, "probe")
        .fetch_watermarks("requests", partition, T)
        .unwrap()
        .1
}

/// What the dev broker does with transactions, measured (docs/DESIGN.md §10):
/// it takes transactional records, commits and aborts, but writes no marker,
/// hands aborted and unfinished transactions' records to a `read_committed`
/// consumer, and accepts `send_offsets_to_transaction` without storing the
/// offsets. A control batch written to it is served as a real broker serves a
/// marker: it takes one offset, no record is handed over, the position passes it.
#[test]
fn the_dev_broker_implements_transactions_only_for_producers() {
    let broker = DevBroker::start(&[("requests", 1)]);
    let p = transactional(&broker, "probe-tx");
    let e = |i: i64| event(&format!("r{i}"), "t", "small", 1_767_225_600_000 + i);
    p.begin_transaction().unwrap();
    for i in 0..3 {
        send(&p, 0, "t", &e(i));
    }
    p.flush(T).unwrap();
    p.commit_transaction(T).unwrap();
    // A real broker: 3 records and a commit marker, the log ends at 4.
    assert_eq!(log_end(&broker, 0), 3, "the mock wrote a commit marker");
    p.begin_transaction().unwrap();
    send(&p, 0, "t", &e(3));
    send(&p, 0, "t", &e(4));
    p.flush(T).unwrap();
    p.abort_transaction(T).unwrap();
    assert_eq!(log_end(&broker, 0), 5, "the mock wrote an abort marker");
    p.begin_transaction().unwrap();
    send(&p, 0, "t", &e(5));
    p.flush(T).unwrap();
    // ListOffsets under read_committed: a real broker answers the last stable
    // offset (5), the mock its log end.
    assert_eq!(log_end(&broker, 0), 6);
    // A real broker hands over 0..3 and stops at the open transaction (its last
    // stable offset, 5 there); the mock hands over everything.
    let c = reader(&broker, "probe");
    let (seen, position) = read_all(&c, 0, 0);
    assert_eq!(seen, vec![0, 1, 2, 3, 4, 5], "aborted and open records");
    assert_eq!(position, Some(6));
    // send_offsets_to_transaction: accepted, committed, never stored.
    let group = reader(&broker, "probe-group");
    let mut offsets = TopicPartitionList::new();
    offsets
        .add_partition_offset("requests", 0, Offset::Offset(6))
        .unwrap();
    p.send_offsets_to_transaction(&offsets, &group.group_metadata().unwrap(), T)
        .unwrap();
    p.commit_transaction(T).unwrap();
    let mut asked = TopicPartitionList::new();
    asked.add_partition("requests", 0);
    let committed = group.committed_offsets(asked, T).unwrap();
    assert_eq!(
        committed.find_partition("requests", 0).map(|e| e.offset()),
        Some(Offset::Invalid),
        "the mock stored transactional offsets"
    );
    // A marker written as a control batch: one offset, no record, passed.
    let at = append_marker(&broker, 0, true);
    assert_eq!(at, 6);
    send_plain(&broker, 0, &[e(7)]);
    let (seen, position) = read_all(&reader(&broker, "probe"), 0, 5);
    assert_eq!(seen, vec![5, 7]);
    assert_eq!(position, Some(8));
    let at = append_marker(&broker, 0, false);
    let (seen, position) = read_all(&reader(&broker, "probe"), 0, 7);
    assert_eq!((seen, position), (vec![7], Some(at + 1)));
}

fn send_plain(broker: &DevBroker, partition: i32, payloads: &[String]) {
    let key = "plain";
    produce(broker, "requests", partition, key, payloads);
}

/// The cost of one `event` of `model` (1,000 prompt and 500 completion tokens)
/// under `common::PRICES`, in pico-USD.
fn cost(model: &str) -> u128 {
    match model {
        "small" => 150_000_000 + 300_000_000,
        "medium" => 3_000_000_000 + 7_500_000_000,
        other => panic!("no price for {other}"),
    }
}

/// The input as it is written, and what it must bill.
struct Input<'a> {
    broker: &'a DevBroker,
    n: i64,
    /// `(tenant, window end)` → (requests, cost).
    bill: BTreeMap<(String, i64), (u64, u128)>,
    /// Per partition: records and markers written.
    records: [u64; 3],
    markers: [u64; 3],
}

impl Input<'_> {
    /// The next event (1 s apart, tenants and models alternating); `billed`: it
    /// belongs to the bill.
    fn next(&mut self, billed: bool) -> String {
        let i = self.n;
        self.n += 1;
        let tenant = ["acme", "globex"][(i % 2) as usize];
        let model = ["small", "medium", "small"][(i % 3) as usize];
        let ts = 1_767_225_600_000 + i * 1_000;
        if billed {
            let b = self
                .bill
                .entry((tenant.to_string(), (ts / 60_000 + 1) * 60_000))
                .or_default();
            b.0 += 1;
            b.1 += cost(model);
        }
        event(&format!("req-{i:05}"), tenant, model, ts)
    }

    fn plain(&mut self, partition: i32, n: usize) {
        let payloads: Vec<String> = (0..n).map(|_| self.next(true)).collect();
        send_plain(self.broker, partition, &payloads);
        self.records[partition as usize] += n as u64;
    }

    /// Records of an open transaction of `p` on `partitions`.
    fn in_txn(&mut self, p: &BaseProducer, partitions: &[i32]) {
        for &q in partitions {
            let payload = self.next(true);
            send(p, q, "txn", &payload);
            self.records[q as usize] += 1;
        }
        p.flush(T).unwrap();
    }

    /// Commits `p`'s transaction, and writes the markers a real broker writes.
    fn commit(&mut self, p: &BaseProducer, touched: &[i32]) {
        p.commit_transaction(T).unwrap();
        for &q in touched {
            append_marker(self.broker, q, true);
            self.markers[q as usize] += 1;
        }
    }
}

/// Committed transactions — one partition and several, two producers' at once —
/// interleaved with plain records on three partitions, whose logs end in a
/// marker (p0), a record (p1) and two markers (p2): a bounded run exits 0, bills
/// exactly the records, and counts every marker as an empty offset, never a gap.
/// Before the consumer's position moved the next offset, it never ended (p0, p2).
#[test]
fn committed_transactions_are_billed_exactly_and_a_log_ending_in_a_marker_drains() {
    let dir = TempDir::new("txn");
    let broker = DevBroker::start(&[
        ("requests", 3),
        ("tenant-cost", 1),
        ("requests.late", 1),
        ("requests.dlq", 1),
    ]);
    let cfg = write_config(dir.path(), &broker, "txn", "");
    let shown = tally_ok(&["config", "--config", cfg.to_str().unwrap()], &[], T);
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown.contains("# \"isolation.level\" = \"read_committed\""),
        "{shown}"
    );
    let a = transactional(&broker, "tx-a");
    let b = transactional(&broker, "tx-b");
    let mut input = Input {
        broker: &broker,
        n: 0,
        bill: BTreeMap::new(),
        records: [0; 3],
        markers: [0; 3],
    };
    input.plain(0, 5);
    input.plain(1, 3);
    a.begin_transaction().unwrap();
    input.in_txn(&a, &[0, 1, 0, 1, 0]);
    input.plain(1, 2);
    input.commit(&a, &[0, 1]);
    input.plain(0, 2);
    input.plain(2, 1);
    // Two producers' transactions open at once on p2.
    a.begin_transaction().unwrap();
    b.begin_transaction().unwrap();
    input.in_txn(&a, &[2, 2, 0]);
    input.in_txn(&b, &[2, 1]);
    input.commit(&a, &[2, 0]);
    input.in_txn(&b, &[2]);
    input.commit(&b, &[2, 1]);
    input.plain(1, 2);
    for (q, markers) in input.markers.iter().enumerate() {
        assert_eq!(
            log_end(&broker, q as i32),
            input.records[q] as i64 + *markers as i64
        );
    }

    tally_ok(
        &["run", "--config", cfg.to_str().unwrap(), "--until-end"],
        &[],
        Duration::from_secs(120),
    );

    let report = tally::worker::report::read(&dir.path().join("state-txn")).unwrap();
    assert!(report.balanced());
    for p in &report.partitions {
        let q = p.partition.0 as usize;
        assert_eq!(
            p.next_offset.0,
            (input.records[q] + input.markers[q]) as i64,
            "partition {q} read to its end"
        );
        assert_eq!(p.counters.consumed, input.records[q], "partition {q}");
        assert_eq!(p.counters.folded, input.records[q], "partition {q}");
        assert_eq!(p.offsets.empty_offsets, input.markers[q], "partition {q}");
        assert_eq!(p.offsets.gap_offsets, 0, "partition {q}");
    }
    let mut billed: BTreeMap<(String, i64), (u64, u128)> = BTreeMap::new();
    for (_, (_, payload)) in final_payloads(&broker, "tenant-cost") {
        let r: tally::engine::ResultRecord = serde_json::from_slice(&payload).unwrap();
        let b = billed.entry((r.tenant_id, r.window_end)).or_default();
        b.0 += r.requests;
        b.1 += r.cost_pico.0;
    }
    assert_eq!(billed, input.bill);
}
