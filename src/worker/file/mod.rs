//! `tally run --input-file … --output-file …`: the engine over JSON lines, no Kafka.
//!
//! The input is one partition (0) in file order. The output holds one result
//! payload per line, exactly as on the results topic. Too-late records and dead
//! letters go to `<output>.late.jsonl` and `<output>.dlq.jsonl` (one JSON object per
//! line with the reason and the original record bytes, exactly: `side`), so nothing
//! is dropped silently. End of file is end of input: every open window emits its
//! on-time pane. Lines are records as `lines` defines them: bounded by
//! `limits.max_record_bytes` (an oversized one is routed on its first `limit + 1`
//! bytes, and its dead letter gets the first `limit` and the true length), without a
//! byte-order mark opening the file.
//!
//! Nothing is opened for writing, and the working copy is not wiped, before
//! `paths::check` has made sure no output is the input and no two outputs are one file,
//! nor before a configuration that cannot work over a file is refused
//! (`watermark.time_source = "kafka_timestamp"`: a line has no Kafka timestamp).
//!
//! A file named `*.gz` or `*.zst` is decompressed as it is read (`decode`). Progress
//! (lines, bytes of the file, rate, ETA against its size) is a bar on a terminal
//! and an `input progress` log line every 5 s otherwise.
//!
//! A stop request (SIGTERM, SIGINT) interrupts the reads (`source`, also one that
//! waits on a FIFO); the lines read so far are applied, the outputs flushed and the
//! state checkpointed at the last line read, and `run` returns it as `interrupted`:
//! the end-of-input panes are not emitted, the input did not end.
//!
//! Two threads share the work (`reader`): a reading thread reads the lines and puts
//! them through step 1 of the rules (parse, validate, price, fingerprint) a chunk
//! at a time, while this thread applies the chunk before (dedup, windows, panes, side
//! files, checkpoints) in file order; so every decision, and every output byte, is
//! what one thread would make. When the process may run on one CPU only, this
//! thread reads and prepares each chunk itself (`base::cpus::Pipeline::Inline`):
//! two threads on one CPU only take turns, and the hand-over costs.
//!
//! The hot path is the worker's: every `checkpoint.interval` the outputs are
//! flushed, the task's changes are committed to the RocksDB state store in one
//! batch, and a checkpoint (offset = lines read) is exported on a background thread
//! into the store `<checkpoint.dir>/file-<input stem>` (never a Kafka job's store).
//! A file run always starts from the first line with empty state; the end-of-input
//! panes are not checkpointed (as with `--until-end`).
//!
//! Under `state.memory_budget`, windows beyond it are evicted after each commit
//! (down to `spill::keep_of` the budget); when the windows in memory pass the
//! budget between checkpoints, the run spills (commits to RocksDB without
//! exporting) and evicts.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod checkpointer;
mod decode;
mod lines;
mod outputs;
mod paths;
mod reader;
mod side;
mod source;

use checkpointer::{group, Checkpointer};
use lines::Lines;
use outputs::SideFiles;
use paths::Paths;
use reader::{End, Reader};
use source::Source;

use super::partitions::{Outputs, Partitions, Settings, Start};
use super::WorkerError;
use crate::base::cpus::Pipeline;
use crate::base::shutdown;
use crate::checkpoint::OffsetLedger;
use crate::config::Config;
use crate::engine::{Counters, EngineConfig, PartitionTask, TimeSource};
use crate::kafka::now_ms;
use crate::kafka::source::StartPolicy;
use crate::model::Partition;
use crate::state::NextOffset;

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> WorkerError + '_ {
    move |source| WorkerError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Configurations that cannot work over a file, refused before anything is touched.
fn refuse_config(cfg: &Config) -> Result<(), WorkerError> {
    if cfg.watermark.time_source == TimeSource::KafkaTimestamp {
        return Err(WorkerError::Config(crate::config::ConfigError::Invalid {
            key: "watermark.time_source".into(),
            msg: "\"kafka_timestamp\" cannot be used with --input-file: a line of a file has \
                  no Kafka timestamp, so every record would be a dead letter (no_timestamp). Set \
                  it to \"completed_ts\" (the default, the one fit for billing) or run against Kafka"
                .into(),
        }));
    }
    Ok(())
}

