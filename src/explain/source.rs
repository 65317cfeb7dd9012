//! What `tally explain` reads: the input topic's partitions from the offsets
//! the replays start at (`start`) to the log end seen at the start, or until a
//! replay is done, a record at a time (`open`, `InputReader::read`: nothing of
//! the topic is held), and the sink's rows of the tenant's windows
//! (`sink_rows`). The I/O of `explain`, with `run` and `start`.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use crate::service::stored_progress::{self, Stored};

use super::{InputRecord, Quantity, QuantityLine, SinkAdjustment, SinkLine, SinkPartial, SinkRows};
use crate::kafka::config::KafkaConfig;
use crate::kafka::{client_config, KafkaIoError};

/// How long reading may see nothing move before it fails.
const STALL: Duration = Duration::from_secs(60);

/// Why the input could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Kafka(#[from] KafkaIoError),
    /// The replay reads more records than the caller allows.
    #[error(
        "the replay reads more than {limit} records of the input topic (the bound of this \
         reader; it holds {records} from where the replay starts)"
    )]
    TooLarge { records: u64, limit: u64 },
    /// The caller's handling of a record failed.
    #[error("{0}")]
    Replay(String),
}

/// The input topic, with its partitions' log starts and the log ends read now.
pub struct InputReader {
    consumer: BaseConsumer<crate::kafka::logging::Logged>,
    topic: String,
    /// `(log_start, log_end)` by partition.
    bounds: Vec<(i64, i64)>,
}

/// Opens `topic`, with every partition's log start and the log end read now
/// (`read_committed`: the last stable offset) as where reading stops.
pub fn open(kafka: &KafkaConfig, topic: &str) -> Result<InputReader, ReadError> {
    let mut c = client_config(
        kafka,
        &[
            ("enable.auto.commit", "false"),
            ("isolation.level", "read_committed"),
        ],
    );
    c.set("group.id", "tally-explain");
    let consumer: BaseConsumer<crate::kafka::logging::Logged> = c
        .create_with_context(crate::kafka::logging::Logged)
        .map_err(KafkaIoError::client("creating a reader"))?;
    let n = crate::kafka::partition_count(&consumer, topic)? as i32;
    if n == 0 {
        return Err(KafkaIoError::Fatal(format!("input topic {topic} does not exist")).into());
    }
    let mut bounds = Vec::new();
    for p in 0..n {
        let (low, high) = crate::kafka::watermarks(&consumer, topic, p, Duration::from_secs(10))
            .map_err(KafkaIoError::client(format!("log range of {topic}/{p}")))?;
        bounds.push((low, high));
    }
    Ok(InputReader {
        consumer,
        topic: topic.to_string(),
        bounds,
    })
}

impl InputReader {
    /// `(log_start, log_end)` of each partition, by partition.
    pub fn bounds(&self) -> &[(i64, i64)] {
        &self.bounds
    }

    /// Hands every record from `starts[p]` on to `each` (its partition, the
    /// record), in offset order within a partition, until every partition
    /// reached its end or `each` said it is done with it (`Ok(true)`: the
    /// partition is paused). A partition reaches its end when a record at
    /// `end - 1` or a position at `end` was seen (transaction markers leave
    /// offsets without records). Reading fails when nothing moves for
    /// `STALL`, and once it handed over more than `max_records` records.
    pub fn read(
        self,
        starts: &[i64],
        max_records: Option<u64>,
        mut each: impl FnMut(i32, &InputRecord) -> Result<bool, String>,
    ) -> Result<(), ReadError> {
        let (consumer, topic, bounds) = (self.consumer, self.topic, self.bounds);
        let mut tpl = TopicPartitionList::new();
        for (p, start) in starts.iter().enumerate() {
            tpl.add_partition_offset(&topic, p as i32, Offset::Offset(*start))
                .map_err(KafkaIoError::client("assignment"))?;
        }
        consumer
            .assign(&tpl)
            .map_err(KafkaIoError::client("assigning"))?;
        let span: u64 = (bounds.iter().zip(starts))
            .map(|((_, h), s)| (h - s).max(0) as u64)
            .sum();
        let mut handed = 0u64;
        let mut done: Vec<bool> = (bounds.iter().zip(starts))
            .map(|((_, h), s)| s >= h)
            .collect();
        let mut moved = Instant::now();
        while !done.iter().all(|d| *d) {
            if moved.elapsed() > STALL {
                let why = format!("reading {topic}: nothing for {} s", STALL.as_secs());
                return Err(KafkaIoError::Fatal(why).into());
            }
            let Some(msg) = consumer.poll(Duration::from_millis(200)) else {
                let at = consumer
                    .position()
                    .map_err(KafkaIoError::client("position"))?;
                for e in at.elements() {
                    let p = e.partition() as usize;
                    if let Offset::Offset(o) = e.offset() {
                        done[p] = done[p] || o >= bounds[p].1;
                    }
                }
                continue;
            };
            let m = msg.map_err(KafkaIoError::client(format!("reading {topic}")))?;
            moved = Instant::now();
            let p = m.partition() as usize;
            let end = bounds[p].1;
            if done[p] {
                continue;
            }
            if m.offset() < end {
                handed += 1;
                if let Some(limit) = max_records.filter(|l| handed > *l) {
                    return Err(ReadError::TooLarge {
                        records: span,
                        limit,
                    });
                }
                let r = InputRecord {
                    offset: m.offset(),
                    key: m.key().map(<[u8]>::to_vec),
                    payload: m.payload().unwrap_or_default().to_vec(),
                    kafka_ts: m.timestamp().to_millis(),
                };
                if each(m.partition(), &r).map_err(ReadError::Replay)? {
                    done[p] = true;
                    pause(&consumer, &topic, m.partition())?;
                }
            }
            done[p] = done[p] || m.offset() + 1 >= end;
        }
        Ok(())
    }
}

