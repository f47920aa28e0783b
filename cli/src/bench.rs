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
    /// Measure N processes deciding on one shared table (a file in /dev/shm) beside N threads on
    /// one heap table, and 1 of each, on the keyed path, each on keys of its own (Linux only).
    #[arg(long, value_name = "N", conflicts_with = "threads",
          value_parser = clap::value_parser!(u16).range(1..=1024))]
    processes: Option<u16>,
    /// One process of `--processes` (internal): the shared table's file.
    #[arg(long, hide = true, value_name = "PATH", requires = "worker_capacity")]
    worker: Option<std::path::PathBuf>,
    /// The worker's number: it decides on keys `index * keys..(index + 1) * keys`.
    #[arg(long, hide = true, default_value_t = 0, requires = "worker")]
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    worker_index: u64,
    /// The shared table's capacity (the table must be opened with the one it was made with).
    #[arg(long, hide = true, requires = "worker")]
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    worker_capacity: Option<usize>,
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
    if let Some(path) = &args.worker {
        return processes::worker(args, path);
    }
    if let Some(n) = args.processes {
        return processes::run(args, usize::from(n));
    }
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

/// `bench --processes N`: N processes on one shared table beside N threads on one heap table.
#[cfg(target_os = "linux")]
mod processes {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::path::{Path, PathBuf};
    use std::process::{Child, Command, Stdio};
    use std::sync::mpsc;
    use std::thread;
    use std::time::Duration;

    use ratewell::{KeyedLimiter, Policy};

    use super::{Args, key, measure};
    use crate::progress::Progress;
    use crate::table;

    /// The policy measured without `--policy`: it admits everything (the CAS path).
    const DEFAULT_POLICY: &str = "token-bucket capacity=1000000000 rate=1/s";

    /// One row: `workers` processes or threads, their decisions summed.
    struct Run {
        name: String,
        workers: usize,
        /// Decisions per second of the workers together: all their decisions over the time from
        /// the first one's start to the last one's end.
        per_second: f64,
        decisions: u64,
        admitted: u64,
    }

    /// Keys a table of `workers` workers of `keys` keys each holds: 4 slots a key, as the
    /// keyed rows of `bench`.
    fn capacity(workers: usize, keys: u64) -> Result<usize, String> {
        usize::try_from(keys * 4 * workers as u64)
            .map_err(|_| format!("--keys {keys} for {workers} workers: too many"))
    }

    pub(super) fn run(args: &Args, n: usize) -> Result<(), String> {
        let spec = args.policies.first().map_or(DEFAULT_POLICY, String::as_str);
        let policy: Policy = spec.parse().map_err(|e| format!("--policy {spec}: {e}"))?;
        // A policy or a table size that cannot be had: refused here, before any process starts.
        KeyedLimiter::<u64>::region_size(&policy, capacity(n, args.keys)?)
            .map_err(|e| format!("--policy {spec}: {e}"))?;
        let cpus = thread::available_parallelism().map_or(1, |c| c.get());
        let plural =
            |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
        println!(
            "ratewell bench: {} on one shared table (in {}) beside {} on one heap table, on {}, \
             {} s a row; keyed: each process or thread on {} keys of its own, at random",
            plural(n, "process", "processes"),
            table_dir().display(),
            plural(n, "thread", "threads"),
            plural(cpus, "CPU", "CPUs"),
            args.seconds,
            args.keys,
        );
        println!("policy: {policy}");
        if args.policies.len() > 1 {
            println!("(--processes measures the first --policy only)");
        }
        if n > cpus {
            println!("(more processes than CPUs: they take turns, and the figures show it)");
        }
        let counts: Vec<usize> = if n == 1 { vec![1] } else { vec![1, n] };
        let total = counts.len() * 2;
        let mut progress = Progress::new("bench");
        let mut runs = Vec::new();
        for &workers in &counts {
            let step =
                format!("[{}/{total}] {}", runs.len() + 1, plural(workers, "process", "processes"));
            progress.update(&step);
            runs.push(shared(args, &policy, workers)?);
        }
        for &workers in &counts {
            let step =
                format!("[{}/{total}] {}", runs.len() + 1, plural(workers, "thread", "threads"));
            progress.update(&format!("{step}: filling {} keys", workers as u64 * args.keys));
            runs.push(heap(args, &policy, workers, &mut progress, &step)?);
        }
        progress.finish(&format!("{total} measurements done"));
        print!("{}", render(&runs));
        if n > 1 {
            let ratio = |many: &Run, one: &Run| many.per_second / one.per_second;
            println!(
                "scaling: {n} processes make {:.2}× the decisions of 1; {n} threads {:.2}×",
                ratio(&runs[1], &runs[0]),
                ratio(&runs[3], &runs[2]),
            );
        }
        let (shared_n, heap_n) = (&runs[counts.len() - 1], &runs[runs.len() - 1]);
        println!("shared / heap at {n}: {:.2}", shared_n.per_second / heap_n.per_second);
        Ok(())
    }

