//! One command's requests, decided in order as `batch` in ratewell-redis's `decide.lua` decides
//! them: the same arguments, the same fields in the reply, the same stored bytes. The decisions are the
//! engine's ([`WordPolicy`], [`LogPolicy`]); the states go between the stored integers and the
//! engine's words by [`WordPolicy::to_fields`] and [`WordPolicy::read_fields`].
//!
//! Each request is all or nothing across its layers; a later request of a batch sees an earlier
//! one's charges, as a later command would; the clock is read once, by the first request that
//! asks for the server's time; a one-word key is read once and written once, when the batch
//! ends, and only if a request changed it. A sliding log's list is read and changed in place, as
//! the script does.

use std::str::FromStr;
use std::sync::Arc;

use ahash::AHashMap as HashMap;
use ratewell::{Decision, LogPolicy, LogState, Nanos, Outcome, Policy, State, WordPolicy};

use crate::codec::{decimal, encode, integer, parse, split_receipt};

/// A key that holds a value of another type than the one its policy stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WrongType;

/// The keyspace a command decides on: the server's (`src/ffi.rs`), or [`Memory`](crate::Memory).
///
/// Keys are the command's key arguments by index; the decision never names a key it was not
/// given. A key named twice is always passed by its first index.
pub trait Store {
    /// The server's clock: microseconds since the Unix epoch. Called at most once a command.
    fn now_us(&mut self) -> u64;
    /// A string key's value; `None` when the key does not exist.
    fn get(&mut self, key: usize) -> Result<Option<Vec<u8>>, WrongType>;
    /// Store `value` at a string key, to expire `ttl_ms` from now (at least 1).
    fn set(&mut self, key: usize, value: &[u8], ttl_ms: u64);
    /// Delete a key.
    fn delete(&mut self, key: usize);
    /// A list key's elements, head first (none when the key does not exist).
    fn list(&mut self, key: usize) -> Result<Vec<Vec<u8>>, WrongType>;
    /// Drop the first `n` elements of a list (fewer than its length).
    fn list_trim_front(&mut self, key: usize, n: usize);
    /// Replace the element at `index` of a list.
    fn list_set(&mut self, key: usize, index: usize, value: &[u8]);
    /// Append an element to a list (created if absent).
    fn list_push(&mut self, key: usize, value: &[u8]);
    /// Remove the element at `index` of a list (the key goes with its last element).
    fn list_remove(&mut self, key: usize, index: usize);
    /// Let a key expire `ttl_ms` from now.
    fn expire(&mut self, key: usize, ttl_ms: u64);
    /// The command's writes are done (the server's store replicates them here).
    fn finish(&mut self) {}
}

/// One field of the reply, as the script returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// A number.
    Int(i64),
    /// A string (a receipt; empty when nothing was stored).
    Bytes(Vec<u8>),
    /// A request's error, in place of its first field.
    Error(String),
}

/// A layer's policy, compiled from the engine's text its argument carries.
enum Compiled {
    Word(WordPolicy),
    Log(LogPolicy),
}

/// The policies commands name, parsed once and kept (at most [`Policies::MAX`], then it starts
/// over, as the script's cache does).
#[derive(Default)]
pub struct Policies {
    known: HashMap<Vec<u8>, Arc<Compiled>>,
    /// The policy named last: a batch's requests mostly name the same few.
    last: Option<(Vec<u8>, Arc<Compiled>)>,
}

impl Policies {
    /// The most policies kept.
    pub const MAX: usize = 1024;

