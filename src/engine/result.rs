//! The result record (docs/DESIGN.md §3): one per emitted pane, JSON on the results topic.
//!
//! Invariants: the payload is a pure function of the window's content — no wall
//! clock, no host names. Field order is fixed by this struct, so equal content
//! gives byte-identical JSON; `ResultRecord::append_json` writes a pane by hand in
//! that order, and a property test holds it to serde_json's bytes (a new field goes
//! into both). `cost_pico` is a decimal string: integers above 2^53
//! lose precision in many JSON readers, and money must not.

use std::sync::Arc;

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

/// One model's share of a pane: the invoice line (docs/DESIGN.md §3). Under a
/// rating (issue 36) a line is one `(model, variant, plan)` and carries its fee
/// and quantities; today's pricing leaves those members out.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LineItem {
    /// Shared with the price table (serialized as a string).
    pub model: Arc<str>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<Arc<str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<Arc<str>>,
    pub requests: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    #[serde(
        serialize_with = "pico_as_string",
        deserialize_with = "pico_from_string"
    )]
    pub cost_pico: Pico,
    /// The fees per request within `cost_pico` (absent: none).
    #[serde(
        default,
        skip_serializing_if = "Pico::is_zero",
        serialize_with = "pico_as_string",
        deserialize_with = "pico_from_string"
    )]
    pub fee_pico: Pico,
    /// The requests charged a fee (absent: none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub fee_requests: u64,
    /// Per quantity billed, by quantity id: `cost_pico` is their cost plus the fee.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quantities: Vec<QuantityItem>,
}

/// One quantity of a line: its net count and cost.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuantityItem {
    pub quantity: Arc<str>,
    pub count: u64,
    #[serde(
        serialize_with = "pico_as_string",
        deserialize_with = "pico_from_string"
    )]
    pub cost_pico: Pico,
}

impl LineItem {
    pub(crate) fn of(l: &super::Line) -> Self {
        Self {
            model: l.model.clone(),
            requests: l.requests,
            prompt_tokens: l.prompt_tokens,
            completion_tokens: l.completion_tokens,
            cost_pico: l.cost,
            ..Self::default()
        }
    }