/// How a file run ended.
#[derive(Debug, Clone)]
pub(crate) struct FileRun {
    pub counters: Counters,
    /// Lines read and applied (the offset of the last checkpoint).
    pub lines: u64,
    /// `Some(signal)` when a stop request (SIGTERM, SIGINT) ended the run before the
    /// end of the input: the outputs are flushed and the state is checkpointed at
    /// `lines`, and windows still open were not emitted. `None`: end of input.
    pub interrupted: Option<i32>,
}

pub(crate) fn run(cfg: &Config, input: &Path, output: &Path) -> Result<FileRun, WorkerError> {
    let mut driver = Driver::open(cfg, input, output)?;
    let stopped = loop {
        if let Some(stopped) = driver.step()? {
            break stopped;
        }
    };
    driver.close(stopped)
}

/// The file loop around the partitions: the reading thread, the checkpoints, the
/// progress.
struct Driver {
    // Dropped in this order: the reading thread first, as when the loop was one
    // function.
    reader: Reader,
    parts: Partitions<SideFiles>,
    checkpointer: Checkpointer,
    progress: crate::progress::Progress,
    input: PathBuf,
    engine: Arc<EngineConfig>,
    /// Every record's ingest time: the run's start.
    now: i64,
    interval: Duration,
    last_checkpoint: Instant,
    /// Lines and bytes read and applied so far.
    line_no: u64,
    bytes: u64,
    /// The line count at which the clock and the progress are looked at next.
    next_check: u64,
}

impl Driver {
    /// Checks the paths and the configuration, then opens the input, the outputs
    /// and the working copy, and starts the reading thread.
    fn open(cfg: &Config, input: &Path, output: &Path) -> Result<Self, WorkerError> {
        refuse_config(cfg)?;
        let engine = cfg.engine()?;
        // Before anything is opened for writing or wiped.
        let paths = Paths::new(input, output);
        let state_copy = cfg.state.dir.join("rocksdb");
        let store = cfg.checkpoint.dir.join(group(input));
        paths.check(&[&state_copy, &store])?;
        let limit = engine.max_record_bytes;
        let source = Source::open(input, shutdown::requested).map_err(io_err(input))?;
        let size = std::fs::metadata(input)
            .ok()
            .filter(|m| m.is_file())
            .map(|m| m.len());
        let (decoded, bytes_read) =
            decode::open(source, decode::Compression::of(input)).map_err(io_err(input))?;
        let progress = crate::progress::Progress::new("input", None, size);
        let checkpointer = Checkpointer::open(cfg, input)?;
        let outputs = SideFiles::create(input, output, &paths.late, &paths.dlq, limit)?;
        let parts = partitions(cfg, input, &engine, &checkpointer, outputs);
        let now = now_ms();
        let pipeline = Pipeline::for_this_process();
        tracing::info!(
            input = %input.display(),
            cpus = crate::base::cpus::available(),
            step1 = pipeline.name(),
            "reading input"
        );
        let lines = Lines::new(decoded, limit);
        let reader = Reader::start(
            lines,
            bytes_read,
            engine.clone(),
            now,
            input.display().to_string(),
            pipeline,
        )
        .map_err(io_err(input))?;
        Ok(Self {
            input: input.to_owned(),
            engine,
            parts,
            checkpointer,
            reader,
            progress,
            now,
            interval: Duration::from_millis(cfg.checkpoint.interval.0 as u64),
            last_checkpoint: Instant::now(),
            line_no: 0,
            bytes: 0,
            next_check: 4096,
        })
    }

