//! Domain types: events, prices and money. Pure; no I/O.

pub mod event;
pub mod money;
pub mod price;

pub use event::{DeadLetterReason, Event};
pub use money::{NanoPer1k, Pico};
pub use price::{PriceEntry, PriceError, PriceTable};
