//! Command-line interface (docs/DESIGN.md §11). One file per command; each builds its
//! inputs from the config and calls into the library.

mod api_key;
mod broker;
mod checkpoints;
mod config_check;
pub(crate) mod demo;
pub mod exit;
pub(crate) mod explain;
mod gen;
mod gen_rated;
mod reprocess;
mod run;

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use crate::config::Config;

#[derive(Parser, Debug)]
#[command(
    name = "tally",
    version,
    about = "Durable, exact, event-time usage billing over Kafka",
    long_about = "tally reads completed API requests from Kafka, prices them with an integer price table, \
and produces the cost of every tenant for every window — in event time (completed_ts), exactly, durably.\n\n\
Every config key can be overridden by an environment variable TALLY_<SECTION>__<KEY>, \
e.g. TALLY_KAFKA__BOOTSTRAP_SERVERS=127.0.0.1:9092."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Args, Debug, Clone)]
pub struct ConfigArg {
    /// Config file (TOML). Without it, built-in defaults plus TALLY_* environment variables.
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,
}

impl ConfigArg {
    pub fn load(&self) -> anyhow::Result<Config> {
        let cfg = Config::load(self.config.as_deref())?;
        Ok(cfg)
    }
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run one worker of the job (consumer group member), or the engine over a file.
    Run(run::RunArgs),
    /// Apply the results topic to PostgreSQL (runs migrations first).
    Sink(SinkArgs),
    /// Apply the PostgreSQL migrations and exit.
    Migrate(ConfigArg),
    /// Generate deterministic traffic into the input topic (or a file).
    Gen(gen::GenArgs),
    /// Run a local Kafka-protocol broker (librdkafka's mock cluster) for dev and tests.
    DevBroker(broker::BrokerArgs),
    /// The whole story on embedded defaults: broker, worker, late events, sink.
    Demo(demo::DemoArgs),
    /// Bill the late-events topic as idempotent adjustments.
    ReprocessLate(reprocess::ReprocessArgs),
    /// Serve the usage API (usage by window, hour, day or month in a time zone,
    /// invoices per month) from the sink's PostgreSQL, on `api.listen`.
    Api(ConfigArg),
    /// Mint, list or revoke the usage API's keys (`api.keys`).
    ApiKey(api_key::ApiKeyArgs),
    /// Inspect the checkpoint store.
    Checkpoints(checkpoints::CheckpointsArgs),
    /// Observed event delays and watermarks of the worker using this state.dir,
    /// with a recommended watermark.max_out_of_orderness.
    Delays(ConfigArg),
    /// Why a window is not final yet: per input partition its watermark and
    /// progress, held records, idleness and the lateness still to run, and the
    /// partition holding the window back (`--finality`, read from the workers'
    /// /status.json or report.json; the only mode built so far).
    Explain(explain::ExplainArgs),
    /// Print the effective configuration (file, TALLY_* variables and defaults)
    /// as TOML, secrets shown as ***; `config check` also says whether a restart
    /// would restore from the checkpoint store or be refused.
    Config(config_check::ConfigCmd),
}

#[derive(Args, Debug)]
pub struct SinkArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// Exit once every results partition is applied up to its end at start.
    #[arg(long)]
    pub until_end: bool,
}

/// An error and its causes on one line, each said once: many errors already
/// include their cause in their own message (`path: No space left on device`),
/// and a cause repeated after it would say it twice.
pub fn error_chain(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = crate::secrets::redact(&cause.to_string()).into_owned();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// A command stopped by SIGTERM or SIGINT before its work was done (the file mode
/// before the end of its input): not an error, but not a success either. `main`
/// prints it and exits `128 + signal` (docs/reference/exit-codes.md).
#[derive(Debug)]
pub struct Interrupted {
    pub signal: i32,
    /// Lines of `input` read and applied.
    pub lines: u64,
    pub input: PathBuf,
}

impl Interrupted {
    /// The exit status: 130 for SIGINT, 143 for SIGTERM, as a shell reports a
    /// command killed by that signal.
    pub fn exit_status(&self) -> u8 {
        u8::try_from(128 + self.signal).unwrap_or(1)
    }
}

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self.signal {
            libc::SIGINT => "SIGINT".to_string(),
            libc::SIGTERM => "SIGTERM".to_string(),
            n => format!("signal {n}"),
        };
        write!(
            f,
            "interrupted by {name}: stopped after line {} of {}. The outputs hold the results \
             of every line up to it and the state is checkpointed there; windows still open \
             were not emitted. A file run always starts from line 1: run it again to finish",
            self.lines,
            self.input.display(),
        )
    }
}

impl std::error::Error for Interrupted {}

pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TALLY_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| {
            tracing_subscriber::EnvFilter::new("info,librdkafka=warn,rdkafka=warn")
        });
    use std::io::IsTerminal;
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(crate::service::logged::LogWriter);
    // TALLY_LOG_FORMAT=json: one JSON object per line, for log shippers.
    match std::env::var("TALLY_LOG_FORMAT").as_deref() {
        Ok("json") => fmt
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .init(),
        other => {
            fmt.with_ansi(std::io::stderr().is_terminal())
                .with_target(false)
                .init();
            if let Ok(v) = other {
                if v != "text" {
                    tracing::warn!(value = v, "TALLY_LOG_FORMAT is json or text; logging text");
                }
            }
        }
    }
}

pub fn dispatch(cli: Cli) -> anyhow::Result<()> {
    crate::base::shutdown::install();
    match cli.command {
        Command::Run(a) => run::run(a),
        Command::Sink(a) => {
            let cfg = a.config.load()?;
            let summary = crate::sink::run::run(
                &cfg,
                crate::sink::run::SinkOptions {
                    until_end: a.until_end,
                },
            )
            .context("sink failed")?;
            eprintln!("sink: {summary}");
            Ok(())
        }
        Command::Migrate(c) => {
            let cfg = c.load()?;
            let n = crate::sink::run::migrate_only(&cfg).context("migration failed")?;
            eprintln!("applied {n} migration(s)");
            Ok(())
        }
        Command::Api(c) => {
            let cfg = c.load()?;
            crate::api::run(&cfg)
        }
        Command::ApiKey(a) => api_key::run(a),
        Command::Gen(a) => gen::run(a),
        Command::DevBroker(a) => broker::run(a),
        Command::Demo(a) => demo::run(a),
        Command::Checkpoints(a) => checkpoints::run(a),
        Command::ReprocessLate(a) => reprocess::run(a),
        Command::Config(c) => config_check::run(c),
        Command::Explain(a) => explain::run(a),
        Command::Delays(c) => {
            let cfg = c.load()?;
            let report = crate::worker::report::read(&cfg.state.dir).map_err(anyhow::Error::msg)?;
            print!("{}", report.render_table());
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn each_cause_is_said_once() {
        let os = std::io::Error::from_raw_os_error(28);
        let text = os.to_string();
        let e = anyhow::Error::new(crate::worker::WorkerError::Io {
            path: "/data/state".into(),
            source: os,
        })
        .context("processing in.jsonl");
        let line = super::error_chain(&e);
        assert_eq!(line.matches(&text).count(), 1, "{line}");
        assert!(
            line.starts_with("processing in.jsonl: /data/state: "),
            "{line}"
        );
    }
}
