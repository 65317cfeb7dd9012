//! Strict percent-decoding (RFC 3986 §2.1), shared by the readers of connection
//! strings (`sink::connect`, `secrets::dsn`) and of URL paths (`api::params`).
//!
//! Invariant: a `%` must be followed by two hex digits, else the whole string is
//! refused (`None`); nothing else is decoded (`+` stays `+`). Pure: no I/O.

/// The bytes `s` encodes, or `None` for a `%` without two hex digits.
pub(crate) fn decode(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3)?;
            // `from_str_radix` alone would take a sign (`%+1`).
            if !hex.iter().all(u8::is_ascii_hexdigit) {
                return None;
            }
            out.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Some(out)
}

/// `decode`, when the bytes are UTF-8.
pub(crate) fn decode_utf8(s: &str) -> Option<String> {
    String::from_utf8(decode(s)?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_percent_decoding() {
        assert_eq!(decode_utf8("a%20b%2Fc+d").as_deref(), Some("a b/c+d"));
        assert_eq!(decode_utf8("%C3%A9").as_deref(), Some("é"));
        assert_eq!(decode("%00"), Some(vec![0]));
        for bad in ["%", "%2", "%zz", "%+1", "%-1", "a%2"] {
            assert_eq!(decode(bad), None, "{bad}");
        }
        assert_eq!(decode_utf8("%FF"), None);
    }
}
