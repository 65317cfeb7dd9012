//! `Partition`: the number of a Kafka partition, as it crosses module boundaries
//! (engine ↔ worker ↔ state ↔ checkpoint ↔ kafka ↔ metrics ↔ sink); `NextOffset`:
//! a position in one, always the offset of the next record to read.
//!
//! Invariants:
//! - It is Kafka's partition number of whichever topic the context names (the input
//!   topic for a worker's partitions, the results topic in the sink), unchanged: a
//!   partition from a broker is `>= 0`; a number read from disk is checked where it
//!   is read (`checkpoint::store` refuses a negative one).
//! - It encodes exactly as the `i32` it wraps — serde transparent, so postcard (state
//!   store, checkpoint manifests) and JSON (`report.json`) bytes are unchanged — and
//!   orders, hashes and displays as that `i32` (`Display` honours width and fill:
//!   `{p:06}` names partition files). `Debug` shows `Partition(3)`; log fields and
//!   messages that must print the bare number use `.0` or `Display`.
//! - rdkafka takes and returns bare `i32`: wrap where a partition comes from
//!   librdkafka, unwrap (`.0`) where it goes back.

use std::fmt;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Partition(pub i32);

impl fmt::Display for Partition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// The offset of the next record to read from a partition (the one Kafka
/// convention used throughout tally).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NextOffset(pub i64);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_displays_and_orders_as_the_integer() {
        for p in [0, 3, -1, i32::MAX, i32::MIN] {
            assert_eq!(
                postcard::to_allocvec(&Partition(p)).unwrap(),
                postcard::to_allocvec(&p).unwrap()
            );
            assert_eq!(
                serde_json::to_string(&Partition(p)).unwrap(),
                serde_json::to_string(&p).unwrap()
            );
            let back: Partition = serde_json::from_str(&p.to_string()).unwrap();
            assert_eq!(back, Partition(p));
            assert_eq!(Partition(p).to_string(), p.to_string());
            assert_eq!(format!("{:06}", Partition(p)), format!("{p:06}"));
            assert_eq!(format!("{:>4}", Partition(p)), format!("{p:>4}"));
        }
        assert!(Partition(-1) < Partition(0) && Partition(0) < Partition(12));
    }
}