/// Stops fetching `topic`'s partition `p`.
fn pause(
    consumer: &BaseConsumer<crate::kafka::logging::Logged>,
    topic: &str,
    p: i32,
) -> Result<(), ReadError> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, p);
    consumer
        .pause(&tpl)
        .map_err(KafkaIoError::client(format!("pausing {topic}/{p}")))?;
    Ok(())
}

/// A sum the sink's views give as an unbounded `NUMERIC`, read as text.
fn num<T: std::str::FromStr>(text: &str) -> anyhow::Result<T>
where
    T::Err: std::fmt::Display,
{
    text.parse()
        .map_err(|e| anyhow::anyhow!("{text} in the sink does not fit: {e}"))
}

const LINE: &str = "SELECT sum(cost_pico)::TEXT, sum(requests)::TEXT, count(*) \
     FROM tenant_cost_minute WHERE tenant_id = $1 AND window_start >= $2 AND window_end <= $3";
const LINES: &str = "SELECT model, sum(cost_pico)::TEXT, sum(requests)::TEXT \
     FROM tenant_cost_minute_line WHERE tenant_id = $1 AND window_start >= $2 AND window_end <= $3 \
     GROUP BY model ORDER BY model";
const PARTIALS: &str = "SELECT source_partition, sum(cost_pico)::TEXT, sum(requests)::TEXT, \
     sum(version)::TEXT FROM tenant_cost_partial \
     WHERE tenant_id = $1 AND window_start >= $2 AND window_end <= $3 \
     GROUP BY source_partition ORDER BY source_partition";
const ADJUSTMENTS: &str = "SELECT request_id, model, cost_pico::TEXT, source, variant, plan \
     FROM tenant_cost_adjustment \
     WHERE tenant_id = $1 AND window_start >= $2 AND window_end <= $3 ORDER BY request_id";

const QUANTITIES: &str = "SELECT model, variant, plan, quantity, sum(count)::TEXT, \
     sum(cost_pico)::TEXT FROM tenant_cost_minute_quantity \
     WHERE tenant_id = $1 AND window_start >= $2 AND window_end <= $3 \
     GROUP BY model, variant, plan, quantity ORDER BY model, variant, plan, quantity";
const ADJUSTMENT_QUANTITIES: &str = "SELECT a.request_id, q.quantity, q.count::TEXT, \
     q.cost_pico::TEXT FROM tenant_cost_adjustment_quantity q \
     JOIN tenant_cost_adjustment a USING (request_id, generation) \
     WHERE a.tenant_id = $1 AND a.window_start >= $2 AND a.window_end <= $3 \
     ORDER BY a.request_id, q.quantity";

/// The sink's rows of `tenant`'s windows in `[start, end)`, summed over them,
/// and its stored progress (`tally_progress`, as the API's `/status.json` reads it).
pub fn sink_rows(
    url: &str,
    tenant: &str,
    (start, end): (i64, i64),
) -> anyhow::Result<(SinkRows, Stored)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let db = crate::sink::connect(url).await?;
        let args: [&(dyn tokio_postgres::types::ToSql + Sync); 3] = [&tenant, &start, &end];
        let mut rows = SinkRows::default();
        for r in db.query(LINE, &args).await? {
            if r.get::<_, i64>(2) > 0 {
                rows.cost_pico = Some(r.get(0));
                rows.requests = num(r.get(1))?;
            }
        }
        for r in db.query(LINES, &args).await? {
            rows.lines.push(SinkLine {
                model: r.get(0),
                cost_pico: r.get(1),
                requests: num(r.get(2))?,
            });
        }
        for r in db.query(PARTIALS, &args).await? {
            rows.partials.push(SinkPartial {
                source_partition: r.get(0),
                cost_pico: r.get(1),
                requests: num(r.get(2))?,
                version: num(r.get(3))?,
            });
        }
        for r in db.query(ADJUSTMENTS, &args).await? {
            rows.adjustments.push(SinkAdjustment {
                request_id: r.get(0),
                model: r.get(1),
                cost_pico: r.get(2),
                source: r.get(3),
                variant: r.get(4),
                plan: r.get(5),
                quantities: Vec::new(),
            });
        }
        for r in db.query(ADJUSTMENT_QUANTITIES, &args).await? {
            let id: String = r.get(0);
            if let Some(a) = rows.adjustments.iter_mut().find(|a| a.request_id == id) {
                a.quantities.push(Quantity {
                    quantity: r.get(1),
                    count: num(r.get(2))?,
                    cost_pico: r.get(3),
                });
            }
        }
        for r in db.query(QUANTITIES, &args).await? {
            rows.quantities.push(QuantityLine {
                model: r.get(0),
                variant: r.get(1),
                plan: r.get(2),
                quantity: r.get(3),
                count: num(r.get(4))?,
                cost_pico: r.get(5),
            });
        }
        Ok((rows, stored_progress::read(&db).await?))
    })
}