    fn get(&mut self, text: &[u8]) -> Result<Arc<Compiled>, String> {
        if let Some((t, c)) = &self.last {
            if t.as_slice() == text {
                return Ok(c.clone());
            }
        }
        if let Some(c) = self.known.get(text) {
            self.last = Some((text.to_vec(), c.clone()));
            return Ok(c.clone());
        }
        // 'algorithm p1 .. p6|policy': the script's integers, then the engine's text.
        let engine = text.iter().position(|&b| b == b'|').map_or(&[][..], |bar| &text[bar + 1..]);
        let policy = std::str::from_utf8(engine)
            .ok()
            .and_then(|t| Policy::from_str(t).ok())
            .ok_or_else(|| format!("ratewell: not a policy: {:?}", shorten(text)))?;
        let compiled = match WordPolicy::new(&policy) {
            Some(w) => Compiled::Word(w),
            None => {
                let log = LogPolicy::new(&policy).expect("a policy is one word or a log");
                Compiled::Log(log)
            }
        };
        if self.known.len() >= Self::MAX {
            self.known.clear();
        }
        let compiled = Arc::new(compiled);
        self.known.insert(text.to_vec(), compiled.clone());
        self.last = Some((text.to_vec(), compiled.clone()));
        Ok(compiled)
    }
}

fn shorten(raw: &[u8]) -> String {
    let s = String::from_utf8_lossy(&raw[..raw.len().min(64)]).into_owned();
    if raw.len() > 64 { s + "..." } else { s }
}

/// A string key as the batch sees it.
#[derive(Clone)]
enum Cached {
    Absent,
    Value(Vec<u8>),
    Other,
}

/// A write the batch makes when it ends.
enum Write {
    Set(Vec<u8>, u64),
    Delete,
}

/// A command's view of its keys, by key index (a key named twice by its first index).
struct Batch {
    cache: Vec<Option<Cached>>,
    writes: Vec<(usize, Write)>,
    /// Where a key's write is in `writes`.
    written: Vec<Option<usize>>,
    now: Option<u64>,
}

impl Batch {
    fn read(&mut self, store: &mut impl Store, key: usize) -> Result<Option<Vec<u8>>, ()> {
        let cached = match &self.cache[key] {
            Some(c) => c.clone(),
            None => {
                let c = match store.get(key) {
                    Ok(Some(v)) => Cached::Value(v),
                    Ok(None) => Cached::Absent,
                    Err(WrongType) => Cached::Other,
                };
                self.cache[key] = Some(c.clone());
                c
            }
        };
        match cached {
            Cached::Absent => Ok(None),
            Cached::Value(v) => Ok(Some(v)),
            Cached::Other => Err(()),
        }
    }

    fn write(&mut self, key: usize, write: Write) {
        self.cache[key] = Some(match &write {
            Write::Set(v, _) => Cached::Value(v.clone()),
            Write::Delete => Cached::Absent,
        });
        match self.written[key] {
            Some(i) => self.writes[i].1 = write,
            None => {
                self.written[key] = Some(self.writes.len());
                self.writes.push((key, write));
            }
        }
    }

    fn clock(&mut self, store: &mut impl Store) -> u64 {
        *self.now.get_or_insert_with(|| store.now_us())
    }
}

/// The cost and mode of a layer.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Enforced,
    DryRun,
    Quota,
    Read,
}

fn mode_of(flag: &[u8], cost: u64) -> Result<(Mode, u64), String> {
    let (m, c) = match flag.split_first() {
        Some((&m, [])) => (m, cost),
        Some((&m, [b':', digits @ ..])) => match integer(digits) {
            Some(c) if c >= 0 => (m, c as u64),
            _ => return Err(format!("ratewell: not a mode: {:?}", shorten(flag))),
        },
        _ => return Err(format!("ratewell: not a mode: {:?}", shorten(flag))),
    };
    let mode = match m {
        b'0' => Mode::Enforced,
        b'1' => Mode::DryRun,
        b'q' => Mode::Quota,
        b'r' => Mode::Read,
        _ => return Err(format!("ratewell: not a mode: {:?}", shorten(flag))),
    };
    Ok((mode, c))
}

/// A count the engine takes: the script's numbers, within u32 (larger costs are impossible
/// under every policy the backend accepts, as they are in the script).
fn cost_u32(c: u64) -> u32 {
    u32::try_from(c).unwrap_or(u32::MAX)
}

