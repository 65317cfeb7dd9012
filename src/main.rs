//! The `tally` command line. Thin: parses arguments and calls into the library.

use std::process::ExitCode;

use clap::Parser;

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    tally::base::alloc::purge_freed_memory_at_once();
    let cli = tally::cli::Cli::parse();
    tally::cli::init_logging();
    match tally::cli::dispatch(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            match e.downcast_ref::<tally::cli::Interrupted>() {
                Some(stop) => eprintln!("tally: {stop}"),
                None => eprintln!("tally: error: {}", tally::cli::error_chain(&e)),
            }
            ExitCode::from(tally::cli::exit::status(&e))
        }
    }
}
