//! One rule for secrets: a config value whose key names a secret, and the
//! passwords of any URL in the config (`user:password@`, and the `password` and
//! `sslpassword` query parameters), never reach an output.
//!
//! Secret keys: any key containing `password`, `secret` or `token`, and
//! librdkafka's `ssl.key*` (the private key and its password) and
//! `sasl.username`/`sasl.password`. The config loader registers every such value
//! (`register_from`) before anything can print it; every output tally writes text
//! to — the log writer (`RedactingWriter`) and the final error line (`redact`) —
//! replaces each registered value with `***`. Redacting at the outputs, not at
//! each message, also covers text tally does not control: librdkafka's config
//! errors quote the offending value.

use std::borrow::Cow;
use std::io::Write;
use std::sync::RwLock;

static SECRETS: RwLock<Vec<String>> = RwLock::new(Vec::new());

pub const MASK: &str = "***";

/// Whether `key` (a config key or librdkafka property, any case) names a secret.
pub fn is_secret_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    ["password", "secret", "token"]
        .iter()
        .any(|w| k.contains(w))
        || k.starts_with("ssl.key")
        || k.starts_with("ssl_key")
        || k == "sasl.username"
}

/// Remembers `value` as a secret (values shorter than 4 bytes are not: masking
/// every "ab" in a log would hide more than it protects, and say what it hides).
pub fn register(value: &str) {
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

/// The passwords a URL carries: `postgres://user:password@host/db`, and the
/// `password` and `sslpassword` query parameters (libpq's), as written.
pub fn url_passwords(url: &str) -> Vec<&str> {
    let mut found: Vec<&str> = url_password(url).into_iter().collect();
    if let Some((_, query)) = url.split_once("://").and_then(|(_, r)| r.split_once('?')) {
        for pair in query.split('&') {
            if let Some(("password" | "sslpassword", v)) = pair.split_once('=') {
                if !v.is_empty() {
                    found.push(v);
                }
            }
        }
    }
    found
}

/// The password of a URL like `postgres://user:password@host/db`, if any.
fn url_password(url: &str) -> Option<&str> {
    let rest = url.split_once("://")?.1;
    let userinfo = rest.split_once('@')?.0;
    let (_, password) = userinfo.split_once(':')?;
    (!password.is_empty()).then_some(password)
}

/// Registers every secret of a config tree: values under secret keys, and URL
/// passwords anywhere.
pub fn register_from(table: &toml::Table) {
    for (k, v) in table {
        match v {
            toml::Value::Table(t) => register_from(t),
            toml::Value::String(s) => {
                if is_secret_key(k) {
                    register(s);
                }
                for p in url_passwords(s) {
                    register(p);
                }
            }
            toml::Value::Integer(i) if is_secret_key(k) => register(&i.to_string()),
            _ => {}
        }
    }
}

/// `text` with every registered secret replaced by `***`.
pub fn redact(text: &str) -> Cow<'_, str> {
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
pub struct RedactingWriter<W: Write>(pub W);

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
        for k in ["bootstrap.servers", "session.timeout.ms", "ssl.ca.location"] {
            assert!(!is_secret_key(k), "{k}");
        }
        assert_eq!(url_password("postgres://u:p4ss@h:5432/db"), Some("p4ss"));
        assert_eq!(url_password("postgres://u@h/db"), None);
        assert_eq!(
            url_passwords("postgres://u:a1b2@h/db?sslmode=require&password=c3d4&sslpassword=e5f6"),
            ["a1b2", "c3d4", "e5f6"]
        );
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
}
