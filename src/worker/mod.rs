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
    /// A refusal to start or continue, with the way out in the message.
    #[error("{0}")]
    Refused(String),
}

/// Creates `state.dir` (and its parents), saying plainly when the path is taken
/// by something that is not a directory.
pub fn create_state_dir(dir: &std::path::Path) -> Result<(), WorkerError> {
    if dir.exists() && !dir.is_dir() {
        return Err(WorkerError::Refused(format!(
            "state.dir {} exists and is not a directory; point `state.dir` (or \
             TALLY_STATE__DIR) at a directory",
            dir.display()
        )));
    }
    std::fs::create_dir_all(dir).map_err(|source| WorkerError::Io {
        path: format!("state.dir {}", dir.display()),
        source,
    })
}
