//! The file mode's source of chunks: the input's lines, a chunk of records at a
//! time, put through step 1 of the rules (`engine::Prepared`: parse, validate,
//! price, fingerprint). On two CPUs or more a reading thread reads and prepares
//! while the main thread applies the chunk before it, so the parse, most of a
//! record's cost, runs beside the windows. On one CPU (`base::cpus::Pipeline`)
//! the two threads could only take turns, so the main thread reads and prepares
//! each chunk itself when it needs it: no channel, no wake-ups.
//!
//! Invariants (both modes):
//! - Chunks come in file order, each with the non-empty records of consecutive
//!   lines (at most `CHUNK`), their line numbers, and `line_no`: every line read
//!   through the chunk, empty ones included. Every record read is in exactly one
//!   chunk; the last chunk says why the input ended (`End`).
//! - A chunk ends before a read that may wait (the buffer is empty, and a FIFO's
//!   writer may be slow): what was read is applied without waiting for more.
//! - Step 1 is a pure function of the record, so which thread prepares a record,
//!   and in which mode, changes nothing it decides: the outputs are the same bytes.
//!
//! With a reading thread:
//! - At most `QUEUE` chunks wait for the main thread: memory stays bounded by
//!   `QUEUE + 2` chunks, whatever the relative speeds.
//! - The thread ends after sending the last chunk, or when the main thread has
//!   stopped receiving (its next send fails).
//! - The two threads share step 1 by need: the reading thread prepares the first
//!   `share` records of a chunk and the main thread the rest (`Reader::next`).
//!   `share` grows when the main thread is behind (the queue is full) and shrinks
//!   when it waits (the queue is empty).

use std::io::{self, Read};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::decode::BytesRead;
use super::lines::{Line, Lines};
use super::source;
use crate::base::cpus::Pipeline;
use crate::engine::{EngineConfig, Prepared, RecordIn};
use crate::model::Partition;
use crate::worker::partitions::Record;

/// Records per chunk: one hand-over per chunk, small enough to stay in cache.
const CHUNK: usize = 1024;

/// Chunks read ahead of the main thread.
const QUEUE: usize = 2;

/// How far `share` moves at a time.
const STEP: usize = 64;

/// Why the input ended, after the records of the chunk that says it.
#[derive(Debug)]
pub(crate) enum End {
    Eof,
    /// A stop request (SIGTERM, SIGINT) interrupted a read.
    Stopped,
    /// A read failed (a corrupt archive, a disk error).
    Failed(io::Error),
}

/// Consecutive records of the input, read and through step 1 of the rules.
#[derive(Debug, Default)]
pub(crate) struct Chunk {
    /// The records, back to back; record `i` ends at `ends[i]`.
    bytes: Vec<u8>,
    ends: Vec<usize>,
    /// Each record's line number.
    numbers: Vec<u64>,
    /// For an oversized record, its true length (it holds a prefix of it).
    oversized: Vec<Option<u64>>,
    pub prepared: Prepared,
    /// Lines read through this chunk (empty ones included).
    pub line_no: u64,
    /// The input's bytes read through this chunk (for progress).
    pub bytes_read: u64,
    /// `Some`: the input ended after this chunk's records.
    pub end: Option<End>,
}

impl Chunk {
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// The `i`-th record's bytes.
    pub(crate) fn record(&self, i: usize) -> &[u8] {
        &self.bytes[self.span(i)]
    }

    /// The `i`-th record's line number.
    fn line(&self, i: usize) -> u64 {
        self.numbers[i]
    }

    fn span(&self, i: usize) -> std::ops::Range<usize> {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        start..self.ends[i]
    }

    /// Step 1 on the records not yet prepared, up to the first `n`.
    fn prepare_up_to(&mut self, n: usize, cfg: &EngineConfig, now_ms: i64) {
        for i in self.prepared.len()..n.min(self.ends.len()) {
            let rec = RecordIn {
                payload: &self.bytes[self.span(i)],
                kafka_ts: None,
                now_ms,
            };
            self.prepared.push(cfg, rec);
        }
    }

