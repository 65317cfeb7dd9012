//! The secrets inside a connection string, in every form libpq accepts (pure).
//!
//! - A URI, `postgres[ql]://user:password@host/db?password=…&sslpassword=…`: the
//!   userinfo's password, and the value of every parameter whose name names a
//!   secret (names percent-decoded first, as libpq decodes them).
//! - Key/value, `host=db password='a b\'c'`: libpq's grammar — whitespace between
//!   pairs, optional spaces around `=`, values unquoted (a backslash escapes the
//!   next character) or in single quotes (with the same escapes) — and the value of
//!   every keyword that names a secret (`password`, `sslpassword`, …).
//!
//! Invariants:
//! - A span is masked as written (quotes included), and registered both as written
//!   and as the driver reads it (percent-decoded, unescaped).
//! - Where two readers differ, the wider reading wins: a URI's password runs from
//!   the userinfo's first `:` to its last `@` (libpq stops at the first `@` before a
//!   `/`, tokio-postgres at the first `@`; a password with an unencoded `@` or `/`
//!   is masked whole), and the narrower reading is registered too.
//! - What cannot be read with certainty is a secret as a whole: a connection string
//!   (a key that names one, `is_dsn_key`) that is neither a URI nor valid
//!   key/value — an unterminated quote, a keyword without `=` — is `Found::Whole`;
//!   so is any other value that fails to parse and mentions a secret word. Masking
//!   more than the password is the safe error.

use std::ops::Range;

/// One secret inside a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Secret {
    /// Where it is written in the value (quotes and escapes included).
    pub span: Range<usize>,
    /// What the driver reads there (percent-decoded or unescaped).
    pub read: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Found {
    /// The value was read; these parts are secrets (none: the value is not one).
    Parts(Vec<Secret>),
    /// The value could not be read with certainty: all of it is a secret.
    Whole,
}

/// Whether a config key holds a connection string (`sink.database_url`): any key
/// whose name ends in `url` or `dsn`.
pub(crate) fn is_dsn_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    k.ends_with("url") || k.ends_with("dsn")
}

/// The secrets of `value`, the value of a key that is a connection string
/// (`dsn`) or of any other key (a URL's password is found anywhere).
pub(crate) fn find(value: &str, dsn: bool) -> Found {
    if let Some(rest) = uri_rest(value) {
        return Found::Parts(uri(value, rest));
    }
    match key_value(value) {
        Some(parts) => Found::Parts(parts),
        None if dsn || names_a_secret(value) => Found::Whole,
        None => Found::Parts(Vec::new()),
    }
}

/// `value` with every secret replaced by `mask` (all of it for `Found::Whole`).
pub(crate) fn mask(value: &str, dsn: bool, mask: &str) -> String {
    let parts = match find(value, dsn) {
        Found::Whole => return mask.to_string(),
        Found::Parts(p) => p,
    };
    // Spans may overlap (a query inside a wide userinfo reading): merge them.
    let mut spans: Vec<Range<usize>> = parts.into_iter().map(|s| s.span).collect();
    spans.sort_by_key(|s| s.start);
    let mut out = String::with_capacity(value.len());
    let mut at = 0;
    for s in spans {
        if s.end <= at {
            continue;
        }
        let start = s.start.max(at);
        out.push_str(&value[at..start]);
        out.push_str(mask);
        at = s.end;
    }
    out.push_str(&value[at..]);
    out
}

fn names_a_secret(value: &str) -> bool {
    super::names_secret(&value.to_ascii_lowercase())
}

/// The offset just after `scheme://` when `value` starts with a URI scheme.
fn uri_rest(value: &str) -> Option<usize> {
    let (scheme, _) = value.split_once("://")?;
    let ok = !scheme.is_empty()
        && scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'));
    ok.then_some(scheme.len() + 3)
}

fn secret(value: &str, span: Range<usize>, read: String) -> Secret {
    debug_assert!(value.get(span.clone()).is_some());
    Secret { span, read }
}

/// A URI's secrets: the userinfo's password and secret query parameters.
fn uri(value: &str, rest: usize) -> Vec<Secret> {
    let mut found = Vec::new();
    let r = &value[rest..];
    // tokio-postgres: the credentials end at the first `@`, the query starts at the
    // first `?` after them. The widest reading ends the credentials at the last `@`.
    let (first_at, last_at) = (r.find('@'), r.rfind('@'));
    if let (Some(first_at), Some(last_at)) = (first_at, last_at) {
        if let Some(colon) = r[..last_at].find(':') {
            let wide = rest + colon + 1..rest + last_at;
            if !wide.is_empty() {
                found.push(secret(value, wide.clone(), decode(&value[wide])));
            }
            if let Some(c) = r[..first_at].find(':') {
                let narrow = rest + c + 1..rest + first_at;
                if !narrow.is_empty() && narrow.end < rest + last_at {
                    found.push(secret(value, narrow.clone(), decode(&value[narrow])));
                }
            }
        }
    }
    let mut queries: Vec<usize> = [first_at, last_at]
        .into_iter()
        .map(|at| at.map_or(0, |i| i + 1))
        .filter_map(|from| r[from..].find('?').map(|q| rest + from + q + 1))
        .collect();
    queries.dedup();
    for mut at in queries {
        for pair in value[at..].split('&') {
            if let Some((k, v)) = pair.split_once('=') {
                let start = at + k.len() + 1;
                // A name that does not decode cannot be told apart from a secret's.
                let secret_name =
                    crate::percent::decode_utf8(k).is_none_or(|k| super::is_secret_key(k.trim()));
                if secret_name && !v.is_empty() {
                    found.push(secret(value, start..start + v.len(), decode(v)));
                }
            }
            at += pair.len() + 1;
        }
    }
    found
}