fn outcome_code(d: &Decision) -> i64 {
    match d.outcome() {
        Outcome::Admitted => 0,
        Outcome::Rejected => 1,
        _ => 2,
    }
}

fn ns(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The reply's five numbers of a layer's decision: outcome, remaining, reset, wait, replenish.
fn fields_of(d: &Decision) -> [i64; 5] {
    let wait = if d.is_admitted() { d.delay_ns() } else { d.retry_after_ns().unwrap_or(0) };
    [
        outcome_code(d),
        ns(d.remaining()),
        ns(d.reset_after_ns()),
        ns(wait),
        ns(d.replenish_after_ns().unwrap_or(0)),
    ]
}

/// `d` with the remaining, reset and replenish times of `state`.
fn with_state(d: [i64; 5], state: &Decision) -> [i64; 5] {
    let s = fields_of(state);
    [d[0], s[1], s[2], d[3], s[4]]
}

/// Milliseconds of a TTL: the fixed one, else `reset_ns` rounded up, at least 1.
fn ttl_ms(fixed: Option<u64>, reset_ns: u64) -> u64 {
    fixed.unwrap_or_else(|| reset_ns.div_ceil(1_000_000).max(1))
}

fn corrupt(key: &[u8], raw: &[u8]) -> String {
    format!(
        "ratewell: the state of {} does not parse: {:?}",
        String::from_utf8_lossy(key),
        shorten(raw)
    )
}

fn wrong_type(key: &[u8]) -> String {
    format!("ratewell: {} holds another type, not a state", String::from_utf8_lossy(key))
}

/// A sliding log's list as the engine's log; an entry is `t_us cost` in decimal.
fn read_log(
    store: &mut impl Store,
    log: &LogPolicy,
    key: usize,
    name: &[u8],
) -> Result<(LogState, Vec<(i64, i64)>), String> {
    let raw = store.list(key).map_err(|WrongType| wrong_type(name))?;
    let mut entries = Vec::with_capacity(raw.len());
    for e in &raw {
        match parse(e) {
            Some((v, 2)) if v[0] >= 0 && v[1] >= 1 => entries.push((v[0], v[1])),
            _ => return Err(corrupt(name, e)),
        }
    }
    let state = LogState::from_entries(
        log,
        entries.iter().map(|&(t, c)| (Nanos::new(t as u64 * 1_000), c as u64)),
    )
    .ok_or_else(|| corrupt(name, raw.first().map_or(&[][..], Vec::as_slice)))?;
    Ok((state, entries))
}

/// One layer of a request, decided.
struct Layer {
    compiled: Arc<Compiled>,
    key: usize,
    mode: Mode,
    cost: u32,
    fields: [i64; 5],
    /// The word to store when the request is admitted.
    next: Option<State>,
    /// The admission's reset (the stored key's TTL).
    reset_ns: u64,
    /// The state the request was decided on, and the stored state's raw bytes.
    seen: State,
    stored: State,
    raw: Option<Vec<u8>>,
}

struct Request<'a> {
    /// The keys, by first index.
    keys: &'a [usize],
    args: &'a [&'a [u8]],
}

