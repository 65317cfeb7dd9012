//! tally: a durable, event-time stream processor for usage billing.
//!
//! Data flows one way: source → partition task → outputs (DESIGN.md).
//! `model`, `time` and `engine` are pure; `state`, `kafka`, `sink` and `worker`
//! are the I/O edges.

pub mod config;
pub mod engine;
pub mod model;
pub mod time;
