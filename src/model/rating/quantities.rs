//! The declared usage quantities of a job: named non-negative integer counts, some
//! of them **parts** of another (`cached_tokens` part of `prompt_tokens`).
//!
//! Invariants:
//! - `prompt_tokens` and `completion_tokens` are always declared, as ids 0 and 1: the
//!   shape tally billed before quantities existed is the degenerate case.
//! - Names are unique; a part's whole is declared; the part-of relation has no cycle
//!   (every chain ends at a quantity that is part of nothing).
//! - A request's counts are gross, as providers report them: a whole includes its
//!   parts. The count billed for a quantity is its **net**: its count less the counts
//!   of its direct parts (each part being billed, net of its own parts, on its own
//!   line). So the net counts of a tree sum to its root's count. Direct parts whose
//!   sum exceeds their whole are a rejection naming the whole and a part
//!   (`Rejection::PartExceedsWhole`), never a negative or saturated count.
//! - A quantity may be declared from a time (`set_effective_from`): before it, its
//!   count is taken as 0 (so its whole is billed in full, as before it existed).
//! - Pure: no I/O.

use std::sync::Arc;

use super::Rejection;

/// A declared quantity: its index in the `QuantitySet`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QuantityId(pub u16);

impl QuantityId {
    pub const PROMPT_TOKENS: QuantityId = QuantityId(0);
    pub const COMPLETION_TOKENS: QuantityId = QuantityId(1);

    pub fn index(self) -> usize {
        usize::from(self.0)
    }
}

/// The most quantities a job may declare (a record's counts live in a small array).
pub const MAX_QUANTITIES: usize = 64;

/// Why a declaration is refused (the config layer names the key).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("quantity {0:?} is declared twice")]
    Duplicate(String),
    #[error("quantity {part:?} is part of {whole:?}, which is not declared")]
    UnknownWhole { part: String, whole: String },
    #[error("quantity {0:?} is part of itself (through {1:?}); a chain of parts must end")]
    Cycle(String, String),
    #[error("more than {MAX_QUANTITIES} quantities are declared")]
    TooMany,
}

/// The declared quantities, in declaration order (the defaults first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuantitySet {
    names: Vec<Arc<str>>,
    whole: Vec<Option<QuantityId>>,
    /// Per quantity, its direct parts in id order.
    parts: Vec<Vec<QuantityId>>,
    /// Per quantity, from when records are read for it (`i64::MIN`: always).
    from: Vec<i64>,
}

impl Default for QuantitySet {
    /// `prompt_tokens` and `completion_tokens`, no parts.
    fn default() -> Self {
        Self::new(&[]).expect("the defaults are valid")
    }
}

impl QuantitySet {
    /// The defaults, then `decls` (`(name, part_of)`) in order. A declaration of a
    /// default name may give it a whole (none of today's configs do).
    pub fn new(decls: &[(&str, Option<&str>)]) -> Result<Self, QuantityError> {
        let mut names: Vec<Arc<str>> = vec!["prompt_tokens".into(), "completion_tokens".into()];
        let mut wholes: Vec<Option<&str>> = vec![None, None];
        for &(name, part_of) in decls {
            match names.iter().position(|n| **n == *name) {
                Some(i) if i < 2 && wholes[i].is_none() => wholes[i] = part_of,
                Some(_) => return Err(QuantityError::Duplicate(name.into())),
                None => {
                    names.push(name.into());
                    wholes.push(part_of);
                }
            }
        }
        if names.len() > MAX_QUANTITIES {
            return Err(QuantityError::TooMany);
        }
        let id = |n: &str| {
            names
                .iter()
                .position(|m| **m == *n)
                .map(|i| QuantityId(i as u16))
        };
        let mut whole = Vec::with_capacity(names.len());
        for (i, w) in wholes.iter().enumerate() {
            whole.push(match w {
                None => None,
                Some(w) => Some(id(w).ok_or_else(|| QuantityError::UnknownWhole {
                    part: names[i].to_string(),
                    whole: w.to_string(),
                })?),
            });
        }
        // A cycle: a chain longer than the set never ends.
        for (i, name) in names.iter().enumerate() {
            let mut at = whole[i];
            for _ in 0..names.len() {
                match at {
                    Some(w) if w.index() == i => {
                        let via = whole[i].map(|v| names[v.index()].to_string());
                        return Err(QuantityError::Cycle(
                            name.to_string(),
                            via.unwrap_or_default(),
                        ));
                    }
                    Some(w) => at = whole[w.index()],
                    None => break,
                }
            }
        }
        let mut parts = vec![Vec::new(); names.len()];
        for (i, w) in whole.iter().enumerate() {
            if let Some(w) = w {
                parts[w.index()].push(QuantityId(i as u16));
            }
        }
        Ok(Self {
            from: vec![i64::MIN; names.len()],
            names,
            whole,
            parts,
        })
    }

    /// From `ms` on (inclusive), records are read for `q`; before, its count is taken
    /// as 0 whatever a record says: what a config without it billed, so declaring a
    /// quantity from a time after everything billed changes no result already out.
    pub fn set_effective_from(&mut self, q: QuantityId, ms: i64) {
        self.from[q.index()] = ms;
    }