/// Decide one request, appending its fields to `out`; an error leaves `out` as it was and
/// changes nothing.
fn decide_one(
    b: &mut Batch,
    store: &mut impl Store,
    policies: &mut Policies,
    names: &[&[u8]],
    req: &Request<'_>,
    out: &mut Vec<Reply>,
) -> Result<(), String> {
    let arg = |i: usize| req.args.get(i).copied().ok_or("ratewell: a request lacks arguments");
    let when = arg(0)?;
    let now_us = if when.is_empty() {
        b.clock(store)
    } else if when.len() == 8 {
        let v = f64::from_le_bytes(when.try_into().expect("8 bytes"));
        match v.fract() == 0.0 && (0.0..9_007_199_254_740_992.0).contains(&v) {
            true => v as u64,
            false => return Err("ratewell: not a time".into()),
        }
    } else {
        match integer(when) {
            Some(v) if v >= 0 => v as u64,
            _ => return Err("ratewell: not a time".into()),
        }
    };
    let now = Nanos::new(now_us.checked_mul(1_000).ok_or("ratewell: not a time")?);
    let cost = match integer(arg(1)?) {
        Some(c) if c >= 0 => c as u64,
        _ => return Err("ratewell: not a cost".into()),
    };
    let op = arg(2)?;
    let fixed_ttl = match arg(3)? {
        [] => None,
        t => match integer(t) {
            Some(ms) if ms >= 1 => Some(ms as u64),
            _ => return Err("ratewell: not a TTL".into()),
        },
    };
    let n = req.keys.len();
    if req.args.len() != 4 + 2 * n + if op == b"refund" { n } else { 0 } {
        return Err("ratewell: a request's arguments do not match its keys".into());
    }

    if op == b"refund" {
        return refund(b, store, policies, names, req, now, cost, fixed_ttl, out);
    }
    let take = match op {
        b"take" => true,
        b"peek" => false,
        _ => return Err(format!("ratewell: not an operation: {:?}", shorten(op))),
    };

    // Layers in order; a key named twice sees the charge its earlier layer would take.
    let mut pending: Vec<(usize, State)> = Vec::new();
    let mut layers = Vec::with_capacity(n);
    let (mut all, mut quota_total, mut quota_rejected) = (true, 0, 0);
    for i in 0..n {
        let compiled = policies.get(req.args[4 + 2 * i])?;
        let (mode, c) = mode_of(req.args[5 + 2 * i], cost)?;
        let c = cost_u32(c);
        let key = req.keys[i];
        let name = names[key];
        let mut layer = Layer {
            compiled: compiled.clone(),
            key,
            mode,
            cost: c,
            fields: [0; 5],
            next: None,
            reset_ns: 0,
            seen: State::FRESH,
            stored: State::FRESH,
            raw: None,
        };
        match &*compiled {
            Compiled::Log(log) => {
                let (state, _) = read_log(store, log, key, name)?;
                layer.fields = fields_of(&log.peek(&state, now, c));
            }
            Compiled::Word(w) => {
                let raw = b.read(store, key).map_err(|()| wrong_type(name))?;
                if let Some(raw) = &raw {
                    let (v, len) = parse(raw).ok_or_else(|| corrupt(name, raw))?;
                    layer.stored =
                        w.read_fields(&v[..len], now).ok_or_else(|| corrupt(name, raw))?;
                }
                layer.raw = raw;
                layer.seen =
                    pending.iter().rev().find(|(k, _)| *k == key).map_or(layer.stored, |&(_, s)| s);
                let (d, next) = w.decide(layer.seen, now, c);
                layer.fields = fields_of(&d);
                layer.reset_ns = d.reset_after_ns();
                layer.next = next;
                if mode != Mode::Read {
                    if let Some(next) = next {
                        pending.push((key, next));
                    }
                }
            }
        }
        let admitted = layer.fields[0] == 0;
        match mode {
            Mode::Enforced if !admitted => all = false,
            Mode::Quota => {
                quota_total += 1;
                if !admitted {
                    quota_rejected += 1;
                }
            }
            _ => {}
        }
        layers.push(layer);
    }
    if quota_total > 0 && quota_rejected == quota_total {
        all = false;
    }

    // A peek, and every layer of a request not admitted, report the state as it is; a read
    // layer of an admitted request, the state it was decided on.
    for l in &mut layers {
        if !take || !all || l.mode == Mode::Read {
            let state = match &*l.compiled {
                Compiled::Log(log) => {
                    let (s, _) = read_log(store, log, l.key, names[l.key])?;
                    log.probe(&s, now)
                }
                Compiled::Word(w) => {
                    w.probe(if all && l.mode == Mode::Read { l.seen } else { l.stored }, now)
                }
            };
            l.fields = with_state(l.fields, &state);
        }
    }

    // Nothing can fail from here: the request's charges are stored.
    let start = out.len();
    out.push(Reply::Int(i64::from(all)));
    let mut buf = Vec::with_capacity(25);
    for l in &mut layers {
        let mut receipt = Vec::new();
        if take && all && l.fields[0] == 0 && l.mode != Mode::Read {
            match &*l.compiled {
                Compiled::Log(log) => {
                    if let Some((fields, at)) = take_log(store, log, l.key, now, l.cost, fixed_ttl)
                    {
                        l.fields = fields;
                        receipt = decimal(&[at]);
                    }
                }
                Compiled::Word(w) => {
                    if let Some(next) = l.next {
                        match w.to_fields(next, now) {
                            Some(f) => {
                                encode(f.as_slice(), &mut buf);
                                let ttl = ttl_ms(fixed_ttl, l.reset_ns);
                                b.write(l.key, Write::Set(buf.clone(), ttl));
                                let before = l.raw.as_deref().unwrap_or_default();
                                receipt = Vec::with_capacity(buf.len() + 1 + before.len());
                                receipt.extend_from_slice(&buf);
                                receipt.push(b'|');
                                receipt.extend_from_slice(before);
                            }
                            None => b.write(l.key, Write::Delete),
                        }
                    }
                }
            }
        }
        out.extend(l.fields.iter().map(|&v| Reply::Int(v)));
        out.push(Reply::Bytes(receipt));
    }
    debug_assert_eq!(out.len() - start, 1 + 6 * n);
    Ok(())
}

