//! The result record (docs/DESIGN.md §3): one per emitted pane, JSON on the results topic.
//!
//! Invariants: the payload is a pure function of the window's content — no wall
//! clock, no host names. Field order is fixed by this struct, so equal content
//! gives byte-identical JSON. `cost_pico` is a decimal string: integers above 2^53
//! lose precision in many JSON readers, and money must not.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::model::Pico;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PaneKind {
    OnTime,
    Late,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResultKind {
    /// A window pane from `tally run`.
    Window,
    /// A reprocessed too-late event from `tally reprocess-late`.
    Adjustment,
    /// A source partition's progress: its windows up to an end are final.
    Progress,
}

/// One model's share of a pane: the invoice line (docs/DESIGN.md §3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LineItem {
    /// Shared with the price table (serialized as a string).
    pub model: std::sync::Arc<str>,
    pub requests: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    #[serde(
        serialize_with = "pico_as_string",
        deserialize_with = "pico_from_string"
    )]
    pub cost_pico: Pico,
}

impl LineItem {
    pub fn of(l: &super::Line) -> Self {
        Self {
            model: l.model.clone(),
            requests: l.requests,
            prompt_tokens: l.prompt_tokens,
            completion_tokens: l.completion_tokens,
            cost_pico: l.cost,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResultRecord {
    pub kind: ResultKind,
    pub tenant_id: String,
    pub window_start: i64,
    pub window_end: i64,
    #[serde(
        serialize_with = "pico_as_string",
        deserialize_with = "pico_from_string"
    )]
    pub cost_pico: Pico,
    pub usd: String,
    pub requests: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub source_partition: i32,
    pub version: u64,
    pub pane: PaneKind,
    pub pane_index: u32,
    pub generation: u64,
    /// Per model, sorted by model name; the totals above are their sums. Absent
    /// in the payloads of a tally before line items (read as none).
    #[serde(default)]
    pub lines: Vec<LineItem>,
}

impl ResultRecord {
    /// The Kafka key: `"{tenant_id}/{window_end_ms}"`.
    pub fn key(&self) -> String {
        let mut k = String::new();
        self.write_key(&mut k);
        k
    }

    /// Replaces `buf`'s content with the key.
    pub fn write_key(&self, buf: &mut String) {
        use std::fmt::Write;
        buf.clear();
        let _ = write!(buf, "{}/{}", self.tenant_id, self.window_end);
    }

    pub fn to_json(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.write_json(&mut v);
        v
    }

    /// Replaces `buf`'s content with the JSON payload.
    pub fn write_json(&self, buf: &mut Vec<u8>) {
        buf.clear();
        // Serializing a struct of plain fields into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *buf, self);
    }
}

/// A billed too-late event (docs/DESIGN.md §8), keyed by `request_id`: the sink inserts it
/// once and ignores every later copy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdjustmentRecord {
    pub kind: ResultKind,
    pub request_id: String,
    pub tenant_id: String,
    /// The model of the request (empty in adjustments of a tally before line items).
    #[serde(default)]
    pub model: String,
    pub window_start: i64,
    pub window_end: i64,
    #[serde(
        serialize_with = "pico_as_string",
        deserialize_with = "pico_from_string"
    )]
    pub cost_pico: Pico,
    pub usd: String,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub generation: u64,
    /// `topic/partition/offset` of the original event on the input topic.
    pub source: String,
}

impl AdjustmentRecord {
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// A source partition's progress (docs/DESIGN.md §6.3, finality): every window
/// ending at or before `final_through` is purged in that partition, so only an
/// adjustment can change it. Sent to every partition of the results topic, after
/// the panes it covers; keyed `"_progress/{source_partition}"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgressRecord {
    pub kind: ResultKind,
    pub source_partition: i32,
    /// Partitions of the input topic (the sink waits for all of them).
    pub source_partitions: i32,
    /// Partitions of the results topic (each gets a copy).
    pub results_partitions: i32,
    pub final_through: i64,
    pub watermark: i64,
    pub generation: u64,
}

impl ProgressRecord {
    pub fn key(&self) -> String {
        format!("_progress/{}", self.source_partition)
    }

    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// What the sink reads from the results topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SinkRecord {
    Window(ResultRecord),
    Adjustment(AdjustmentRecord),
    Progress(ProgressRecord),
}

impl SinkRecord {
    pub fn parse(bytes: &[u8]) -> Result<SinkRecord, serde_json::Error> {
        #[derive(Deserialize)]
        struct Kind {
            kind: ResultKind,
        }
        match serde_json::from_slice::<Kind>(bytes)?.kind {
            ResultKind::Window => serde_json::from_slice(bytes).map(SinkRecord::Window),
            ResultKind::Adjustment => serde_json::from_slice(bytes).map(SinkRecord::Adjustment),
            ResultKind::Progress => serde_json::from_slice(bytes).map(SinkRecord::Progress),
        }
    }
}

fn pico_as_string<S: Serializer>(p: &Pico, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(p)
}

fn pico_from_string<'de, D: Deserializer<'de>>(d: D) -> Result<Pico, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either<'a> {
        Num(u128),
        Str(&'a str),
    }
    match Either::deserialize(d)? {
        Either::Num(n) => Ok(Pico(n)),
        Either::Str(s) => s.parse().map(Pico).map_err(serde::de::Error::custom),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_round_trip_keeps_money_exact() {
        let r = ResultRecord {
            kind: ResultKind::Window,
            tenant_id: "acme".into(),
            window_start: 0,
            window_end: 60_000,
            cost_pico: Pico(u128::from(u64::MAX) * 7),
            usd: Pico(u128::from(u64::MAX) * 7).usd_string(),
            requests: 2,
            prompt_tokens: 3,
            completion_tokens: 4,
            source_partition: 1,
            version: 2,
            pane: PaneKind::OnTime,
            pane_index: 0,
            generation: 1,
            lines: vec![LineItem {
                model: "small".into(),
                requests: 2,
                prompt_tokens: 3,
                completion_tokens: 4,
                cost_pico: Pico(u128::from(u64::MAX) * 7),
            }],
        };
        let json = String::from_utf8(r.to_json()).unwrap();
        assert!(
            json.contains("\"cost_pico\":\"129127208515966861305\""),
            "{json}"
        );
        assert!(json.contains("\"pane\":\"on_time\""));
        assert!(
            json.ends_with(r#""lines":[{"model":"small","requests":2,"prompt_tokens":3,"completion_tokens":4,"cost_pico":"129127208515966861305"}]}"#),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<ResultRecord>(&json).unwrap(), r);
        assert_eq!(r.key(), "acme/60000");
        // A payload of a tally before line items still reads.
        let old = json.split(r#","lines""#).next().unwrap().to_string() + "}";
        let back: ResultRecord = serde_json::from_str(&old).unwrap();
        assert!(back.lines.is_empty());
    }
}
