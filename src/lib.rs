//! tally: a durable, event-time stream processor for usage billing.
//!
//! Data flows one way: source → partition task → outputs (docs/DESIGN.md, docs/architecture.md).
//! `model`, `time` and `engine` are pure; `state`, `kafka`, `sink` and `worker`
//! are the I/O edges. `base` is the ground floor every layer may import; which
//! module may import which is docs/DEVELOPING.md#layers (checked by the test
//! `codebase` in tests/it).

pub(crate) mod api;
pub mod base;
pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod devtools;
pub mod engine;
pub mod explain;
pub(crate) mod failpoint;
pub mod gen;
pub mod kafka;
pub(crate) mod logfmt;
pub mod metrics;
pub mod model;
pub(crate) mod percent;
pub(crate) mod progress;
pub(crate) mod reprocess;
pub(crate) mod secrets;
pub(crate) mod service;
pub mod sink;
pub mod state;
pub mod time;
pub mod worker;

#[cfg(test)]
mod untrusted_tests;
