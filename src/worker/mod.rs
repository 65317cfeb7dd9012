//! `tally run`: the worker. `kafka` runs it against a consumer group; `file` runs
//! the same engine over JSON lines (backfills, benchmarks).

pub mod clock;
pub mod file;
pub mod kafka;
pub mod lag;
pub mod partitions;
pub mod report;
pub mod shutdown;

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
