//! Exit statuses by class, so a supervisor can tell "an operator must act" from
//! "restart me": `class → status` (`base::error::ErrorClass::exit_status`; the
//! table is in docs/reference/exit-codes.md, tested against `ErrorClass::ALL`).
//!
//! Each error type says its own class (`Classify`, an exhaustive match). The
//! class of an error is that of the first cause in its chain that is one of
//! those types; anything else (a context string alone) is `Internal`.

use std::error::Error;

use rdkafka::error::KafkaError;

use super::Interrupted;
use crate::base::error::{Bug, Classify, ErrorClass, Refusal};
use crate::checkpoint::objects::ObjectError;
use crate::checkpoint::CheckpointError;
use crate::config::ConfigError;
use crate::kafka::KafkaIoError;
use crate::sink::SinkError;
use crate::state::StateError;
use crate::worker::WorkerError;

/// The exit status for `e`.
pub fn status(e: &anyhow::Error) -> u8 {
    for cause in e.chain() {
        if let Some(i) = cause.downcast_ref::<Interrupted>() {
            return i.exit_status();
        }
        if let Some(class) = class_of(cause) {
            return class.exit_status();
        }
    }
    ErrorClass::Internal.exit_status()
}

/// The class of `cause` if its type is one that knows it.
pub fn class_of(cause: &(dyn Error + 'static)) -> Option<ErrorClass> {
    fn own<T: Classify + Error + 'static>(cause: &(dyn Error + 'static)) -> Option<ErrorClass> {
        cause.downcast_ref::<T>().map(Classify::class)
    }
    own::<WorkerError>(cause)
        .or_else(|| own::<CheckpointError>(cause))
        .or_else(|| own::<ConfigError>(cause))
        .or_else(|| own::<StateError>(cause))
        .or_else(|| own::<KafkaIoError>(cause))
        .or_else(|| own::<SinkError>(cause))
        .or_else(|| own::<ObjectError>(cause))
        .or_else(|| own::<Refusal>(cause))
        .or_else(|| own::<Bug>(cause))
        .or_else(|| own::<super::explain::ExplainError>(cause))
        // Foreign types, classified where they are used.
        .or_else(|| {
            cause
                .downcast_ref::<KafkaError>()
                .map(crate::kafka::client_class)
        })
        .or_else(|| {
            cause
                .downcast_ref::<tokio_postgres::Error>()
                .map(crate::sink::postgres_class)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::error::RefusalKind;
    use crate::engine::SpillError;

    const INTERNAL: u8 = 1;
    const CONFIG: u8 = 2;
    const REFUSED: u8 = 3;
    const UNAVAILABLE: u8 = 4;

    fn refusal() -> Refusal {
        Refusal::new(RefusalKind::ConfigChanged, "fingerprint")
    }

    #[test]
    fn classes() {
        let refused = anyhow::Error::new(WorkerError::Refused(refusal())).context("run");
        assert_eq!(status(&refused), REFUSED);
        let nested =
            anyhow::Error::new(WorkerError::Checkpoint(CheckpointError::Refused(refusal())));
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

    /// Issue 35: the errors the code once turned into refusals (3) by carrying
    /// them as strings: a Kafka failure inside the rebalance callback, a producer
    /// flush failing at a checkpoint barrier (timed or hand-over: the same port),
    /// a state store read failing under a spill, a thread's panic.
    #[test]
    fn errors_keep_their_class_across_the_rebalance_flush_and_spill_paths() {
        let kafka = || KafkaIoError::Client {
            context: "reading the log range of requests/0".into(),
            source: KafkaError::MetadataFetch(
                rdkafka::types::RDKafkaErrorCode::BrokerTransportFailure,
            ),
        };
        let in_rebalance = anyhow::Error::new(WorkerError::Kafka(kafka()));
        assert_eq!(status(&in_rebalance), UNAVAILABLE);
        let flush = anyhow::Error::new(WorkerError::Checkpoint(CheckpointError::Outputs(
            Box::new(kafka()),
        )));
        assert_eq!(status(&flush), UNAVAILABLE);
        let file_flush = anyhow::Error::new(CheckpointError::Outputs(Box::new(WorkerError::Io {
            path: "out.jsonl".into(),
            source: std::io::Error::from(std::io::ErrorKind::StorageFull),
        })));
        assert_eq!(status(&file_flush), INTERNAL);
        let spill = anyhow::Error::new(WorkerError::Spill(SpillError {
            doing: "reading spilled windows ending 60000".into(),
            msg: "IO error".into(),
        }));
        assert_eq!(status(&spill), INTERNAL);
        let poisoned = anyhow::Error::new(WorkerError::from(Bug::poisoned("worker state")));
        assert_eq!(status(&poisoned), INTERNAL);
        let panicked = anyhow::Error::new(CheckpointError::Bug(Bug("an upload thread".into())));
        assert_eq!(status(&panicked), INTERNAL);
        let locked = anyhow::Error::new(StateError::Locked { path: "s".into() });
        assert_eq!(status(&locked), REFUSED);
    }

    /// Issue 33: PostgreSQL's errors by SQLSTATE class (a wrong password is a
    /// configuration error, a server shutting down is unavailable).
    #[test]
    fn postgres_errors_by_sqlstate() {
        for (code, want) in [
            ("08006", UNAVAILABLE),
            ("57P01", UNAVAILABLE),
            ("53300", UNAVAILABLE),
            ("53100", UNAVAILABLE),
            ("28P01", CONFIG),
            ("3D000", CONFIG),
            ("42501", CONFIG),
            ("42P01", INTERNAL),
            ("22021", INTERNAL),
            ("", INTERNAL),
        ] {
            assert_eq!(
                crate::sink::sqlstate_class(code).exit_status(),
                want,
                "{code}"
            );
        }
    }

    /// Issue 33: the checkpoint store's failures by where they happen — the
    /// object store is a dependency (4), the local directory is local I/O (1).
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

    /// Every refusal kind's way out is a section of docs/operations/refusals.md.
    #[test]
    fn every_refusal_names_a_section_of_the_refusals_page() {
        let doc = include_str!("../../docs/operations/refusals.md");
        let anchors: Vec<String> = doc
            .lines()
            .filter_map(|l| {
                l.trim_start_matches('#')
                    .strip_prefix(' ')
                    .filter(|_| l.starts_with('#'))
            })
            .map(|h| {
                h.to_lowercase()
                    .chars()
                    .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-')
                    .map(|c| if c == ' ' { '-' } else { c })
                    .collect()
            })
            .collect();
        for kind in RefusalKind::ALL {
            let anchor = kind.doc().strip_prefix("refusals.md#").unwrap();
            assert!(
                anchors.iter().any(|a| a == anchor),
                "{kind:?}: #{anchor} not in {anchors:?}"
            );
        }
    }
}
