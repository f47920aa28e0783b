//! `ratewell`: run traffic through rate-limiting policies.

mod bench;
mod chart;
mod compare;
mod duration;
mod output;
mod progress;
mod replay;
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
    let result = match cli.command {
        Command::Replay(args) => replay::run(&args),
        Command::Compare(args) => compare::run(&args),
        Command::Bench(args) => bench::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("ratewell: {message}");
            ExitCode::from(2)
        }
    }
}
