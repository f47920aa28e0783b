//! `ratewell compare`: one trace through several policies at once, side by side.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::thread;

use ratewell::{Decision, KeyedLimiter, ManualClock, Parameters, Policy};

/// Requests whose buckets are fetched together.
const GROUP: usize = KeyedLimiter::<u32, ManualClock>::BATCH_GROUP;

use ratewell_cli::trace::{Reader, Request as TraceRequest};

use crate::chart::{self, Chart, Panel};
use crate::duration::duration;
use crate::input::{LogArgs, LogInput, reopener, total_size};
use crate::output::AtomicFile;
use crate::progress::FileProgress;
use crate::replay::{DEFAULT_CAPACITY, PROGRESS_BYTES};
use crate::spool::{self, SEED, Tee, TempFile};
use crate::table;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// The trace: `t_ns,key[,cost]` per line, as for `replay`; `-` for standard input. A chart
    /// reads the trace twice: with `--svg` or `--png` it must be a file. With --log, an access
    /// log (gzipped or not), and more may follow, read in order (rotated logs: oldest first).
    trace: PathBuf,
    /// More access logs, after the first, with --log.
    #[arg(requires = "log")]
    more: Vec<PathBuf>,
    #[command(flatten)]
    logs: LogArgs,
    /// The limit to compare the algorithms at, `N/W` (e.g. `20/10s`, `100/s`, `5/250ms`): each
    /// algorithm gets its equivalent policy (token buckets of capacity B at N/W, Envoy-style with N
    /// tokens every W, nginx leaky buckets at N/W with burst B-1, nodelay and delayed; fixed
    /// window, sliding-window counter and sliding log of N per W).
    #[arg(long)]
    limit: Option<String>,
    /// The burst B the token and leaky buckets allow at once (default: N).
    #[arg(long, requires = "limit")]
    burst: Option<u32>,
    /// The reference every policy's decisions are judged against, request by request (default,
    /// with --limit N/W: the exact sliding log, `sliding-log limit=N window=W`).
    #[arg(long, value_name = "SPEC")]
    against: Option<String>,
    /// A policy to compare (repeatable); added after the derived ones of --limit.
    #[arg(long = "policy", value_name = "SPEC")]
    policies: Vec<String>,
    /// Write the chart as SVG.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Write the chart as PNG.
    #[arg(long, value_name = "FILE")]
    png: Option<PathBuf>,
    /// The key the chart shows (limits are per key); default: the key with the most requests.
    #[arg(long, value_name = "KEY")]
    chart_key: Option<String>,
    /// Keys each policy's table holds, and never more (see `replay --capacity`; evictions of live
    /// keys are reported on stderr).
    #[arg(long, default_value_t = DEFAULT_CAPACITY)]
    capacity: usize,
    /// When a policy evicted live keys, replay the trace again through it at doubling capacities
    /// to name the smallest that evicts none (see `replay --find-capacity`).
    #[arg(long)]
    find_capacity: bool,
}

/// Where requests come from: a trace, or access logs.
enum Source {
    Trace(Reader<BufReader<Tee<Box<dyn Read>>>>),
    Logs(Box<LogInput>),
}

impl Source {
    #[inline]
    fn next(&mut self) -> Result<Option<TraceRequest<'_>>, String> {
        match self {
            Source::Trace(reader) => reader.next().map_err(|e| e.to_string()),
            Source::Logs(logs) => logs.next(),
        }
    }

    fn bytes(&self) -> u64 {
        match self {
            Source::Trace(reader) => reader.bytes(),
            Source::Logs(logs) => logs.bytes(),
        }
    }

    fn lines(&self) -> u64 {
        match self {
            Source::Trace(reader) => reader.lines(),
            Source::Logs(logs) => logs.lines(),
        }
    }
}

/// One policy being compared.
struct Entry {
    policy: Policy,
    /// The span over which the peak is measured, and the limit's `N` over it (`N/W` is also the
    /// limit line of the chart).
    span_ns: u64,
    limit: u64,
}