    pub(crate) fn of_rated(l: &super::RatedLine) -> Self {
        Self {
            model: l.model.clone(),
            variant: l.variant.clone(),
            plan: l.plan.clone(),
            requests: l.requests,
            prompt_tokens: l.prompt_tokens,
            completion_tokens: l.completion_tokens,
            cost_pico: l.cost,
            fee_pico: l.fee,
            fee_requests: l.fee_requests,
            quantities: l
                .items
                .iter()
                .map(|q| QuantityItem {
                    quantity: q.name.clone(),
                    count: q.count,
                    cost_pico: q.cost,
                })
                .collect(),
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
    pub(crate) fn write_key(&self, buf: &mut String) {
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
    pub(crate) fn write_json(&self, buf: &mut Vec<u8>) {
        buf.clear();
        self.append_json(buf);
    }

    /// Appends the JSON payload: exactly the bytes `serde_json` writes for this
    /// struct (a property test compares them on random records), written by hand
    /// because serde's calls and escaping per member were most of producing a pane.
    pub(crate) fn append_json(&self, buf: &mut Vec<u8>) {
        let mut n = itoa::Buffer::new();
        let mut int = |buf: &mut Vec<u8>, key: &[u8], v: Int| {
            buf.extend_from_slice(key);
            buf.extend_from_slice(
                match v {
                    Int::U(v) => n.format(v),
                    Int::I(v) => n.format(v),
                }
                .as_bytes(),
            );
        };
        buf.extend_from_slice(b"{\"kind\":");
        json_str(buf, self.kind.name());
        buf.extend_from_slice(b",\"tenant_id\":");
        json_str(buf, &self.tenant_id);
        int(buf, b",\"window_start\":", Int::I(self.window_start));
        int(buf, b",\"window_end\":", Int::I(self.window_end));
        buf.extend_from_slice(b",\"cost_pico\":");
        json_pico(buf, self.cost_pico);
        buf.extend_from_slice(b",\"usd\":");
        json_str(buf, &self.usd);
        int(buf, b",\"requests\":", Int::U(self.requests));
        int(buf, b",\"prompt_tokens\":", Int::U(self.prompt_tokens));
        int(
            buf,
            b",\"completion_tokens\":",
            Int::U(self.completion_tokens),
        );
        int(
            buf,
            b",\"source_partition\":",
            Int::I(self.source_partition.into()),
        );
        int(buf, b",\"version\":", Int::U(self.version));
        buf.extend_from_slice(b",\"pane\":");
        json_str(buf, self.pane.name());
        int(buf, b",\"pane_index\":", Int::U(self.pane_index.into()));
        int(buf, b",\"generation\":", Int::U(self.generation));
        buf.extend_from_slice(b",\"lines\":[");
        for (i, l) in self.lines.iter().enumerate() {
            buf.extend_from_slice(if i == 0 {
                b"{\"model\":"
            } else {
                b",{\"model\":"
            });
            json_str(buf, &l.model);
            if let Some(v) = &l.variant {
                buf.extend_from_slice(b",\"variant\":");
                json_str(buf, v);
            }
            if let Some(p) = &l.plan {
                buf.extend_from_slice(b",\"plan\":");
                json_str(buf, p);
            }
            int(buf, b",\"requests\":", Int::U(l.requests));
            int(buf, b",\"prompt_tokens\":", Int::U(l.prompt_tokens));
            int(buf, b",\"completion_tokens\":", Int::U(l.completion_tokens));
            buf.extend_from_slice(b",\"cost_pico\":");
            json_pico(buf, l.cost_pico);
            if !l.fee_pico.is_zero() {
                buf.extend_from_slice(b",\"fee_pico\":");
                json_pico(buf, l.fee_pico);
            }
            if l.fee_requests != 0 {
                int(buf, b",\"fee_requests\":", Int::U(l.fee_requests));
            }
            if !l.quantities.is_empty() {
                buf.extend_from_slice(b",\"quantities\":[");
                for (j, q) in l.quantities.iter().enumerate() {
                    buf.extend_from_slice(if j == 0 {
                        b"{\"quantity\":"
                    } else {
                        b",{\"quantity\":"
                    });
                    json_str(buf, &q.quantity);
                    int(buf, b",\"count\":", Int::U(q.count));
                    buf.extend_from_slice(b",\"cost_pico\":");
                    json_pico(buf, q.cost_pico);
                    buf.push(b'}');
                }
                buf.push(b']');
            }
            buf.push(b'}');
        }
        buf.extend_from_slice(b"]}");
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// An integer member: formatted in 64 bits, as serde_json does (never `i128`,
/// whose division is far slower).
enum Int {
    U(u64),
    I(i64),
}

impl ResultKind {
    /// The name serde gives it (`rename_all = "snake_case"`).
    fn name(self) -> &'static str {
        match self {
            ResultKind::Window => "window",
            ResultKind::Adjustment => "adjustment",
            ResultKind::Progress => "progress",
        }
    }
}

impl PaneKind {
    fn name(self) -> &'static str {
        match self {
            PaneKind::OnTime => "on_time",
            PaneKind::Late => "late",
        }
    }
}

/// A JSON string as serde_json writes it: as is when nothing needs escaping (the
/// common case: tenant ids, model names, amounts), else through serde_json.
fn json_str(buf: &mut Vec<u8>, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        buf.push(b'"');
        buf.extend_from_slice(s.as_bytes());
        buf.push(b'"');
    } else {
        // Writing a string into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *buf, s);
    }
}

/// Money as a quoted decimal (`pico_as_string`).
fn json_pico(buf: &mut Vec<u8>, p: Pico) {
    let mut n = itoa::Buffer::new();
    buf.push(b'"');
    buf.extend_from_slice(match u64::try_from(p.0) {
        Ok(v) => n.format(v).as_bytes(),
        Err(_) => n.format(p.0).as_bytes(),
    });
    buf.push(b'"');
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
    /// Under a rating (docs/DESIGN.md §3.2): the request's variant and plan, its fee
    /// and its quantities, as a pane's line carries them; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<Arc<str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<Arc<str>>,
    #[serde(
        default,
        skip_serializing_if = "Pico::is_zero",
        serialize_with = "pico_as_string",
        deserialize_with = "pico_from_string"
    )]
    pub fee_pico: Pico,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quantities: Vec<QuantityItem>,
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

