//! `ratewell take` and `ratewell inspect`: one decision on a shared table file (a limit that
//! every process on the machine shares, as `flock` shares a lock), and what such a file holds.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use ratewell::{Decision, KeyedLimiter, OnFull, Outcome, Policy, SharedClock};

#[derive(clap::Args)]
pub(crate) struct TakeArgs {
    /// The shared table's file (e.g. in /dev/shm), created by the first call: every process that
    /// takes from it shares its keys' states.
    #[arg(long, value_name = "PATH")]
    shared: PathBuf,
    /// The policy, e.g. 'token-bucket capacity=10 rate=5/s' (see docs/SEMANTICS.md); not a
    /// sliding log. It must be the one the table was made with.
    #[arg(long, value_name = "SPEC")]
    policy: String,
    /// Keys the table holds (16 bytes a key); it must be the one the table was made with.
    #[arg(long, default_value_t = DEFAULT_CAPACITY)]
    capacity: usize,
    /// What a new key does when its candidate slots all hold live keys: `evict` the one whose
    /// loss grants the least, or `refuse` the new key (a rejection); it must be the one the
    /// table was made with.
    #[arg(long, value_enum, default_value_t = Full::Evict)]
    on_full: Full,
    /// Units the request takes.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    cost: u32,
    /// The key to take from.
    key: String,
}

