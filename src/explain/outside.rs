//! The records of the windows a partition's replay did not read, taken from the
//! late and dead-letter topics: its dead letters before the checkpoint the
//! replay started from (a checkpoint is only taken as a start when no valid
//! record before it is of the windows, `start`), and its too-late records and
//! dead letters from the offset where the replay stopped (`Replayer`: once the
//! watermark left the windows' dedup horizon, every record of them is one of
//! those) to the log end the explanation read.
//!
//! Pure. Invariants: a record is taken at most once (by its `tally.source`
//! coordinates) and only from offsets the replay did not read; it is attributed
//! by the replay's own reads — a too-late record by `engine::validate` (its
//! window, request id and cost), a dead letter leniently (`replay::attribute`).

use std::collections::BTreeSet;

use super::replay::{attribute, request_id, too_late, Replayed};
use super::{Elsewhere, InputRecord, Routed};
use crate::engine::{validate, EngineConfig, RecordIn};
use crate::kafka::headers;
use crate::kafka::read::StoredRecord;

/// The topics' records of the tenant's windows `range` that `r`'s replay did
/// not read, added to its `elsewhere` (`now_ms`: the ingest clock of a record
/// without a Kafka timestamp, as the replay's).
pub fn add_outside(
    cfg: &EngineConfig,
    (tenant, range): (&str, (i64, i64)),
    input_topic: &str,
    r: &mut Replayed,
    (late, dead): (&[StoredRecord], &[StoredRecord]),
    now_ms: i64,
) {
    let p = r.range.partition;
    let before = r.range.from_offset;
    let after = r.range.stopped_early.then_some(r.range.to_offset);
    let unread = |o: i64| o < before || after.is_some_and(|a| o >= a && o < r.range.log_end);
    let inside = |w: crate::time::Window| w.start >= range.0 && w.end <= range.1;
    let mut seen = BTreeSet::new();
    let mut found = Vec::new();
    for rec in late {
        let Some(o) = source_offset(rec, input_topic, p).filter(|o| unread(*o)) else {
            continue;
        };
        let kafka_ts = number(rec, headers::KAFKA_TIMESTAMP);
        let input = RecordIn {
            payload: &rec.payload,
            kafka_ts,
            now_ms: kafka_ts.unwrap_or(now_ms),
        };
        let (Ok(v), Some(w)) = (validate(cfg, input), number(rec, headers::WATERMARK)) else {
            continue;
        };
        if v.ev.tenant_id == tenant && inside(v.window) && seen.insert(o) {
            let mut route = too_late(w, &v);
            if let Routed::TooLate { on_late_topic, .. } = &mut route {
                *on_late_topic = true;
            }
            found.push(Elsewhere {
                request_id: Some(v.ev.request_id.to_string()),
                window_end: v.window.end,
                partition: p,
                offset: o,
                route,
            });
        }
    }
    for rec in dead {
        let Some(o) = source_offset(rec, input_topic, p).filter(|o| unread(*o)) else {
            continue;
        };
        let as_input = InputRecord {
            offset: o,
            key: rec.key.clone(),
            payload: rec.payload.clone(),
            kafka_ts: None,
        };
        match attribute(cfg, &as_input) {
            (Some(t), Some(w)) if t == tenant && inside(w) && seen.insert(o) => {
                found.push(Elsewhere {
                    request_id: request_id(&cfg.input, &rec.payload),
                    window_end: w.end,
                    partition: p,
                    offset: o,
                    route: Routed::DeadLetter {
                        code: rec.header(headers::ERROR).unwrap_or("").to_string(),
                        detail: rec.header(headers::ERROR_DETAIL).unwrap_or("").to_string(),
                        on_dead_letter_topic: true,
                    },
                });
            }
            (Some(t), None) if t == tenant && seen.insert(o) => {
                r.range.unreadable_dead_letters += 1
            }
            _ => {}
        }
    }
    r.elsewhere.extend(found);
    r.elsewhere.sort_by_key(|e| e.offset);
}

/// The offset of `rec`'s source record when it is `topic`'s partition `p`.
fn source_offset(rec: &StoredRecord, topic: &str, p: i32) -> Option<i64> {
    let mut it = rec.header(headers::SOURCE)?.rsplitn(3, '/');
    let (o, part, t) = (it.next()?, it.next()?, it.next()?);
    (t == topic && part.parse::<i32>().ok()? == p)
        .then(|| o.parse().ok())
        .flatten()
}

fn number(rec: &StoredRecord, header: &str) -> Option<i64> {
    rec.header(header)?.parse().ok()
}

#[cfg(test)]
#[path = "outside_tests.rs"]
mod tests;
