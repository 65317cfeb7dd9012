//! Exit statuses by class, so a supervisor can tell "an operator must act" from
//! "restart me" (the table is in docs/reference/exit-codes.md).
//!
//! The class is read off the error's chain: the first cause whose type says
//! what it is decides. Anything not recognised is `INTERNAL`.

use rdkafka::error::KafkaError;

use super::Interrupted;
use crate::checkpoint::objects::ObjectError;
use crate::checkpoint::CheckpointError;
use crate::config::ConfigError;
use crate::kafka::KafkaIoError;
use crate::sink::SinkError;
use crate::state::StateError;
use crate::worker::WorkerError;

/// An error tally did not classify (a bug, an I/O failure, damage found by
/// `checkpoints verify`).
pub const INTERNAL: u8 = 1;
/// The configuration (file, environment) is wrong; clap's usage errors exit 2 too.
pub const CONFIG: u8 = 2;
/// Refused: restarting changes nothing until an operator takes the way out the
/// message names (a changed config, missing checkpoints, a truncated log, a
/// state.dir in use).
pub const REFUSED: u8 = 3;
/// A dependency (Kafka, PostgreSQL) could not be reached or failed: a restart
/// may succeed once it is back.
pub const UNAVAILABLE: u8 = 4;

/// The exit status for `e`.
pub fn status(e: &anyhow::Error) -> u8 {
    for cause in e.chain() {
        if let Some(i) = cause.downcast_ref::<Interrupted>() {
            return i.exit_status();
        }
        let class = if let Some(e) = cause.downcast_ref::<WorkerError>() {
            worker(e)
        } else if let Some(e) = cause.downcast_ref::<CheckpointError>() {
            checkpoint(e)
        } else if cause.is::<ConfigError>() {
            Some(CONFIG)
        } else if let Some(e) = cause.downcast_ref::<StateError>() {
            state(e)
        } else if let Some(e) = cause.downcast_ref::<KafkaIoError>() {
            Some(kafka_io(e))
        } else if let Some(e) = cause.downcast_ref::<KafkaError>() {
            Some(kafka(e))
        } else if let Some(e) = cause.downcast_ref::<SinkError>() {
            sink(e)
        } else if let Some(e) = cause.downcast_ref::<tokio_postgres::Error>() {
            postgres(e)
        } else {
            None
        };
        if let Some(c) = class {
            return c;
        }
    }
    INTERNAL
}

fn worker(e: &WorkerError) -> Option<u8> {
    match e {
        WorkerError::Config(_) => Some(CONFIG),
        WorkerError::Refused(_) => Some(REFUSED),
        WorkerError::Checkpoint(c) => checkpoint(c),
        WorkerError::State(s) => state(s),
        WorkerError::Kafka(k) => Some(kafka_io(k)),
        WorkerError::Io { .. } => None,
    }
}

fn checkpoint(e: &CheckpointError) -> Option<u8> {
    match e {
        CheckpointError::Refused(_) => Some(REFUSED),
        CheckpointError::State(s) => state(s),
        CheckpointError::Outputs(e) => e.downcast_ref::<KafkaIoError>().map(kafka_io),
        // The object store could not be reached or failed: a restart may help.
        // A local directory that fails (disk full, read-only) is local I/O: 1.
        CheckpointError::Store(ObjectError::Unavailable { .. }) => Some(UNAVAILABLE),
        _ => None,
    }
}

fn state(e: &StateError) -> Option<u8> {
    matches!(e, StateError::Locked { .. }).then_some(REFUSED)
}

fn kafka_io(e: &KafkaIoError) -> u8 {
    match e {
        KafkaIoError::Client { source, .. } => kafka(source),
        KafkaIoError::Fatal(_) | KafkaIoError::Unreachable { .. } => UNAVAILABLE,
    }
}

fn kafka(e: &KafkaError) -> u8 {
    match e {
        // librdkafka refused the properties: a configuration error.
        KafkaError::ClientConfig(..) | KafkaError::ClientCreation(_) => CONFIG,
        _ => UNAVAILABLE,
    }
}

