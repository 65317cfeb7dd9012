//! The partitions' one port to the world: where what applying records produces
//! goes — results (panes), progress records, too-late records, dead letters — and
//! the flush that makes them durable (step 2 of a checkpoint, docs/DESIGN.md §7.2).
//! A Kafka worker produces them to its topics (`worker::kafka::outputs`), a file run
//! writes them to its output and side files (`worker::file::outputs`), a test
//! records them.
//!
//! Invariants:
//! - Calls come in the order the engine decided them; an implementation keeps that
//!   order per destination (results and progress records share one).
//! - After `flush` returns `Ok`, everything handed over before it is durable (Kafka:
//!   acknowledged; files: written to the operating system). A failed flush fails the
//!   checkpoint: nothing after it is committed.

use crate::checkpoint::coordinator::{OffsetCommitter, Ports};
use crate::checkpoint::{CheckpointError, CheckpointId};
use crate::engine::{ProgressRecord, ResultRecord};
use crate::model::{DeadLetterReason, Partition};
use crate::state::NextOffset;
use crate::worker::WorkerError;

/// One input record as an output carries it on: its coordinates and its bytes,
/// exactly as read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Record<'a> {
    pub partition: Partition,
    /// Its offset (a file run: its line number − 1).
    pub offset: i64,
    pub key: Option<&'a [u8]>,
    pub payload: &'a [u8],
    pub kafka_ts: Option<i64>,
    /// For a record longer than `limits.max_record_bytes` that was read as a
    /// prefix (the file run), its true length.
    pub true_len: Option<u64>,
}

/// Where applied records' outputs go.
pub(crate) trait Outputs {
    /// A pane.
    fn result(&mut self, r: &ResultRecord) -> Result<(), WorkerError>;
    /// A progress record (finality), after the panes it covers.
    fn progress(&mut self, r: &ProgressRecord) -> Result<(), WorkerError>;
    /// A record too late for its window.
    fn late(&mut self, r: &Record<'_>, window_end: i64, watermark: i64) -> Result<(), WorkerError>;
    /// A record that cannot be billed; `nth` counts the partition's dead letters,
    /// this one included (an implementation may log the first few).
    fn dead_letter(
        &mut self,
        r: &Record<'_>,
        reason: &DeadLetterReason,
        nth: u64,
    ) -> Result<(), WorkerError>;
    /// Waits until everything handed over is durable; fails if anything was lost.
    fn flush(&mut self) -> Result<(), WorkerError>;
}

/// A checkpoint's offsets go nowhere (the file run has no consumer group).
pub(crate) struct NoGroup;

impl OffsetCommitter for NoGroup {
    fn commit(&mut self, _: CheckpointId, _: &[(Partition, NextOffset)]) {}
}

/// The coordinator's ports over an `Outputs` and a committer. A flush's error is
/// given back as it was: a producer's as the coordinator's own
/// (`CheckpointError::Outputs`), any other (a file's, naming it) kept aside and
/// returned instead of the coordinator's (`error`), which knows only that step 2
/// failed.
pub(crate) struct OutputPorts<'a, O: ?Sized> {
    outputs: &'a mut O,
    committer: &'a mut dyn OffsetCommitter,
    failed: Option<WorkerError>,
}

impl<'a, O: Outputs + ?Sized> OutputPorts<'a, O> {
    pub(crate) fn new(outputs: &'a mut O, committer: &'a mut dyn OffsetCommitter) -> Self {
        Self {
            outputs,
            committer,
            failed: None,
        }
    }

    /// The error of a step: the flush's own when it was the flush that failed.
    pub(crate) fn error(&mut self, e: CheckpointError) -> WorkerError {
        self.failed.take().unwrap_or(WorkerError::Checkpoint(e))
    }
}

impl<O: Outputs + ?Sized> Ports for OutputPorts<'_, O> {
    fn flush_outputs(&mut self) -> Result<(), CheckpointError> {
        match self.outputs.flush() {
            Ok(()) => Ok(()),
            Err(WorkerError::Kafka(k)) => Err(CheckpointError::Outputs(Box::new(k))),
            Err(e) => {
                let why = CheckpointError::Io {
                    path: "the run's outputs".into(),
                    source: std::io::Error::other(e.to_string()),
                };
                self.failed = Some(e);
                Err(why)
            }
        }
    }

    fn commit_offsets(&mut self, id: CheckpointId, offsets: &[(Partition, NextOffset)]) {
        self.committer.commit(id, offsets);
    }
}
