//! The inverse of a mapping: an event written the way a mapping reads it (the
//! generator's and the demo's records, the tests' fixtures).
//!
//! Invariants:
//! - `parse(render(f))` gives back `f` for every field the mapping has, with event
//!   times at the format's precision (`TimestampFormat::quantize`).
//! - CloudEvents records carry the required attributes (`specversion`, `id`,
//!   `source`, `type`) and `datacontenttype`.
//! - Pure: no I/O.

use super::{pointer::Token, InputFormat, InputMapping, Kind, TimestampFormat};
use crate::time::utc::format_utc_ms;

/// One event's values; `None` leaves the field out (a missing-field dead letter).
#[derive(Debug, Clone)]
pub struct Fields<'a> {
    pub request_id: &'a str,
    pub tenant_id: Option<&'a str>,
    pub model: &'a str,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub started_ts: i64,
    pub completed_ts: i64,
    /// The completed time as written, instead of `completed_ts` in the format (a
    /// seconds-for-milliseconds dead letter).
    pub completed_raw: Option<i64>,
}

/// The `source` of generated CloudEvents.
pub const GEN_SOURCE: &str = "//tally/gen";

impl TimestampFormat {
    /// `ms` at this format's precision (what a record of it can carry).
    pub fn quantize(self, ms: i64) -> i64 {
        match self {
            Self::EpochS => ms - ms.rem_euclid(1000),
            _ => ms,
        }
    }

    fn write(self, ms: i64) -> String {
        match self {
            Self::EpochMs => ms.to_string(),
            Self::EpochS => ms.div_euclid(1000).to_string(),
            Self::EpochUs => (i128::from(ms) * 1000).to_string(),
            Self::Rfc3339 => format!("\"{}\"", format_utc_ms(ms)),
        }
    }
}

impl InputMapping {
    /// The record of `f` under this mapping (JSON text, no newline).
    pub fn render(&self, f: &Fields<'_>) -> String {
        let q = |s: &str| serde_json::to_string(s).expect("a string serializes");
        let mut tree = Tree::Obj(Vec::new());
        if self.format == InputFormat::Cloudevents {
            tree.insert(&[token("type")], "\"com.example.request.completed\"".into());
            tree.insert(&[token("datacontenttype")], "\"application/json\"".into());
        }
        for spec in &self.fields {
            let v = match spec.name {
                "request_id" => q(f.request_id),
                "tenant_id" => match f.tenant_id {
                    Some(t) => q(t),
                    None => continue,
                },
                "model" => q(f.model),
                "prompt_tokens" => f.prompt_tokens.to_string(),
                "completion_tokens" => f.completion_tokens.to_string(),
                "source" => q(GEN_SOURCE),
                "specversion" => q("1.0"),
                name => {
                    let Kind::Ts(t) = spec.kind else {
                        unreachable!("{name} is a timestamp")
                    };
                    match (name, f.completed_raw) {
                        ("completed_ts", Some(raw)) => raw.to_string(),
                        ("completed_ts", None) => t.write(f.completed_ts),
                        _ => t.write(f.started_ts),
                    }
                }
            };
            tree.insert(&spec.tokens, v);
        }
        tree.text()
    }
}

fn token(name: &str) -> Token {
    Token {
        name: name.into(),
        index: None,
    }
}

/// A JSON document under construction: values as text, members in insertion
/// order (the tests use it to write records members in any order).
#[derive(Debug, Clone)]
pub enum Tree {
    Leaf(String),
    Obj(Vec<(String, Tree)>),
    Arr(Vec<Tree>),
}

impl Tree {
    /// Puts `v` at `path`, creating the objects and arrays on the way (array slots
    /// before an index are `{}`).
    pub fn insert(&mut self, path: &[Token], v: String) {
        let Some((t, rest)) = path.split_first() else {
            *self = Tree::Leaf(v);
            return;
        };
        let empty = || match rest.first().and_then(|n| n.index) {
            Some(_) => Tree::Arr(Vec::new()),
            None => Tree::Obj(Vec::new()),
        };
        match self {
            Tree::Obj(members) => {
                let at = match members.iter().position(|(k, _)| *k == *t.name) {
                    Some(i) => i,
                    None => {
                        members.push((t.name.to_string(), empty()));
                        members.len() - 1
                    }
                };
                members[at].1.insert(rest, v);
            }
            Tree::Arr(items) => {
                let i = t.index.expect("an index into an array");
                while items.len() <= i {
                    items.push(Tree::Obj(Vec::new()));
                }
                items[i].insert(rest, v);
            }
            // Overlapping pointers are refused when a mapping compiles.
            Tree::Leaf(_) => {}
        }
    }

    pub fn text(&self) -> String {
        match self {
            Tree::Leaf(v) => v.clone(),
            Tree::Obj(m) => {
                let body: Vec<String> = m
                    .iter()
                    .map(|(k, v)| format!("{}:{}", serde_json::to_string(k).unwrap(), v.text()))
                    .collect();
                format!("{{{}}}", body.join(","))
            }
            Tree::Arr(a) => {
                let body: Vec<String> = a.iter().map(Tree::text).collect();
                format!("[{}]", body.join(","))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::input::InputConfig;

    #[test]
    fn rendered_records_parse_back_under_their_mapping() {
        let f = Fields {
            request_id: "r-\"1\"",
            tenant_id: Some("acme"),
            model: "small",
            prompt_tokens: 1200,
            completion_tokens: 350,
            started_ts: 1_767_261_640_250,
            completed_ts: 1_767_261_644_123,
            completed_raw: None,
        };
        let nested: InputConfig = toml::from_str(
            "tenant_id = \"/customer/id\"\nmodel = \"/usage/0/model\"\ncompleted_ts = \"/t\"\n\
             completed_ts_format = \"epoch_s\"\nstarted_ts_format = \"epoch_us\"",
        )
        .unwrap();
        let ce = InputConfig {
            format: InputFormat::Cloudevents,
            ..Default::default()
        };
        for c in [InputConfig::default(), nested, ce] {
            let m = InputMapping::new(&c).unwrap();
            let text = m.render(&f);
            let e = m
                .parse(text.as_bytes())
                .unwrap_or_else(|r| panic!("{text}: {r}"));
            assert_eq!(
                e.request_id,
                m.dedup_key(f.request_id, GEN_SOURCE),
                "{text}"
            );
            assert_eq!((e.tenant_id.as_ref(), e.model.as_ref()), ("acme", "small"));
            assert_eq!((e.prompt_tokens, e.completion_tokens), (1200, 350));
            let t = m.ts_format(super::super::COMPLETED_TS);
            assert_eq!(e.completed_ts, t.quantize(f.completed_ts), "{text}");
            assert_eq!(e.started_ts, Some(f.started_ts), "{text}");
            let missing = m.render(&Fields {
                tenant_id: None,
                ..f.clone()
            });
            assert_eq!(
                m.parse(missing.as_bytes()).unwrap_err().code(),
                "missing_field"
            );
        }
    }
}
