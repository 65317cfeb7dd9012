//! A chaos run's plan: its topic layout, workers, checkpoint store, group
//! protocol, static membership, session timeout, timings and fault mix. A single
//! `tally-dev chaos` run builds one from its flags; a campaign draws one per run
//! from that run's seed (`Plan::draw`), and `tally-dev chaos --replay <seed>` draws
//! the same plan again.
//!
//! Invariant: `Plan::draw(seed, s3, pg_restarts)` is a pure function of its arguments (the
//! campaign's replay command rests on it), and every plan it draws is valid
//! (`min <= max`, at least one worker and one partition).

use serde::{Deserialize, Serialize};

use crate::gen::Rng;

/// The group protocols a worker can run: classic eager (tally's default),
/// classic cooperative-sticky, KIP-848 `consumer`.
pub const PROTOCOLS: [&str; 3] = ["classic", "cooperative-sticky", "consumer"];

/// The worker crash points (`TALLY_CRASH_AT`) a crash fault arms, from every
/// step of the checkpoint protocol, the upload, the rebalance callbacks and the
/// apply loop.
pub const WORKER_CRASH_POINTS: [&str; 9] = [
    "before_barrier",
    "after_flush",
    "after_manifest",
    "after_offset_commit",
    "mid_upload",
    "before_manifest",
    "rebalance_assign",
    "rebalance_revoke",
    "mid_pane_burst",
];

/// The sink's crash point.
pub const SINK_CRASH_POINT: &str = "sink_before_commit";

/// How a fault event's kind is drawn: each share in per mille; SIGKILL of a
/// worker takes what the others leave.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultMix {
    /// SIGKILL of a worker that is restarted armed at a crash point, where it
    /// then dies by itself.
    pub crash_point: u32,
    /// SIGSTOP of a worker past the session timeout, then SIGCONT (a zombie).
    pub zombie: u32,
    /// SIGKILL of the sink (half of them restart it armed at its crash point).
    pub sink: u32,
    /// `scripts/pg.sh restart` of the PostgreSQL cluster (only with `--pg-dir`).
    pub pg_restart: u32,
    /// SIGKILL of `tally reprocess-late --follow`, restarted from its group's
    /// position (only in plans that run it).
    #[serde(default)]
    pub reprocess_kill: u32,
    /// An outage of the S3 endpoint: every connection to it reset and new ones
    /// refused for 1–4 s, as when the server is killed and restarted (only in
    /// plans that keep checkpoints on S3).
    #[serde(default)]
    pub s3_outage: u32,
    /// The dev broker down for 1–3 s: every connection dropped, new ones refused
    /// (its logs, offsets and groups stay).
    #[serde(default)]
    pub broker_down: u32,
    /// The dev broker slow for 2–5 s: every response delayed by 200–800 ms.
    #[serde(default)]
    pub broker_slow: u32,
    /// The leadership of one partition (of the input or the results topic)
    /// moved to another of the dev broker's brokers.
    #[serde(default)]
    pub leader_change: u32,
}

impl FaultMix {
    /// The shares of every kind but the plain worker SIGKILL, which takes the
    /// rest.
    pub fn total(&self) -> u32 {
        self.pg_restart
            + self.sink
            + self.reprocess_kill
            + self.s3_outage
            + self.broker_down
            + self.broker_slow
            + self.leader_change
            + self.zombie
            + self.crash_point
    }
}

/// A fault's kind, as `FaultMix::kind` draws it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    PgRestart,
    SinkKill,
    ReprocessKill,
    S3Outage,
    BrokerDown,
    BrokerSlow,
    LeaderChange,
    Zombie,
    /// A worker SIGKILLed and restarted armed at a crash point.
    CrashPoint,
    /// A worker SIGKILLed and restarted.
    Kill,
}

impl FaultKind {
    /// Whether the fault hits a worker (and so the group): these wait until
    /// every earlier worker death has recovered.
    pub fn hits_a_worker(self) -> bool {
        matches!(
            self,
            FaultKind::Zombie | FaultKind::CrashPoint | FaultKind::Kill
        )
    }
}

