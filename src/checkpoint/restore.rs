//! The restore decision of one partition, as pure functions of the facts gathered
//! first (docs/DESIGN.md §7.3–7.5):
//!
//! 1. `plan`: which checkpoints to try, best first, or which refusal — from the
//!    checkpoints found (their manifests), the running config's fingerprint, the
//!    partition's log end and the policy. A candidate that resumes past the log
//!    end is damage (no writer checkpoints an offset the log never reached), and
//!    the plan goes on with the next one;
//! 2. the caller loads the first candidate whose parts check out (I/O: the only
//!    step that is not pure), falling back on damage;
//! 3. `decide`: where the partition starts, or which refusal — from what was
//!    restored, the offset the group committed, the partition's log range and
//!    the policy. A gap below the log start is refused, or accepted into the
//!    ledger with `--allow-truncated-log`; for a partition without a checkpoint
//!    whose log starts above 0, `--start-at-log-start` is the one-time choice to
//!    start there (the gap `0..log start`, recorded like any accepted gap, which
//!    every later start restores — so it never accepts a later gap).
//!
//! A manifest or part the store could not *read* (`read_failure`: the object
//! store failing, the local directory failing, a stop request) is neither damage
//! nor absence: the restore stops with that error (exit 4 or 1), so an outage
//! never leads to a fallback, to "no checkpoint" or to `--reset-state` advice.
//!
//! No I/O, no clock (the time of an accepted gap is passed in), no logging: the
//! caller logs what the decision says. Tested table by table.

use super::evolution::{self, Rules, Semantics};
use super::format::Unreadable;
use super::ledger::Gap;
use super::objects::ObjectError;
use super::{Manifest, OffsetLedger, PartitionEntry};
use crate::base::error::{Refusal, RefusalKind};
use crate::model::NextOffset;
use crate::model::Partition;

/// Options for partitions without any checkpoint.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct StartPolicy {
    /// Ignore checkpoints and committed offsets of assigned partitions and rebuild
    /// them from the log start.
    pub reset_state_earliest: bool,
    /// Accept offsets deleted by retention before tally read them (a log start
    /// above a partition's next offset): skip them, log, count and checkpoint the
    /// gap (see `checkpoint::ledger`). Without it such a gap is refused.
    pub allow_truncated_log: bool,
    /// Start a partition that has no checkpoint at its log start when the log no
    /// longer begins at 0: the one-time choice of a new consumer group, recorded
    /// as the gap `0..log start` in the checkpoint. It accepts no later gap.
    pub start_at_log_start: bool,
}

/// One step of a restore plan, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Try<'m> {
    /// Load this checkpoint's entry; on damage, go on with the next step.
    Load {
        name: &'m str,
        entry: &'m PartitionEntry,
        /// The compatible config changes it restores across (`evolution`), to log.
        changes: Vec<String>,
    },
    /// This checkpoint's entry is damage without reading a byte of it (it
    /// resumes past the log end): log it, go on with the next step.
    Skip { name: &'m str, why: String },
    /// Stop here with this refusal.
    Refuse(Refusal),
}

/// How a failed read of a manifest counts: `Ok(reason)` when the object itself
/// is wrong (too large, not a regular file, gone between the listing and the
/// read) — damage, restored around and reported by `verify`; `Err` when the
/// store could not be read — the listing fails with it, and so do the restore,
/// `checkpoints list` and `verify`.
pub(crate) fn read_failure(e: ObjectError) -> Result<Unreadable, ObjectError> {
    if e.is_damage() {
        Ok(Unreadable::Damaged(e.to_string()))
    } else {
        Err(e)
    }
}

/// What the checkpoint store holds for the partition, as listed.
pub(crate) struct Found<'m> {
    /// Complete checkpoints: `(name, manifest)`.
    pub checkpoints: Vec<(&'m str, &'m Manifest)>,
    /// Manifests that could not be read, by reason.
    pub unreadable: Vec<Unreadable>,
}

