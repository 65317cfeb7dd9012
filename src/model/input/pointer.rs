//! JSON Pointers (RFC 6901) as the input mapping uses them: `/customer/id`.
//!
//! Invariants:
//! - A pointer is `""` (the whole document) or a sequence of `/`-prefixed reference
//!   tokens; in a token `~1` is `/` and `~0` is `~` (decoded in that order, as the
//!   RFC says), and any other `~` is an error.
//! - A token matches an object member by its exact (unescaped) name, and an array
//!   element when it is an index: `0`, or digits without a leading zero.
//! - Pure: no I/O.

/// One reference token, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub name: Box<str>,
    /// The array index this token also names, if it is one.
    pub index: Option<usize>,
}

/// Parses `text` into its tokens; the error says what is wrong with it.
pub fn parse(text: &str) -> Result<Vec<Token>, String> {
    if text.is_empty() {
        return Ok(Vec::new());
    }
    let Some(rest) = text.strip_prefix('/') else {
        return Err(format!(
            "{text:?} is not a JSON Pointer: it must start with '/' (e.g. \"/customer/id\")"
        ));
    };
    rest.split('/').map(|raw| token(text, raw)).collect()
}

fn token(text: &str, raw: &str) -> Result<Token, String> {
    let mut name = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c != '~' {
            name.push(c);
            continue;
        }
        match chars.next() {
            Some('0') => name.push('~'),
            Some('1') => name.push('/'),
            _ => {
                return Err(format!(
                    "{text:?} is not a JSON Pointer: '~' must be followed by '0' (for '~') or \
                     '1' (for '/')"
                ))
            }
        }
    }
    let index = (!name.is_empty()
        && name.bytes().all(|b| b.is_ascii_digit())
        && (name == "0" || !name.starts_with('0')))
    .then(|| name.parse().ok())
    .flatten();
    Ok(Token {
        name: name.into(),
        index,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(p: &str) -> Vec<String> {
        parse(p)
            .unwrap()
            .iter()
            .map(|t| t.name.to_string())
            .collect()
    }

    #[test]
    fn tokens_are_decoded_as_the_rfc_says() {
        assert_eq!(names("/customer/id"), ["customer", "id"]);
        assert_eq!(names("/a~1b/m~0n"), ["a/b", "m~n"]);
        // ~01 is "~1", not "/": ~1 is decoded first.
        assert_eq!(names("/~01"), ["~1"]);
        assert_eq!(names("/"), [""]);
        assert!(parse("").unwrap().is_empty());
        assert!(parse("customer").is_err());
        assert!(parse("/a~2").is_err());
        assert!(parse("/a~").is_err());
    }

    #[test]
    fn indexes_have_no_leading_zero() {
        let idx = |p: &str| parse(p).unwrap()[0].index;
        assert_eq!(idx("/0"), Some(0));
        assert_eq!(idx("/12"), Some(12));
        assert_eq!(idx("/012"), None);
        assert_eq!(idx("/-"), None);
        assert_eq!(idx("/1a"), None);
    }
}
