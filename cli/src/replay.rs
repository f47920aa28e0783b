//! `ratewell replay`: the contract of `docs/SEMANTICS.md`.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Write};
use std::path::PathBuf;

use ratewell::{
    Decision, KeyedLimiter, Layer, LayerKey, LayeredLimiter, ManualClock, Policy, Request, Resume,
};

use ratewell_cli::logs::LogFormat;
use ratewell_cli::trace::Reader;

use crate::input::{LAYER_SEPARATOR, LogArgs, LogInput, Requests, reopener, total_size};
use crate::progress::FileProgress;
use crate::spool::{self, SEED, Tee, TempFile};

#[derive(clap::Args)]
pub(crate) struct Args {
    /// The policy, e.g. 'token-bucket capacity=10 rate=5/s' (see docs/SEMANTICS.md). Repeated,
    /// the layers of a layered limiter, in order: a request is admitted only if every layer
    /// admits it, and charged to none if one rejects it. The key field is then one key for every
    /// layer, or one key per layer separated by `|` (`ip-1|key-7|search`).
    #[arg(long, required = true)]
    policy: Vec<String>,
    /// Print admitted/rejected per key and in total instead of one line per request (with the
    /// default `--format`; not with `--format full`).
    #[arg(long)]
    summary: bool,
    /// `contract`: `1`/`0` per request (`1,<delay_ns>` for a delaying leaky bucket), exactly as
    /// docs/SEMANTICS.md says. `full`: a CSV with a header and every field of each decision:
    /// `admitted,delay_ns,remaining,retry_after_ns,reset_after_ns` (`retry_after_ns` is empty for
    /// an admitted request and for one that can never pass); with several policies (or a dry
    /// run), two more: `layer`, the layer that decided (from 1: the first that rejected, or the
    /// one with the least remaining), and `would_reject`, the dry-run layers that would have
    /// rejected (separated by `|`).
    #[arg(long, value_enum, default_value_t = Format::Contract)]
    format: Format,
    /// Keys the limiter's table holds (memory: 16 bytes a key, allocated up front, and never more
    /// than this). Beyond it, keys whose state is back to fresh are reclaimed without changing any
    /// decision; only if all of a new key's candidate slots are live is one evicted, which stderr
    /// reports.
    #[arg(long, default_value_t = DEFAULT_CAPACITY)]
    capacity: usize,
    /// When live keys were evicted, replay the trace again at doubling capacities (2, 4, 8, ...
    /// times `--capacity`, up to the larger of 2^28 keys and 8 times `--capacity`) and name the
    /// smallest that evicts none. Each try allocates its table: up to 16 bytes a key of it.
    /// One policy only.
    #[arg(long)]
    find_capacity: bool,
    /// Decide every line in a Redis (or Valkey) server instead of in process:
    /// `redis://HOST:PORT[/DB]`. The trace's times are passed in (they must be whole
    /// microseconds, the backend's resolution), the output is what the in-process replay prints,
    /// and the run's keys (under a prefix of their own) are deleted at the end. `--capacity` does
    /// not apply.
    #[arg(long, value_name = "URL")]
    backend: Option<String>,
    /// Before the first line, restore the limiter's keys from a snapshot written by
    /// `--save-state` (same policies and `--capacity`). The trace continues on the snapshot's
    /// clock: a trace split in two and replayed as two runs prints what one run prints.
    #[arg(long, value_name = "FILE")]
    load_state: Option<PathBuf>,
    /// After the last line, write a snapshot of the limiter's keys to FILE (replaced whole, or
    /// not at all), for `--load-state`.
    #[arg(long, value_name = "FILE")]
    save_state: Option<PathBuf>,
    #[command(flatten)]
    logs: LogArgs,
    /// The trace; standard input if absent or `-`. With --log, an access log (gzipped or not),
    /// and more may follow, read in order (rotated logs: oldest first).
    file: Option<PathBuf>,
    /// More access logs, after the first, with --log.
    #[arg(requires = "log")]
    more: Vec<PathBuf>,
}

/// What is replayed: a trace (standard input if `None`), or access logs.
enum Input<'a> {
    Trace(Option<&'a PathBuf>),
    Logs { formats: &'a [LogFormat], files: &'a [PathBuf], strict: bool },
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    Contract,
    Full,
}

/// 2^20 keys: 16 MiB of table.
pub(crate) const DEFAULT_CAPACITY: usize = 1 << 20;

