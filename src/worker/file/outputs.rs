//! The file run's `Outputs`: results to the output file (one payload per line,
//! exactly as on the results topic), too-late records and dead letters to the side
//! files `<output>.late.jsonl` and `<output>.dlq.jsonl` (`side`), each naming its
//! source as `<input>:<line>`. A file run has no progress records (no sink reads
//! its finality).
//!
//! Invariants: every error names the file and the operation; an oversized record
//! (read as its first `limit + 1` bytes) is written as its first `limit` bytes, its
//! reason and line carrying its true length.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::side;
use crate::engine::{ProgressRecord, ResultRecord};
use crate::model::DeadLetterReason;
use crate::worker::partitions::{Outputs, Record};
use crate::worker::WorkerError;

const OUTPUT: &str = "output file";
const LATE: &str = "too-late side file";
const DLQ: &str = "dead-letter side file";

/// An error of `doing` on one of the run's output files (`what`: "output file",
/// "too-late side file", "dead-letter side file"), naming both and the file.
fn out_err<'a>(
    doing: &'a str,
    what: &'a str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> WorkerError + 'a {
    move |source| WorkerError::Io {
        path: format!("{doing} the {what} {}", path.display()),
        source,
    }
}

/// A file written through a large buffer, with its path and what it is.
struct Out {
    what: &'static str,
    path: PathBuf,
    w: BufWriter<File>,
}

impl Out {
    fn create(what: &'static str, path: &Path) -> Result<Self, WorkerError> {
        let w = File::create(path)
            .map(|f| BufWriter::with_capacity(1 << 20, f))
            .map_err(out_err("creating", what, path))?;
        Ok(Self {
            what,
            path: path.to_owned(),
            w,
        })
    }

    fn written(&self, r: std::io::Result<()>) -> Result<(), WorkerError> {
        r.map_err(out_err("writing", self.what, &self.path))
    }

    fn flush(&mut self) -> Result<(), WorkerError> {
        let r = self.w.flush();
        self.written(r)
    }
}

pub(super) struct SideFiles {
    out: Out,
    late: Out,
    dlq: Out,
    /// The input as the sources name it.
    input: String,
    /// `limits.max_record_bytes`.
    limit: usize,
    /// A pane's JSON line (reused).
    scratch: Vec<u8>,
}

impl SideFiles {
    /// Creates (truncates) the three files.
    pub(super) fn create(
        input: &Path,
        output: &Path,
        late: &Path,
        dlq: &Path,
        limit: usize,
    ) -> Result<Self, WorkerError> {
        Ok(Self {
            out: Out::create(OUTPUT, output)?,
            late: Out::create(LATE, late)?,
            dlq: Out::create(DLQ, dlq)?,
            input: input.display().to_string(),
            limit,
            scratch: Vec::new(),
        })
    }

    fn source(&self, r: &Record<'_>) -> String {
        format!("{}:{}", self.input, r.offset + 1)
    }
}

impl Outputs for SideFiles {
    fn result(&mut self, r: &ResultRecord) -> Result<(), WorkerError> {
        self.scratch.clear();
        r.append_json(&mut self.scratch);
        self.scratch.push(b'\n');
        let written = self.out.w.write_all(&self.scratch);
        self.out.written(written)
    }

    fn progress(&mut self, _: &ProgressRecord) -> Result<(), WorkerError> {
        Ok(())
    }

    fn late(&mut self, r: &Record<'_>, window_end: i64, watermark: i64) -> Result<(), WorkerError> {
        let source = self.source(r);
        let written = side::too_late(&mut self.late.w, window_end, watermark, &source, r.payload);
        self.late.written(written)
    }

    fn dead_letter(
        &mut self,
        r: &Record<'_>,
        reason: &DeadLetterReason,
        _: u64,
    ) -> Result<(), WorkerError> {
        let source = self.source(r);
        let written = match r.true_len {
            None => side::dead_letter(&mut self.dlq.w, reason, &source, r.payload, None),
            // The engine saw a prefix: the reason gets the true length, the dead
            // letter the first `limit` bytes.
            Some(bytes) => {
                let reason = DeadLetterReason::Oversized {
                    bytes: usize::try_from(bytes).unwrap_or(usize::MAX),
                    limit: self.limit,
                };
                let prefix = &r.payload[..self.limit];
                side::dead_letter(&mut self.dlq.w, &reason, &source, prefix, Some(bytes))
            }
        };
        self.dlq.written(written)
    }

    /// The three files flushed, in order; an error names the file.
    fn flush(&mut self) -> Result<(), WorkerError> {
        self.out.flush()?;
        self.late.flush()?;
        self.dlq.flush()
    }
}
