//! One rule for secrets: a config value whose key names a secret, and the
//! secrets inside any connection string or URL in the config (a URI's
//! `user:password@` and secret parameters, libpq's key/value `password=…`, a
//! connection string that cannot be read masked whole: `dsn`), never reach an
//! output.
//!
//! Secret keys: any key containing `password`, `secret` or `token` (not `tokens`:
//! `prompt_tokens`, `cached_tokens` and their rates are usage, not credentials), and
//! librdkafka's `ssl.key*` (the private key and its password) and
//! `sasl.username`/`sasl.password`. The config loader registers every such value
//! (`register_from`) before anything can print it; every output tally writes text
//! to — the log writer (`RedactingWriter`) and the final error line (`redact`) —
//! replaces each registered value with `***`. Redacting at the outputs, not at
//! each message, also covers text tally does not control: librdkafka's config
//! errors quote the offending value.

mod dsn;

use std::borrow::Cow;
use std::io::Write;
use std::sync::RwLock;

static SECRETS: RwLock<Vec<String>> = RwLock::new(Vec::new());

pub(crate) const MASK: &str = "***";

/// Whether `key` (a config key or librdkafka property, any case) names a secret.
pub(crate) fn is_secret_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    names_secret(&k) || k.starts_with("ssl.key") || k.starts_with("ssl_key") || k == "sasl.username"
}

/// Whether lower-case `text` names a secret: it holds `password`, `secret` or
/// `token` — but not `tokens`, which names usage (`prompt_tokens`).
pub(crate) fn names_secret(text: &str) -> bool {
    let token = text
        .match_indices("token")
        .any(|(i, w)| text.as_bytes().get(i + w.len()) != Some(&b's'));
    token || text.contains("password") || text.contains("secret")
}

/// Remembers `value` as a secret (values shorter than 4 bytes are not: masking
/// every "ab" in a log would hide more than it protects, and say what it hides).
pub(crate) fn register(value: &str) {
    if value.len() < 4 {
        return;
    }
    // The JSON log format writes a value escaped: mask that form too.
    let json = serde_json::to_string(value).unwrap_or_default();
    let escaped = json
        .get(1..json.len().saturating_sub(1))
        .unwrap_or_default();
    if let Ok(mut s) = SECRETS.write() {
        if escaped != value && !escaped.is_empty() && !s.iter().any(|v| v == escaped) {
            s.push(escaped.to_string());
        }
        if !s.iter().any(|v| v == value) {
            s.push(value.to_string());
            // Longest first, so a secret containing another is masked whole.
            s.sort_by_key(|v| std::cmp::Reverse(v.len()));
        }
    }
}

/// Registers the secrets of `value`, the value of config key `key` (its last
/// segment): all of it when the key names a secret, else what `dsn` finds in it
/// (as written and as a driver reads it; all of it when it cannot be read).
pub(crate) fn register_value(key: &str, value: &str) {
    if is_secret_key(key) {
        register(value);
        return;
    }
    match dsn::find(value, dsn::is_dsn_key(key)) {
        dsn::Found::Whole => register(value),
        dsn::Found::Parts(parts) => {
            for p in parts {
                register(&value[p.span.clone()]);
                register(&p.read);
            }
        }
    }
}

/// Registers the secrets of a connection string given outside the config
/// (`tally demo --database-url`).
pub(crate) fn register_dsn(value: &str) {
    register_value("database_url", value);
}

/// `value` (of config key `key`) as `tally config` prints it: `***` for a secret
/// key's value, whatever its length; the secrets inside a connection string or
/// URL replaced by `***`; all of it when it cannot be read.
pub(crate) fn mask_value(key: &str, value: &str) -> String {
    if is_secret_key(key) {
        return MASK.to_string();
    }
    dsn::mask(value, dsn::is_dsn_key(key), MASK)
}

/// Registers every secret of a config tree (`register_value` on every string).
pub(crate) fn register_from(table: &toml::Table) {
    for (k, v) in table {
        match v {
            toml::Value::Table(t) => register_from(t),
            toml::Value::String(s) => register_value(k, s),
            toml::Value::Integer(i) if is_secret_key(k) => register(&i.to_string()),
            _ => {}
        }
    }
}

/// `text` with every registered secret replaced by `***`.
pub(crate) fn redact(text: &str) -> Cow<'_, str> {
    let Ok(secrets) = SECRETS.read() else {
        return Cow::Owned(MASK.to_string());
    };
    let mut out = Cow::Borrowed(text);
    for s in secrets.iter() {
        if out.contains(s.as_str()) {
            out = Cow::Owned(out.replace(s.as_str(), MASK));
        }
    }
    out
}

/// A writer that redacts what passes through it. The log formatter writes one
/// whole line per call, so a secret is never split across two writes.
pub(crate) struct RedactingWriter<W: Write>(pub W);

impl<W: Write> Write for RedactingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match std::str::from_utf8(buf) {
            Ok(text) => {
                self.0.write_all(redact(text).as_bytes())?;
            }
            Err(_) => self.0.write_all(buf)?,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_keys_urls_and_masking() {
        for k in [
            "sasl.password",
            "ssl.key.password",
            "ssl.key.pem",
            "sasl.oauthbearer.client.secret",
            "SASL_PASSWORD",
            "api_token",
        ] {
            assert!(is_secret_key(k), "{k}");
        }
        for k in [
            "bootstrap.servers",
            "session.timeout.ms",
            "ssl.ca.location",
            // Usage quantities (an input pointer, a rate): not credentials.
            "prompt_tokens",
            "cache_read_input_tokens",
        ] {
            assert!(!is_secret_key(k), "{k}");
        }
        for k in [
            "token",
            "access_token_file",
            "sasl.oauthbearer.token.endpoint.url",
        ] {
            assert!(is_secret_key(k), "{k}");
        }
        let table: toml::Table = r#"
            [kafka]
            "sasl.password" = "UNIT-CANARY-1"
            [sink]
            database_url = "postgres://billing:UNIT-CANARY-2@db/tally"
        "#
        .parse()
        .unwrap();
        register_from(&table);
        assert_eq!(
            redact("x UNIT-CANARY-1 y postgres://billing:UNIT-CANARY-2@db"),
            "x *** y postgres://billing:***@db"
        );
        let mut out = Vec::new();
        RedactingWriter(&mut out)
            .write_all(b"error: UNIT-CANARY-1\n")
            .unwrap();
        assert_eq!(out, b"error: ***\n");
    }

    /// Issue 33, item 8: libpq's key/value form, quoted and escaped, and a
    /// connection string that cannot be read, registered for every output.
    #[test]
    fn key_value_and_unreadable_connection_strings_are_registered() {
        register_value(
            "database_url",
            "host=db password = 'UNIT-CANARY-kv \\'x' user=u",
        );
        assert_eq!(
            redact("password 'UNIT-CANARY-kv \\'x' read UNIT-CANARY-kv 'x"),
            "password *** read ***"
        );
        register_value("database_url", "host=db password='UNIT-CANARY-open");
        assert_eq!(redact("[host=db password='UNIT-CANARY-open]"), "[***]");
        register_dsn("postgres://u:UNIT-CANARY-p%40ct@h/db");
        assert_eq!(redact("UNIT-CANARY-p@ct"), "***");
        assert_eq!(
            mask_value("database_url", "host=h password=UNIT-CANARY-m"),
            "host=h password=***"
        );
        assert_eq!(mask_value("sasl.password", "ab"), "***");
    }
}
