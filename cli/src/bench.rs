//! `ratewell bench`: decisions per second and nanoseconds per decision on this machine.

use std::hint::black_box;
use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use ratewell::{Clock, KeyedLimiter, Limiter, Policy, QuantaClock};

use crate::progress::Progress;
use crate::table;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Threads deciding at once (on one shared limiter).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1024))]
    threads: u16,
    /// Distinct keys of the keyed runs, drawn at random (the table holds 4 per key: 64 bytes a
    /// key).
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=1 << 26))]
    keys: u64,
    /// Seconds each measurement runs.
    #[arg(long, default_value_t = 0.5, value_parser = seconds)]
    seconds: f64,
    /// Measure these policies instead of one per algorithm (repeatable).
    #[arg(long = "policy", value_name = "SPEC")]
    policies: Vec<String>,
}

fn seconds(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(s) if s > 0.0 && s <= 3600.0 => Ok(s),
        _ => Err("expected a number of seconds above 0 and at most 3600".into()),
    }
}

/// The name of `policy`'s algorithm, as the rows of the default policies name it.
fn algorithm_name(policy: &Policy) -> &'static str {
    let text = policy.to_string();
    let words: Vec<&str> = text.split(' ').collect();
    let has = |prefix: &str| words.iter().any(|w| w.starts_with(prefix));
    match words[0] {
        "token-bucket" if has("refill=") => ALGORITHMS[1].0,
        "token-bucket" => ALGORITHMS[0].0,
        "leaky-bucket" if has("compat=nginx") => ALGORITHMS[3].0,
        "leaky-bucket" => ALGORITHMS[2].0,
        "fixed-window" => ALGORITHMS[4].0,
        "sliding-window" => ALGORITHMS[5].0,
        _ => ALGORITHMS[6].0,
    }
}

/// One policy per algorithm, all "10 per second" with a burst of 10: keys that are asked often
/// are mostly refused (the read-only path), keys asked rarely mostly admitted (the CAS path);
/// the `admitted` column says which one a row measured.
const ALGORITHMS: [(&str, &str); 7] = [
    ("token bucket (GCRA)", "token-bucket capacity=10 rate=10/s"),
    ("token bucket (discrete fill)", "token-bucket capacity=10 refill=1 every=100ms"),
    ("leaky bucket", "leaky-bucket rate=10r/s burst=9 nodelay"),
    ("leaky bucket (compat=nginx)", "leaky-bucket rate=10r/s burst=9 nodelay compat=nginx"),
    ("fixed window", "fixed-window limit=10 window=1s"),
    ("sliding-window counter", "sliding-window limit=10 window=1s"),
    ("sliding log", "sliding-log limit=10 window=1s"),
];

struct Row {
    name: String,
    policy: String,
    mode: &'static str,
    decisions: u64,
    admitted: u64,
    elapsed: Duration,
}

/// Run `decide` on `threads` threads for `seconds`; `decide(thread, i)` says whether its `i`th
/// decision was admitted. Returns (decisions, admitted, elapsed).
fn measure(
    threads: usize,
    seconds: f64,
    decide: impl Fn(usize, u64) -> bool + Sync,
) -> (u64, u64, Duration) {
    let stop = AtomicBool::new(false);
    let start = Barrier::new(threads + 1);
    thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|thread| {
                let (stop, start, decide) = (&stop, &start, &decide);
                s.spawn(move || {
                    let (mut i, mut admitted) = (0u64, 0u64);
                    start.wait();
                    while !stop.load(Ordering::Relaxed) {
                        // The flag is read once per 256 decisions: its cost stays out of the figures.
                        for _ in 0..256 {
                            admitted += u64::from(black_box(decide(thread, i)));
                            i += 1;
                        }
                    }
                    (i, admitted)
                })
            })
            .collect();
        start.wait();
        let began = Instant::now();
        thread::sleep(Duration::from_secs_f64(seconds));
        stop.store(true, Ordering::Relaxed);
        let totals = workers.into_iter().map(|w| w.join().expect("a bench thread panicked"));
        let (decisions, admitted) = totals.fold((0, 0), |(d, a), (i, ad)| (d + i, a + ad));
        (decisions, admitted, began.elapsed())
    })
}

