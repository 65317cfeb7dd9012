//! One explanation from the live sources: the window the caller names, on the
//! config's grid; the late and dead-letter topics read; every input partition
//! replayed from its start (`start`: a checkpoint before the windows, or the log
//! start) until done, the topics' records of the windows outside that range
//! added (`outside`); the sink's rows when a URL is given; the join.
//! What `tally explain --tenant` prints (and what a service would serve).

use super::finality::stored_finality;
use super::outside::add_outside;
use super::{join, source, start, Explanation, Replayer, Sides};
use crate::base::clock::now_ms;
use crate::config::Config;
use crate::kafka::read::read_topic;

/// The windows asked for: one by its start or by its end, or every window of
/// `[start, end)` (a calendar bucket, its bounds given with the zone's offset).
#[derive(Debug, Clone, Copy)]
pub enum Asked {
    Start(i64),
    End(i64),
    Range(i64, i64),
}

/// Why no explanation was made.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// The question is wrong (not a window boundary, a config without prices).
    #[error("{0}")]
    Usage(String),
    /// The broker does not answer, or a topic cannot be read.
    #[error("{0}")]
    Kafka(String),
    /// The sink's database cannot be read.
    #[error("reading the sink's rows: {0}")]
    Sink(String),
    /// The input holds more records than the caller's bound.
    #[error("{0}")]
    TooLarge(String),
    /// The engine failed to replay a record (not expected: the replay's task
    /// keeps every window in memory).
    #[error("{0}")]
    Replay(String),
}

/// The windows `[start, end)` asked for, on `spec`'s grid.
pub fn window(asked: Asked, spec: &crate::time::WindowSpec) -> Result<(i64, i64), Failure> {
    let starts = |s: i64| spec.assign(s).filter(|w| w.start == s);
    let ends = |e: i64| Some(spec.ending_at(e)).filter(|w| w.end == e);
    let w = match asked {
        Asked::Start(s) => starts(s).map(|w| (w.start, w.end)),
        Asked::End(e) => ends(e).map(|w| (w.start, w.end)),
        Asked::Range(s, e) => match (starts(s), ends(e)) {
            (Some(a), Some(b)) if a.start < b.end => Some((a.start, b.end)),
            (Some(_), Some(_)) => {
                return Err(Failure::Usage(
                    "the window start must come before the window end".into(),
                ))
            }
            _ => None,
        },
    };
    w.ok_or_else(|| {
        Failure::Usage(format!(
            "the time given is not a window boundary of the config's windows ({} ms, offset {} ms)",
            spec.size_ms, spec.offset_ms
        ))
    })
}

/// `tenant`'s window explained from the topics `cfg` names (and the sink at
/// `sink_url`, if given), refused when the input holds more than `max_records`.
pub fn explain(
    cfg: &Config,
    tenant: &str,
    asked: Asked,
    sink_url: Option<&str>,
    max_records: Option<u64>,
) -> Result<Explanation, Failure> {
    let engine = cfg.engine().map_err(|e| Failure::Usage(e.to_string()))?;
    let (start, end) = window(asked, &engine.window)?;
    let kafka = |e: crate::kafka::KafkaIoError| Failure::Kafka(e.to_string());
    let read = |e: source::ReadError| match e {
        source::ReadError::TooLarge { .. } => Failure::TooLarge(e.to_string()),
        source::ReadError::Replay(m) => Failure::Replay(m),
        source::ReadError::Kafka(e) => kafka(e),
    };
    let input = source::open(&cfg.kafka, &cfg.topics.input).map_err(read)?;
    let late = read_topic(&cfg.kafka, &cfg.topics.late).map_err(kafka)?;
    let dead = read_topic(&cfg.kafka, &cfg.topics.dead_letter).map_err(kafka)?;
    let now = now_ms();
    // Declared before the replays: their restored tasks spill to it.
    let (resumed, _scratch, start_notes) = start::starts(cfg, &engine, start, input.bounds());
    let mut replays: Vec<Replayer<'_>> = (input.bounds().iter().zip(resumed))
        .enumerate()
        .map(|(p, (b, from))| {
            let r = Replayer::new(&engine, tenant, (start, end), (p as i32, *b), now);
            match from {
                Some((task, at)) => r.resume(task, at),
                None => r,
            }
        })
        .collect();
    let starts: Vec<i64> = replays.iter().map(Replayer::from_offset).collect();
    input
        .read(&starts, max_records, |p, r| replays[p as usize].push(r))
        .map_err(read)?;
    let replays: Vec<_> = replays
        .into_iter()
        .map(|r| {
            let mut r = r.finish();
            let topics = (late.as_slice(), dead.as_slice());
            let (of, topic) = ((tenant, (start, end)), &cfg.topics.input);
            add_outside(&engine, of, topic, &mut r, topics, now);
            r
        })
        .collect();
    let read = sink_url
        .map(|u| source::sink_rows(u, tenant, (start, end)))
        .transpose()
        .map_err(|e| Failure::Sink(format!("{e:#}")))?;
    let (sink, stored) = read.unzip();
    let mut x = join(
        tenant,
        (start, end),
        replays,
        Sides {
            input_topic: &cfg.topics.input,
            late: &late,
            dead_letters: &dead,
            sink,
        },
    );
    x.finality = stored.map(|s| stored_finality(&s, end, engine.allowed_lateness_ms));
    x.notes.extend(start_notes);
    Ok(x)
}