#[derive(clap::Args)]
pub(crate) struct InspectArgs {
    /// The shared table's file.
    path: PathBuf,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Full {
    Evict,
    Refuse,
}

/// The default `--capacity` of `take`.
const DEFAULT_CAPACITY: usize = 10_000;

/// `ratewell take`: exit status 0 when admitted, 1 when not.
pub(crate) fn take(args: &TakeArgs) -> Result<ExitCode, String> {
    let policy: Policy =
        args.policy.parse().map_err(|e| format!("--policy '{}': {e}", args.policy))?;
    let on_full = match args.on_full {
        Full::Evict => OnFull::EvictLeastGranting,
        Full::Refuse => OnFull::Refuse,
    };
    let limiter = KeyedLimiter::<str>::builder(&policy, args.capacity)
        .on_full(on_full)
        .open_shared(&args.shared)
        .map_err(|e| format!("{}: {e}", args.shared.display()))?;
    let decision = limiter.request(args.key.as_str()).cost(args.cost).check();
    let (line, admitted) = describe(&decision, args.cost);
    // A dry-run policy decides and counts as when enforcing, but rejects nothing.
    let (line, admitted) = if policy.is_dry_run() && !admitted {
        (format!("{line} (dry run: not enforced)"), true)
    } else {
        (line, admitted)
    };
    println!("{line}");
    Ok(if admitted { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// The line `take` prints for `d`, and whether it admits.
fn describe(d: &Decision, cost: u32) -> (String, bool) {
    let wait = |ns: Option<u64>| seconds(ns.unwrap_or(0));
    match d.outcome() {
        Outcome::Admitted => {
            let mut line = format!("admitted: {} of {} remaining", d.remaining(), d.limit());
            if d.delay_ns() > 0 {
                let _ = write!(line, ", delay {} s", seconds(d.delay_ns()));
            }
            (line, true)
        }
        Outcome::Rejected => {
            (format!("rejected: retry after {} s", wait(d.retry_after_ns())), false)
        }
        Outcome::TableFull => {
            let retry = wait(d.retry_after_ns());
            (
                format!(
                    "rejected: the table is full (no slot for a new key), retry after {retry} s"
                ),
                false,
            )
        }
        // `Impossible`, and any outcome a later engine adds: not admitted, and no wait helps.
        _ => (format!("rejected: never (cost {cost} exceeds the limit {})", d.limit()), false),
    }
}

/// `ns` as seconds with millisecond precision, rounded up (waiting that long is enough).
fn seconds(ns: u64) -> String {
    let ms = ns.div_ceil(1_000_000);
    format!("{}.{:03}", ms / 1000, ms % 1000)
}

/// `ratewell inspect`.
pub(crate) fn inspect(args: &InspectArgs) -> Result<(), String> {
    let shown = args.path.display();
    let limiter: KeyedLimiter<str, SharedClock> =
        KeyedLimiter::<str>::attach_shared(&args.path).map_err(|e| format!("{shown}: {e}"))?;
    let info = limiter
        .shared_info()
        .ok_or_else(|| format!("{shown}: the limiter attached is not on a shared table"))?;
    let m = limiter.metrics();
    print!("{}", report(&args.path, &limiter.policy(), &info, &m));
    Ok(())
}

/// What `inspect` prints: `name: value` lines, the values aligned.
fn report(
    path: &Path,
    policy: &Policy,
    info: &ratewell::SharedInfo,
    m: &ratewell::Metrics,
) -> String {
    let on_full = match info.on_full {
        OnFull::EvictLeastGranting => "evict".to_string(),
        OnFull::Refuse => "refuse".to_string(),
        other => format!("{other:?}"),
    };
    let percent = if m.capacity == 0 { 0.0 } else { 100.0 * m.keys as f64 / m.capacity as f64 };
    let mut rows: Vec<(&str, String)> = vec![
        ("table", path.display().to_string()),
        ("layout version", info.version.to_string()),
        ("bytes", format!("{} ({})", info.bytes, binary(info.bytes))),
        match info.log_entries {
            0 => (
                "slots",
                format!(
                    "{} ({} shards x {} buckets x 8)",
                    info.shards * info.buckets_per_shard * 8,
                    info.shards,
                    info.buckets_per_shard
                ),
            ),
            entries => (
                "logs",
                format!(
                    "{} ({} shards x {} keys, {entries} entries a key)",
                    info.shards * info.buckets_per_shard,
                    info.shards,
                    info.buckets_per_shard
                ),
            ),
        },
        ("policy", policy.to_string()),
        ("on_full", on_full),
        ("clock", clock(info.clock_scale)),
        ("created by", format!("pid {}", info.created_by)),
        ("keys", format!("{} of {} ({percent:.1}%)", m.keys, m.capacity)),
        ("memory_bytes", m.memory_bytes.to_string()),
        ("huge_pages", m.huge_pages.to_string()),
        ("admitted", m.admitted.to_string()),
        ("rejected", m.rejected.to_string()),
        ("refunds", m.refunds.to_string()),
        ("reclaims", m.reclaims.to_string()),
        ("evictions", m.evictions.to_string()),
        ("refused", m.refused.to_string()),
        ("relocations", m.relocations.to_string()),
        ("moves", m.moves.to_string()),
    ];
    let processes = if info.processes.is_empty() {
        "none".to_string()
    } else {
        let each = info
            .processes
            .iter()
            .map(|&(pid, alive)| format!("{pid} ({})", if alive { "alive" } else { "gone" }));
        each.collect::<Vec<_>>().join(", ")
    };
    rows.push(("processes", processes));
    let locks = if info.locks_held.is_empty() {
        "none".to_string()
    } else {
        let each =
            info.locks_held.iter().map(|&(shard, pid)| format!("shard {shard} by pid {pid}"));
        each.collect::<Vec<_>>().join(", ")
    };
    rows.push(("locks held", locks));
    let width = rows.iter().map(|(name, _)| name.len() + 1).max().unwrap_or(0);
    let mut text = String::new();
    for (name, value) in rows {
        let _ = writeln!(text, "{:<width$} {value}", format!("{name}:"));
    }
    text
}

/// `bytes` in KiB, MiB or GiB.
fn binary(bytes: u64) -> String {
    let units = [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    match units.iter().find(|&&(_, size)| bytes >= size) {
        Some(&(unit, size)) => format!("{:.1} {unit}", bytes as f64 / size as f64),
        None => format!("{bytes} B"),
    }
}

/// The clock's scale (nanoseconds per 2^32 ticks) as the counter's frequency and its tick.
fn clock(scale: u64) -> String {
    if scale == 0 {
        return "scale 0 (none)".into();
    }
    let ns_per_tick = scale as f64 / 2f64.powi(32);
    let ghz = 1.0 / ns_per_tick;
    let frequency =
        if ghz >= 1.0 { format!("{ghz:.3} GHz") } else { format!("{:.3} MHz", ghz * 1e3) };
    format!("{frequency} ({ns_per_tick:.4} ns a tick; {scale} ns per 2^32 ticks)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_round_up_to_the_millisecond() {
        assert_eq!(seconds(0), "0.000");
        assert_eq!(seconds(1), "0.001");
        assert_eq!(seconds(250_000_000), "0.250");
        assert_eq!(seconds(3_600_000_000_000), "3600.000");
        assert_eq!(seconds(u64::MAX), "18446744073.710");
    }

    #[test]
    fn clock_and_sizes_read() {
        assert_eq!(clock(1 << 32), "1.000 GHz (1.0000 ns a tick; 4294967296 ns per 2^32 ticks)");
        assert!(clock(1 << 33).starts_with("500.000 MHz"));
        assert_eq!(binary(512), "512 B");
        assert_eq!(binary(3 << 19), "1.5 MiB");
    }
}