    pub fn effective_from(&self, q: QuantityId) -> i64 {
        self.from[q.index()]
    }

    /// The counts of a request at `at_ms` as rating reads them: a quantity not yet
    /// in effect is 0.
    pub fn in_effect_into(&self, counts: &[u64], at_ms: i64, out: &mut [u64]) {
        for (i, o) in out.iter_mut().enumerate() {
            let c = counts.get(i).copied().unwrap_or(0);
            *o = if at_ms >= self.from[i] { c } else { 0 };
        }
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    pub fn id(&self, name: &str) -> Option<QuantityId> {
        self.names
            .iter()
            .position(|n| **n == *name)
            .map(|i| QuantityId(i as u16))
    }

    pub fn name(&self, q: QuantityId) -> &Arc<str> {
        &self.names[q.index()]
    }

    pub fn ids(&self) -> impl Iterator<Item = QuantityId> {
        (0..self.names.len()).map(|i| QuantityId(i as u16))
    }

    /// The quantity `q` is a direct part of, if any.
    pub fn whole_of(&self, q: QuantityId) -> Option<QuantityId> {
        self.whole[q.index()]
    }

    /// Whether `a` is `b`, a part of `b` or a whole of `b` (at any depth): two such
    /// quantities counted together would count tokens twice.
    pub fn overlap(&self, a: QuantityId, b: QuantityId) -> bool {
        let within = |mut x: Option<QuantityId>, y: QuantityId| {
            while let Some(v) = x {
                if v == y {
                    return true;
                }
                x = self.whole[v.index()];
            }
            false
        };
        within(Some(a), b) || within(Some(b), a)
    }

    /// The net counts of a request's gross `counts` (one per declared quantity; a
    /// missing one is 0), written to `net` (module header).
    pub fn net_into(&self, counts: &[u64], net: &mut [u64]) -> Result<(), Rejection> {
        let gross = |q: QuantityId| counts.get(q.index()).copied().unwrap_or(0);
        for q in self.ids() {
            let whole = gross(q);
            let mut left = whole;
            for &p in &self.parts[q.index()] {
                left = left
                    .checked_sub(gross(p))
                    .ok_or_else(|| Rejection::PartExceedsWhole {
                        whole: self.names[q.index()].clone(),
                        whole_count: whole,
                        part: self.names[p.index()].clone(),
                        parts_count: self.parts[q.index()]
                            .iter()
                            .map(|&p| u128::from(gross(p)))
                            .sum(),
                    })?;
            }
            net[q.index()] = left;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn openai() -> QuantitySet {
        QuantitySet::new(&[
            ("cached_tokens", Some("prompt_tokens")),
            ("reasoning_tokens", Some("completion_tokens")),
        ])
        .unwrap()
    }

    #[test]
    fn defaults_come_first() {
        let s = QuantitySet::default();
        assert_eq!(s.len(), 2);
        assert_eq!(s.id("prompt_tokens"), Some(QuantityId::PROMPT_TOKENS));
        assert_eq!(
            s.id("completion_tokens"),
            Some(QuantityId::COMPLETION_TOKENS)
        );
    }

    #[test]
    fn a_whole_is_billed_net_of_its_parts() {
        let s = openai();
        let mut net = [0; 4];
        s.net_into(&[10_000, 500, 8_000, 200], &mut net).unwrap();
        assert_eq!(net, [2_000, 300, 8_000, 200]);
        let e = s.net_into(&[10, 0, 11, 0], &mut net).unwrap_err();
        assert_eq!(
            e,
            Rejection::PartExceedsWhole {
                whole: "prompt_tokens".into(),
                whole_count: 10,
                part: "cached_tokens".into(),
                parts_count: 11,
            }
        );
    }

    #[test]
    fn declarations_are_checked() {
        let dup = QuantitySet::new(&[("a", None), ("a", None)]);
        assert_eq!(dup, Err(QuantityError::Duplicate("a".into())));
        let unknown = QuantitySet::new(&[("a", Some("b"))]);
        assert!(matches!(unknown, Err(QuantityError::UnknownWhole { .. })));
        let cycle = QuantitySet::new(&[("a", Some("b")), ("b", Some("a"))]);
        assert!(matches!(cycle, Err(QuantityError::Cycle(..))));
        let nested = QuantitySet::new(&[("a", Some("prompt_tokens")), ("b", Some("a"))]).unwrap();
        let (p, a, b) = (QuantityId(0), QuantityId(2), QuantityId(3));
        assert!(nested.overlap(p, b) && nested.overlap(b, p) && nested.overlap(a, a));
        assert!(!nested.overlap(QuantityId(1), b));
        let many: Vec<String> = (0..MAX_QUANTITIES).map(|i| format!("q{i}")).collect();
        let many: Vec<(&str, Option<&str>)> = many.iter().map(|n| (n.as_str(), None)).collect();
        assert_eq!(QuantitySet::new(&many), Err(QuantityError::TooMany));
    }
}