/// Log an admission on a sliding log's list: the decision's fields and the entry's time (us).
/// `None` when the list changed under the decision (it cannot: one command runs at a time).
fn take_log(
    store: &mut impl Store,
    log: &LogPolicy,
    key: usize,
    now: Nanos,
    cost: u32,
    fixed_ttl: Option<u64>,
) -> Option<([i64; 5], i64)> {
    let (mut state, before) = read_log(store, log, key, &[]).ok()?;
    let (d, at) = log.take(&mut state, now, cost);
    let at = at?;
    let after: Vec<(i64, i64)> =
        state.entries().map(|(t, c)| ((t.get() / 1_000) as i64, c as i64)).collect();
    let last = *after.last()?;
    let pushed = before.last().map(|e| e.0) != Some(last.0);
    let kept = after.len() - usize::from(pushed);
    let dropped = before.len() - kept;
    if dropped > 0 {
        store.list_trim_front(key, dropped);
    }
    let entry = decimal(&[last.0, last.1]);
    if pushed {
        store.list_push(key, &entry);
    } else {
        store.list_set(key, kept - 1, &entry);
    }
    store.expire(key, ttl_ms(fixed_ttl, d.reset_after_ns()));
    Some((fields_of(&d), (at.get() / 1_000) as i64))
}