    fn render(runs: &[Run]) -> String {
        let mut cells = vec![["run", "decisions/s", "ns/decision", "admitted"].map(String::from)];
        for run in runs {
            // Each worker's time per decision: with W workers, W decisions overlap.
            let ns = 1e9 * run.workers as f64 / run.per_second.max(f64::MIN_POSITIVE);
            let admitted = run.admitted as f64 * 100.0 / run.decisions.max(1) as f64;
            cells.push([
                run.name.clone(),
                format!("{:.2} M", run.per_second / 1e6),
                format!("{ns:.1}"),
                format!("{admitted:.1}%"),
            ]);
        }
        let mut text = table::render(&cells, &[0]);
        text += "decisions/s is summed over the processes or threads; ns/decision is each one's \
                 time per decision.\n";
        text
    }

    /// `workers` threads on one heap table, each on its own keys (inserted first, untimed).
    fn heap(
        args: &Args,
        policy: &Policy,
        workers: usize,
        progress: &mut Progress,
        step: &str,
    ) -> Result<Run, String> {
        let capacity = capacity(workers, args.keys)?;
        let limiter = KeyedLimiter::<u64>::builder(policy, capacity)
            .build()
            .map_err(|e| format!("a heap table of {capacity} keys: {e}"))?;
        let keys = args.keys;
        thread::scope(|s| {
            for t in 0..workers as u64 {
                let limiter = &limiter;
                s.spawn(move || {
                    for k in t * keys..(t + 1) * keys {
                        limiter.check(&k);
                    }
                });
            }
        });
        progress.update(step);
        let (decisions, admitted, elapsed) = measure(workers, args.seconds, |t, i| {
            limiter.check(&(t as u64 * keys + key(t, i, keys))).is_admitted()
        });
        let plural = if workers == 1 { "thread" } else { "threads" };
        Ok(Run {
            name: format!("{workers} {plural} (heap table)"),
            workers,
            per_second: decisions as f64 / elapsed.as_secs_f64(),
            decisions,
            admitted,
        })
    }