/// The counter quanta reads on this architecture (where it finds one usable: otherwise it reads the
/// operating system's monotonic clock, and the frequency below shows 1 GHz).
const COUNTER: &str = if cfg!(target_arch = "aarch64") {
    "cntvct_el0"
} else if cfg!(target_arch = "x86_64") {
    "TSC"
} else {
    "OS"
};

/// What the limiters' clock (`QuantaClock`) can tell apart here, measured: neither quanta nor the
/// standard library reports the counter's frequency.
struct Resolution {
    /// Counter ticks per second: the raw counter's advance over 20 ms of the operating system's
    /// monotonic clock.
    hz: f64,
    /// The median of the nonzero forward steps between successive readings of `QuantaClock` on
    /// one thread (ns): the counter's step as read, or the time a reading takes where that is
    /// longer. The median, not the smallest: under qemu-user a few steps are odd (4 ns among
    /// steps of 992 ns).
    step: Option<u64>,
    /// Of the successive pairs of readings, how many read the same nanosecond, and how many an
    /// earlier one.
    equal: usize,
    back: usize,
    pairs: usize,
}

impl Resolution {
    fn measure() -> Resolution {
        let counter = quanta::Clock::new();
        let began = Instant::now();
        let first = counter.raw();
        while began.elapsed() < Duration::from_millis(20) {
            std::hint::spin_loop();
        }
        let ticks = counter.raw().wrapping_sub(first);
        let hz = ticks as f64 / began.elapsed().as_secs_f64();

        let clock = QuantaClock::new();
        let pairs = 100_000;
        let (mut steps, mut equal, mut back) = (Vec::with_capacity(pairs), 0, 0);
        let mut last = clock.now();
        for _ in 0..pairs {
            let now = black_box(clock.now());
            match now.cmp(&last) {
                std::cmp::Ordering::Equal => equal += 1,
                std::cmp::Ordering::Less => back += 1,
                std::cmp::Ordering::Greater => steps.push(now - last),
            }
            last = now;
        }
        steps.sort_unstable();
        let step = steps.get(steps.len() / 2).copied();
        Resolution { hz, step, equal, back, pairs }
    }
}

impl std::fmt::Display for Resolution {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tick = 1e9 / self.hz;
        let equal = self.equal as f64 * 100.0 / self.pairs as f64;
        write!(
            f,
            "clock: the counter runs at {:.2} MHz (measured against the OS clock over 20 ms), a \
             tick of {tick:.2} ns; successive readings on one thread: {equal:.1}% of {} pairs \
             equal",
            self.hz / 1e6,
            self.pairs,
        )?;
        if self.back > 0 {
            write!(f, ", {} going back", self.back)?;
        }
        let Some(step) = self.step else {
            return write!(f, ", none moving on (the clock stood still)");
        };
        // Where readings repeat, they come faster than the counter moves: the steps are the
        // counter's own, as the limiter reads it (a tick, or more where the counter is updated
        // in coarser steps, as under qemu-user). Where none repeats, a step is the read's own
        // time, and the limit is the tick, in whole nanoseconds.
        let finest = if self.equal > 0 { step as f64 } else { tick.max(1.0) };
        write!(
            f,
            ", the median step {step} ns{}: a decision tells apart instants {finest:.0} ns apart \
             (requests within that share an instant)",
            if self.equal > 0 { " (the counter's step)" } else { " (the read's own time)" },
        )
    }
}

/// A cheap, decent stream of random keys in `0..keys` per thread (xorshift64*, then a
/// multiply-shift into the range).
#[inline]
fn key(thread: usize, i: u64, keys: u64) -> u64 {
    let mut x = (i ^ ((thread as u64 + 1) << 40)).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    let r = x.wrapping_mul(0x2545_F491_4F6C_DD1D);
    ((u128::from(r) * u128::from(keys)) >> 64) as u64
}