/// What a driver reads: percent-decoded, or as written when that fails.
fn decode(s: &str) -> String {
    match crate::percent::decode(s) {
        Some(b) => String::from_utf8_lossy(&b).into_owned(),
        None => s.to_string(),
    }
}

/// libpq's `isspace` in its conninfo parser (ASCII only).
fn space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c)
}

/// Key/value secrets by libpq's grammar (`conninfo_parse`); `None` when the text
/// is not valid key/value (libpq would refuse it).
fn key_value(value: &str) -> Option<Vec<Secret>> {
    let b = value.as_bytes();
    let mut found = Vec::new();
    let mut i = 0;
    loop {
        while i < b.len() && space(b[i]) {
            i += 1;
        }
        if i == b.len() {
            return Some(found);
        }
        let name_start = i;
        while i < b.len() && b[i] != b'=' && !space(b[i]) {
            i += 1;
        }
        let name = &value[name_start..i];
        while i < b.len() && space(b[i]) {
            i += 1;
        }
        if name.is_empty() || b.get(i) != Some(&b'=') {
            return None;
        }
        i += 1;
        while i < b.len() && space(b[i]) {
            i += 1;
        }
        let start = i;
        let mut read = Vec::new();
        if b.get(i) == Some(&b'\'') {
            i += 1;
            loop {
                match b.get(i) {
                    None => return None,
                    Some(b'\\') => {
                        if let Some(&c) = b.get(i + 1) {
                            read.push(c);
                        }
                        i += 2;
                    }
                    Some(b'\'') => {
                        i += 1;
                        break;
                    }
                    Some(&c) => {
                        read.push(c);
                        i += 1;
                    }
                }
            }
        } else {
            while i < b.len() && !space(b[i]) {
                if b[i] == b'\\' {
                    i += 1;
                }
                if let Some(&c) = b.get(i) {
                    read.push(c);
                }
                i += 1;
            }
        }
        let end = i.min(b.len());
        if super::is_secret_key(name) && end > start {
            let read = String::from_utf8_lossy(&read).into_owned();
            found.push(secret(value, start..end, read));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: &str = "***";

    fn masked(v: &str) -> String {
        mask(v, true, M)
    }

    #[test]
    fn uri_userinfo_and_parameters() {
        assert_eq!(
            masked("postgres://u:p4ss@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(masked("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(
            masked("postgresql://u:a1b2@h/db?sslmode=require&password=c3d4&sslpassword=e5f6"),
            "postgresql://u:***@h/db?sslmode=require&password=***&sslpassword=***"
        );
        // An unencoded `@`, `/`, `?` or `:` in the password: masked whole.
        assert_eq!(masked("postgres://u:p@s/s?x@h/db"), "postgres://u:***@h/db");
        assert_eq!(
            masked("postgres://u:p@s?x@h/db?password=CANARY"),
            "postgres://u:***@h/db?password=***"
        );
        assert_eq!(masked("postgres://u:a:b@h/db"), "postgres://u:***@h/db");
        // A parameter name libpq decodes; one that does not decode is a secret.
        assert_eq!(
            masked("postgres://h/db?%70assword=CANARY&app=x"),
            "postgres://h/db?%70assword=***&app=x"
        );
        assert_eq!(
            masked("postgres://h/db?%zz=CANARY"),
            "postgres://h/db?%zz=***"
        );
        // Any scheme: a URL's password is a secret wherever it is.
        assert_eq!(mask("https://k:CANARY@h/", false, M), "https://k:***@h/");
        assert_eq!(mask("s3://bucket/prefix", false, M), "s3://bucket/prefix");
        let Found::Parts(p) = find("postgres://u:p%40ss@h/db", true) else {
            panic!()
        };
        assert_eq!(p[0].read, "p@ss");
    }

    #[test]
    fn key_value_by_libpq_grammar() {
        assert_eq!(masked("host=db password=CANARY"), "host=db password=***");
        assert_eq!(
            masked("host=db password = 'a b\\'c' user=x"),
            "host=db password = *** user=x"
        );
        assert_eq!(
            masked("password=a\\ b sslpassword='' port=5432"),
            "password=*** sslpassword=*** port=5432"
        );
        assert_eq!(masked("\tPASSWORD\n=\nCANARY\t"), "\tPASSWORD\n=\n***\t");
        assert_eq!(masked("host=db"), "host=db");
        assert_eq!(masked(""), "");
        let Found::Parts(p) = find("password='a b\\'c'", true) else {
            panic!()
        };
        assert_eq!(p[0].read, "a b'c");
        assert_eq!(p[0].span, 9..17);
    }

    #[test]
    fn what_cannot_be_read_is_masked_whole() {
        for bad in [
            "host=db password='CANARY",
            "host=db password CANARY",
            "host=db =CANARY",
            "password='CANARY\\'",
            "postgres:/u:CANARY@h",
        ] {
            assert_eq!(masked(bad), M, "{bad}");
        }
        // Outside a connection string key, only a value that mentions a secret is.
        assert_eq!(mask("requests", false, M), "requests");
        assert_eq!(mask("broker,cgrp", false, M), "broker,cgrp");
        assert_eq!(mask("password CANARY", false, M), M);
        assert_eq!(mask("x token=CANARY", false, M), M);
        assert_eq!(mask("a=b token=CANARY", false, M), "a=b token=***");
        assert!(is_dsn_key("database_url") && is_dsn_key("DSN") && !is_dsn_key("dir"));
    }
}
