//! The integration suite: one test binary (it links librdkafka and RocksDB once),
//! one module per area. Every test runs on real services — `tally dev-broker`
//! processes and the PostgreSQL cluster `scripts/test.sh` starts (see `common`).

mod alerts;
mod api_csv;
mod api_http;
mod api_keys;
mod api_limits;
mod api_openapi;
mod api_quantities;
mod api_queries;
mod api_stream;
mod codebase;
mod common;
mod compose;
mod crafted;
mod defaults;
mod demo;
mod endpoints;
mod evolution;
mod exit_codes;
mod file_mode;
mod finality;
mod harness;
mod input_mapping;
mod late;
mod object_store;
mod onboarding;
mod openapi_check;
mod pipeline;
mod poison;
mod producer;
mod rating;
mod rating_evolution;
mod rating_stream;
mod recovery;
mod s3_proxy;
mod scaleout;
mod semantics;
mod service;
mod signals;
mod sink_batch;
mod state_budget;
mod store_faults;
mod tls;
mod transactions;
mod usage_api;
