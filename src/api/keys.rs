//! API keys: who may read which tenants (docs/API.md#authentication).
//!
//! - A key is `tally_` and 64 hex digits (32 bytes from the OS's random source).
//!   Its clear text is printed once, when it is minted (`tally api-key create`),
//!   and never stored: the keys file (`api.keys_file`) holds one line per key,
//!   `<id> <scope> sha256:<hex of SHA-256 of the key>`. A key has 256 bits of
//!   entropy, so a fast hash is enough (as for GitHub's tokens): nothing can be
//!   guessed from a hash, and a lookup by hash compares no secret byte by byte.
//! - A scope is `admin` (every tenant) or `tenant:<id>[,<id>…]`, each tenant id
//!   percent-encoded where it holds a comma, a space or a `%` (`percent`).
//! - Invariants: a file with a malformed line is refused whole (naming the line),
//!   so a typo never leaves a key out or in; ids and hashes are unique. Pure:
//!   parsing and checking do no I/O but the file read in `load`.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;
use std::path::Path;

use sha2::{Digest, Sha256};

/// What a key may read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Scope {
    /// Every tenant, and the tenants listing.
    Admin,
    /// Only these tenants: any other answers as unknown.
    Tenants(BTreeSet<String>),
}

impl Scope {
    pub(crate) fn parse(s: &str) -> Result<Scope, String> {
        if s == "admin" {
            return Ok(Scope::Admin);
        }
        let Some(list) = s.strip_prefix("tenant:") else {
            return Err(format!(
                "scope {s:?}: expected `admin` or `tenant:<id>[,<id>…]`"
            ));
        };
        let mut tenants = BTreeSet::new();
        for t in list.split(',') {
            let id = crate::percent::decode_utf8(t)
                .ok_or_else(|| format!("scope {s:?}: {t:?} is not valid percent-encoded UTF-8"))?;
            if id.is_empty() {
                return Err(format!("scope {s:?}: an empty tenant id"));
            }
            tenants.insert(id);
        }
        Ok(Scope::Tenants(tenants))
    }

    /// Whether this scope may read `tenant`.
    pub(crate) fn allows(&self, tenant: &str) -> bool {
        match self {
            Scope::Admin => true,
            Scope::Tenants(t) => t.contains(tenant),
        }
    }

    /// The scope as the keys file writes it.
    fn render(&self) -> String {
        match self {
            Scope::Admin => "admin".into(),
            Scope::Tenants(t) => {
                let ids: Vec<String> = t.iter().map(|id| encode(id)).collect();
                format!("tenant:{}", ids.join(","))
            }
        }
    }
}

/// Percent-encodes what would break a scope: `%`, `,`, whitespace, controls.
fn encode(id: &str) -> String {
    let mut out = String::with_capacity(id.len());
    for c in id.chars() {
        if c == '%' || c == ',' || c.is_whitespace() || c.is_control() {
            let mut buf = [0; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                let _ = write!(out, "%{b:02X}");
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// One key of the file (its hash is the map's key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Key {
    /// A name for people and logs (never secret).
    pub id: String,
    pub scope: Scope,
}

/// The keys of `api.keys_file`, by the hash of their clear text.
#[derive(Debug, Default)]
pub(crate) struct Keys {
    by_hash: HashMap<[u8; 32], Key>,
}

/// Why a request's credentials are refused (answered 401).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// No `Authorization` header.
    Missing,
    /// Not `Bearer <key>`, or not a tally key.
    Malformed,
    /// A well-formed key no line of the file holds (wrong, or revoked).
    Unknown,
}

impl Refused {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Refused::Missing => "missing",
            Refused::Malformed => "malformed",
            Refused::Unknown => "unknown",
        }
    }
}

const PREFIX: &str = "tally_";