    /// Applies the next chunk; `Some(stopped)` once the input ended (`stopped`: by
    /// a stop request).
    fn step(&mut self) -> Result<Option<bool>, WorkerError> {
        // Every 4096 lines, between chunks: reading the clock per line would show.
        if self.line_no >= self.next_check {
            self.next_check = self.line_no + 4096;
            self.progress.show(self.line_no, Some(self.bytes), false);
            // Lines so far are applied: the offset of a checkpoint here.
            if self.last_checkpoint.elapsed() >= self.interval {
                self.checkpointer.checkpoint(&mut self.parts)?;
                self.last_checkpoint = Instant::now();
            }
        }
        let mut chunk = self.reader.next();
        // A window end firing in steps stops the chunk: spill between steps.
        while !self.parts.apply(&chunk, &self.engine, self.now)? {
            if self.parts.spill_due() {
                self.checkpointer.spill(&mut self.parts)?;
            }
        }
        // Lines with no record after the chunk's last record are passed.
        self.parts
            .pass(Partition(0), 0, chunk.line_no as i64, Some(0))?;
        if self.parts.spill_due() {
            self.checkpointer.spill(&mut self.parts)?;
        }
        (self.line_no, self.bytes) = (chunk.line_no, chunk.bytes_read);
        match chunk.end.take() {
            None => {
                self.reader.recycle(chunk);
                Ok(None)
            }
            Some(End::Eof) => Ok(Some(false)),
            // A stop request: the lines read so far are applied; stop there.
            Some(End::Stopped) => Ok(Some(true)),
            Some(End::Failed(e)) => Err(io_err(&self.input)(e)),
        }
    }

    /// The last checkpoint; at the end of the input (not after a stop request)
    /// every open window's panes, and the outputs flushed.
    fn close(mut self, stopped: bool) -> Result<FileRun, WorkerError> {
        let (parts, checkpointer, line_no) =
            (&mut self.parts, &mut self.checkpointer, self.line_no);
        self.progress.show(line_no, Some(self.bytes), true);
        checkpointer.checkpoint(parts)?;
        checkpointer.finish(parts)?;
        if stopped {
            tracing::info!(
                lines = line_no,
                checkpoints = checkpointer.taken,
                "stop requested; outputs flushed and state committed at the last line read"
            );
            return Ok(FileRun {
                counters: parts.audit(),
                lines: line_no,
                interrupted: Some(shutdown::signal().unwrap_or(libc::SIGTERM)),
            });
        }
        let reports = parts.reports(|_| None);
        let sum =
            |f: fn(&crate::metrics::PartitionReport) -> u64| reports.iter().map(f).sum::<u64>();
        tracing::info!(
            checkpoints = checkpointer.taken,
            windows_evicted = parts.evicted(),
            windows_spilled = sum(|r| r.spilled_windows as u64),
            dedup_ids_moved_out = sum(|r| r.dedup_cold_ids),
            dedup_cold_reads = sum(|r| r.dedup_cold_reads),
            "input read; state committed"
        );
        parts.end_of_input()?;
        parts.outputs_mut().flush()?;
        Ok(FileRun {
            counters: parts.audit(),
            lines: line_no,
            interrupted: None,
        })
    }
}

/// The run's one partition (0), from the first line with empty state, its task
/// spilling to the checkpointer's working copy.
fn partitions(
    cfg: &Config,
    input: &Path,
    engine: &Arc<EngineConfig>,
    checkpointer: &Checkpointer,
    outputs: SideFiles,
) -> Partitions<SideFiles> {
    let settings = Settings {
        engine: engine.clone(),
        topic: format!("file:{}", input.display()),
        policy: StartPolicy::default(),
        bounded: false,
        idle_ms: None,
        memory_budget: cfg.state.memory_budget_bytes(),
    };
    let mut parts = Partitions::new(settings, outputs);
    let mut task = PartitionTask::new(Partition(0), engine.clone());
    task.attach_spill(checkpointer.store.clone());
    let start = Start {
        next: NextOffset(0),
        end: i64::MAX,
        offsets: OffsetLedger::default(),
        epoch: 0,
    };
    parts.assign(Partition(0), task, start);
    parts
}