/// The policies of `--limit N/W [--burst B]`, each algorithm's equivalent of "N per W".
fn derived(limit: &str, burst: Option<u32>) -> Result<(Vec<Entry>, Vec<String>), String> {
    let bad = |why: String| format!("--limit {limit}: {why}; expected N/W, e.g. 20/10s or 100/s");
    if limit.contains(char::is_whitespace) {
        return Err(bad("spaces".into()));
    }
    let (n, w) = limit.split_once('/').ok_or_else(|| bad("no `/`".into()))?;
    // `100/s` means 100 per 1s.
    let w =
        if w.starts_with(|c: char| c.is_ascii_digit()) { w.to_string() } else { format!("1{w}") };
    let window: Policy = format!("fixed-window limit={n} window={w}")
        .parse()
        .map_err(|e: ratewell::PolicyError| bad(e.to_string()))?;
    let n = window.limit();
    let b = u64::from(burst.unwrap_or(n as u32));
    if b == 0 {
        return Err("--burst: expected an integer from 1 to 4294967295".into());
    }
    // The window's limit and span, and the burst: each algorithm's policy built from them.
    let (limit, span, b) = (n as u32, window.window_ns(), b as u32);
    let leaky = |delay| Parameters::LeakyBucket {
        count: limit,
        period_ns: span,
        burst: b - 1,
        delay,
        nginx: false,
    };
    let params = [
        Parameters::TokenBucket { capacity: b, count: limit, period_ns: span },
        Parameters::DiscreteFill { capacity: b, refill: limit, every_ns: span },
        leaky(None),
        leaky(Some(0)),
        Parameters::FixedWindow { limit, window_ns: span, align_first: false },
        Parameters::SlidingWindow { limit, window_ns: span },
        Parameters::SlidingLog { limit, window_ns: span },
    ];
    let (mut entries, mut skipped) = (Vec::new(), Vec::new());
    for params in params {
        match Policy::new(params) {
            Ok(policy) => entries.push(Entry { policy, span_ns: span, limit: n }),
            // Not every algorithm holds every limit exactly (e.g. a sliding log keeps at most
            // 65,536 entries): compare the others and say which one is missing and why.
            Err(e) => skipped.push(format!("{params}: {e}")),
        }
    }
    Ok((entries, skipped))
}

/// The most cost one key had admitted within any span of `span` ns, kept as the trace goes.
struct Peaks {
    span: u64,
    /// Per key, its admitted cost within the last span.
    sums: Vec<u64>,
    /// The admissions within the last span of the trace, oldest first: (time, key, cost). One
    /// queue for all keys (its length is the traffic of one span, whatever the number of keys)
    /// when admission times never decrease, i.e. when nothing is delayed.
    recent: VecDeque<(u64, u32, u32)>,
    /// Per key, for a delaying policy: a key's releases come in order, different keys' do not.
    /// (Should a release ever precede the previous one, the pair counts as within the span:
    /// a guard, not seen in 300,000-request random traces of exact and nginx arithmetic.)
    per_key: Option<Vec<VecDeque<(u64, u32)>>>,
    peak: u64,
}

impl Peaks {
    fn new(span: u64, delays: bool) -> Self {
        let per_key = delays.then(Vec::new);
        Peaks { span, sums: Vec::new(), recent: VecDeque::new(), per_key, peak: 0 }
    }

    fn add_key(&mut self) {
        self.sums.push(0);
        if let Some(queues) = &mut self.per_key {
            queues.push(VecDeque::new());
        }
    }

    /// Key `id` had `cost` admitted at `t`: drop what is `span` or more before `t` (so the sum
    /// covers `[t - span + 1, t]`, any span of that length ending at `t`), then add it.
    #[inline]
    fn admit(&mut self, id: u32, t: u64, cost: u32) {
        let span = self.span;
        match &mut self.per_key {
            None => {
                while let Some(&(old, key, c)) = self.recent.front() {
                    if t.saturating_sub(old) < span {
                        break;
                    }
                    self.sums[key as usize] -= u64::from(c);
                    self.recent.pop_front();
                }
                self.recent.push_back((t, id, cost));
            }
            Some(queues) => {
                let queue = &mut queues[id as usize];
                while let Some(&(old, c)) = queue.front() {
                    if t.saturating_sub(old) < span {
                        break;
                    }
                    self.sums[id as usize] -= u64::from(c);
                    queue.pop_front();
                }
                queue.push_back((t, cost));
            }
        }
        let sum = &mut self.sums[id as usize];
        *sum += u64::from(cost);
        self.peak = self.peak.max(*sum);
    }
}

