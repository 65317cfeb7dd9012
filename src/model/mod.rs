//! Domain types: events, prices, money and partitions, and the input mapping that
//! reads events. Pure; no I/O.

pub mod event;
pub mod input;
pub mod money;
pub mod partition;
pub mod price;

pub use event::{DeadLetterReason, Event};
pub use money::{NanoPer1k, Pico};
pub use partition::Partition;
pub use price::{PriceEntry, PriceError, PriceTable};