impl FaultMix {
    /// The kind that `x` (drawn below 1000) picks; `pg`: PostgreSQL restarts can
    /// be drawn. Worker faults take the first ranges after PostgreSQL and the
    /// sink, the others are tested apart from them, so that a plan without the
    /// later kinds draws what earlier builds drew.
    pub fn kind(&self, x: u32, pg: bool) -> FaultKind {
        let pg = if pg { self.pg_restart } else { 0 };
        let sink = pg + self.sink;
        let zombie = sink + self.zombie;
        let worker_faults = zombie + self.crash_point;
        let reprocess = worker_faults + self.reprocess_kill;
        let s3 = reprocess + self.s3_outage;
        let down = s3 + self.broker_down;
        let slow = down + self.broker_slow;
        let leader = slow + self.leader_change;
        match x {
            x if x < pg => FaultKind::PgRestart,
            x if x < sink => FaultKind::SinkKill,
            x if (worker_faults..reprocess).contains(&x) => FaultKind::ReprocessKill,
            x if (reprocess..s3).contains(&x) => FaultKind::S3Outage,
            x if (s3..down).contains(&x) => FaultKind::BrokerDown,
            x if (down..slow).contains(&x) => FaultKind::BrokerSlow,
            x if (slow..leader).contains(&x) => FaultKind::LeaderChange,
            x if x < zombie => FaultKind::Zombie,
            x if x < worker_faults => FaultKind::CrashPoint,
            _ => FaultKind::Kill,
        }
    }
}

/// One run's plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// Seeds the generator and the fault schedule.
    pub seed: u64,
    pub workers: usize,
    pub partitions: i32,
    /// How long the generator produces.
    pub duration_ms: u64,
    /// Generated records per second.
    pub rate: u64,
    pub kill_min_ms: u64,
    pub kill_max_ms: u64,
    pub restart_min_ms: u64,
    pub restart_max_ms: u64,
    /// One of `PROTOCOLS`.
    pub group_protocol: String,
    /// Each worker runs with `group.instance.id = chaos-w<i>`.
    pub static_membership: bool,
    /// `local` or `s3`.
    pub store: String,
    /// The group session timeout (classic: the consumer's `session.timeout.ms`;
    /// KIP-848: the dev broker's `--group-session-timeout`).
    pub session_timeout_ms: u64,
    pub faults: FaultMix,
    /// `tally reprocess-late --follow` runs beside the workers, and the end
    /// checks add the too-late events' adjustments (each billed once).
    #[serde(default)]
    pub reprocess_late: bool,
}

impl Plan {
    /// The plan of a campaign run with `seed`. `s3` says whether an S3 server is
    /// there to draw; `pg_restarts` whether PostgreSQL restarts may be drawn.
    pub fn draw(seed: u64, s3: bool, pg_restarts: bool) -> Plan {
        // The plan's own stream, apart from the run's (which `seed` also seeds).
        let mut r = Rng::new(seed ^ 0x05EE_D0FC_4A05);
        let mut between = |lo: u64, hi: u64| lo + r.below(hi - lo + 1);
        let partitions = between(1, 16) as i32;
        let workers = between(1, 4) as usize;
        let protocol = PROTOCOLS[between(0, 2) as usize].to_string();
        // The dev broker implements static membership only for KIP-848 groups
        // (docs/operations/scale-out.md#static-membership).
        let static_membership = between(0, 1) == 1 && protocol == "consumer";
        let store = if s3 && between(0, 1) == 1 {
            "s3"
        } else {
            "local"
        };
        let duration_ms = between(20, 40) * 1000;
        let rate = between(200, 600);
        let kill_min_ms = between(800, 1500);
        let kill_max_ms = kill_min_ms + between(500, 2000);
        let restart_min_ms = between(100, 500);
        let restart_max_ms = restart_min_ms + between(0, 1500);
        // Classic groups (the worker's session.timeout.ms): 2 s, since the dev
        // broker holds each classic join phase for the session timeout less 1 s,
        // and a kill can take two or three of them; KIP-848 groups (the
        // broker's): 3 s. Not drawn.
        let session_timeout_ms = if protocol == "consumer" { 3000 } else { 2000 };
        // Drawn last, so the fields above stay what earlier builds drew.
        let reprocess_late = between(0, 1) == 1;
        Plan {
            seed,
            workers,
            partitions,
            duration_ms,
            rate,
            kill_min_ms,
            kill_max_ms,
            restart_min_ms,
            restart_max_ms,
            group_protocol: protocol,
            static_membership,
            store: store.to_string(),
            session_timeout_ms,
            faults: FaultMix {
                crash_point: 200,
                zombie: 80,
                sink: 120,
                pg_restart: if pg_restarts { 20 } else { 0 },
                reprocess_kill: if reprocess_late { 60 } else { 0 },
                s3_outage: if store == "s3" { 40 } else { 0 },
                // Not drawn: a broker down while a classic group syncs aborts
                // librdkafka 2.12.1's mock (`rd_kafka_mock_cgrp_classic_member_sync_set:
                // Assertion !member->resp`), which ends the run, not the test of tally.
                broker_down: 0,
                broker_slow: 40,
                leader_change: 40,
            },
            reprocess_late,
        }
    }

