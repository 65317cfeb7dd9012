//! The `tally` command line. Thin: parses arguments and calls into the library.

use std::process::ExitCode;

use clap::Parser;

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    tally::base::alloc::purge_freed_memory_at_once();
    tally::base::alloc::bound_system_arenas();
    let cli = tally::cli::Cli::parse();
    tally::cli::init_logging();
    // A panic on this thread is a bug like any other: exit 1 (the default
    // would be 101, a status the exit-code table does not know).
    let outcome =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| tally::cli::dispatch(cli)));
    let Ok(outcome) = outcome else {
        eprintln!("tally: error: internal error: a panic (a bug; see the message above)");
        return ExitCode::from(tally::base::error::ErrorClass::Internal.exit_status());
    };
    match outcome {
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
