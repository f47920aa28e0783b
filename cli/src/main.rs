//! `ratewell`: run traffic through rate-limiting policies.

mod bench;
mod chart;
mod compare;
mod duration;
mod input;
mod output;
mod progress;
mod replay;
#[cfg(target_os = "linux")]
mod shared;
mod spool;
mod table;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "ratewell",
    version,
    about = "Exact, lock-free rate limiting: replay your traffic through any policy"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Replay a trace (`t_ns,key[,cost]` per line) through a policy; print `1`/`0` per request.
    Replay(replay::Args),
    /// Replay a trace through every algorithm at one limit (or through given policies) and
    /// compare what each admitted: a table, and optionally a chart.
    Compare(compare::Args),
    /// Measure decisions per second and nanoseconds per decision of every algorithm on this
    /// machine, direct and keyed.
    Bench(bench::Args),
    /// Take from a key of a shared table file (created by the first call), which every process
    /// on the machine shares: print the decision; exit 0 if admitted, 1 if not.
    #[cfg(target_os = "linux")]
    Take(shared::TakeArgs),
    /// Print a shared table file's header, occupancy, counters, processes and held locks.
    #[cfg(target_os = "linux")]
    Inspect(shared::InspectArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            // Usage errors are bad input too: exit 2 (help and version exit 0).
            return if e.use_stderr() { ExitCode::from(2) } else { ExitCode::SUCCESS };
        }
    };
    let done = |result: Result<(), String>| result.map(|()| ExitCode::SUCCESS);
    let result = match cli.command {
        Command::Replay(args) => done(replay::run(&args)),
        Command::Compare(args) => done(compare::run(&args)),
        Command::Bench(args) => done(bench::run(&args)),
        // Exit 1 for a rejection: the shell's `if ratewell take ...; then`.
        #[cfg(target_os = "linux")]
        Command::Take(args) => shared::take(&args),
        #[cfg(target_os = "linux")]
        Command::Inspect(args) => done(shared::inspect(&args)),
    };
    match result {
        Ok(code) => code,
        Err(message) => {
            eprintln!("ratewell: {message}");
            ExitCode::from(2)
        }
    }
}
