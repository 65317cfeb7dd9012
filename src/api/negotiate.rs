//! Content negotiation (RFC 9110 §12.5.1) between the representations a route
//! offers, and the CSV rule against formulas (OWASP "CSV injection").
//!
//! Invariants: a media range's `q` is that of the most specific range that
//! matches (`text/csv` over `text/*` over `*/*`); `q=0` means "not acceptable",
//! so `text/csv;q=0` never selects CSV; when nothing offered is acceptable the
//! route answers 406. No `Accept` header accepts anything. Pure: no I/O.

/// What a route can answer with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Offer {
    Json,
    Csv,
}

impl Offer {
    fn media(self) -> (&'static str, &'static str) {
        match self {
            Offer::Json => ("application", "json"),
            Offer::Csv => ("text", "csv"),
        }
    }
}

/// The q-value (0–1000) `accept` gives `offer`, and how specific the range
/// that decided it was (2 exact, 1 `type/*`, 0 `*/*`); `None` if no range
/// matches.
fn quality(accept: &str, offer: Offer) -> Option<(u16, u8)> {
    let (ty, sub) = offer.media();
    let mut best: Option<(u16, u8)> = None;
    for range in accept.split(',') {
        let mut parts = range.split(';');
        let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        let Some((t, s)) = media.split_once('/') else {
            continue;
        };
        let specificity = match (t, s) {
            _ if t == ty && s == sub => 2,
            _ if t == ty && s == "*" => 1,
            ("*", "*") => 0,
            _ => continue,
        };
        let q = parts
            .filter_map(|p| p.trim().strip_prefix("q=").or(p.trim().strip_prefix("Q=")))
            .map(parse_q)
            .next()
            .unwrap_or(Some(1000));
        let Some(q) = q else {
            continue;
        };
        if best.is_none_or(|(_, spec)| specificity > spec) {
            best = Some((q, specificity));
        }
    }
    best
}

/// A q-value as thousandths: `1`, `0.5`, `0.001`; `None` if malformed.
fn parse_q(s: &str) -> Option<u16> {
    let s = s.trim();
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let whole: u16 = match int {
        "0" => 0,
        "1" => 1000,
        _ => return None,
    };
    let thousandths: u16 = format!("{frac:0<3}").parse().ok()?;
    (whole + thousandths <= 1000).then_some(whole + thousandths)
}

/// Which of `offers` (in order of preference) to answer with, given the
/// `Accept` header values; `None`: none is acceptable (406).
pub(crate) fn choose(accept: &[&str], offers: &[Offer]) -> Option<Offer> {
    if accept.is_empty() {
        return offers.first().copied();
    }
    let header = accept.join(",");
    let mut best: Option<(Offer, u16, u8)> = None;
    for &offer in offers {
        let Some((q, spec)) = quality(&header, offer) else {
            continue;
        };
        if q == 0 {
            continue;
        }
        // A higher q wins; on a tie, the offer named exactly (an explicit
        // `Accept: text/csv` beside `*/*`), then the route's preference.
        let better = best.is_none_or(|(_, bq, bs)| (q, spec) > (bq, bs));
        if better {
            best = Some((offer, q, spec));
        }
    }
    best.map(|(o, _, _)| o)
}

/// A CSV text cell that a spreadsheet would run as a formula — one that begins
/// with `=`, `+`, `-`, `@`, a tab or a carriage return — gets a leading `'`
/// (OWASP); the cell is then quoted as RFC 4180 requires. Only cells of text
/// from the data (tenant ids, model names) go through here.
pub(crate) fn csv_text(s: &str) -> String {
    let neutral = if s.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{s}")
    } else {
        s.to_string()
    };
    if neutral.contains([',', '"', '\r', '\n', '\'']) {
        format!("\"{}\"", neutral.replace('"', "\"\""))
    } else {
        neutral
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Offer::{Csv, Json};

    #[test]
    fn q_values_decide_and_q0_excludes() {
        let both = [Json, Csv];
        for (accept, want) in [
            (vec![], Some(Json)),
            (vec!["application/json"], Some(Json)),
            (vec!["text/csv"], Some(Csv)),
            (vec!["text/csv;q=0"], None),
            (vec!["text/csv;q=0", "*/*"], Some(Json)),
            (vec!["text/csv;q=0, */*;q=0.1"], Some(Json)),
            (vec!["text/*;q=0.9, application/json;q=0.5"], Some(Csv)),
            (vec!["text/csv;q=0.4, application/json;q=0.5"], Some(Json)),
            (vec!["*/*"], Some(Json)),
            (vec!["text/csv, */*"], Some(Csv)),
            (vec!["text/csv", "application/json"], Some(Json)),
            (vec!["image/png"], None),
            (vec!["text/*;q=0, */*"], Some(Json)),
            (vec!["TEXT/CSV; Q=1"], Some(Csv)),
            (vec!["text/csv;q=2"], None),
            (vec!["application/json;q=0, text/csv;q=0.001"], Some(Csv)),
        ] {
            assert_eq!(choose(&accept, &both), want, "{accept:?}");
        }
        assert_eq!(choose(&["text/csv"], &[Json]), None);
        assert_eq!(choose(&["*/*;q=0.2"], &[Json]), Some(Json));
    }

    #[test]
    fn formula_cells_are_neutralised_then_quoted() {
        for (cell, want) in [
            ("acme", "acme"),
            ("=HYPERLINK(\"x\")", "\"'=HYPERLINK(\"\"x\"\")\""),
            ("+1", "\"'+1\""),
            ("-2", "\"'-2\""),
            ("@SUM(A1)", "\"'@SUM(A1)\""),
            ("\tx", "\"'\tx\""),
            ("\rx", "\"'\rx\""),
            ("a,b", "\"a,b\""),
            ("it's", "\"it's\""),
            ("a=b", "a=b"),
        ] {
            assert_eq!(csv_text(cell), want, "{cell:?}");
        }
    }
}