    /// The hand-written payload is serde_json's, byte for byte, on random records:
    /// strings that need escaping (quotes, backslashes, control characters,
    /// non-ASCII), integers at their edges, 0-3 lines, every kind.
    #[test]
    fn the_hand_written_payload_is_serde_jsons() {
        let mut rng = crate::gen::Rng::new(18);
        let pieces = [
            "acme",
            "t\"q",
            "back\\slash",
            "tab\t",
            "nl\n",
            "\u{1}",
            "é€😀",
            "",
            "/",
            "\u{7f}",
        ];
        let text = |rng: &mut crate::gen::Rng| -> String {
            (0..rng.below(4))
                .map(|_| pieces[rng.below(pieces.len() as u64) as usize])
                .collect()
        };
        let num = |rng: &mut crate::gen::Rng| -> u64 {
            [0, 1, 9, 10, u64::MAX, rng.next_u64(), rng.below(1000)][rng.below(7) as usize]
        };
        for _ in 0..20_000 {
            let lines = (0..rng.below(4))
                .map(|_| {
                    let opt = |rng: &mut crate::gen::Rng| {
                        (rng.below(2) == 0).then(|| Arc::from(text(rng).as_str()))
                    };
                    LineItem {
                        model: text(&mut rng).into(),
                        variant: opt(&mut rng),
                        plan: opt(&mut rng),
                        requests: num(&mut rng),
                        prompt_tokens: num(&mut rng),
                        completion_tokens: num(&mut rng),
                        cost_pico: Pico(u128::from(num(&mut rng)) * u128::from(num(&mut rng))),
                        fee_pico: Pico(u128::from(num(&mut rng) % 3)),
                        fee_requests: num(&mut rng) % 2,
                        quantities: (0..rng.below(3))
                            .map(|_| QuantityItem {
                                quantity: text(&mut rng).into(),
                                count: num(&mut rng),
                                cost_pico: Pico(u128::from(num(&mut rng)) << rng.below(64)),
                            })
                            .collect(),
                    }
                })
                .collect();
            let r = ResultRecord {
                kind: [
                    ResultKind::Window,
                    ResultKind::Adjustment,
                    ResultKind::Progress,
                ][rng.below(3) as usize],
                tenant_id: text(&mut rng),
                window_start: num(&mut rng) as i64,
                window_end: num(&mut rng) as i64,
                cost_pico: Pico(u128::from(num(&mut rng)) << rng.below(64)),
                usd: text(&mut rng),
                requests: num(&mut rng),
                prompt_tokens: num(&mut rng),
                completion_tokens: num(&mut rng),
                source_partition: num(&mut rng) as i32,
                version: num(&mut rng),
                pane: [PaneKind::OnTime, PaneKind::Late][rng.below(2) as usize],
                pane_index: num(&mut rng) as u32,
                generation: num(&mut rng),
                lines,
            };
            let want = serde_json::to_vec(&r).unwrap();
            assert_eq!(
                String::from_utf8(r.to_json()).unwrap(),
                String::from_utf8(want).unwrap()
            );
        }
    }

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
                ..LineItem::default()
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