    /// Step 1 on every record not yet prepared.
    fn prepare(&mut self, cfg: &EngineConfig, now_ms: i64) {
        self.prepare_up_to(usize::MAX, cfg, now_ms);
    }

    fn clear(&mut self) {
        self.bytes.clear();
        self.ends.clear();
        self.numbers.clear();
        self.oversized.clear();
        self.prepared.clear();
        self.end = None;
    }
}

/// A chunk is a run of partition 0, its offsets the lines' numbers − 1; a file has
/// every line from the first (its log start is 0), read under no assignment.
impl crate::worker::partitions::Run for Chunk {
    fn partition(&self) -> Partition {
        Partition(0)
    }

    fn epoch(&self) -> u64 {
        0
    }

    fn log_start(&self) -> Option<i64> {
        Some(0)
    }

    fn len(&self) -> usize {
        self.ends.len()
    }

    fn offset(&self, i: usize) -> i64 {
        self.line(i) as i64 - 1
    }

    fn prepared(&self) -> &Prepared {
        &self.prepared
    }

    fn record_in(&self, i: usize, now_ms: i64) -> RecordIn<'_> {
        RecordIn {
            payload: self.record(i),
            kafka_ts: None,
            now_ms,
        }
    }

    fn record(&self, i: usize) -> Record<'_> {
        Record {
            partition: Partition(0),
            offset: self.offset(i),
            key: None,
            payload: self.record(i),
            kafka_ts: None,
            true_len: self.oversized[i],
        }
    }
}

/// The input's lines, as one chunk after another reads them.
struct Input {
    lines: Lines<Box<dyn Read + Send>>,
    bytes_read: BytesRead,
    /// The input's name in log lines.
    name: String,
}

impl Input {
    /// Reads the next chunk's lines into `chunk` (cleared first): up to `CHUNK`
    /// records, fewer when the next read may wait or the input ends (`end`).
    fn fill(&mut self, chunk: &mut Chunk) {
        let lines = &mut self.lines;
        chunk.clear();
        while chunk.len() < CHUNK {
            if chunk.len() > 0 && !lines.buffered() {
                break;
            }
            let start = chunk.bytes.len();
            let kind = match lines.append_next(&mut chunk.bytes) {
                Ok(Some(kind)) => kind,
                Ok(None) => {
                    chunk.end = Some(End::Eof);
                    break;
                }
                Err(e) if source::is_stop(&e) => {
                    chunk.end = Some(End::Stopped);
                    break;
                }
                Err(e) => {
                    chunk.end = Some(End::Failed(e));
                    break;
                }
            };
            let line_no = lines.line_no();
            if line_no == 1 && lines.skipped_bom() {
                tracing::info!(
                    input = self.name,
                    "the input starts with a UTF-8 byte-order mark; skipped"
                );
            }
            if chunk.bytes.len() > start {
                chunk.ends.push(chunk.bytes.len());
                chunk.numbers.push(line_no);
                // The engine sees more than `limit` bytes of it: enough to route it.
                chunk.oversized.push(match kind {
                    Line::Record => None,
                    Line::Oversized { bytes } => Some(bytes),
                });
            }
        }
        chunk.line_no = lines.line_no();
        chunk.bytes_read = self.bytes_read.get();
    }
}

/// The main thread's source of prepared chunks.
pub(crate) struct Reader {
    mode: Mode,
    cfg: Arc<EngineConfig>,
    now_ms: i64,
}

enum Mode {
    /// One CPU: this thread reads and prepares each chunk itself, when it needs
    /// it (`base::cpus::Pipeline`). One chunk's buffers are reused.
    Inline {
        input: Box<Input>,
        spare: Option<Chunk>,
    },
    /// A reading thread reads ahead and shares step 1 (the module header).
    Threaded {
        chunks: Receiver<Chunk>,
        spent: Sender<Chunk>,
        thread: Option<JoinHandle<()>>,
        /// Records of a chunk the reading thread prepares.
        share: Arc<AtomicUsize>,
    },
}

