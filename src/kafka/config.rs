//! `[kafka]` and `[topics]`: the cluster, the group and the topics
//! (docs/reference/configuration.md). The sections are this subsystem's; the config
//! tree (`config`) holds them (and the environment overrides of `[kafka]`'s
//! librdkafka properties), and calls `validate` from its own.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::OWNED_CONSUMER_PROPERTIES;
use crate::base::duration::Millis;
use crate::base::InvalidKey;

/// `[kafka]`: the two named keys plus librdkafka pass-through properties.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(try_from = "BTreeMap<String, toml::Value>")]
pub struct KafkaConfig {
    pub bootstrap_servers: String,
    pub group_id: String,
    /// How long a command waits at start for the cluster to answer before it
    /// exits 4 with the last broker error (a TLS or SASL failure names itself).
    pub connect_timeout: Millis,
    /// librdkafka properties (keys with a dot), verbatim.
    #[serde(flatten)]
    pub properties: BTreeMap<String, String>,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        Self {
            bootstrap_servers: "127.0.0.1:9092".into(),
            group_id: "tally".into(),
            connect_timeout: Millis(30_000),
            properties: BTreeMap::new(),
        }
    }
}

impl KafkaConfig {
    /// The keys of `[kafka]` that are tally's, not librdkafka's (in the
    /// environment, their `_` stays `_`).
    pub(crate) const OWN_KEYS: [&'static str; 3] =
        ["bootstrap_servers", "group_id", "connect_timeout"];
}

impl TryFrom<BTreeMap<String, toml::Value>> for KafkaConfig {
    type Error = String;
    fn try_from(map: BTreeMap<String, toml::Value>) -> Result<Self, String> {
        let mut k = KafkaConfig::default();
        for (key, v) in map {
            let s = match v {
                toml::Value::String(s) => s,
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::Boolean(b) => b.to_string(),
                other => {
                    return Err(format!(
                        "kafka.{key}: expected a string, got {}",
                        other.type_str()
                    ))
                }
            };
            match key.as_str() {
                "bootstrap_servers" => k.bootstrap_servers = s,
                "group_id" => k.group_id = s,
                "connect_timeout" => {
                    k.connect_timeout =
                        Millis::parse(&s).map_err(|e| format!("kafka.connect_timeout: {e}"))?
                }
                // `debug` is the one common librdkafka property without a dot.
                p if p.contains('.') || p == "debug" => {
                    k.properties.insert(key, s);
                }
                _ => {
                    return Err(format!(
                    "unknown key `kafka.{key}` (known: {}; librdkafka properties contain a dot, \
                         e.g. \"session.timeout.ms\")",
                    KafkaConfig::OWN_KEYS.join(", ")
                ))
                }
            }
        }
        Ok(k)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TopicsConfig {
    pub input: String,
    pub results: String,
    pub late: String,
    pub dead_letter: String,
}

impl Default for TopicsConfig {
    fn default() -> Self {
        Self {
            input: "requests".into(),
            results: "tenant-cost".into(),
            late: "requests.late".into(),
            dead_letter: "requests.dlq".into(),
        }
    }
}

impl KafkaConfig {
    /// The section's own checks; each error names the key.
    pub(crate) fn validate(&self) -> Result<(), InvalidKey> {
        if self.group_id.is_empty() {
            return Err(InvalidKey::new("kafka.group_id", "must not be empty"));
        }
        for owned in OWNED_CONSUMER_PROPERTIES {
            if let Some(v) = self.properties.get(owned.key) {
                return Err(InvalidKey::new(
                    format!("kafka.\"{}\"", owned.key),
                    format!(
                        "is set to {v:?}, but tally sets it itself (to {:?}): {}. Remove the key.",
                        owned.value, owned.why
                    ),
                ));
            }
        }
        Ok(())
    }
}

impl TopicsConfig {
    /// The section's own checks; each error names the key.
    pub(crate) fn validate(&self) -> Result<(), InvalidKey> {
        for (key, v) in [
            ("topics.input", &self.input),
            ("topics.results", &self.results),
            ("topics.late", &self.late),
            ("topics.dead_letter", &self.dead_letter),
        ] {
            if v.is_empty() {
                return Err(InvalidKey::new(key, "must not be empty"));
            }
        }
        if self.input == self.results || self.input == self.late {
            return Err(InvalidKey::new(
                "topics.input",
                "must differ from topics.results and topics.late",
            ));
        }
        Ok(())
    }
}