#[allow(clippy::too_many_arguments)]
fn refund(
    b: &mut Batch,
    store: &mut impl Store,
    policies: &mut Policies,
    names: &[&[u8]],
    req: &Request<'_>,
    now: Nanos,
    cost: u64,
    fixed_ttl: Option<u64>,
    out: &mut Vec<Reply>,
) -> Result<(), String> {
    let n = req.keys.len();
    let cost = cost_u32(cost);
    // Every layer's policy and key are checked first: an error changes nothing.
    let mut plan = Vec::with_capacity(n);
    for i in 0..n {
        let compiled = policies.get(req.args[4 + 2 * i])?;
        let key = req.keys[i];
        let raw = match &*compiled {
            Compiled::Log(..) => None,
            Compiled::Word(_) => b.read(store, key).map_err(|()| wrong_type(names[key]))?,
        };
        plan.push((compiled, key, raw, req.args[4 + 2 * n + i]));
    }
    for (compiled, key, _, receipt_raw) in plan {
        let (after_raw, before_raw, bar) = split_receipt(receipt_raw);
        let receipt = if after_raw.is_empty() { None } else { parse(after_raw) };
        let Some((rv, rlen)) = receipt else { continue };
        match &*compiled {
            Compiled::Log(log) => {
                let Ok((mut state, before)) = read_log(store, log, key, names[key]) else {
                    continue;
                };
                let Some(i) = before.iter().position(|e| e.0 == rv[0]) else { continue };
                log.give_back(&mut state, Nanos::new(rv[0] as u64 * 1_000), cost);
                match state.entries().find(|(t, _)| t.get() == rv[0] as u64 * 1_000) {
                    Some((_, c)) => store.list_set(key, i, &decimal(&[rv[0], c as i64])),
                    None => store.list_remove(key, i),
                }
            }
            Compiled::Word(w) => {
                // As it is now: an earlier layer of this refund may have named the same key.
                let Ok(Some(raw)) = b.read(store, key) else { continue };
                let Some((sv, slen)) = parse(&raw) else { continue };
                if bar && raw == after_raw {
                    // Nothing since the charge: the state before it, bit for bit.
                    match parse(before_raw) {
                        Some((bv, blen)) if !before_raw.is_empty() => {
                            let word = w.read_fields(&bv[..blen], now).unwrap_or(State::FRESH);
                            let ttl = ttl_ms(fixed_ttl, w.probe(word, now).reset_after_ns());
                            let mut buf = Vec::new();
                            encode(&bv[..blen], &mut buf);
                            b.write(key, Write::Set(buf, ttl));
                        }
                        _ => b.write(key, Write::Delete),
                    }
                    continue;
                }
                let (Some(state), Some(charged)) =
                    (w.read_fields(&sv[..slen], now), w.read_fields(&rv[..rlen], now))
                else {
                    continue;
                };
                let back = w.give_back(state, now, charged, cost);
                if back == state {
                    continue;
                }
                match w.to_fields(back, now) {
                    Some(f) => {
                        let mut buf = Vec::new();
                        encode(f.as_slice(), &mut buf);
                        let ttl = ttl_ms(fixed_ttl, w.probe(back, now).reset_after_ns());
                        b.write(key, Write::Set(buf, ttl));
                    }
                    None => b.write(key, Write::Delete),
                }
            }
        }
    }
    out.push(Reply::Int(1));
    Ok(())
}