fn hash(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn unhex(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

impl Keys {
    /// Parses a keys file: `<id> <scope> sha256:<hex>` per line; blank lines and
    /// `#` comments are skipped. The error names the line.
    pub(crate) fn parse(text: &str) -> Result<Keys, String> {
        let mut keys = Keys::default();
        let mut ids = BTreeSet::new();
        for (n, line) in text.lines().enumerate().map(|(i, l)| (i + 1, l.trim())) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [id, scope, digest] = fields[..] else {
                return Err(format!(
                    "line {n}: expected `<id> <scope> sha256:<hex>` (three fields)"
                ));
            };
            if !valid_id(id) {
                return Err(format!(
                    "line {n}: key id {id:?}: letters, digits, '-', '_' and '.' only (at most 64)"
                ));
            }
            let scope = Scope::parse(scope).map_err(|e| format!("line {n}: {e}"))?;
            let h = digest
                .strip_prefix("sha256:")
                .and_then(unhex)
                .ok_or_else(|| format!("line {n}: the hash must be sha256:<64 hex digits>"))?;
            if !ids.insert(id.to_string()) {
                return Err(format!("line {n}: key id {id:?} appears twice"));
            }
            let key = Key {
                id: id.to_string(),
                scope,
            };
            if keys.by_hash.insert(h, key).is_some() {
                return Err(format!("line {n}: the same key appears twice"));
            }
        }
        Ok(keys)
    }

    /// Reads and parses `path`.
    pub(crate) fn load(path: &Path) -> Result<Keys, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Keys::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    pub(crate) fn len(&self) -> usize {
        self.by_hash.len()
    }

    /// The key an `Authorization` header value presents.
    pub(crate) fn check(&self, authorization: Option<&str>) -> Result<&Key, Refused> {
        let value = authorization.ok_or(Refused::Missing)?;
        let (scheme, token) = value.trim().split_once(' ').ok_or(Refused::Malformed)?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(Refused::Malformed);
        }
        let token = token.trim();
        let well_formed = token
            .strip_prefix(PREFIX)
            .is_some_and(|hex| unhex(hex).is_some());
        if !well_formed {
            return Err(Refused::Malformed);
        }
        self.by_hash.get(&hash(token)).ok_or(Refused::Unknown)
    }
}

/// A new key for `id` with `scope`: its clear text (to show once) and its line
/// for the keys file. `random` is 32 bytes from the OS.
pub(crate) fn mint(id: &str, scope: &Scope, random: [u8; 32]) -> Result<(String, String), String> {
    if !valid_id(id) {
        return Err(format!(
            "key id {id:?}: letters, digits, '-', '_' and '.' only (at most 64)"
        ));
    }
    let key = format!("{PREFIX}{}", hex(&random));
    let line = format!("{id} {} sha256:{}", scope.render(), hex(&hash(&key)));
    Ok((key, line))
}

/// 32 bytes from the OS's random source.
pub(crate) fn random_bytes() -> std::io::Result<[u8; 32]> {
    use std::io::Read;
    let mut out = [0; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenants(ids: &[&str]) -> Scope {
        Scope::Tenants(ids.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn a_minted_key_is_found_by_its_line_and_nothing_else_is() {
        let scope = tenants(&["acme", "a,b c%"]);
        let (key, line) = mint("acme-dash", &scope, [7; 32]).unwrap();
        let (other, _) = mint("other", &Scope::Admin, [8; 32]).unwrap();
        assert!(!line.contains(&key[PREFIX.len()..]), "{line}");
        let keys = Keys::parse(&format!("# a comment\n\n{line}\n")).unwrap();
        let found = keys.check(Some(&format!("Bearer {key}"))).unwrap();
        assert_eq!((found.id.as_str(), &found.scope), ("acme-dash", &scope));
        assert!(found.scope.allows("a,b c%") && !found.scope.allows("globex"));
        assert_eq!(
            keys.check(Some(&format!("bearer  {key} "))).map(|k| &k.id),
            Ok(&"acme-dash".to_string())
        );
        assert_eq!(keys.check(None), Err(Refused::Missing));
        assert_eq!(
            keys.check(Some(&format!("Bearer {other}"))),
            Err(Refused::Unknown)
        );
        for bad in [
            "Basic dXNlcjpwYXNz".to_string(),
            "Bearer".to_string(),
            format!("Bearer {}", &key[..key.len() - 1]),
            format!("Token {key}"),
            "Bearer tally_zz".to_string(),
        ] {
            assert_eq!(keys.check(Some(&bad)), Err(Refused::Malformed), "{bad}");
        }
    }

    #[test]
    fn a_malformed_file_is_refused_naming_the_line() {
        let (_, line) = mint("a", &Scope::Admin, [1; 32]).unwrap();
        let (_, same_id) = mint("a", &Scope::Admin, [2; 32]).unwrap();
        for (text, want) in [
            (format!("{line}\nb admin\n"), "line 2: expected"),
            (
                format!("{line}\n{same_id}\n"),
                "line 2: key id \"a\" appears twice",
            ),
            ("x tenant: sha256:00".to_string(), "line 1: scope"),
            ("x admin md5:00".to_string(), "line 1: the hash"),
            ("x/y admin sha256:00".to_string(), "line 1: key id"),
            ("x everyone sha256:00".to_string(), "line 1: scope"),
        ] {
            let e = Keys::parse(&text).unwrap_err();
            assert!(e.starts_with(want), "{e} (wanted {want})");
        }
    }

    #[test]
    fn keys_differ_by_their_randomness() {
        let a = mint("a", &Scope::Admin, random_bytes().unwrap()).unwrap();
        let b = mint("a", &Scope::Admin, random_bytes().unwrap()).unwrap();
        assert_ne!(a.0, b.0);
        assert_eq!(a.0.len(), PREFIX.len() + 64);
    }
}
