//! `tally run --input-file … --output-file …`: the engine over JSON lines, no Kafka.
//!
//! The input is one partition (0) in file order. The output holds one result
//! payload per line, exactly as on the results topic. Too-late records and dead
//! letters go to `<output>.late.jsonl` and `<output>.dlq.jsonl` (one JSON object per
//! line with the reason and the original record), so nothing is dropped silently.
//! End of file is end of input: every open window emits its on-time pane.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::Path;

use serde_json::json;

use super::WorkerError;
use crate::config::Config;
use crate::engine::{Counters, PartitionTask, RecordIn, Route};
use crate::kafka::now_ms;

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

pub fn run(cfg: &Config, input: &Path, output: &Path) -> Result<Counters, WorkerError> {
    let engine = cfg.engine()?;
    let mut task = PartitionTask::new(0, engine);
    let mut reader = BufReader::with_capacity(1 << 20, File::open(input).map_err(io_err(input))?);
    let mut out = create(output)?;
    let side = |ext: &str| {
        output.with_extension(format!(
            "{}{ext}",
            output
                .extension()
                .map_or(String::new(), |e| format!("{}.", e.to_string_lossy()))
        ))
    };
    let (late_path, dlq_path) = (side("late.jsonl"), side("dlq.jsonl"));
    let mut late = create(&late_path)?;
    let mut dlq = create(&dlq_path)?;
    let mut panes = Vec::new();
    let mut line = Vec::new();
    let mut line_no = 0u64;
    let now = now_ms();
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line).map_err(io_err(input))? == 0 {
            break;
        }
        line_no += 1;
        while matches!(line.last(), Some(b'\n' | b'\r')) {
            line.pop();
        }
        if line.is_empty() {
            continue;
        }
        let route = task.process(
            RecordIn {
                payload: &line,
                kafka_ts: None,
                now_ms: now,
            },
            &mut panes,
        );
        for pane in panes.drain(..) {
            out.write_all(&pane.to_json())
                .and_then(|_| out.write_all(b"\n"))
                .map_err(io_err(output))?;
        }
        // Built only for the rare records that go to a side file.
        let original = || String::from_utf8_lossy(&line).into_owned();
        let source = || format!("{}:{line_no}", input.display());
        match route {
            Route::Window | Route::Duplicate => {}
            Route::TooLate {
                window_end,
                watermark,
            } => {
                let rec = json!({"reason": "too_late", "window_end": window_end, "watermark": watermark,
                    "source": source(), "record": original()});
                writeln!(late, "{rec}").map_err(io_err(&late_path))?;
            }
            Route::DeadLetter(reason) => {
                let rec = json!({"error": reason.code(), "detail": reason.to_string(), "source": source(),
                    "record": original()});
                writeln!(dlq, "{rec}").map_err(io_err(&dlq_path))?;
            }
        }
    }
    task.end_of_input(&mut panes);
    for pane in panes.drain(..) {
        out.write_all(&pane.to_json())
            .and_then(|_| out.write_all(b"\n"))
            .map_err(io_err(output))?;
    }
    out.flush().map_err(io_err(output))?;
    late.flush().map_err(io_err(&late_path))?;
    dlq.flush().map_err(io_err(&dlq_path))?;
    Ok(task.counters())
}