/// Decide a command: `names` are its keys, `args` the script's arguments (the number of
/// requests, then per request its number of keys, its number of arguments and the arguments).
/// The reply as the script's: the server's time (us; 0 if no request read it), then each
/// request's fields, or its error and zeros in their place. An error for the whole command when
/// the counts do not describe the keys and arguments given.
pub fn decide(
    store: &mut impl Store,
    policies: &mut Policies,
    names: &[&[u8]],
    args: &[&[u8]],
) -> Result<Vec<Reply>, String> {
    let malformed = || "ratewell: the arguments do not describe a batch".to_string();
    let count = |a: Option<&&[u8]>| -> Result<usize, String> {
        match a.and_then(|a| integer(a)) {
            Some(v) if v >= 0 => Ok(v as usize),
            _ => Err(malformed()),
        }
    };
    let n = count(args.first())?;
    // Each key by the first index naming it.
    let mut first: HashMap<&[u8], usize> = HashMap::with_capacity(names.len());
    let keys: Vec<usize> =
        names.iter().enumerate().map(|(i, k)| *first.entry(*k).or_insert(i)).collect();
    let mut requests = Vec::with_capacity(n.min(names.len()));
    let (mut k, mut a) = (0usize, 1usize);
    for _ in 0..n {
        let nk = count(args.get(a))?;
        let na = count(args.get(a + 1))?;
        let ks = keys.get(k..k.checked_add(nk).ok_or_else(malformed)?).ok_or_else(malformed)?;
        let start = a + 2;
        let r#as = args.get(start..start.checked_add(na).ok_or_else(malformed)?);
        let r#as = r#as.ok_or_else(malformed)?;
        if nk == 0 {
            return Err(malformed());
        }
        requests.push(Request { keys: ks, args: r#as });
        k += nk;
        a = start + na;
    }
    if k != names.len() || a != args.len() {
        return Err(malformed());
    }

    let mut b = Batch {
        cache: vec![None; names.len()],
        writes: Vec::with_capacity(names.len()),
        written: vec![None; names.len()],
        now: None,
    };
    let mut out =
        Vec::with_capacity(1 + requests.iter().map(|r| 1 + 6 * r.keys.len()).sum::<usize>());
    out.push(Reply::Int(0));
    for req in &requests {
        let start = out.len();
        if let Err(e) = decide_one(&mut b, store, policies, names, req, &mut out) {
            out.truncate(start);
            out.push(Reply::Error(e));
            let len = if req.args.get(2).copied() == Some(b"refund") {
                1
            } else {
                1 + 6 * req.keys.len()
            };
            out.extend((1..len).map(|_| Reply::Int(0)));
        }
    }
    for (key, write) in std::mem::take(&mut b.writes) {
        match write {
            Write::Set(v, ttl) => store.set(key, &v, ttl),
            Write::Delete => store.delete(key),
        }
    }
    store.finish();
    if let Some(now) = b.now {
        out[0] = Reply::Int(i64::try_from(now).unwrap_or(i64::MAX));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use crate::{Memory, Policies, Reply};

    const POLICY: &[u8] = b"x|token-bucket capacity=5 rate=1/h";

    fn take(store: &mut Memory, p: &mut Policies, op: &[u8], receipts: &[Vec<u8>]) -> Vec<Reply> {
        let mut args: Vec<&[u8]> = vec![b"1", b"2"];
        let na = (4 + 4 + receipts.len()).to_string();
        args.push(na.as_bytes());
        args.extend_from_slice(&[b"", b"2", op, b"", POLICY, b"0", POLICY, b"0"]);
        args.extend(receipts.iter().map(Vec::as_slice));
        store.run(p, &[b"k", b"k"], &args).unwrap()
    }

    /// Two layers on one key, charged together, another request after them, then both refunded
    /// together: the refund of the second sees the first's, as two calls would.
    #[test]
    fn a_refund_of_two_layers_on_one_key_gives_both_back() {
        let (mut store, mut p) = (Memory::new(1_800_000_000_000_000), Policies::default());
        let reply = take(&mut store, &mut p, b"take", &[]);
        assert_eq!(reply[1], Reply::Int(1), "{reply:?}");
        let receipt = |i: usize| match &reply[1 + 6 * i + 6] {
            Reply::Bytes(b) => b.clone(),
            other => panic!("{other:?}"),
        };
        let (r1, r2) = (receipt(0), receipt(1));
        let peek = take(&mut store, &mut p, b"peek", &[]);
        // Two of each layer's five taken from one key: one left.
        assert_eq!(peek[3], Reply::Int(1), "{peek:?}");
        // Another request takes the last one: the state is no longer the charge's.
        let one: [&[u8]; 9] = [b"1", b"1", b"6", b"", b"1", b"take", b"", POLICY, b"0"];
        assert_eq!(store.run(&mut p, &[b"k"], &one).unwrap()[1], Reply::Int(1));
        let refund = take(&mut store, &mut p, b"refund", &[r1, r2]);
        assert_eq!(refund[1], Reply::Int(1), "{refund:?}");
        // Both charges back: four left, the other request's one still taken.
        let peek = take(&mut store, &mut p, b"peek", &[]);
        assert_eq!(peek[3], Reply::Int(4), "{peek:?}");
    }
}