/// One policy's limiter and what it did.
struct Run {
    entry: Entry,
    limiter: KeyedLimiter<u32, ManualClock>,
    /// The limiter's own clock: runs decide on different threads, each at its own pace.
    clock: ManualClock,
    admitted: u64,
    rejected: u64,
    peaks: Peaks,
    /// Per key, whether it was ever rejected.
    ever_rejected: Vec<bool>,
    keys_rejected: u64,
    delays: Option<Vec<u64>>,
    /// Admitted and rejected cost of the charted key per bucket (a delayed admission counts when
    /// it is released).
    series: Vec<[u64; 2]>,
    charted: [u64; 2],
    /// Admissions of the charted key released after the trace's end (off the chart).
    late: u64,
    /// Whether each request of the batch was admitted, for the comparison with the reference.
    bits: Vec<bool>,
    /// Requests admitted that the reference rejected, and rejected that it admitted.
    wrong: [u64; 2],
    /// Per key, whether any of its requests was decided otherwise than by the reference.
    key_wrong: Vec<bool>,
    keys_wrong: u64,
    /// The reference itself, when it is not one of the policies compared: not in the table.
    hidden: bool,
}

impl Run {
    /// Decide a batch of requests among `keys` keys so far; `charted` is the key the chart shows
    /// and its bucket width.
    fn decide_batch(&mut self, batch: &[Request], keys: usize, charted: Option<(u32, u64)>) {
        while self.ever_rejected.len() < keys {
            self.peaks.add_key();
            self.ever_rejected.push(false);
            self.key_wrong.push(false);
        }
        self.bits.clear();
        // A group's keys are hashed and their buckets prefetched before the first is decided
        // (the clock is set per request, so the group is pipelined by hand rather than handed
        // to `batch`, which decides at one instant).
        for group in batch.chunks(GROUP) {
            let mut decided = [None; GROUP];
            let mut ahead = [None; GROUP];
            for (request, r) in ahead.iter_mut().zip(group) {
                *request = Some(self.limiter.request(&r.id).prefetch());
            }
            for ((request, r), decision) in ahead.into_iter().flatten().zip(group).zip(&mut decided)
            {
                self.clock.set(r.t);
                *decision = Some(request.cost(r.cost).check());
            }
            for (decision, r) in decided.into_iter().flatten().zip(group) {
                let bucket = charted.filter(|&(key, _)| key == r.id).map(|(_, width)| width);
                self.record(decision, r.id, r.t, r.cost, bucket);
            }
        }
    }

    #[inline]
    fn record(&mut self, decision: Decision, id: u32, t: u64, cost: u32, bucket: Option<u64>) {
        let admitted = decision.is_admitted();
        self.bits.push(admitted);
        if admitted {
            self.admitted += 1;
            // What reaches the service: a delayed request when it is released.
            self.peaks.admit(id, t.saturating_add(decision.delay_ns()), cost);
            if let Some(delays) = &mut self.delays {
                delays.push(decision.delay_ns());
            }
        } else {
            self.rejected += 1;
            let ever = &mut self.ever_rejected[id as usize];
            if !*ever {
                *ever = true;
                self.keys_rejected += 1;
            }
        }
        if let Some(width) = bucket {
            let at = t.saturating_add(decision.delay_ns());
            match self.series.get_mut(usize::try_from(at / width).unwrap_or(usize::MAX)) {
                Some(counts) => counts[usize::from(!admitted)] += u64::from(cost),
                None => self.late += 1,
            }
            self.charted[usize::from(!admitted)] += 1;
        }
    }
}

/// A parsed request, its key numbered.
struct Request {
    t: u64,
    id: u32,
    cost: u32,
}

impl Run {
    /// Count where this run's decisions of `batch` differ from the reference's (`bits`).
    fn judge(&mut self, reference: &[bool], batch: &[Request]) {
        for ((&mine, &theirs), r) in self.bits.iter().zip(reference).zip(batch) {
            if mine != theirs {
                self.wrong[usize::from(theirs)] += 1;
                let flag = &mut self.key_wrong[r.id as usize];
                if !*flag {
                    *flag = true;
                    self.keys_wrong += 1;
                }
            }
        }
    }
}

/// Requests parsed before the policies decide them.
const BATCH: usize = 1 << 14;

