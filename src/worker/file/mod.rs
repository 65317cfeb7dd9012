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
//! The hot path is the worker's: every `checkpoint.interval` the outputs are
//! flushed, the task's changes are committed to the RocksDB state store in one
//! batch, and a checkpoint (offset = lines read) is exported on a background thread
//! into the store `<checkpoint.dir>/file-<input stem>` (never a Kafka job's store).
//! A file run always starts from the first line with empty state; the end-of-input
//! panes are not checkpointed (as with `--until-end`).
//!
//! Under `state.memory_budget`, windows beyond it are evicted after each commit;
//! when the windows in memory are a quarter over the budget between checkpoints,
//! the run spills (commits to RocksDB without exporting) and evicts.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::time::{Duration, Instant};

mod checkpointer;
mod decode;
mod lines;
mod paths;
mod side;
mod source;

use checkpointer::{group, Checkpointer};
use lines::{Line, Lines};
use paths::Paths;
use source::Source;

use super::{shutdown, WorkerError};
use crate::checkpoint::CheckpointError;
use crate::config::Config;
use crate::engine::{Counters, PartitionTask, RecordIn, Route, TimeSource};
use crate::kafka::now_ms;
use crate::model::event::DeadLetterReason;
use crate::model::Partition;

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> WorkerError + '_ {
    move |source| WorkerError::Io {
        path: path.display().to_string(),
        source,
    }
}

fn create(path: &Path) -> Result<BufWriter<File>, WorkerError> {
    File::create(path)
        .map(|f| BufWriter::with_capacity(1 << 20, f))
        .map_err(io_err(path))
}

/// Records per `process_batch` call: enough for the dedup prefetches of a batch
/// to land while it is parsed.
const BATCH: usize = 32;

/// Step 2 of a checkpoint in a file run: the three output files flushed.
fn flush_all(
    out: &mut BufWriter<File>,
    output: &Path,
    late: &mut BufWriter<File>,
    late_path: &Path,
    dlq: &mut BufWriter<File>,
    dlq_path: &Path,
) -> Result<(), CheckpointError> {
    let err = |p: &Path| {
        let path = p.display().to_string();
        move |source| CheckpointError::Io { path, source }
    };
    out.flush().map_err(err(output))?;
    late.flush().map_err(err(late_path))?;
    dlq.flush().map_err(err(dlq_path))
}

