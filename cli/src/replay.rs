//! `ratewell replay`: the contract of `SEMANTICS.md`.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, IsTerminal, Read, Write};
use std::path::PathBuf;

use ratewell::{KeyedLimiter, ManualClock, Policy};

use ratewell_cli::trace::{LineError, parse_line};

#[derive(clap::Args)]
pub(crate) struct Args {
    /// The policy, e.g. 'token-bucket capacity=10 rate=5/s' (see SEMANTICS.md).
    #[arg(long)]
    policy: String,
    /// Print admitted/rejected per key and in total instead of one line per request.
    #[arg(long)]
    summary: bool,
    /// Keys the limiter's table holds (memory: 16 bytes a key, allocated up front). Beyond it,
    /// keys whose state is back to fresh are reclaimed without changing any decision; only if all
    /// of a new key's candidate slots are live is one evicted.
    #[arg(long, default_value_t = DEFAULT_CAPACITY)]
    capacity: usize,
    /// The trace; standard input if absent.
    file: Option<PathBuf>,
}

/// 2^20 keys: 16 MiB of table.
const DEFAULT_CAPACITY: usize = 1 << 20;

/// Progress on stderr for traces above this size, when stderr is a terminal.
const PROGRESS_BYTES: u64 = 16 << 20;

pub(crate) fn run(args: &Args) -> Result<(), String> {
    let policy: Policy = args.policy.parse().map_err(|e| format!("--policy: {e}"))?;
    let (input, size): (Box<dyn Read>, Option<u64>) = match &args.file {
        Some(path) => {
            let file =
                File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            let size = file.metadata().ok().map(|m| m.len());
            (Box::new(file), size)
        }
        None => (Box::new(io::stdin().lock()), None),
    };
    let progress = size.filter(|&s| s >= PROGRESS_BYTES && io::stderr().is_terminal());
    let stdout = io::stdout().lock();
    let mut out = BufWriter::with_capacity(1 << 16, stdout);
    let limiter = KeyedLimiter::<[u8], _>::with_clock(&policy, args.capacity, ManualClock::new(0));
    let input = BufReader::with_capacity(1 << 16, input);
    let result = replay(&limiter, input, &mut out, args.summary, progress);
    // Whatever happened, what was written ends at a line boundary: flush it.
    let flushed = out.flush();
    match (result, flushed) {
        (Err(e), _) => Err(e),
        (Ok(()), Err(e)) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        (Ok(()), Err(e)) => Err(format!("cannot write output: {e}")),
        (Ok(()), Ok(())) => Ok(()),
    }
}

struct KeyStats {
    name: Vec<u8>,
    admitted: u64,
    rejected: u64,
}

fn replay(
    limiter: &KeyedLimiter<[u8], ManualClock>,
    mut input: impl BufRead,
    out: &mut impl Write,
    summary: bool,
    progress: Option<u64>,
) -> Result<(), String> {
    let clock = limiter.clock();
    // Per-key counts only for --summary: the table keeps no keys, so a replay of millions of
    // distinct keys stays within the table's memory.
    let mut ids: HashMap<Vec<u8>, usize> = HashMap::new();
    let mut stats: Vec<KeyStats> = Vec::new();
    let delays = limiter.policy().delays();
    let mut line = Vec::with_capacity(128);
    let mut previous = 0;
    let mut number = 0u64;
    let mut read = 0u64;
    let mut reported = 0u64;
    let write_err = |e: io::Error| {
        if e.kind() == io::ErrorKind::BrokenPipe {
            String::new()
        } else {
            format!("cannot write output: {e}")
        }
    };
    loop {
        line.clear();
        let n =
            input.read_until(b'\n', &mut line).map_err(|e| format!("cannot read trace: {e}"))?;
        if n == 0 {
            break;
        }
        number += 1;
        read += n as u64;
        let text = line.strip_suffix(b"\n").unwrap_or(&line);
        let request = match parse_line(text) {
            Ok(Some(r)) => r,
            Ok(None) => continue,
            Err(e) => return Err(format!("line {number}: {e}")),
        };
        if request.t < previous {
            let e = LineError::Decreasing { t: request.t, previous };
            return Err(format!("line {number}: {e}"));
        }
        previous = request.t;
        clock.set(request.t);
        let decision = limiter.check_n(request.key, request.cost);
        if summary {
            let id = *ids.entry(request.key.to_vec()).or_insert_with(|| {
                stats.push(KeyStats { name: request.key.to_vec(), admitted: 0, rejected: 0 });
                stats.len() - 1
            });
            let entry = &mut stats[id];
            if decision.is_admitted() {
                entry.admitted += 1;
            } else {
                entry.rejected += 1;
            }
        }
        if !summary {
            let written = match (decision.is_admitted(), delays) {
                (true, true) => writeln!(out, "1,{}", decision.delay_ns()),
                (true, false) => out.write_all(b"1\n"),
                (false, _) => out.write_all(b"0\n"),
            };
            written.map_err(write_err)?;
        }
        if let Some(total) = progress {
            if read - reported >= total / 100 {
                reported = read;
                eprint!("\rreplay: {:3}% ({number} lines)", read * 100 / total);
            }
        }
    }
    if progress.is_some() {
        eprintln!("\rreplay: 100% ({number} lines)");
    }
    if summary {
        let (mut admitted, mut rejected) = (0, 0);
        writeln!(out, "key,admitted,rejected").map_err(write_err)?;
        for s in &stats {
            admitted += s.admitted;
            rejected += s.rejected;
            out.write_all(&s.name).map_err(write_err)?;
            writeln!(out, ",{},{}", s.admitted, s.rejected).map_err(write_err)?;
        }
        writeln!(out, "*,{admitted},{rejected}").map_err(write_err)?;
    }
    Ok(())
}