/// Every policy decides the batch; the policies are spread over the machine's cores (they share
/// nothing, each has its own limiter and clock), `per_thread` policies to a thread.
fn decide_all(
    runs: &mut [Run],
    per_thread: usize,
    batch: &[Request],
    keys: usize,
    charted: Option<(u32, u64)>,
) {
    thread::scope(|s| {
        let mut groups = runs.chunks_mut(per_thread);
        let here = groups.next();
        for group in groups {
            s.spawn(move || group.iter_mut().for_each(|r| r.decide_batch(batch, keys, charted)));
        }
        for run in here.into_iter().flatten() {
            run.decide_batch(batch, keys, charted);
        }
    });
}

/// Keys as small integers, in order of first appearance; their names in one buffer (no
/// allocation per key: a trace may have millions).
#[derive(Default)]
struct Keys {
    hasher: ahash::RandomState,
    ids: hashbrown::HashTable<u32>,
    bytes: Vec<u8>,
    /// Where each key's name ends in `bytes`.
    ends: Vec<usize>,
    requests: Vec<u64>,
}

impl Keys {
    fn len(&self) -> usize {
        self.ends.len()
    }

    fn name(&self, id: u32) -> &[u8] {
        name(&self.bytes, &self.ends, id)
    }

    fn find(&self, key: &[u8]) -> Option<u32> {
        let hash = self.hasher.hash_one(key);
        self.ids.find(hash, |&id| name(&self.bytes, &self.ends, id) == key).copied()
    }

    #[inline]
    fn id(&mut self, key: &[u8]) -> Result<u32, String> {
        let hash = self.hasher.hash_one(key);
        let Keys { hasher, ids, bytes, ends, requests } = self;
        if let Some(&id) = ids.find(hash, |&id| name(bytes, ends, id) == key) {
            return Ok(id);
        }
        let id = u32::try_from(ends.len())
            .map_err(|_| "more than 2^32 distinct keys: too many to compare".to_string())?;
        ids.insert_unique(hash, id, |&id| hasher.hash_one(name(bytes, ends, id)));
        bytes.extend_from_slice(key);
        ends.push(bytes.len());
        requests.push(0);
        Ok(id)
    }
}

fn name<'a>(bytes: &'a [u8], ends: &[usize], id: u32) -> &'a [u8] {
    let id = id as usize;
    let start = if id == 0 { 0 } else { ends[id - 1] };
    &bytes[start..ends[id]]
}

