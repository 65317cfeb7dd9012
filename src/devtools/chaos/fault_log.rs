//! What a chaos run's fault loop did and saw (`FaultLog`): each fault and
//! restart with its time, the counts per kind, the recovery times. It is part
//! of the run's report and of the campaign's JSON, so every field added later
//! reads as its default from older reports (`#[serde(default)]`).

use serde::{Deserialize, Serialize};

/// One fault or restart, as it happened.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Event {
    /// Seconds since the generator started.
    pub at_s: f64,
    pub what: String,
}

/// What the fault loop did and saw.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct FaultLog {
    /// Workers SIGKILLed by the loop (those restarted armed included).
    pub kills: usize,
    /// Workers that died at their armed crash point.
    pub crash_point_kills: usize,
    pub zombies: usize,
    /// Sink deaths: SIGKILLs and its crash point.
    pub sink_kills: usize,
    pub pg_restarts: usize,
    /// SIGKILLs of `reprocess-late --follow`.
    #[serde(default)]
    pub reprocess_kills: usize,
    /// Outages of the S3 endpoint (connections reset, then refused for 1–4 s).
    #[serde(default)]
    pub s3_outages: usize,
    /// Workers that exited 4 (checkpoint store unavailable) during an S3 outage
    /// or within 10 s of its end; restarted like any other death.
    #[serde(default)]
    pub s3_exits: usize,
    /// Dev broker down (1–3 s) and slow (responses delayed 200–800 ms, 2–5 s).
    #[serde(default)]
    pub broker_downs: usize,
    #[serde(default)]
    pub broker_slows: usize,
    /// Partition leaderships moved to another broker.
    #[serde(default)]
    pub leader_changes: usize,
    /// Workers, sinks or reprocessors that exited without being killed or reaching a crash point.
    pub unexpected_exits: usize,
    /// Seconds from each worker death until its partitions — and those of the
    /// earlier deaths it superseded — moved on.
    pub recoveries: Vec<f64>,
    /// The same recoveries timed from the first of the deaths they cover: how
    /// long the longest-waiting orphan stalled.
    #[serde(default)]
    pub stalls: Vec<f64>,
    /// Those of `recoveries` that no other fault overlapped (from the death to
    /// the recovery).
    #[serde(default)]
    pub isolated_recoveries: Vec<f64>,
    pub never_recovered: usize,
    /// Worker deaths followed by another before their orphans moved on: the
    /// later death's recovery covers their orphans too.
    #[serde(default)]
    pub superseded: usize,
    /// Workers that did not stop within 60 s of the final SIGTERM (then killed).
    #[serde(default)]
    pub hung_at_stop: usize,
    /// Partitions no live worker had consumed to the end 300 s after the faults
    /// stopped (the final bounded run then drained them).
    #[serde(default)]
    pub undrained_partitions: Vec<i32>,
    pub events: Vec<Event>,
}