/// Which checkpoints to try for `p`, best first (greatest next offset, then id),
/// ending at the first written under rules it may not restore under (a refusal:
/// restoring it would mix two sets of rules; `evolution::compare`). A candidate
/// past `log_end` (the partition's log end, when known) is skipped as damage.
/// Empty: no checkpoint holds `p`.
pub(crate) fn plan<'m>(
    p: Partition,
    found: &Found<'m>,
    rules: &Rules,
    policy: StartPolicy,
    log_end: Option<i64>,
) -> Vec<Try<'m>> {
    if policy.reset_state_earliest {
        return Vec::new();
    }
    // Damage is restored around; another format is refused, never skipped.
    if let Some(e) = found
        .unreadable
        .iter()
        .find(|e| matches!(e, Unreadable::OtherFormat(_)))
    {
        return vec![Try::Refuse(Refusal::new(
            RefusalKind::StoreFormat,
            format!("partition {p}: {e}"),
        ))];
    }
    let mut candidates: Vec<(&str, &Manifest, &PartitionEntry)> = found
        .checkpoints
        .iter()
        .filter_map(|(name, m)| Some((*name, *m, m.entry(p)?)))
        .collect();
    candidates.sort_by_key(|(_, m, e)| std::cmp::Reverse((e.next_offset, m.id)));
    let mut steps = Vec::with_capacity(candidates.len());
    for (name, m, entry) in candidates {
        if let Some(end) = log_end.filter(|end| entry.next_offset.0 > *end) {
            steps.push(Try::Skip {
                name,
                why: format!(
                    "checkpoint {name}: partition {p} resumes at offset {}, past the log end {end}: \
                     an offset the log never reached",
                    entry.next_offset.0
                ),
            });
            continue;
        }
        match compatible(m, entry, rules) {
            Ok(changes) => steps.push(Try::Load {
                name,
                entry,
                changes,
            }),
            Err(why) => {
                steps.push(Try::Refuse(Refusal::new(RefusalKind::ConfigChanged, format!(
                    "partition {p}: the newest usable checkpoint {name} was written under another configuration \
                     (fingerprint {} ≠ {}): {why}. Either run with the previous configuration, or re-bill under a \
                     new `job.generation` with a new consumer group (state rebuilt from the log start), or — \
                     knowingly — pass `--reset-state earliest`.",
                    short(&m.fingerprint),
                    short(&rules.fingerprint)
                ))));
                return steps;
            }
        }
    }
    steps
}

/// Whether `m`'s entry may restore under `rules`: the compatible changes, or why
/// not.
fn compatible(m: &Manifest, entry: &PartitionEntry, rules: &Rules) -> Result<Vec<String>, String> {
    if m.fingerprint == rules.fingerprint {
        return Ok(Vec::new());
    }
    const UNKNOWN: &str =
        "window, lateness, bound, time source, idle timeout, dedup horizon, lead limit, \
                           prices or generation changed";
    let Some(now) = &rules.semantics else {
        return Err(UNKNOWN.into());
    };
    match &m.semantics {
        Some(was) => evolution::compare(was, now, entry.high_water, rules.parse_rating),
        None => {
            // Format 4 had no lead limit: the same rules without one?
            let without = Semantics {
                max_lead_ms: None,
                ..now.clone()
            };
            if now.max_lead_ms.is_some() && without.fingerprint() == m.fingerprint {
                Err("`watermark.max_lead` is new (this checkpoint's format 4 had no lead limit); set \
                     `watermark.max_lead = \"off\"` to go on under the rules it was written under"
                    .into())
            } else {
                Err(format!(
                    "{UNKNOWN} (a checkpoint of format {} records no configuration to compare)",
                    m.format
                ))
            }
        }
    }
}

/// The refusal when every candidate of a plan was damaged.
pub(crate) fn none_usable(p: Partition, problems: &[String]) -> Refusal {
    Refusal::new(RefusalKind::NoUsableCheckpoint, format!(
        "partition {p}: checkpoints exist but none is usable ({}). Refusing to start from empty state. \
         Restore the checkpoint store, or rebuild the partition from the log start with \
         `--reset-state earliest`.",
        problems.join("; ")
    ))
}

/// The facts about a partition that the Kafka adapter gathers before it calls the
/// worker (inside the rebalance callback, before the partition's first record).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LogFacts {
    pub partition: Partition,
    /// The log start (first offset kept) and end (next offset to be written).
    pub log_start: i64,
    pub log_end: i64,
    /// The offset the consumer group committed, if any.
    pub committed: Option<i64>,
}

/// Where a partition starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Start {
    pub next: NextOffset,
    /// The ledger at `next` (an accepted gap included).
    pub offsets: OffsetLedger,
    /// A gap accepted under `--allow-truncated-log`, and how it was found.
    pub accepted_gap: Option<(Gap, String)>,
    /// The accepted gap is the partition's first start at its log start
    /// (`--start-at-log-start`), not a gap found later.
    pub onboarded: bool,
    /// Rebuilt from the log start although the group had committed this offset
    /// (`--reset-state earliest`).
    pub rebuilt_over: Option<i64>,
}

/// Where names of the job for messages: the topic, the group and the store.
pub(crate) struct Names<'a> {
    pub topic: &'a str,
    pub group: &'a str,
    pub store: &'a str,
}

