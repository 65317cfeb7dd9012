//! The lines of the file mode's side files, `OUT.dlq.jsonl` and `OUT.late.jsonl`
//! (format: docs/reference/data-contracts.md#the-file-modes-side-files).
//!
//! Invariant: a side line carries the original record bytes exactly. Bytes that are
//! valid UTF-8 are the JSON string `record` (which decodes to exactly those bytes);
//! any other bytes are `record_base64` (standard alphabet, padded). Exactly one of the
//! two is present. An oversized record keeps its first `limits.max_record_bytes`
//! bytes, flagged `"truncated": true`, with its true length in `bytes`.
//!
//! Field order is fixed, so equal input gives byte-identical side files.

use std::io::{self, Write};

use base64::Engine as _;
use serde::Serialize;

use crate::model::event::DeadLetterReason;

/// The original bytes, as one of the two fields.
#[derive(Serialize)]
struct Original<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    record: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    record_base64: Option<String>,
}

impl<'a> Original<'a> {
    fn of(bytes: &'a [u8]) -> Self {
        match std::str::from_utf8(bytes) {
            Ok(s) => Self {
                record: Some(s),
                record_base64: None,
            },
            Err(_) => Self {
                record: None,
                record_base64: Some(base64::engine::general_purpose::STANDARD.encode(bytes)),
            },
        }
    }
}

#[derive(Serialize)]
struct DeadLetterLine<'a> {
    error: &'static str,
    detail: String,
    source: &'a str,
    #[serde(flatten)]
    original: Original<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    truncated: Option<bool>,
}

#[derive(Serialize)]
struct LateLine<'a> {
    reason: &'static str,
    window_end: i64,
    watermark: i64,
    source: &'a str,
    #[serde(flatten)]
    original: Original<'a>,
}

fn line(w: &mut impl Write, value: &impl Serialize) -> io::Result<()> {
    serde_json::to_writer(&mut *w, value).map_err(io::Error::from)?;
    w.write_all(b"\n")
}

/// One dead letter. `record` is the record, or for an oversized one its first
/// `limits.max_record_bytes` bytes with `true_len` its length.
pub(crate) fn dead_letter(
    w: &mut impl Write,
    reason: &DeadLetterReason,
    source: &str,
    record: &[u8],
    true_len: Option<u64>,
) -> io::Result<()> {
    line(
        w,
        &DeadLetterLine {
            error: reason.code(),
            detail: reason.to_string(),
            source,
            original: Original::of(record),
            bytes: true_len,
            truncated: true_len.map(|_| true),
        },
    )
}

/// One too-late record.
pub(crate) fn too_late(
    w: &mut impl Write,
    window_end: i64,
    watermark: i64,
    source: &str,
    record: &[u8],
) -> io::Result<()> {
    line(
        w,
        &LateLine {
            reason: "too_late",
            window_end,
            watermark,
            source,
            original: Original::of(record),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a user does: the string as UTF-8, or the base64 decoded.
    fn decode(line: &[u8]) -> (serde_json::Value, Vec<u8>) {
        let v: serde_json::Value = serde_json::from_slice(line).unwrap();
        let bytes = match (v.get("record"), v.get("record_base64")) {
            (Some(s), None) => s.as_str().unwrap().as_bytes().to_vec(),
            (None, Some(b)) => base64::engine::general_purpose::STANDARD
                .decode(b.as_str().unwrap())
                .unwrap(),
            other => panic!("exactly one of record, record_base64: {other:?}"),
        };
        (v, bytes)
    }

    fn dlq(record: &[u8], true_len: Option<u64>) -> Vec<u8> {
        let mut out = Vec::new();
        let reason = DeadLetterReason::MalformedJson("x".into());
        dead_letter(&mut out, &reason, "in.jsonl:7", record, true_len).unwrap();
        assert_eq!(out.last(), Some(&b'\n'));
        assert_eq!(out.iter().filter(|b| **b == b'\n').count(), 1, "one line");
        out
    }

    #[test]
    fn every_record_decodes_to_its_original_bytes() {
        let cases: [&[u8]; 6] = [
            b"{\"request_id\":\"r-1\"",
            b"{\"a\":\"\xff\xfe\"}",
            b"\xef\xbb\xbf{\"request_id\":\"r-1\"}",
            b"tab\tquote\"backslash\\ control\x01 nul\x00",
            "ünïcødé \u{feff} 🙂".as_bytes(),
            b"\xe2\x82",
        ];
        for record in cases {
            let (v, bytes) = decode(&dlq(record, None));
            assert_eq!(bytes, record);
            assert_eq!(v["error"], "malformed_json");
            assert_eq!(v["source"], "in.jsonl:7");
            assert!(v.get("truncated").is_none() && v.get("bytes").is_none());
            let mut late = Vec::new();
            too_late(&mut late, 60_000, 90_000, "in.jsonl:8", record).unwrap();
            let (v, bytes) = decode(&late);
            assert_eq!(bytes, record);
            assert_eq!(v["reason"], "too_late");
            assert_eq!(v["window_end"], 60_000);
        }
    }

    #[test]
    fn the_encoding_is_the_documented_one() {
        assert_eq!(
            dlq(b"{\"a\":\"\xff\"}", None),
            b"{\"error\":\"malformed_json\",\"detail\":\"malformed JSON: x\",\"source\":\"in.jsonl:7\",\
              \"record_base64\":\"eyJhIjoi/yJ9\"}\n"
        );
        assert_eq!(
            dlq(b"abc", Some(10_000_000)),
            b"{\"error\":\"malformed_json\",\"detail\":\"malformed JSON: x\",\"source\":\"in.jsonl:7\",\
              \"record\":\"abc\",\"bytes\":10000000,\"truncated\":true}\n"
        );
    }
}