pub(crate) fn run(args: &Args) -> Result<(), String> {
    let policies: Vec<(String, Policy)> = if args.policies.is_empty() {
        ALGORITHMS
            .iter()
            .map(|&(name, spec)| Ok((name.to_string(), spec.parse().map_err(|e| format!("{e}"))?)))
            .collect::<Result<_, String>>()?
    } else {
        let mut named: Vec<(String, Policy)> = args
            .policies
            .iter()
            .map(|spec| {
                let policy: Policy = spec.parse().map_err(|e| format!("--policy {spec}: {e}"))?;
                Ok((algorithm_name(&policy).to_string(), policy))
            })
            .collect::<Result<_, String>>()?;
        // Several policies of one algorithm: number them, in the order given.
        let names: Vec<String> = named.iter().map(|(n, _)| n.clone()).collect();
        for (i, (name, _)) in named.iter_mut().enumerate() {
            if names.iter().filter(|n| *n == name).count() > 1 {
                let k = names[..=i].iter().filter(|n| *n == name).count();
                *name = format!("{name} #{k}");
            }
        }
        named
    };
    let threads = usize::from(args.threads);
    let cpus = thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "ratewell bench: {threads} thread{} on {cpus} CPU{}, {} s a row, {COUNTER} clock (quanta); \
         keyed: {} keys at random",
        if threads == 1 { "" } else { "s" },
        if cpus == 1 { "" } else { "s" },
        args.seconds,
        args.keys,
    );
    println!("{}", Resolution::measure());
    if threads > cpus {
        println!("(more threads than CPUs: the threads take turns, and the figures show it)");
    }
    let mut progress = Progress::new("bench");
    let total = policies.len() * 2;
    let mut rows = Vec::new();
    for (i, (name, policy)) in policies.iter().enumerate() {
        progress.update(&format!("[{}/{total}] {name}, direct", 2 * i + 1));
        let limiter = Limiter::new(policy);
        let (decisions, admitted, elapsed) =
            measure(threads, args.seconds, |_, _| limiter.check().is_admitted());
        rows.push(Row {
            name: name.clone(),
            policy: policy.to_string(),
            mode: "direct",
            decisions,
            admitted,
            elapsed,
        });

        progress.update(&format!(
            "[{}/{total}] {name}, keyed: filling {} keys",
            2 * i + 2,
            args.keys
        ));
        let capacity = usize::try_from(args.keys * 4).map_err(|_| "--keys: too many")?;
        let limiter = KeyedLimiter::<u64>::new(policy, capacity);
        for k in 0..args.keys {
            limiter.check(&k);
        }
        progress.update(&format!("[{}/{total}] {name}, keyed", 2 * i + 2));
        let keys = args.keys;
        let (decisions, admitted, elapsed) = measure(threads, args.seconds, |thread, i| {
            limiter.check(&key(thread, i, keys)).is_admitted()
        });
        rows.push(Row {
            name: name.clone(),
            policy: policy.to_string(),
            mode: "keyed",
            decisions,
            admitted,
            elapsed,
        });
    }
    progress.finish(&format!("{total} measurements done"));
    print!("{}", table(&rows, threads));
    Ok(())
}

fn table(rows: &[Row], threads: usize) -> String {
    let mut cells = vec![
        ["algorithm", "mode", "decisions/s", "ns/decision", "admitted", "policy"].map(String::from),
    ];
    for row in rows {
        let seconds = row.elapsed.as_secs_f64();
        let per_second = row.decisions as f64 / seconds;
        // Each thread's time per decision: with T threads, T decisions overlap.
        let ns = seconds * 1e9 * threads as f64 / row.decisions.max(1) as f64;
        let admitted = row.admitted as f64 * 100.0 / row.decisions.max(1) as f64;
        cells.push([
            row.name.clone(),
            row.mode.to_string(),
            format!("{:.2} M", per_second / 1e6),
            format!("{ns:.1}"),
            format!("{admitted:.1}%"),
            row.policy.clone(),
        ]);
    }
    let mut text = table::render(&cells, &[0, 1, 5]);
    text += "ns/decision is each thread's time per decision; keyed rows pick keys at random.\n";
    text
}