    /// Where the shared tables' files go: /dev/shm (memory), or the temporary directory
    /// where there is none.
    fn table_dir() -> PathBuf {
        let shm = Path::new("/dev/shm");
        if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() }
    }

    /// A file of the run, removed when dropped (on errors too).
    struct Removed(PathBuf);

    impl Removed {
        /// A new file of `bytes` zeros, for a shared table. Written, not just sized: a sparse
        /// file on a full /dev/shm would kill the process touching it (SIGBUS); a write reports
        /// it.
        fn table(path: PathBuf, bytes: usize) -> Result<Removed, String> {
            use std::os::unix::fs::OpenOptionsExt;
            let shown = path.display().to_string();
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .map_err(|e| format!("{shown}: {e}"))?;
            let table = Removed(path);
            let zeros = vec![0u8; 1 << 20];
            let mut left = bytes;
            while left > 0 {
                let n = left.min(zeros.len());
                file.write_all(&zeros[..n]).map_err(|e| {
                    format!("{shown}: {e} (the shared table needs {} MiB)", bytes.div_ceil(1 << 20))
                })?;
                left -= n;
            }
            Ok(table)
        }
    }

    impl Drop for Removed {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    /// The worker processes, killed (and reaped) when dropped before they ended.
    struct Workers(Vec<Child>);

    impl Drop for Workers {
        fn drop(&mut self) {
            for child in &mut self.0 {
                // A child already waited for is not signalled again.
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }

    /// `workers` processes on one shared table, each on its own keys (inserted first,
    /// untimed), started together.
    fn shared(args: &Args, policy: &Policy, workers: usize) -> Result<Run, String> {
        let capacity = capacity(workers, args.keys)?;
        let bytes = KeyedLimiter::<u64>::region_size(policy, capacity)
            .map_err(|e| format!("a shared table of {capacity} keys: {e}"))?;
        let path = table_dir().join(format!("ratewell-bench-{}-{workers}", std::process::id()));
        // Declared before the workers: dropped after them.
        let file = Removed::table(path, bytes)?;
        let start = Removed(start_file(&file.0));
        let exe = std::env::current_exe().map_err(|e| format!("this program's path: {e}"))?;
        let io = |what: &'static str| move |e: std::io::Error| format!("{what}: {e}");
        // One pipe to release every worker (its end: every reader sees it at once), one for
        // what they report (a line is written at once: lines of workers do not mix).
        let (release_in, release) = std::io::pipe().map_err(io("a pipe"))?;
        let (reports, report_out) = std::io::pipe().map_err(io("a pipe"))?;
        let mut children = Workers(Vec::with_capacity(workers));
        for i in 0..workers {
            let child = Command::new(&exe)
                .arg("bench")
                .arg("--worker")
                .arg(&file.0)
                .args(["--worker-index", &i.to_string()])
                .args(["--worker-capacity", &capacity.to_string()])
                .args(["--keys", &args.keys.to_string()])
                .args(["--seconds", &args.seconds.to_string()])
                .args(["--policy", &policy.to_string()])
                .stdin(release_in.try_clone().map_err(io("a pipe"))?)
                .stdout(report_out.try_clone().map_err(io("a pipe"))?)
                .stderr(Stdio::inherit())
                .spawn()
                .map_err(|e| format!("starting bench process {} of {workers}: {e}", i + 1))?;
            children.0.push(child);
        }
        // Only the workers hold these ends now: the reports end when the last one exits.
        drop((release_in, report_out));
        let (send, lines) = mpsc::channel();
        let reader = thread::spawn(move || {
            for line in BufReader::new(reports).lines() {
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        collect(&lines, &mut children, "ready", 0)?;
        // They start at one instant, a little later (a woken process reads the instant first),
        // and stop at one instant `--seconds` later.
        let margin = Duration::from_millis(50) + Duration::from_micros(200) * workers as u32;
        let at = unix_ns() + margin.as_nanos() as u64;
        std::fs::write(&start.0, format!("{at}\n"))
            .map_err(|e| format!("{}: {e}", start.0.display()))?;
        drop(release);
        let done = collect(&lines, &mut children, "done", 4)?;
        for (i, child) in children.0.iter_mut().enumerate() {
            let status = child.wait().map_err(io("waiting for a bench process"))?;
            if !status.success() {
                return Err(format!("bench process {} of {workers} failed ({status})", i + 1));
            }
        }
        let _ = reader.join();
        // The decisions of them all over the time from the first one's start to the last
        // one's end (a worker that started late decided less, and counts so).
        let decisions = done.iter().map(|r| r[0]).sum::<u64>();
        let admitted = done.iter().map(|r| r[1]).sum::<u64>();
        let began = done.iter().map(|r| r[2]).min().unwrap_or(0);
        let ended = done.iter().map(|r| r[2] + r[3]).max().unwrap_or(0);
        let per_second = decisions as f64 / (ended.saturating_sub(began).max(1) as f64 / 1e9);
        let plural = if workers == 1 { "process" } else { "processes" };
        Ok(Run {
            name: format!("{workers} {plural} (shared table)"),
            workers,
            per_second,
            decisions,
            admitted,
        })
    }

    /// Wait for one line `WORD INDEX NUMBERS...` (of `numbers` numbers) from each worker, and
    /// return each one's numbers in the workers' order; an error if a worker fails first.
    fn collect(
        lines: &mpsc::Receiver<std::io::Result<String>>,
        children: &mut Workers,
        word: &str,
        numbers: usize,
    ) -> Result<Vec<Vec<u64>>, String> {
        let workers = children.0.len();
        let mut got: Vec<Option<Vec<u64>>> = vec![None; workers];
        let mut left = workers;
        let (when, all) = if word == "ready" {
            ("it was ready", "were ready")
        } else {
            ("it reported", "reported")
        };
        let failed = |i: usize, status| {
            format!("bench process {} of {workers} failed ({status}) before {when}", i + 1)
        };
        while left > 0 {
            match lines.recv_timeout(Duration::from_millis(100)) {
                Ok(Ok(line)) => {
                    let odd = || format!("a bench process said {line:?}, not `{word} ...`");
                    let mut fields = line.split(' ');
                    if fields.next() != Some(word) {
                        return Err(odd());
                    }
                    let values: Vec<u64> =
                        fields.map(str::parse).collect::<Result<_, _>>().map_err(|_| odd())?;
                    match values.split_first() {
                        Some((&i, rest)) if rest.len() == numbers && (i as usize) < workers => {
                            if got[i as usize].replace(rest.to_vec()).is_some() {
                                return Err(odd());
                            }
                            left -= 1;
                        }
                        _ => return Err(odd()),
                    }
                }
                Ok(Err(e)) => return Err(format!("reading the bench processes' reports: {e}")),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    // A worker that failed (its message is on standard error) holds up the rest.
                    for (i, child) in children.0.iter_mut().enumerate() {
                        let status =
                            child.try_wait().map_err(|e| format!("a bench process: {e}"))?;
                        if let Some(status) = status.filter(|s| !s.success()) {
                            return Err(failed(i, status));
                        }
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    // Every worker has closed its output: it is exiting. Name one that failed.
                    for (i, child) in children.0.iter_mut().enumerate() {
                        match child.wait() {
                            Ok(status) if !status.success() => return Err(failed(i, status)),
                            _ => {}
                        }
                    }
                    return Err(format!("the bench processes exited before all of them {all}"));
                }
            }
        }
        Ok(got.into_iter().flatten().collect())
    }

    /// The file that says when the workers of the table at `table` start: nanoseconds since
    /// the Unix epoch (the clock every process reads alike).
    fn start_file(table: &Path) -> PathBuf {
        let mut name = table.as_os_str().to_owned();
        name.push(".start");
        PathBuf::from(name)
    }

    fn unix_ns() -> u64 {
        let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        since.map_or(0, |d| d.as_nanos() as u64)
    }

    /// One worker process: open the table, insert its keys, say `ready`, wait for the end of
    /// standard input, read the start instant, decide from it for `--seconds`, and say `done
    /// INDEX DECISIONS ADMITTED BEGAN_NS ELAPSED_NS` (began: since the Unix epoch).
    pub(super) fn worker(args: &Args, path: &Path) -> Result<(), String> {
        let spec = args.policies.first().ok_or("--worker needs --policy")?;
        let policy: Policy = spec.parse().map_err(|e| format!("--policy {spec}: {e}"))?;
        let capacity = args.worker_capacity.ok_or("--worker needs --worker-capacity")?;
        let limiter = KeyedLimiter::<u64>::open_shared(path, &policy, capacity)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let (index, keys) = (args.worker_index, args.keys);
        let first = index.checked_mul(keys).ok_or("--worker-index: too large")?;
        for k in first..first + keys {
            limiter.check(&k);
        }
        say(&format!("ready {index}\n"))?;
        // The parent closes standard input once every worker is ready, after writing the start
        // instant (a parent that went away closes it too, and leaves no instant).
        let _ = std::io::stdin().lock().read_to_end(&mut Vec::new());
        let gone = || "the bench's parent process went away before the start".to_string();
        let text = std::fs::read_to_string(start_file(path)).map_err(|_| gone())?;
        let at: u64 = text.trim().parse().map_err(|_| gone())?;
        thread::sleep(Duration::from_nanos(at.saturating_sub(unix_ns())));
        let end = at + (args.seconds * 1e9) as u64;
        let began = unix_ns();
        let thread = index as usize;
        let seconds = end.saturating_sub(began) as f64 / 1e9;
        let (decisions, admitted, elapsed) = measure(1, seconds, |_, i| {
            limiter.check(&(first + key(thread, i, keys))).is_admitted()
        });
        let elapsed = elapsed.as_nanos();
        say(&format!("done {index} {decisions} {admitted} {began} {elapsed}\n"))
    }

    /// Write `line` in one write (a pipe's writes of up to 4,096 bytes do not interleave).
    fn say(line: &str) -> Result<(), String> {
        let mut out = std::io::stdout().lock();
        out.write_all(line.as_bytes())
            .and_then(|()| out.flush())
            .map_err(|e| format!("standard output: {e}"))
    }
}

/// `bench --processes` needs shared tables: Linux only.
#[cfg(not(target_os = "linux"))]
mod processes {
    use super::Args;

    pub(super) fn run(_: &Args, _: usize) -> Result<(), String> {
        Err("--processes needs shared tables, which only Linux has".into())
    }

    pub(super) fn worker(_: &Args, _: &std::path::Path) -> Result<(), String> {
        Err("--worker needs shared tables, which only Linux has".into())
    }
}