fn open(path: &Path) -> Result<(File, u64), String> {
    let shown = path.display();
    let file = File::open(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
    let meta = file.metadata().map_err(|e| format!("cannot read {shown}: {e}"))?;
    if !meta.is_file() {
        return Err(format!("cannot read {shown}: not a regular file"));
    }
    Ok((file, meta.len()))
}

/// The first pass of a charted comparison: every key's number of requests and the trace's end.
fn survey(source: &mut Source, size: Option<u64>, keys: &mut Keys) -> Result<u64, String> {
    let mut progress = FileProgress::new("compare: reading", size, PROGRESS_BYTES);
    let mut end = 0;
    while let Some(request) = source.next()? {
        end = request.t;
        let id = keys.id(request.key)?;
        keys.requests[id as usize] += 1;
        progress.update(source.bytes(), source.lines());
    }
    progress.finish(source.lines());
    Ok(end)
}

pub(crate) fn run(args: &Args) -> Result<(), String> {
    let mut entries = Vec::new();
    if let Some(limit) = &args.limit {
        let (derived, skipped) = derived(limit, args.burst)?;
        for s in skipped {
            eprintln!("ratewell: compare: skipping {s}");
        }
        entries.extend(derived);
    }
    let own_span = args.limit.as_ref().map(|_| (entries[0].span_ns, entries[0].limit));
    for spec in &args.policies {
        let policy: Policy = spec.parse().map_err(|e| format!("--policy {spec}: {e}"))?;
        // Explicit policies are measured over the span of --limit if there is one (to compare
        // like with like), else over their own: the window, or the time to refill from empty.
        let (span_ns, limit) = own_span.unwrap_or((policy.window_ns(), policy.limit()));
        entries.push(Entry { policy, span_ns: span_ns.max(1), limit });
    }
    if entries.is_empty() {
        return Err("nothing to compare: give --limit N/W or --policy SPEC".into());
    }
    // The reference: --against, else with --limit the exact sliding log at N per W. One of the
    // policies compared when it is the same policy; else decided beside them, not shown.
    let reference = match (&args.against, own_span) {
        (Some(spec), _) => {
            let policy: Policy = spec.parse().map_err(|e| format!("--against {spec}: {e}"))?;
            Some(policy)
        }
        (None, Some((span, n))) => {
            match Policy::new(Parameters::SlidingLog { limit: n as u32, window_ns: span }) {
                Ok(policy) => Some(policy),
                Err(e) => {
                    eprintln!("ratewell: compare: no wrong-decision counts: the sliding log: {e}");
                    None
                }
            }
        }
        (None, None) => None,
    };
    let shown_policies = entries.len();
    let reference_index = reference.map(|policy| {
        let text = policy.to_string();
        entries.iter().position(|e| e.policy.to_string() == text).unwrap_or_else(|| {
            let (span_ns, limit) = own_span.unwrap_or((policy.window_ns(), policy.limit()));
            entries.push(Entry { policy, span_ns: span_ns.max(1), limit });
            entries.len() - 1
        })
    });
    // Fail on an unwritable output before the work, not after it.
    let svg = args.svg.as_deref().map(|p| AtomicFile::create(p, "--svg")).transpose()?;
    let png = args.png.as_deref().map(|p| AtomicFile::create(p, "--png")).transpose()?;

    let template = args.logs.formats(1)?;
    let mut logs: Vec<PathBuf> = vec![args.trace.clone()];
    logs.extend(args.more.iter().cloned());
    let mut keys = Keys::default();
    let charting = svg.is_some() || png.is_some();
    if charting && logs.iter().any(|l| l.as_os_str() == "-") {
        return Err("a chart reads its input twice: --svg and --png need files, not -".into());
    }
    let chart_plan = if charting {
        let end = match &template {
            Some(t) => {
                let mut source = Source::Logs(Box::new(LogInput::new(
                    t.clone(),
                    logs.clone(),
                    args.logs.strict,
                )));
                survey(&mut source, total_size(&logs), &mut keys)?
            }
            None => {
                let (file, size) = open(&args.trace)?;
                let input: Box<dyn Read> = Box::new(file);
                let reader =
                    Reader::new(BufReader::with_capacity(1 << 16, Tee::new_if(input, false)));
                survey(&mut Source::Trace(reader), Some(size), &mut keys)?
            }
        };
        let key = match &args.chart_key {
            Some(k) => keys
                .find(k.as_bytes())
                .ok_or_else(|| format!("--chart-key {k}: no request of the trace has this key"))?,
            // The busiest key; the first one seen among equals.
            None => (0..keys.len() as u32)
                .max_by_key(|&id| (keys.requests[id as usize], std::cmp::Reverse(id)))
                .ok_or("the trace has no requests: nothing to chart")?,
        };
        let width = chart::bucket_width(end);
        Some((key, width, usize::try_from(end / width + 1).unwrap_or(usize::MAX)))
    } else {
        None
    };

    let mut runs: Vec<Run> = entries
        .into_iter()
        .map(|entry| {
            let clock = ManualClock::new(0);
            Ok(Run {
                limiter: KeyedLimiter::builder(&entry.policy, args.capacity)
                    .clock(clock.clone())
                    .seed(SEED)
                    .build()
                    .map_err(|e| format!("--capacity {}: {e}", args.capacity))?,
                clock,
                delays: entry.policy.delays().then(Vec::new),
                peaks: Peaks::new(entry.span_ns, entry.policy.delays()),
                entry,
                admitted: 0,
                rejected: 0,
                ever_rejected: Vec::new(),
                keys_rejected: 0,
                series: chart_plan.map_or(Vec::new(), |(_, _, buckets)| vec![[0, 0]; buckets]),
                charted: [0, 0],
                late: 0,
                bits: Vec::with_capacity(BATCH),
                wrong: [0, 0],
                key_wrong: Vec::new(),
                keys_wrong: 0,
                hidden: false,
            })
        })
        .collect::<Result<_, String>>()?;
    for run in &mut runs[shown_policies..] {
        run.hidden = true;
    }
    let charted = chart_plan.map(|(key, width, _)| (key, width));
    // Asked once: on Linux the answer reads the affinity mask and the cgroup's CPU quota.
    let cores = thread::available_parallelism().map_or(1, |n| n.get());
    let per_thread = runs.len().div_ceil(cores.min(runs.len())).max(1);

    // A file, or a pipe (no chart: read once), copied as it is read should it be needed again.
    let stdin = args.trace.as_os_str() == "-";
    let (input, size): (Box<dyn Read>, Option<u64>) = if template.is_some() {
        (Box::new(io::empty()), total_size(&logs))
    } else if stdin {
        (Box::new(io::stdin().lock()), None)
    } else if charting {
        let (file, size) = open(&args.trace)?;
        (Box::new(file), Some(size))
    } else {
        let file = File::open(&args.trace)
            .map_err(|e| format!("cannot read {}: {e}", args.trace.display()))?;
        let meta =
            file.metadata().map_err(|e| format!("cannot read {}: {e}", args.trace.display()))?;
        if meta.is_dir() {
            return Err(format!("cannot read {}: not a regular file", args.trace.display()));
        }
        (Box::new(file), meta.is_file().then_some(meta.len()))
    };
    let regular = size.is_some() && template.is_none();
    let tee = Tee::new_if(input, !regular && args.find_capacity);
    let mut reader = match &template {
        Some(t) => Source::Logs(Box::new(LogInput::new(t.clone(), logs.clone(), args.logs.strict))),
        None => Source::Trace(Reader::new(BufReader::with_capacity(1 << 16, tee))),
    };
    let mut progress = FileProgress::new("compare", size, PROGRESS_BYTES);
    let (mut requests, mut end, mut unit_costs) = (0u64, 0u64, true);
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        // Parse a batch here, then let every policy decide it, in parallel across policies.
        batch.clear();
        while batch.len() < BATCH {
            let Some(request) = reader.next()? else { break };
            let id = keys.id(request.key)?;
            unit_costs &= charted.is_none_or(|(key, _)| key != id) || request.cost == 1;
            batch.push(Request { t: request.t, id, cost: request.cost });
        }
        let Some(last) = batch.last() else { break };
        requests += batch.len() as u64;
        end = last.t;
        decide_all(&mut runs, per_thread, &batch, keys.len(), charted);
        if let Some(at) = reference_index {
            let reference = std::mem::take(&mut runs[at].bits);
            for run in &mut runs {
                run.judge(&reference, &batch);
            }
            runs[at].bits = reference;
        }
        progress.update(reader.bytes(), reader.lines());
    }
    progress.finish(reader.lines());
    let copy = match reader {
        Source::Trace(reader) => reader.into_inner().into_inner().finish(),
        Source::Logs(logs) => {
            eprintln!("ratewell: compare: {}", logs.summary());
            if logs.found.requests == 0 {
                return Err("no line of the log could be read as a request".into());
            }
            None
        }
    };

    let mut out = std::io::stdout().lock();
    let against = reference_index.map(|at| runs[at].entry.policy.to_string());
    let table = report(&args.trace, requests, keys.len(), end, &mut runs, against.as_deref());
    out.write_all(table.as_bytes()).map_err(|e| format!("cannot write output: {e}"))?;
    let trace_again =
        if regular { Some(args.trace.as_path()) } else { copy.as_ref().map(TempFile::path) };
    let again = reopener(
        template.as_deref().map(|formats| (formats, &logs[..], args.logs.strict)),
        trace_again,
    );
    for run in &runs {
        let evictions = run.limiter.metrics().evictions;
        if evictions == 0 {
            continue;
        }
        let what = if run.hidden { "the reference " } else { "" };
        let search = match &again {
            _ if !args.find_capacity => spool::Search::NotAsked,
            Some(reopen) => {
                let mut check = |l: &KeyedLimiter<u32, ManualClock>, key: &[u8], cost: u32| {
                    if let Some(id) = keys.find(key) {
                        l.request(&id).cost(cost).check();
                    }
                };
                spool::avoiding_capacity(&run.entry.policy, reopen, args.capacity, &mut check)?
            }
            None => spool::Search::Unreadable,
        };
        let what = format!("compare: {what}{}: ", run.entry.policy);
        eprintln!(
            "{}",
            spool::eviction_note(&what, evictions, run.limiter.metrics().capacity, search)
        );
    }

    if let Some((key, width, _)) = chart_plan {
        let chart = Chart {
            title: format!(
                "{}: key {} ({} requests){}",
                args.trace.file_name().map_or("trace".into(), |n| n.to_string_lossy()),
                String::from_utf8_lossy(keys.name(key)),
                keys.requests[key as usize],
                own_span.map_or(String::new(), |(span, n)| format!(
                    "; limit {n} per {}, burst {}",
                    duration(span),
                    args.burst.map_or(n, u64::from)
                )),
            ),
            bucket_ns: width,
            unit: if unit_costs { "requests" } else { "cost" },
            panels: runs
                .iter()
                .filter(|run| !run.hidden)
                .map(|run| Panel {
                    label: run.entry.policy.to_string(),
                    note: match (run.delays.is_some(), run.late) {
                        (false, _) => {
                            format!("admitted {}, rejected {}", run.charted[0], run.charted[1])
                        }
                        (true, 0) => format!(
                            "admitted {}, rejected {}; admissions shown when released",
                            run.charted[0], run.charted[1]
                        ),
                        (true, late) => format!(
                            "admitted {}, rejected {}; admissions shown when released, {late} \
                             after the trace's end",
                            run.charted[0], run.charted[1]
                        ),
                    },
                    series: run.series.clone(),
                    limit: run.entry.limit,
                    span_ns: run.entry.span_ns,
                })
                .collect(),
        };
        let drawn = chart.svg()?;
        if let Some(file) = png {
            file.commit(&chart::png(&drawn)?)?;
        }
        if let Some(file) = svg {
            file.commit(drawn.as_bytes())?;
        }
    }
    Ok(())
}

