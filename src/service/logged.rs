//! The last warning and the last error the process logged, for the status
//! page: the log writer (`LogWriter`, installed by `cli::init_logging`) writes
//! each event to stderr as before, and keeps a copy of each WARN or ERROR line.
//!
//! Invariants:
//! - A kept line is masked like stderr's (`crate::secrets::redact`), without
//!   terminal colours, and at most `MAX_LINE` bytes: a secret never reaches the
//!   page by this path.
//! - Process-wide, like the log: one process, one last error.

use std::io::Write;
use std::sync::Mutex;

use tracing::{Level, Metadata};
use tracing_subscriber::fmt::MakeWriter;

use super::status_page::Logged;

/// The longest line kept, bytes.
pub(crate) const MAX_LINE: usize = 4_096;

static LAST_WARNING: Mutex<Option<Logged>> = Mutex::new(None);
static LAST_ERROR: Mutex<Option<Logged>> = Mutex::new(None);

/// Keeps `line`, logged at `level` at `at_ms`, if it is a warning or an error.
pub(crate) fn record(level: Level, line: &str, at_ms: i64) {
    let slot = match level {
        Level::ERROR => &LAST_ERROR,
        Level::WARN => &LAST_WARNING,
        _ => return,
    };
    let mut text = strip_ansi(&crate::secrets::redact(line))
        .trim_end()
        .to_string();
    if text.len() > MAX_LINE {
        let mut cut = MAX_LINE;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push('…');
    }
    let mut last = slot.lock().unwrap_or_else(|e| e.into_inner());
    *last = Some(Logged {
        at_ms,
        level: level.to_string(),
        line: text,
    });
}

pub(crate) fn last_warning() -> Option<Logged> {
    LAST_WARNING
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
}

pub(crate) fn last_error() -> Option<Logged> {
    LAST_ERROR.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// `s` without ANSI escape sequences (`ESC [ … letter`).
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Makes the log's writers: masked stderr, and a copy of warnings and errors.
pub(crate) struct LogWriter;

/// One event's writer.
pub(crate) struct EventWriter {
    keep: Option<Level>,
    line: Vec<u8>,
}

impl<'a> MakeWriter<'a> for LogWriter {
    type Writer = EventWriter;

    fn make_writer(&'a self) -> EventWriter {
        EventWriter {
            keep: None,
            line: Vec::new(),
        }
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> EventWriter {
        let level = *meta.level();
        EventWriter {
            keep: (level <= Level::WARN).then_some(level),
            line: Vec::new(),
        }
    }
}

impl Write for EventWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.keep.is_some() && self.line.len() < 4 * MAX_LINE {
            self.line.extend_from_slice(buf);
        }
        crate::secrets::RedactingWriter(std::io::stderr()).write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

impl Drop for EventWriter {
    fn drop(&mut self) {
        if let Some(level) = self.keep {
            if !self.line.is_empty() {
                let line = String::from_utf8_lossy(&self.line);
                record(level, &line, crate::base::clock::now_ms());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_warnings_and_errors_masked_and_without_colours() {
        crate::secrets::register_value("password", "LOGGED-CANARY-7");
        record(Level::INFO, "not kept", 1);
        record(
            Level::WARN,
            "\u{1b}[33mWARN\u{1b}[0m cannot reach postgres://u:LOGGED-CANARY-7@db/x\n",
            2,
        );
        let w = last_warning().unwrap();
        assert_eq!(w.at_ms, 2);
        assert_eq!(w.line, "WARN cannot reach postgres://u:***@db/x");
        record(Level::ERROR, &"é".repeat(MAX_LINE), 3);
        let e = last_error().unwrap();
        assert!(e.line.len() <= MAX_LINE + '…'.len_utf8() && e.line.ends_with('…'));
        assert_eq!(e.level, "ERROR");
    }
}
