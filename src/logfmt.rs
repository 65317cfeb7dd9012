//! Log field values that are lists, written for people and log shippers alike
//! (no Rust `Debug` in the log): `pairs` gives `0:17,1:4` (e.g. partition and
//! offset), `list` gives `0,1,3`.

use std::fmt::Display;

/// `a:b,c:d` — each key and value by `Display`.
pub(crate) fn pairs<K: Display, V: Display>(items: impl IntoIterator<Item = (K, V)>) -> String {
    items
        .into_iter()
        .map(|(k, v)| format!("{k}:{v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// `a,b,c`.
pub(crate) fn list<T: Display>(items: &[T]) -> String {
    items
        .iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    #[test]
    fn shapes() {
        assert_eq!(super::pairs([(0, 17), (1, 4)]), "0:17,1:4");
        assert_eq!(super::pairs(Vec::<(i32, i64)>::new()), "");
        assert_eq!(super::list(&[0, 1, 3]), "0,1,3");
    }
}