/// The comparison table; with a reference, the wrong-decision columns.
fn report(
    trace: &Path,
    requests: u64,
    keys: usize,
    end: u64,
    runs: &mut [Run],
    against: Option<&str>,
) -> String {
    let mut rows = vec![
        [
            "policy",
            "admitted",
            "rejected",
            "peak (span)",
            "keys rejected",
            "delay p50",
            "p99",
            "max",
            "wrong: admitted",
            "wrong: rejected",
            "keys wrong",
        ]
        .map(String::from),
    ];
    let percent =
        |part: u64, whole: u64| if whole == 0 { 0.0 } else { part as f64 * 100.0 / whole as f64 };
    for run in runs.iter_mut().filter(|run| !run.hidden) {
        let total = run.admitted + run.rejected;
        let mut row = [
            run.entry.policy.to_string(),
            format!("{} ({:.1}%)", run.admitted, percent(run.admitted, total)),
            format!("{} ({:.1}%)", run.rejected, percent(run.rejected, total)),
            format!("{} ({})", run.peaks.peak, duration(run.entry.span_ns)),
            format!("{} of {keys}", run.keys_rejected),
            "-".into(),
            "-".into(),
            "-".into(),
            "-".into(),
            "-".into(),
            "-".into(),
        ];
        if let Some(delays) = &mut run.delays {
            delays.sort_unstable();
            let at = |q: f64| {
                // Nearest rank: the smallest delay at least q of the admitted requests had.
                let rank = ((q * delays.len() as f64).ceil() as usize).clamp(1, delays.len());
                delays.get(rank - 1).map_or("-".into(), |&d| duration(d))
            };
            row[5] = at(0.50);
            row[6] = at(0.99);
            row[7] = at(1.0);
        }
        if against.is_some() {
            // Shares of all requests, fine enough for Cloudflare's 0.003%.
            row[8] = format!("{} ({:.4}%)", run.wrong[0], percent(run.wrong[0], total));
            row[9] = format!("{} ({:.4}%)", run.wrong[1], percent(run.wrong[1], total));
            row[10] = format!("{} of {keys}", run.keys_wrong);
        }
        rows.push(row);
    }
    let mut text = format!(
        "{}: {requests} requests from {keys} keys over {}\n",
        trace.display(),
        duration(end)
    );
    if against.is_some() {
        text += &table::render(&rows, &[0]);
    } else {
        // No reference: no wrong-decision columns.
        let rows: Vec<[String; 8]> =
            rows.iter().map(|row| std::array::from_fn(|i| row[i].clone())).collect();
        text += &table::render(&rows, &[0]);
    }
    text += "peak: the most cost one key had admitted within any span of that length (a delayed \
             request counts when it is released).\n";
    if let Some(reference) = against {
        text += &format!(
            "wrong: the requests a policy admitted that the reference ({reference}) rejected, \
             and rejected that it admitted, deciding the same requests (a delayed request is \
             admitted); their share of all requests, and the keys of those requests.\n"
        );
    }
    text
}
