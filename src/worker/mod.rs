//! `tally run`: the worker. One unit, `partitions`, applies records to the
//! partitions a worker owns and sends what they produce through its one port,
//! `Outputs`; two drivers are short loops around it: `kafka` against a consumer
//! group (the producer as its outputs), `file` over JSON lines (backfills,
//! benchmarks; the output and side files as its outputs).

pub mod file;
pub mod kafka;
pub mod lag;
pub mod partitions;
pub mod rebalance;
pub mod report;

use crate::base::error::{Bug, Classify, ErrorClass, Refusal};
use crate::config::ConfigError;
use crate::kafka::KafkaIoError;
use crate::state::StateError;

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Kafka(#[from] KafkaIoError),
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    /// A refusal to start or continue, with the way out.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// A thread panicked or a lock was poisoned by one.
    #[error(transparent)]
    Bug(#[from] Bug),
    /// An evicted window or a cold dedup id could not be read back (or ids not
    /// moved out): the partition's output since is void.
    #[error(transparent)]
    Spill(#[from] crate::engine::SpillError),
}

impl Classify for WorkerError {
    fn class(&self) -> ErrorClass {
        match self {
            WorkerError::Config(e) => e.class(),
            WorkerError::Kafka(e) => e.class(),
            WorkerError::State(e) => e.class(),
            WorkerError::Checkpoint(e) => e.class(),
            WorkerError::Refused(e) => e.class(),
            WorkerError::Bug(e) => e.class(),
            // Local I/O: a file, a thread that could not start; the state store
            // failing under a spill.
            WorkerError::Io { .. } | WorkerError::Spill(_) => ErrorClass::Internal,
        }
    }
}

/// Creates `state.dir` (and its parents), saying plainly when the path is taken
/// by something that is not a directory.
pub(crate) fn create_state_dir(dir: &std::path::Path) -> Result<(), WorkerError> {
    if dir.exists() && !dir.is_dir() {
        return Err(Refusal::setup(format!(
            "state.dir {} exists and is not a directory; point `state.dir` (or \
             TALLY_STATE__DIR) at a directory",
            dir.display()
        ))
        .into());
    }
    std::fs::create_dir_all(dir).map_err(|source| WorkerError::Io {
        path: format!("state.dir {}", dir.display()),
        source,
    })
}
