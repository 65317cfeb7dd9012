//! `tally-dev`: the development commands — the chaos run and the benchmarks —
//! kept out of the production `tally` binary. They drive the `tally` binary built
//! beside this one (`cargo build --bins`).

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tally::devtools::{
    bench, bench_api, bench_kafka, bench_memory, bench_sink, bench_state, certs, chaos,
};

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug)]
#[command(
    name = "tally-dev",
    version,
    about = "tally's development commands: the chaos run and the benchmarks (not for production)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Scale-out acceptance run: N workers, random SIGKILLs, exact totals, one report.
    Chaos(chaos::ChaosArgs),
    /// Chaos campaign: many short randomized chaos runs back to back (layouts,
    /// workers, stores, protocols, membership, faults), a JSON report and a
    /// Markdown summary; a failing run prints the command that replays it.
    ChaosCampaign(chaos::campaign::CampaignArgs),
    /// Benchmark: the engine over a file vs a parse-only baseline, same run.
    BenchEngine(bench::BenchEngineArgs),
    /// Benchmark: tally draining a preloaded topic vs a raw consume+parse baseline.
    BenchKafka(bench_kafka::BenchKafkaArgs),
    /// Benchmark: `tally sink` applying a results topic vs a plain batched upsert loop.
    BenchSink(bench_sink::BenchSinkArgs),
    /// Benchmark: the usage API's latency per query, and its queries' plans.
    BenchApi(bench_api::BenchApiArgs),
    /// Benchmark: checkpoint pause, duration, size and restore time by open windows.
    BenchCheckpoint(bench::BenchArgs),
    /// Benchmark: long lateness over many tenants under a memory budget.
    BenchLateness(bench_state::LatenessArgs),
    /// Benchmark: tens of millions of live dedup ids, with and without a budget.
    BenchDedup(bench_state::DedupArgs),
    /// Benchmark: peak RSS against the memory budget, per case (restore included).
    BenchMemory(bench_memory::MemoryArgs),
    /// Throw-away TLS certificates (CA, server for localhost/127.0.0.1, client,
    /// a second CA) for `tally dev-broker --tls-*` and a TLS PostgreSQL.
    Certs(CertsArgs),
}

#[derive(clap::Args, Debug)]
struct CertsArgs {
    /// Directory to write ca.pem, server.pem/.key, client.pem/.key, other-ca.pem.
    #[arg(long)]
    out: std::path::PathBuf,
    /// Encrypt client.key with this password (librdkafka's `ssl.key.password`).
    #[arg(long, env = "TALLY_DEV_CLIENT_KEY_PASSWORD", hide_env_values = true)]
    client_key_password: Option<String>,
}

fn main() -> ExitCode {
    tally::base::alloc::purge_freed_memory_at_once();
    tally::base::alloc::bound_system_arenas();
    let cli = Cli::parse();
    tally::cli::init_logging();
    tally::base::shutdown::install();
    let result = match cli.command {
        Command::Chaos(a) => chaos::run(a),
        Command::ChaosCampaign(a) => chaos::campaign::run(a),
        Command::BenchEngine(a) => bench::run_engine(a),
        Command::BenchKafka(a) => bench_kafka::run(a),
        Command::BenchSink(a) => bench_sink::run(a),
        Command::BenchApi(a) => bench_api::run(a),
        Command::BenchCheckpoint(a) => bench::run(a),
        Command::BenchLateness(a) => bench_state::run_lateness(a),
        Command::BenchDedup(a) => bench_state::run_dedup(a),
        Command::BenchMemory(a) => bench_memory::run(a),
        Command::Certs(a) => certs::generate(&a.out, a.client_key_password.as_deref()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tally-dev: error: {}", tally::cli::error_chain(&e));
            ExitCode::from(1)
        }
    }
}
