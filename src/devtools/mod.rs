//! Development support: the `tally-dev` commands (the chaos run, the benchmarks)
//! and the service harness they share with the integration tests (`support`).
//! No production command uses this module; it lives in the library so that
//! `tally-dev`, `tests/it` and the benchmarks drive exactly the code users run.

pub mod bench;
pub mod bench_api;
mod bench_api_plans;
pub mod bench_kafka;
pub mod bench_memory;
pub mod bench_memory_kafka;
pub mod bench_sink;
pub mod bench_state;
pub mod certs;
pub mod chaos;
pub mod rig;
pub mod support;