    /// One line for people: the run's seed, layout, protocol, store and faults.
    pub fn describe(&self, records: u64) -> String {
        format!(
            "seed {}, {} workers, {} partitions, {records} records at {}/s, {} ({}), store {}, \
             faults every {}–{} ms{}",
            self.seed,
            self.workers,
            self.partitions,
            self.rate,
            self.group_protocol,
            if self.static_membership {
                "static"
            } else {
                "dynamic"
            },
            self.store,
            self.kill_min_ms,
            self.kill_max_ms,
            if self.reprocess_late {
                ", reprocess-late --follow"
            } else {
                ""
            }
        )
    }

    /// The recovery target: p99 at most the session timeout plus 5 s.
    pub fn recovery_target_s(&self) -> f64 {
        self.session_timeout_ms as f64 / 1000.0 + 5.0
    }

    /// The recovery class a run's kills are counted under in a campaign report.
    pub fn class(&self) -> String {
        format!(
            "{} / {} / {}",
            self.group_protocol,
            self.store,
            if self.static_membership {
                "static"
            } else {
                "dynamic"
            }
        )
    }

    /// The `[kafka]` properties of the group protocol and the session timeout.
    pub fn kafka_properties(&self) -> String {
        let t = self.session_timeout_ms;
        let classic = format!(
            "\"session.timeout.ms\" = \"{t}\"\n\"heartbeat.interval.ms\" = \"{}\"\n",
            (t / 6).max(100)
        );
        match self.group_protocol.as_str() {
            "consumer" => "\"group.protocol\" = \"consumer\"\n".to_string(),
            "cooperative-sticky" => {
                classic + "\"partition.assignment.strategy\" = \"cooperative-sticky\"\n"
            }
            _ => classic,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{FaultKind, Plan};

    /// Every kind gets exactly its share of the 1000 draws, and the worker
    /// kinds keep the ranges right after PostgreSQL and the sink.
    #[test]
    fn each_kind_gets_its_share() {
        let plan = Plan::draw(7, true, true);
        let f = plan.faults;
        let count =
            |k: FaultKind, pg: bool| (0..1000).filter(|x| f.kind(*x, pg) == k).count() as u32;
        assert_eq!(count(FaultKind::PgRestart, true), f.pg_restart);
        assert_eq!(count(FaultKind::PgRestart, false), 0);
        assert_eq!(count(FaultKind::SinkKill, true), f.sink);
        assert_eq!(count(FaultKind::Zombie, true), f.zombie);
        assert_eq!(count(FaultKind::CrashPoint, true), f.crash_point);
        assert_eq!(count(FaultKind::ReprocessKill, true), f.reprocess_kill);
        assert_eq!(count(FaultKind::S3Outage, true), f.s3_outage);
        assert_eq!(count(FaultKind::BrokerDown, true), f.broker_down);
        assert_eq!(count(FaultKind::BrokerSlow, true), f.broker_slow);
        assert_eq!(count(FaultKind::LeaderChange, true), f.leader_change);
        assert_eq!(count(FaultKind::Kill, true), 1000 - f.total());
        let first_worker = f.pg_restart + f.sink;
        assert_eq!(f.kind(first_worker, true), FaultKind::Zombie);
        assert!(f.kind(first_worker + f.zombie, true).hits_a_worker());
        assert!(!f.kind(first_worker - 1, true).hits_a_worker());
    }
}