impl Reader {
    /// Starts reading `lines`, on a reading thread unless `pipeline` is
    /// `Inline`; `input` names the file in log lines, `now_ms` is the run's wall
    /// clock for step 1, `cfg` the run's configuration.
    pub(crate) fn start(
        lines: Lines<Box<dyn Read + Send>>,
        bytes_read: BytesRead,
        cfg: Arc<EngineConfig>,
        now_ms: i64,
        input: String,
        pipeline: Pipeline,
    ) -> io::Result<Self> {
        let input = Input {
            lines,
            bytes_read,
            name: input,
        };
        let mode = match pipeline {
            Pipeline::Inline => Mode::Inline {
                input: Box::new(input),
                spare: None,
            },
            Pipeline::Threaded => {
                let (tx, chunks) = mpsc::sync_channel(QUEUE);
                let (spent, recycled) = mpsc::channel();
                let share = Arc::new(AtomicUsize::new(CHUNK));
                let thread = {
                    let (cfg, share) = (cfg.clone(), share.clone());
                    let ends = Ends {
                        tx,
                        recycled,
                        share,
                    };
                    std::thread::Builder::new()
                        .name("input-reader".into())
                        .spawn(move || read(input, &cfg, now_ms, &ends))?
                };
                Mode::Threaded {
                    chunks,
                    spent,
                    thread: Some(thread),
                    share,
                }
            }
        };
        Ok(Self { mode, cfg, now_ms })
    }

    /// The next chunk, every record prepared. After the one with an `end`, there
    /// is none. A panic of the reading thread resumes here.
    pub(crate) fn next(&mut self) -> Chunk {
        let mut chunk = match &mut self.mode {
            Mode::Inline { input, spare } => {
                let mut chunk = spare.take().unwrap_or_default();
                input.fill(&mut chunk);
                chunk
            }
            Mode::Threaded {
                chunks,
                thread,
                share,
                ..
            } => {
                let got = match chunks.try_recv() {
                    Err(TryRecvError::Empty) => {
                        // This thread waits: the reading thread prepares less.
                        let s = share.load(Ordering::Relaxed);
                        share.store(s.saturating_sub(STEP), Ordering::Relaxed);
                        chunks.recv().ok()
                    }
                    got => got.ok(),
                };
                let Some(chunk) = got else {
                    if let Some(Err(panic)) = thread.take().map(JoinHandle::join) {
                        std::panic::resume_unwind(panic);
                    }
                    unreachable!("the reading thread ends only after its last chunk")
                };
                chunk
            }
        };
        chunk.prepare(&self.cfg, self.now_ms);
        chunk
    }

    /// Gives an applied chunk's buffers back for reuse.
    pub(crate) fn recycle(&mut self, chunk: Chunk) {
        match &mut self.mode {
            Mode::Inline { spare, .. } => *spare = Some(chunk),
            Mode::Threaded { spent, .. } => {
                let _ = spent.send(chunk);
            }
        }
    }
}

/// The reading thread's ends of the channels, and its share of step 1.
struct Ends {
    tx: SyncSender<Chunk>,
    recycled: Receiver<Chunk>,
    share: Arc<AtomicUsize>,
}

fn read(mut input: Input, cfg: &EngineConfig, now_ms: i64, ends: &Ends) {
    loop {
        let mut chunk = ends.recycled.try_recv().unwrap_or_default();
        input.fill(&mut chunk);
        chunk.prepare_up_to(ends.share.load(Ordering::Relaxed), cfg, now_ms);
        let last = chunk.end.is_some();
        let sent = match ends.tx.try_send(chunk) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(chunk)) => {
                // The main thread is behind: this thread prepares more.
                let s = ends.share.load(Ordering::Relaxed);
                ends.share.store((s + STEP).min(CHUNK), Ordering::Relaxed);
                ends.tx.send(chunk).map_err(drop)
            }
            Err(TrySendError::Disconnected(_)) => Err(()),
        };
        if sent.is_err() || last {
            return;
        }
    }
}