/// One result payload per line, exactly as on the results topic.
fn write_panes(
    out: &mut BufWriter<File>,
    output: &Path,
    panes: &mut Vec<crate::engine::ResultRecord>,
    scratch: &mut Vec<u8>,
) -> Result<(), WorkerError> {
    if panes.is_empty() {
        return Ok(());
    }
    scratch.clear();
    for pane in panes.drain(..) {
        pane.append_json(scratch);
        scratch.push(b'\n');
    }
    out.write_all(scratch).map_err(io_err(output))
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
pub struct FileRun {
    pub counters: Counters,
    /// Lines read and applied (the offset of the last checkpoint).
    pub lines: u64,
    /// `Some(signal)` when a stop request (SIGTERM, SIGINT) ended the run before the
    /// end of the input: the outputs are flushed and the state is checkpointed at
    /// `lines`, and windows still open were not emitted. `None`: end of input.
    pub interrupted: Option<i32>,
}

pub fn run(cfg: &Config, input: &Path, output: &Path) -> Result<FileRun, WorkerError> {
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
    let mut reader = Lines::new(decoded, limit);
    let progress = crate::progress::Progress::new("input", None, size);
    let mut task = PartitionTask::new(Partition(0), engine);
    let mut checkpointer = Checkpointer::open(cfg, input)?;
    task.attach_spill(checkpointer.store.clone());
    let budget = cfg.state.memory_budget_bytes();
    let interval = Duration::from_millis(cfg.checkpoint.interval.0 as u64);
    let mut last_checkpoint = Instant::now();
    let mut out = create(output)?;
    let (late_path, dlq_path) = (paths.late, paths.dlq);
    let mut late = create(&late_path)?;
    let mut dlq = create(&dlq_path)?;
    let mut panes = Vec::new();
    // The JSON of a batch's panes (reused).
    let mut scratch = Vec::new();
    let mut routes = Vec::with_capacity(BATCH);
    // A batch of non-empty records, their line numbers and, for an oversized one, its
    // true length (buffers reused).
    let mut lines: Vec<Vec<u8>> = (0..BATCH).map(|_| Vec::new()).collect();
    let mut numbers = [0u64; BATCH];
    let mut oversized = [None::<u64>; BATCH];
    let mut line_no = 0u64;
    let now = now_ms();
    let (mut eof, mut stopped) = (false, false);
    let mut next_check = 4096u64;
    tracing::info!(input = %input.display(), "reading input");
    while !eof && !stopped {
        // Every 4096 lines, at a batch boundary: reading the clock per line would show.
        if line_no >= next_check {
            next_check = line_no + 4096;
            progress.show(line_no, Some(bytes_read.get()), false);
            // Lines so far are applied: the offset of a commit here.
            if last_checkpoint.elapsed() >= interval {
                let mut flush =
                    || flush_all(&mut out, output, &mut late, &late_path, &mut dlq, &dlq_path);
                checkpointer.checkpoint(&mut task, line_no, &mut flush)?;
                last_checkpoint = Instant::now();
            } else if budget.is_some_and(|b| task.memory_bytes() + task.dedup_bytes() > b + b / 4) {
                checkpointer.spill(&mut task, line_no)?;
            }
        }
        let mut n = 0;
        while n < BATCH {
            // Apply what was read before a read that may wait (a FIFO's writer may be
            // slow); for a file, a short batch once per buffer.
            if n > 0 && !reader.buffered() {
                break;
            }
            let line = &mut lines[n];
            let kind = match reader.next_into(line) {
                Ok(Some(kind)) => kind,
                Ok(None) => {
                    eof = true;
                    break;
                }
                // A stop request: apply the lines read so far, then stop there.
                Err(e) if source::is_stop(&e) => {
                    stopped = true;
                    break;
                }
                Err(e) => return Err(io_err(input)(e)),
            };
            line_no = reader.line_no();
            if line_no == 1 && reader.skipped_bom() {
                tracing::info!(input = %input.display(), "the input starts with a UTF-8 byte-order mark; skipped");
            }
            if !line.is_empty() {
                numbers[n] = line_no;
                // The engine sees more than `limit` bytes of it: enough to route it.
                oversized[n] = match kind {
                    Line::Record => None,
                    Line::Oversized { bytes } => Some(bytes),
                };
                n += 1;
            }
        }
        let recs: Vec<RecordIn<'_>> = lines[..n]
            .iter()
            .map(|l| RecordIn {
                payload: l,
                kafka_ts: None,
                now_ms: now,
            })
            .collect();
        routes.clear();
        task.process_batch(&recs, &mut panes, &mut routes);
        if let Some(e) = task.take_spill_error() {
            return Err(WorkerError::Refused(e));
        }
        write_panes(&mut out, output, &mut panes, &mut scratch)?;
        for (i, route) in routes.drain(..).enumerate() {
            // Built only for the rare records that go to a side file.
            let source = || format!("{}:{}", input.display(), numbers[i]);
            match route {
                Route::Window | Route::Duplicate => {}
                Route::TooLate {
                    window_end,
                    watermark,
                } => side::too_late(&mut late, window_end, watermark, &source(), &lines[i])
                    .map_err(io_err(&late_path))?,
                Route::DeadLetter(reason) => match oversized[i] {
                    None => side::dead_letter(&mut dlq, &reason, &source(), &lines[i], None),
                    // The engine saw a prefix: the reason gets the true length, the
                    // dead letter the first `limit` bytes.
                    Some(bytes) => {
                        let reason = DeadLetterReason::Oversized {
                            bytes: usize::try_from(bytes).unwrap_or(usize::MAX),
                            limit,
                        };
                        let prefix = &lines[i][..limit];
                        side::dead_letter(&mut dlq, &reason, &source(), prefix, Some(bytes))
                    }
                }
                .map_err(io_err(&dlq_path))?,
            }
        }
    }
    progress.show(line_no, Some(bytes_read.get()), true);
    let mut flush = || flush_all(&mut out, output, &mut late, &late_path, &mut dlq, &dlq_path);
    checkpointer.checkpoint(&mut task, line_no, &mut flush)?;
    checkpointer.finish()?;
    if stopped {
        tracing::info!(
            lines = line_no,
            checkpoints = checkpointer.taken,
            "stop requested; outputs flushed and state committed at the last line read"
        );
        return Ok(FileRun {
            counters: task.counters(),
            lines: line_no,
            interrupted: Some(shutdown::signal().unwrap_or(libc::SIGTERM)),
        });
    }
    let (ids_cold, cold_reads) = task.dedup_cold_stats();
    tracing::info!(
        checkpoints = checkpointer.taken,
        windows_evicted = checkpointer.evicted,
        windows_spilled = task.open_windows() - task.windows_in_memory(),
        dedup_ids_moved_out = ids_cold,
        dedup_cold_reads = cold_reads,
        "input read; state committed"
    );
    task.end_of_input(&mut panes);
    if let Some(e) = task.take_spill_error() {
        return Err(WorkerError::Refused(e));
    }
    write_panes(&mut out, output, &mut panes, &mut scratch)?;
    out.flush().map_err(io_err(output))?;
    late.flush().map_err(io_err(&late_path))?;
    dlq.flush().map_err(io_err(&dlq_path))?;
    Ok(FileRun {
        counters: task.counters(),
        lines: line_no,
        interrupted: None,
    })
}