/// Where partition `facts.partition` starts, given what was restored
/// (`restored`: its next offset and ledger, or `None`: no checkpoint) — or the
/// refusal, with the way out.
pub(crate) fn decide(
    names: &Names<'_>,
    facts: &LogFacts,
    restored: Option<(NextOffset, OffsetLedger)>,
    policy: StartPolicy,
    now_ms: i64,
) -> Result<Start, Refusal> {
    let (topic, p) = (names.topic, facts.partition);
    let (low, high) = (facts.log_start, facts.log_end);
    let fresh = restored.is_none();
    let mut rebuilt_over = None;
    let (start, mut offsets) = match restored {
        Some((next, offsets)) => (next.0, offsets),
        None => {
            if let Some(o) = facts.committed {
                if !policy.reset_state_earliest {
                    return Err(Refusal::new(RefusalKind::CommittedWithoutCheckpoint, format!(
                        "partition {topic}/{p} has committed offset {o} in consumer group {} but no checkpoint \
                         in {}. Starting from empty state would under-bill (the windows before offset {o} \
                         are lost). Restore the checkpoint store, or rebuild this partition from the log \
                         start with `tally run --reset-state earliest`.",
                        names.group, names.store
                    )));
                }
                rebuilt_over = Some(o);
            }
            (0, OffsetLedger::default())
        }
    };
    if start > high {
        return Err(Refusal::new(RefusalKind::PastLogEnd, format!(
            "partition {topic}/{p}: the checkpoint resumes at offset {start} but the log ends at {high}: the \
             topic was recreated or the broker lost data. Refusing to guess. If the topic was recreated on \
             purpose, start a new consumer group (or rebuild from the log start with `--reset-state \
             earliest`); if the broker lost data, restore the topic first."
        )));
    }
    let mut accepted_gap = None;
    let mut onboarded = false;
    if start < low {
        let gap = Gap {
            from: start,
            to: low,
            at_ms: now_ms,
        };
        let how = if fresh {
            format!(
                "the partition has no checkpoint in {} and its log starts at offset {low}, not 0, so a \
                 replay would bill a partial history (if it had checkpoints, restore that store)",
                names.store
            )
        } else {
            format!("the checkpoint resumes at offset {start} but the log now starts at {low}")
        };
        if fresh && policy.start_at_log_start {
            onboarded = true;
        } else if !policy.allow_truncated_log {
            return Err(if fresh {
                first_start_refusal(topic, p, &gap, &how)
            } else {
                gap_refusal(topic, p, &gap, &how, policy)
            });
        }
        offsets.accept_gap(gap);
        accepted_gap = Some((gap, how));
    }
    Ok(Start {
        next: NextOffset(start.max(low)),
        offsets,
        accepted_gap,
        onboarded,
        rebuilt_over,
    })
}

/// The refusal of a partition's first start (no checkpoint) on a log that no
/// longer begins at 0: both ways to accept it, and what each covers.
fn first_start_refusal(topic: &str, p: Partition, gap: &Gap, how: &str) -> Refusal {
    Refusal::new(RefusalKind::NewGroupOnTruncatedLog, format!(
        "partition {topic}/{p}: {gap} were deleted by the broker (retention.ms, retention.bytes or \
         DeleteRecords) before this consumer group first read them: {how}. Refusing to bill a partial \
         history silently. Either bring the records back (restore the topic from a backup), or choose \
         where billing starts, once: `--start-at-log-start` starts each partition without a checkpoint \
         at its log start — the gap is logged, counted in tally_offsets_gap_total and recorded in the \
         checkpoint, and any later gap is still refused; `--allow-truncated-log` accepts this gap and \
         every later one for as long as it is given."
    ))
}

/// The refusal of a gap of deleted offsets found after a partition's first start
/// (`how`: how it was found).
pub(crate) fn gap_refusal(
    topic: &str,
    p: Partition,
    gap: &Gap,
    how: &str,
    policy: StartPolicy,
) -> Refusal {
    let onboarding = if policy.start_at_log_start {
        " (`--start-at-log-start` does not cover it: it chooses only where a partition without a \
         checkpoint starts.)"
    } else {
        ""
    };
    Refusal::new(RefusalKind::LogTruncated, format!(
        "partition {topic}/{p}: {gap} were deleted by the broker (retention.ms, retention.bytes or \
         DeleteRecords) before tally read them: {how}. None of them is billed, and the last checkpoint \
         is intact, so a plain restart refuses again. Either bring the records back (restore the topic \
         from a backup, then restart), or accept the gap: restart with `--allow-truncated-log` — it \
         is logged, counted in tally_offsets_gap_total and recorded in the checkpoint. Then find out why \
         tally fell behind and raise the topic's retention.{onboarding}"
    ))
}

fn short(h: &str) -> &str {
    &h[..h.len().min(12)]
}

#[cfg(test)]
mod tests;