fn sink(e: &SinkError) -> Option<u8> {
    match e {
        SinkError::Postgres(p) => postgres(p),
        SinkError::Kafka(k) => Some(kafka_io(k)),
        SinkError::Url(_) => Some(CONFIG),
        SinkError::Refused(_) => Some(REFUSED),
        _ => None,
    }
}

fn postgres(e: &tokio_postgres::Error) -> Option<u8> {
    match e.code() {
        // No SQLSTATE: the connection itself failed (refused, closed, timed out).
        None => Some(UNAVAILABLE),
        Some(c) => sqlstate(c.code()),
    }
}

/// The class of a PostgreSQL error by its SQLSTATE: what to do about it.
fn sqlstate(code: &str) -> Option<u8> {
    match code.get(..2)? {
        // The server is unreachable, going away or out of resources (disk, memory,
        // connections): a restart may succeed once it is back.
        "08" | "53" | "57" => Some(UNAVAILABLE),
        // Credentials refused (28), no such database (3D), a privilege missing
        // (42501): `sink.database_url` or the role must change.
        "28" | "3D" => Some(CONFIG),
        _ if code == "42501" => Some(CONFIG),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        let refused = anyhow::Error::new(WorkerError::Refused("x".into())).context("run");
        assert_eq!(status(&refused), REFUSED);
        let nested = anyhow::Error::new(WorkerError::Checkpoint(CheckpointError::Refused(
            "fingerprint".into(),
        )));
        assert_eq!(status(&nested), REFUSED);
        let cfg = anyhow::Error::new(ConfigError::Parse("bad".into()));
        assert_eq!(status(&cfg), CONFIG);
        let creation = anyhow::Error::new(KafkaIoError::Client {
            context: "creating".into(),
            source: KafkaError::ClientCreation("unsupported".into()),
        });
        assert_eq!(status(&creation), CONFIG);
        let gone = anyhow::Error::new(KafkaIoError::Fatal("timed out".into()));
        assert_eq!(status(&gone), UNAVAILABLE);
        assert_eq!(status(&anyhow::anyhow!("verify found damage")), INTERNAL);
        let stop = anyhow::Error::new(Interrupted {
            signal: libc::SIGTERM,
            lines: 3,
            input: "in".into(),
        });
        assert_eq!(status(&stop), 143);
    }

    /// Issue 33: PostgreSQL's errors by SQLSTATE class (a wrong password is a
    /// configuration error, a server shutting down is unavailable).
    #[test]
    fn postgres_errors_by_sqlstate() {
        for (code, want) in [
            ("08006", Some(UNAVAILABLE)),
            ("57P01", Some(UNAVAILABLE)),
            ("53300", Some(UNAVAILABLE)),
            ("53100", Some(UNAVAILABLE)),
            ("28P01", Some(CONFIG)),
            ("3D000", Some(CONFIG)),
            ("42501", Some(CONFIG)),
            ("42P01", None),
            ("22021", None),
            ("", None),
        ] {
            assert_eq!(sqlstate(code), want, "{code}");
        }
    }

    /// Issue 33: the checkpoint store's failures by where they happen — the
    /// object store is a dependency (4), the local directory is local I/O (1),
    /// damage found by a restore is a refusal with a way out (3).
    #[test]
    fn checkpoint_store_failures_by_class() {
        let store =
            |e: ObjectError| anyhow::Error::new(WorkerError::Checkpoint(CheckpointError::Store(e)));
        let at = || "s3://b/g/chk-1-w/MANIFEST".to_string();
        assert_eq!(
            status(&store(ObjectError::Unavailable {
                location: at(),
                msg: "500".into()
            })),
            UNAVAILABLE
        );
        assert_eq!(
            status(&store(ObjectError::Io {
                location: "/ckpt/g".into(),
                msg: "No space left on device (os error 28)".into()
            })),
            INTERNAL
        );
        let local = anyhow::Error::new(CheckpointError::Io {
            path: "/ckpt/g".into(),
            source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        });
        assert_eq!(status(&local), INTERNAL);
    }
}