/// Progress on stderr for traces above this size, when stderr is a terminal.
pub(crate) const PROGRESS_BYTES: u64 = 16 << 20;

pub(crate) fn run(args: &Args) -> Result<(), String> {
    let policies = args
        .policy
        .iter()
        .map(|p| p.parse::<Policy>().map_err(|e| format!("--policy '{p}': {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    // Several policies, or a dry run: the layered limiter. Else the keyed limiter itself.
    let layered = policies.len() > 1 || policies[0].is_dry_run();
    let output = match (args.summary, args.format) {
        (true, Format::Full) => {
            return Err(
                "--summary and --format full: choose one (a summary has its own format)".into()
            );
        }
        (true, Format::Contract) => Output::Summary,
        (false, Format::Contract) => {
            Output::Contract { delays: policies.iter().any(Policy::delays) }
        }
        (false, Format::Full) => Output::Full { layered },
    };
    let path = args.file.as_ref().filter(|p| p.as_os_str() != "-");
    let state = args.load_state.is_some() || args.save_state.is_some();
    let formats = args.logs.formats(policies.len())?;
    let files: Vec<PathBuf> = match &args.file {
        Some(file) => std::iter::once(file).chain(&args.more).cloned().collect(),
        None => vec![PathBuf::from("-")],
    };
    let input = match &formats {
        Some(formats) => {
            if state {
                return Err("--load-state and --save-state continue a trace's clock: not with \
                            --log, whose times count from its first line (give every log to one \
                            run, oldest first)"
                    .into());
            }
            Input::Logs { formats, files: &files, strict: args.logs.strict }
        }
        None => Input::Trace(path),
    };
    // The byte between the keys of a request's layers: `|` in a trace; with --log, a byte no
    // log line holds (one --key per layer), so that a `|` in a log's value is part of its key.
    let sep = if formats.is_some() { LAYER_SEPARATOR } else { b'|' };
    if let Some(url) = &args.backend {
        if state {
            return Err("--load-state and --save-state keep an in-process limiter's keys: not \
                        with --backend (the server keeps its own)"
                .into());
        }
        return replay_redis(url, &policies, &input, sep, output);
    }
    if args.find_capacity && args.load_state.is_some() {
        return Err(
            "--find-capacity replays the trace from empty tables: not with --load-state".into()
        );
    }
    if args.find_capacity && layered {
        return Err("--find-capacity searches the capacity of one policy: give one --policy \
                    (and no dry run)"
            .into());
    }
    if layered {
        let layers = policies
            .iter()
            .enumerate()
            .map(|(i, p)| Layer::new(format!("{}", i + 1), p).capacity(args.capacity).seeded(SEED))
            .collect();
        let mut limiter = LayeredLimiter::with_clock(layers, ManualClock::new(0))
            .map_err(|e| format!("--policy: {e}"))?;
        if let Some(file) = &args.load_state {
            let restored = File::open(file)
                .map_err(ratewell::SnapshotError::from)
                .and_then(|f| limiter.restore_with(BufReader::new(f), Resume::SameClock));
            restored.map_err(|e| format!("--load-state {}: {e}", file.display()))?;
        }
        let n = limiter.len();
        let ahead = |field: &[u8]| {
            let keys: Vec<&[u8]> = field.split(|&b| b == sep).collect();
            let refs: Vec<&dyn LayerKey> = keys.iter().map(|k| k as &dyn LayerKey).collect();
            // A wrong number of keys is reported when the line is decided.
            let _ = limiter.prefetch(&refs);
        };
        let decide = |t: u64, field: &[u8], (): (), cost: u32, line: u64| {
            let keys: Vec<&[u8]> = field.split(|&b| b == sep).collect();
            if keys.len() != 1 && keys.len() != n {
                return Err(Failure::Read(format!(
                    "line {line}: {} keys for {n} policies: give one key, or one per --policy \
                     separated by |",
                    keys.len()
                )));
            }
            let refs: Vec<&dyn LayerKey> = keys.iter().map(|k| k as &dyn LayerKey).collect();
            limiter.clock().set(t);
            let d = limiter
                .check(&refs, cost)
                .map_err(|e| Failure::Read(format!("line {line}: {e}")))?;
            let would: Vec<String> = d.would_reject().map(|i| (i + 1).to_string()).collect();
            Ok(Decided { decision: d.decision(), layer: d.decided_by(), would: would.join("|") })
        };
        replay_trace(&input, output, false, ahead, decide, Ok, 1)?;
        if let Some(file) = &args.save_state {
            limiter.save(file).map_err(|e| format!("--save-state {}: {e}", file.display()))?;
        }
        for i in 0..n {
            let m = limiter.metrics(i).expect("a layer of the limiter");
            if m.evictions > 0 {
                let times = match m.evictions {
                    1 => "once".to_string(),
                    e => format!("{e} times"),
                };
                eprintln!(
                    "layer {}: live keys were evicted {times} (--capacity {}): the decisions may \
                     differ from an unbounded table's; a larger --capacity avoids it \
                     (--find-capacity, with one policy, finds one)",
                    i + 1,
                    m.capacity
                );
            }
        }
        return Ok(());
    }
    let policy = &policies[0];
    let clock = ManualClock::new(0);
    let mut limiter = KeyedLimiter::<[u8]>::builder(policy, args.capacity)
        .clock(clock.clone())
        .seed(SEED)
        .build()
        .map_err(|e| format!("--capacity {}: {e}", args.capacity))?;
    if let Some(file) = &args.load_state {
        let restored = File::open(file)
            .map_err(ratewell::SnapshotError::from)
            .and_then(|f| limiter.restore(BufReader::new(f), Resume::SameClock));
        restored.map_err(|e| format!("--load-state {}: {e}", file.display()))?;
    }
    let ahead = |key: &[u8]| limiter.request(key).prefetch();
    let decide =
        |t: u64, key: &[u8], request: Request<'_, [u8], ManualClock>, cost: u32, line: u64| {
            if key.contains(&sep) {
                let keys = key.split(|&b| b == sep).count();
                return Err(Failure::Read(format!(
                    "line {line}: {keys} keys for 1 policy: give one key, or one per --policy"
                )));
            }
            clock.set(t);
            let decision = request.cost(cost).check();
            Ok(Decided { decision, layer: None, would: String::new() })
        };
    let copy = replay_trace(&input, output, args.find_capacity, ahead, decide, Ok, 1)?;
    if let Some(file) = &args.save_state {
        limiter.save(file).map_err(|e| format!("--save-state {}: {e}", file.display()))?;
    }
    let evictions = limiter.metrics().evictions;
    if evictions > 0 {
        let trace = path.map(PathBuf::as_path).or(copy.as_ref().map(TempFile::path));
        let again = match input {
            Input::Logs { formats, files, strict } => {
                reopener(Some((formats, files, strict)), None)
            }
            Input::Trace(_) => reopener(None, trace),
        };
        let search = match &again {
            _ if !args.find_capacity => spool::Search::NotAsked,
            Some(reopen) => {
                let mut check = |l: &KeyedLimiter<[u8], ManualClock>, key: &[u8], cost: u32| {
                    l.request(key).cost(cost).check();
                };
                spool::avoiding_capacity(policy, reopen, args.capacity, &mut check)?
            }
            None => spool::Search::Unreadable,
        };
        eprintln!("{}", spool::eviction_note("", evictions, limiter.metrics().capacity, search));
    }
    Ok(())
}

/// Requests a replay on a server keeps outstanding: sent ahead of the one printed next, so that
/// the limiter's queue stays full and each call carries a full batch.
const REDIS_WINDOW: usize = 8192;
/// The most requests one call to the server carries during a replay.
const REDIS_BATCH: usize = 256;

/// A line's decision on the server: made already, or a task still waiting for it.
enum Outstanding {
    Done(Box<Result<ratewell_redis::Verdict, ratewell_redis::Error>>),
    Task(tokio::task::JoinHandle<Result<ratewell_redis::Verdict, ratewell_redis::Error>>),
}

/// The replay in a Redis server, on the trace's clock: each line is one request, sent ahead of
/// its printing (up to [`REDIS_WINDOW`] outstanding), so that the limiter batches them; the
/// server decides a batch's requests in order, as it would one call per line.
fn replay_redis(
    url: &str,
    policies: &[Policy],
    input: &Input<'_>,
    sep: u8,
    output: Output,
) -> Result<(), String> {
    // One worker: the requests go out while this thread reads the trace and prints.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the Redis client: {e}"))?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let prefix = format!("ratewell-replay:{}-{stamp}:", std::process::id());
    let mut builder = ratewell_redis::RedisLimiter::builder(url)
        .prefix(prefix)
        .timeout(std::time::Duration::from_secs(10))
        .batch(REDIS_BATCH);
    for (i, p) in policies.iter().enumerate() {
        builder = builder.layer(format!("{}", i + 1), p);
    }
    let limiter = runtime.block_on(builder.build()).map_err(|e| format!("--backend {url}: {e}"))?;
    if limiter.is_down() {
        return Err(format!("--backend {url}: the server does not answer"));
    }
    let n = policies.len();
    let decide = |t: u64, field: &[u8], (): (), cost: u32, line: u64| {
        let field = std::str::from_utf8(field)
            .map_err(|_| Failure::Read(format!("line {line}: a key that is not UTF-8")))?;
        let keys: Vec<String> = field.split(char::from(sep)).map(str::to_string).collect();
        let keys = match keys.len() {
            1 => vec![keys[0].clone(); n],
            k if k == n => keys,
            k => {
                return Err(Failure::Read(format!(
                    "line {line}: {k} keys for {n} policies: give one key, or one per --policy \
                     separated by |"
                )));
            }
        };
        let limiter = limiter.clone();
        let mut decision = Box::pin(async move {
            let keys: Vec<Option<&str>> = keys.iter().map(|k| Some(k.as_str())).collect();
            limiter.check_at(&keys, cost, ratewell::Nanos::new(t)).await
        });
        // Polled once here, in the trace's order, so that the request joins the limiter's queue
        // in that order (the runtime's worker polls spawned tasks in an order of its own); the
        // task polls it again with its own waker.
        let _context = runtime.enter();
        let mut first = std::task::Context::from_waker(std::task::Waker::noop());
        Ok(match decision.as_mut().poll(&mut first) {
            std::task::Poll::Ready(verdict) => (Outstanding::Done(Box::new(verdict)), line),
            std::task::Poll::Pending => (Outstanding::Task(runtime.spawn(decision)), line),
        })
    };
    let resolve = |(outstanding, line): (Outstanding, u64)| {
        let verdict = match outstanding {
            Outstanding::Done(verdict) => *verdict,
            Outstanding::Task(task) => runtime
                .block_on(task)
                .map_err(|e| Failure::Read(format!("line {line}: --backend {url}: {e}")))?,
        }
        .map_err(|e| Failure::Read(format!("line {line}: --backend {url}: {e}")))?;
        let d = verdict.layered();
        let would: Vec<String> = d.would_reject().map(|i| (i + 1).to_string()).collect();
        Ok(Decided { decision: d.decision(), layer: d.decided_by(), would: would.join("|") })
    };
    let result =
        replay_trace(input, output, false, |_: &[u8]| {}, decide, resolve, REDIS_WINDOW).map(drop);
    let cleared = runtime.block_on(limiter.delete_keys());
    result?;
    cleared.map_err(|e| format!("--backend {url}: deleting the replay's keys: {e}"))?;
    Ok(())
}

/// One request's decision, as printed: the (combined) decision and, for a layered limiter, the
/// layer that decided and the dry-run layers that would have rejected.
struct Decided {
    decision: Decision,
    layer: Option<usize>,
    would: String,
}

/// Replay `input` (a trace kept in a temporary copy if it is standard input and `keep`,
/// returned, to be read again should live keys be evicted) through `decide` and `resolve`,
/// printing to standard output; `ahead` is called on each key a little before `decide` (see
/// [`replay`]). For logs, what was read (lines skipped, the time's resolution) goes to stderr.
fn replay_trace<T: Copy, P>(
    input: &Input<'_>,
    output: Output,
    keep: bool,
    ahead: impl FnMut(&[u8]) -> T,
    decide: impl FnMut(u64, &[u8], T, u32, u64) -> Result<P, Failure>,
    resolve: impl FnMut(P) -> Result<Decided, Failure>,
    window: usize,
) -> Result<Option<TempFile>, String> {
    let stdout = io::stdout().lock();
    let mut out = BufWriter::with_capacity(1 << 16, stdout);
    let (result, copy) = match *input {
        Input::Logs { formats, files, strict } => {
            let progress = FileProgress::new("replay", total_size(files), PROGRESS_BYTES);
            let mut logs = LogInput::new(formats.to_vec(), files.to_vec(), strict);
            let mut result =
                replay(&mut logs, &mut out, output, progress, ahead, decide, resolve, window);
            eprintln!("ratewell: replay: {}", logs.summary());
            if result.is_ok() && logs.found.requests == 0 {
                result = Err(Failure::Read("no line of the log could be read as a request".into()));
            }
            (result, None)
        }
        Input::Trace(Some(path)) => {
            let file =
                File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            let size = file.metadata().ok().map(|m| m.len());
            let progress = FileProgress::new("replay", size, PROGRESS_BYTES);
            let mut reader = Reader::new(BufReader::with_capacity(1 << 16, file)).with_key_lists();
            let result =
                replay(&mut reader, &mut out, output, progress, ahead, decide, resolve, window);
            (result, None)
        }
        Input::Trace(None) => {
            let progress = FileProgress::new("replay", None, PROGRESS_BYTES);
            let mut reader = Reader::new(BufReader::with_capacity(
                1 << 16,
                Tee::new_if(io::stdin().lock(), keep),
            ))
            .with_key_lists();
            let result =
                replay(&mut reader, &mut out, output, progress, ahead, decide, resolve, window);
            (result, reader.into_inner().into_inner().finish())
        }
    };
    // Whatever happened, what was written ends at a line boundary: flush it.
    let flushed = out.flush();
    match (result, flushed) {
        (Err(Failure::Write(e)), _) | (Ok(()), Err(e)) if e.kind() == io::ErrorKind::BrokenPipe => {
            Ok(copy)
        }
        (Err(Failure::Write(e)), _) | (Ok(()), Err(e)) => Err(format!("cannot write output: {e}")),
        (Err(Failure::Read(e)), _) => Err(e),
        (Ok(()), Ok(())) => Ok(copy),
    }
}

enum Failure {
    Read(String),
    Write(io::Error),
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Self {
        Failure::Write(e)
    }
}

#[derive(Clone, Copy)]
enum Output {
    Contract {
        delays: bool,
    },
    /// With `layered`, the layer that decided and the dry runs that would have rejected too.
    Full {
        layered: bool,
    },
    Summary,
}

struct KeyStats {
    name: Vec<u8>,
    admitted: u64,
    rejected: u64,
}

/// A request read ahead of its decision: its key is `keys[start..end]` of the group's buffer.
struct Ahead<T> {
    t: u64,
    cost: u32,
    line: u64,
    start: usize,
    end: usize,
    token: T,
}

/// Requests read, and their keys handed to `ahead` (a limiter hashes them and prefetches their
/// buckets), before the first of them is decided: a replay of keys out of cache waits for a
/// group's memory accesses together rather than one after another.
const GROUP: usize = KeyedLimiter::<[u8], ManualClock>::BATCH_GROUP;

/// The replay: requests are read `GROUP` at a time, each key passed to `ahead` as it is read, then
/// handed in order to `decide` (given what `ahead` returned), and what it returns to `resolve`,
/// in the same order, for the decision that is printed. With a `window` of 1 each request is
/// resolved as soon as it is decided; with more, up to `window` requests are outstanding at once
/// (a server deciding them while more are read). A line that does not parse, or that `decide`
/// refuses, ends the replay after the lines before it are resolved and printed, as it would one
/// line at a time.
#[allow(clippy::too_many_arguments)]
fn replay<T: Copy, P>(
    reader: &mut impl Requests,
    out: &mut impl Write,
    output: Output,
    mut progress: FileProgress,
    mut ahead: impl FnMut(&[u8]) -> T,
    mut decide: impl FnMut(u64, &[u8], T, u32, u64) -> Result<P, Failure>,
    mut resolve: impl FnMut(P) -> Result<Decided, Failure>,
    window: usize,
) -> Result<(), Failure> {
    // Per-key counts only for --summary: the table keeps no keys, so a replay of millions of
    // distinct keys stays within the table's memory.
    let mut ids: HashMap<Vec<u8>, usize> = HashMap::new();
    let mut stats: Vec<KeyStats> = Vec::new();
    if let Output::Full { layered } = output {
        out.write_all(b"admitted,delay_ns,remaining,retry_after_ns,reset_after_ns")?;
        out.write_all(if layered { b",layer,would_reject\n" } else { b"\n" })?;
    }
    // The group's keys, copied out of the reader's lines.
    let mut keys: Vec<u8> = Vec::with_capacity(GROUP * 64);
    let mut group: Vec<Ahead<T>> = Vec::with_capacity(GROUP);
    // Requests decided and not yet resolved (a window over 1): their keys and what `decide`
    // returned, in order.
    let mut outstanding: VecDeque<(Vec<u8>, P)> = VecDeque::new();
    let mut end = None;
    while end.is_none() {
        keys.clear();
        group.clear();
        while group.len() < GROUP {
            match reader.next_request() {
                Ok(Some(request)) => {
                    let start = keys.len();
                    keys.extend_from_slice(request.key);
                    let token = ahead(&keys[start..]);
                    let (t, cost, line) = (request.t, request.cost, reader.lines());
                    group.push(Ahead { t, cost, line, start, end: keys.len(), token });
                }
                Ok(None) => {
                    end = Some(Ok(()));
                    break;
                }
                Err(e) => {
                    end = Some(Err(Failure::Read(e)));
                    break;
                }
            }
        }
        for r in &group {
            let key = &keys[r.start..r.end];
            let pending = match decide(r.t, key, r.token, r.cost, r.line) {
                Ok(p) => p,
                Err(e) => {
                    for (key, p) in outstanding.drain(..) {
                        let Decided { decision, layer, would } = resolve(p)?;
                        record(out, output, &mut ids, &mut stats, &key, &decision, layer, &would)?;
                    }
                    return Err(e);
                }
            };
            if window <= 1 {
                let Decided { decision, layer, would } = resolve(pending)?;
                record(out, output, &mut ids, &mut stats, key, &decision, layer, &would)?;
                continue;
            }
            outstanding.push_back((key.to_vec(), pending));
            if outstanding.len() >= window {
                let (key, p) = outstanding.pop_front().expect("not empty");
                let Decided { decision, layer, would } = resolve(p)?;
                record(out, output, &mut ids, &mut stats, &key, &decision, layer, &would)?;
            }
        }
        if end.is_some() {
            for (key, p) in outstanding.drain(..) {
                let Decided { decision, layer, would } = resolve(p)?;
                record(out, output, &mut ids, &mut stats, &key, &decision, layer, &would)?;
            }
        }
        progress.update(reader.bytes(), reader.lines());
    }
    end.unwrap_or(Ok(()))?;
    progress.finish(reader.lines());
    if let Output::Summary = output {
        let (mut admitted, mut rejected) = (0, 0);
        writeln!(out, "key,admitted,rejected")?;
        for s in &stats {
            admitted += s.admitted;
            rejected += s.rejected;
            out.write_all(&s.name)?;
            writeln!(out, ",{},{}", s.admitted, s.rejected)?;
        }
        writeln!(out, "*,{admitted},{rejected}")?;
    }
    Ok(())
}

/// One decision printed (or, for `--summary`, counted under its key).
#[allow(clippy::too_many_arguments)]
fn record(
    out: &mut impl Write,
    output: Output,
    ids: &mut HashMap<Vec<u8>, usize>,
    stats: &mut Vec<KeyStats>,
    key: &[u8],
    decision: &Decision,
    layer: Option<usize>,
    would: &str,
) -> Result<(), Failure> {
    match output {
        Output::Summary => {
            let id = *ids.entry(key.to_vec()).or_insert_with(|| {
                stats.push(KeyStats { name: key.to_vec(), admitted: 0, rejected: 0 });
                stats.len() - 1
            });
            let entry = &mut stats[id];
            if decision.is_admitted() {
                entry.admitted += 1;
            } else {
                entry.rejected += 1;
            }
        }
        Output::Contract { delays } => match (decision.is_admitted(), delays) {
            (true, true) => writeln!(out, "1,{}", decision.delay_ns())?,
            (true, false) => out.write_all(b"1\n")?,
            (false, _) => out.write_all(b"0\n")?,
        },
        Output::Full { layered } => {
            write_fields(out, decision)?;
            if layered {
                match layer {
                    Some(i) => write!(out, ",{},{would}", i + 1)?,
                    None => write!(out, ",,{would}")?,
                }
            }
            out.write_all(b"\n")?;
        }
    }
    Ok(())
}

/// The fields of `--format full`, without the line's end.
fn write_fields(out: &mut impl Write, d: &Decision) -> io::Result<()> {
    let admitted = u8::from(d.is_admitted());
    write!(out, "{admitted},{},{},", d.delay_ns(), d.remaining())?;
    if let Some(retry) = d.retry_after_ns() {
        write!(out, "{retry}")?;
    }
    write!(out, ",{}", d.reset_after_ns())
}
