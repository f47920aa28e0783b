//! A naive reference model of every algorithm, written from docs/SEMANTICS.md alone: unpacked state,
//! absolute time in u128/i128, rates as unreduced integer ratios. It knows nothing of the packed
//! layouts. `remaining`, `reset_after` and `retry_after` are derived by search from the model's own
//! admission rule, using their definitions:
//! - retry_after: the smallest wait after which the same request would be admitted;
//! - remaining: the largest cost admitted right after the decision, at the same instant;
//! - reset_after: the smallest wait after which the key is indistinguishable from a fresh one.

//!
//! [`run`] drives a scenario ([`Op`]s) through a [`Backend`] and the model side by side and
//! reports the first field of the first decision that differs. The in-process backends are here
//! ([`Direct`], [`Keyed`], [`Pure`]); another backend (a server-side store) implements
//! [`Backend`] and passes the same scenarios. The crate is used by the engine's tests, the loom
//! models and the fuzz targets, and is not published.
#![allow(missing_docs)]

use ratewell::{
    Decision, KeyedLimiter, Limiter, ManualClock, Nanos, Outcome, Policy, State, WordPolicy,
};

/// What the model's admission rule says about one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Admitted { delay: u128 },
    Rejected,
    Impossible,
}

pub trait Model: Clone {
    fn limit(&self) -> u128;
    /// Decide at `now`; when admitted, update the state.
    fn step(&mut self, now: u128, cost: u128) -> Verdict;
    /// Every later decision equals a fresh key's.
    fn is_full(&self, now: u128) -> bool;
}

/// The decision the model expects, field by field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expected {
    pub outcome: Outcome,
    pub limit: u128,
    pub remaining: u128,
    pub reset_after: u128,
    pub retry_after: Option<u128>,
    pub delay: u128,
    /// When more quota comes (the `RateLimit` field's `t`): `None` when full.
    pub replenish: Option<u128>,
}

impl Expected {
    pub fn of(d: &Decision) -> Self {
        Expected {
            outcome: d.outcome(),
            limit: d.limit().into(),
            remaining: d.remaining().into(),
            reset_after: d.reset_after_ns().into(),
            retry_after: d.retry_after_ns().map(u128::from),
            delay: d.delay_ns().into(),
            replenish: d.replenish_after_ns().map(u128::from),
        }
    }
}

/// Smallest `x` in `lo..=hi` with `f(x)`, for `f` monotone (false then true) and `f(hi)`.
fn min_true(mut lo: u128, mut hi: u128, f: impl Fn(u128) -> bool) -> u128 {
    // Gallop first, so that the search never evaluates far beyond the answer (keeps the model's
    // products small).
    let mut probe = lo.max(1);
    while probe < hi && !f(probe) {
        lo = probe + 1;
        probe = probe.saturating_mul(2);
    }
    hi = hi.min(probe);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if f(mid) { hi = mid } else { lo = mid + 1 }
    }
    lo
}

const FOREVER: u128 = 1 << 100;

/// Nanoseconds from `now` until `model` is back to full (a fresh key's equal).
pub fn reset_after<M: Model>(model: &M, now: u128) -> u128 {
    min_true(0, FOREVER, |w| model.is_full(now + w))
}

/// The largest cost `model` admits at `now` (nothing taken).
fn remaining_at<M: Model>(model: &M, now: u128) -> u128 {
    let fits = |k: u128| k == 0 || matches!(model.clone().step(now, k), Verdict::Admitted { .. });
    // Largest k with fits(k): smallest k with !fits(k+1).
    min_true(0, model.limit(), |k| !fits(k + 1))
}

/// Decide with the model, deriving every field; the state advances only if `commit`. A peek
/// (`!commit`) reports the state as it is: remaining, reset and replenish of the state before.
pub fn expect<M: Model>(model: &mut M, now: u128, cost: u128, commit: bool) -> Expected {
    let before = model.clone();
    let mut after = model.clone();
    let verdict = after.step(now, cost);
    let reported = if commit { after.clone() } else { before.clone() };
    let remaining = remaining_at(&reported, now);
    let reset_after = min_true(0, FOREVER, |w| reported.is_full(now + w));
    let replenish = (remaining < reported.limit())
        .then(|| min_true(1, FOREVER, |w| remaining_at(&reported, now + w) > remaining));
    let (outcome, retry_after, delay) = match verdict {
        Verdict::Admitted { delay } => (Outcome::Admitted, None, delay),
        Verdict::Impossible => (Outcome::Impossible, None, 0),
        Verdict::Rejected => {
            let wait = min_true(1, FOREVER, |w| {
                matches!(before.clone().step(now + w, cost), Verdict::Admitted { .. })
            });
            (Outcome::Rejected, Some(wait), 0)
        }
    };
    if commit {
        *model = after;
    }
    // Durations longer than u64 ns (584 years) saturate, as documented on `Decision`.
    let sat = |x: u128| x.min(u64::MAX.into());
    Expected {
        outcome,
        limit: before.limit(),
        remaining,
        reset_after: sat(reset_after),
        retry_after: retry_after.map(sat),
        delay: sat(delay),
        replenish: replenish.map(sat),
    }
}

fn ceil_div(a: u128, b: u128) -> u128 {
    a.div_ceil(b)
}

/// Token bucket, continuous: GCRA with TAT in units of 1/count ns.
#[derive(Clone, Debug)]
pub struct Gcra {
    pub capacity: u128,
    pub count: u128,
    pub period: u128,
    pub tat: Option<u128>,
}

impl Model for Gcra {
    fn limit(&self) -> u128 {
        self.capacity
    }
    fn step(&mut self, now: u128, c: u128) -> Verdict {
        if c > self.capacity {
            return Verdict::Impossible;
        }
        let now_n = now * self.count;
        let t = self.tat.unwrap_or(0).max(now_n);
        // max(TAT, now) + c*T - now <= B*T, everything times `count`.
        if t + c * self.period - now_n <= self.capacity * self.period {
            self.tat = Some(t + c * self.period);
            Verdict::Admitted { delay: 0 }
        } else {
            Verdict::Rejected
        }
    }
    fn is_full(&self, now: u128) -> bool {
        self.tat.is_none_or(|t| t <= now * self.count)
    }
}

/// Leaky bucket, nginx semantics in exact arithmetic: excess in units of 1/period requests,
/// `excess' = max(0, excess - R*(now - last) + 1) + (c - 1)` with the signed elapsed time.
#[derive(Clone, Debug)]
pub struct Leaky {
    pub burst: u128,
    pub count: u128,
    pub period: u128,
    /// `None`: nodelay.
    pub delay: Option<u128>,
    pub state: Option<(i128, i128)>,
}

impl Model for Leaky {
    fn limit(&self) -> u128 {
        self.burst + 1
    }
    fn step(&mut self, now: u128, c: u128) -> Verdict {
        if c > self.burst + 1 {
            return Verdict::Impossible;
        }
        let (n, d) = (self.count as i128, self.period as i128);
        let now = now as i128;
        let excess = match self.state {
            None => (c as i128 - 1) * d,
            Some((e, last)) => (e - n * (now - last) + d).max(0) + (c as i128 - 1) * d,
        };
        if excess > self.burst as i128 * d {
            return Verdict::Rejected;
        }
        self.state = Some((excess, now));
        // Delay: max(0, excess - D) / R, in ns: (excess - D*period)/count, rounded up.
        let delay = match self.delay {
            None => 0,
            Some(free) => ceil_div((excess - free as i128 * d).max(0) as u128, self.count),
        };
        Verdict::Admitted { delay }
    }
    fn is_full(&self, now: u128) -> bool {
        let (n, d) = (self.count as i128, self.period as i128);
        self.state.is_none_or(|(e, last)| e - n * (now as i128 - last) + d <= 0)
    }
}

/// Leaky bucket with nginx's own arithmetic (compat=nginx), from docs/SEMANTICS.md.
#[derive(Clone, Debug)]
pub struct Nginx {
    /// milli-requests per second.
    pub rate: i128,
    pub burst: i128,
    pub delay: Option<i128>,
    /// `(excess, last_ms)`.
    pub state: Option<(i128, i128)>,
}

impl Nginx {
    pub fn new(count: u128, period: u128, burst: u128, delay: Option<u128>) -> Self {
        let rate = (count * 1000 * 1_000_000_000 / period) as i128;
        Nginx { rate, burst: burst as i128, delay: delay.map(|d| d as i128), state: None }
    }
}

impl Model for Nginx {
    fn limit(&self) -> u128 {
        (self.burst + 1) as u128
    }
    fn step(&mut self, now: u128, c: u128) -> Verdict {
        if c as i128 > self.burst + 1 {
            return Verdict::Impossible;
        }
        let now_ms = (now / 1_000_000) as i128;
        let (excess_1, last) = match self.state {
            None => (0, now_ms),
            Some((excess, last)) => {
                let ms = (now_ms - last).max(0);
                let e = (excess - self.rate * ms / 1000 + 1000).max(0);
                (e, if ms != 0 { now_ms } else { last })
            }
        };
        let excess_c = excess_1 + (c as i128 - 1) * 1000;
        if excess_c > self.burst * 1000 {
            return Verdict::Rejected;
        }
        self.state = Some((excess_c, last));
        let delay_ms = match self.delay {
            Some(d) if excess_c > d * 1000 => (excess_c - d * 1000) * 1000 / self.rate,
            _ => 0,
        };
        Verdict::Admitted { delay: delay_ms as u128 * 1_000_000 }
    }
    fn is_full(&self, now: u128) -> bool {
        let now_ms = (now / 1_000_000) as i128;
        self.state.is_none_or(|(excess, last)| {
            excess - self.rate * (now_ms - last).max(0) / 1000 + 1000 <= 0
        })
    }
}

/// Token bucket with discrete fill (Envoy).
#[derive(Clone, Debug)]
pub struct Discrete {
    pub capacity: u128,
    pub refill: u128,
    pub every: u128,
    /// `(tokens, index of the last fill applied)`.
    pub state: Option<(u128, u128)>,
}

impl Discrete {
    fn at(&self, now: u128) -> (u128, u128) {
        let k_now = now / self.every;
        match self.state {
            None => (self.capacity, k_now),
            Some((tokens, k)) if k_now > k => {
                ((tokens + self.refill * (k_now - k)).min(self.capacity), k_now)
            }
            Some(s) => s,
        }
    }
}

impl Model for Discrete {
    fn limit(&self) -> u128 {
        self.capacity
    }
    fn step(&mut self, now: u128, c: u128) -> Verdict {
        if c > self.capacity {
            return Verdict::Impossible;
        }
        let (tokens, k) = self.at(now);
        if tokens < c {
            return Verdict::Rejected;
        }
        self.state = Some((tokens - c, k));
        Verdict::Admitted { delay: 0 }
    }
    fn is_full(&self, now: u128) -> bool {
        self.at(now).0 == self.capacity
    }
}

/// Fixed window; `first`: windows open at a key's first request after the previous one ends.
#[derive(Clone, Debug)]
pub struct Fixed {
    pub limit: u128,
    pub window: u128,
    pub first: bool,
    /// `(window start, admitted cost)`.
    pub state: Option<(u128, u128)>,
}

impl Fixed {
    fn at(&self, now: u128) -> (u128, u128) {
        let open = if self.first { now } else { now / self.window * self.window };
        match self.state {
            Some((start, count)) if now < start + self.window => (start, count),
            _ => (open, 0),
        }
    }
}

impl Model for Fixed {
    fn limit(&self) -> u128 {
        self.limit
    }
    fn step(&mut self, now: u128, c: u128) -> Verdict {
        if c > self.limit {
            return Verdict::Impossible;
        }
        let (start, count) = self.at(now);
        if count + c > self.limit {
            return Verdict::Rejected;
        }
        self.state = Some((start, count + c));
        Verdict::Admitted { delay: 0 }
    }
    fn is_full(&self, now: u128) -> bool {
        self.at(now).1 == 0
    }
}

/// Sliding-window counter.
#[derive(Clone, Debug)]
pub struct Sliding {
    pub limit: u128,
    pub window: u128,
    /// `(window index, prev, cur)`.
    pub state: (u128, u128, u128),
}

impl Sliding {
    /// `(k, prev, cur, r)` at `now`; a reading before the stored window counts at its start.
    fn at(&self, now: u128) -> (u128, u128, u128, u128) {
        let (k, prev, cur) = self.state;
        let (k_now, r) = (now / self.window, now % self.window);
        if k_now < k {
            (k, prev, cur, 0)
        } else if k_now == k {
            (k, prev, cur, r)
        } else if k_now == k + 1 {
            (k_now, cur, 0, r)
        } else {
            (k_now, 0, 0, r)
        }
    }
}

impl Model for Sliding {
    fn limit(&self) -> u128 {
        self.limit
    }
    fn step(&mut self, now: u128, c: u128) -> Verdict {
        if c > self.limit {
            return Verdict::Impossible;
        }
        let (k, prev, cur, r) = self.at(now);
        let w = self.window;
        if (prev * (w - r) + cur * w) / w + c > self.limit {
            return Verdict::Rejected;
        }
        self.state = (k, prev, cur + c);
        Verdict::Admitted { delay: 0 }
    }
    fn is_full(&self, now: u128) -> bool {
        let (_, prev, cur, r) = self.at(now);
        cur == 0 && prev * (self.window - r) / self.window == 0
    }
}

/// Sliding log: every admitted request with its time.
#[derive(Clone, Debug)]
pub struct Log {
    pub limit: u128,
    pub window: u128,
    pub entries: Vec<(u128, u128)>,
}

impl Model for Log {
    fn limit(&self) -> u128 {
        self.limit
    }
    fn step(&mut self, now: u128, c: u128) -> Verdict {
        if c > self.limit {
            return Verdict::Impossible;
        }
        let now = self.entries.last().map_or(now, |&(t, _)| t.max(now));
        let live: u128 =
            self.entries.iter().filter(|&&(t, _)| t + self.window >= now).map(|&(_, c)| c).sum();
        if live + c > self.limit {
            return Verdict::Rejected;
        }
        self.entries.push((now, c));
        Verdict::Admitted { delay: 0 }
    }
    fn is_full(&self, now: u128) -> bool {
        self.entries.iter().all(|&(t, _)| t + self.window < now)
    }
}

/// One step of a scenario.
#[derive(Clone, Copy, Debug)]
pub struct Op {
    pub gap: Gap,
    pub cost: u32,
    pub peek: bool,
}

#[derive(Clone, Copy, Debug)]
pub enum Gap {
    /// Move forward by this many ns (clamped to the policy's idle horizon and to 2^63 - 1).
    Forward(u64),
    /// Move backward by this many ns (a skewed clock), at most down to 0.
    Back(u64),
}

/// Something that decides requests for one key under one policy, at instants the caller gives.
pub trait Backend {
    /// Decide a request of `cost` at `now` (ns on the scenario's clock, which may step back),
    /// taking it if admitted; `Err` for a failure of the backend itself.
    fn check(&mut self, now: u64, cost: u32) -> Result<Decision, String>;
    /// Decide without taking anything, reporting the state as it is.
    fn peek(&mut self, now: u64, cost: u32) -> Result<Decision, String>;
}

/// The direct [`Limiter`] on a [`ManualClock`], with a second limiter on the lean path
/// (`allow_n`) kept in lockstep: it must admit exactly what `check_n` admits.
pub struct Direct {
    clock: ManualClock,
    limiter: Limiter<ManualClock>,
    lean: Limiter<ManualClock>,
}

impl Direct {
    pub fn new(policy: &Policy, start: u64) -> Self {
        let clock = ManualClock::new(start);
        let limiter = Limiter::with_clock(policy, clock.clone());
        let lean = Limiter::with_clock(policy, clock.clone());
        Direct { clock, limiter, lean }
    }
}

impl Backend for Direct {
    fn check(&mut self, now: u64, cost: u32) -> Result<Decision, String> {
        self.clock.set(now);
        let got = self.limiter.check_n(cost);
        if self.lean.allow_n(cost) != got.is_admitted() {
            return Err(format!("allow_n disagrees with {got:?}"));
        }
        Ok(got)
    }
    fn peek(&mut self, now: u64, cost: u32) -> Result<Decision, String> {
        self.clock.set(now);
        // Both limiters act on every reading: a peek, too, is a reading acted on.
        self.lean.peek_n(cost);
        Ok(self.limiter.peek_n(cost))
    }
}

/// One key of a [`KeyedLimiter`] (other keys of its table are left alone), lean path in
/// lockstep on another key.
pub struct Keyed {
    clock: ManualClock,
    limiter: KeyedLimiter<str, ManualClock>,
}

impl Keyed {
    pub fn new(policy: &Policy, start: u64) -> Self {
        let clock = ManualClock::new(start);
        Keyed { limiter: KeyedLimiter::with_clock(policy, 64, clock.clone()), clock }
    }
}

impl Backend for Keyed {
    fn check(&mut self, now: u64, cost: u32) -> Result<Decision, String> {
        self.clock.set(now);
        let got = self.limiter.request("key").cost(cost).check();
        if self.limiter.request("lean").cost(cost).allow() != got.is_admitted() {
            return Err(format!("allow_n disagrees with {got:?}"));
        }
        Ok(got)
    }
    fn peek(&mut self, now: u64, cost: u32) -> Result<Decision, String> {
        self.clock.set(now);
        self.limiter.request("lean").cost(cost).peek();
        Ok(self.limiter.request("key").cost(cost).peek())
    }
}

/// The pure decision ([`WordPolicy`]) on a [`State`] held here, at the running maximum of the
/// readings (as the limiters decide), with [`WordPolicy::admit`] in lockstep.
pub struct Pure {
    policy: WordPolicy,
    state: State,
    latest: u64,
}

impl Pure {
    /// `None` for a policy that is not one word (the sliding log).
    pub fn new(policy: &Policy) -> Option<Self> {
        Some(Pure { policy: WordPolicy::new(policy)?, state: State::FRESH, latest: 0 })
    }
}

impl Backend for Pure {
    fn check(&mut self, now: u64, cost: u32) -> Result<Decision, String> {
        self.latest = self.latest.max(now);
        let now = Nanos::new(self.latest);
        let (got, next) = self.policy.decide(self.state, now, cost);
        if self.policy.admit(self.state, now, cost) != next {
            return Err(format!("admit disagrees with {got:?}"));
        }
        if got.is_admitted() != next.is_some() {
            return Err(format!("{got:?} came with the state {next:?}"));
        }
        self.state = next.unwrap_or(self.state);
        Ok(got)
    }
    fn peek(&mut self, now: u64, cost: u32) -> Result<Decision, String> {
        self.latest = self.latest.max(now);
        Ok(self.policy.peek(self.state, Nanos::new(self.latest), cost))
    }
}

/// Run `ops` through every in-process backend ([`Direct`], [`Keyed`] and, for a one-word
/// policy, [`Pure`]) and the model, comparing every field of every decision.
pub fn run<M: Model>(policy: &Policy, model: M, start: u64, ops: &[Op]) -> Result<(), String> {
    run_on("direct", Direct::new(policy, start), policy, model.clone(), start, ops)?;
    run_on("keyed", Keyed::new(policy, start), policy, model.clone(), start, ops)?;
    if let Some(pure) = Pure::new(policy) {
        run_on("pure", pure, policy, model, start, ops)?;
    }
    Ok(())
}

/// Run `ops` through `backend` and the model, comparing every field of every decision.
///
/// The limiters decide at the running maximum of their clock's readings (a reading earlier than
/// one they have acted on is replaced by that one), so the model is given the running maximum.
pub fn run_on<B: Backend, M: Model>(
    name: &str,
    mut backend: B,
    policy: &Policy,
    mut model: M,
    start: u64,
    ops: &[Op],
) -> Result<(), String> {
    let horizon = policy.idle_horizon_ns().min(u128::from(i64::MAX as u64)) as u64;
    let mut now = start;
    // The latest reading the backend has acted on (none yet).
    let mut latest = 0;
    // Exactness is promised while a key's silence (time since its state was last written) stays
    // under the idle horizon; beyond it, decisions may only be stricter (tested on their own).
    let mut written = None::<u64>;
    for (i, op) in ops.iter().enumerate() {
        now = match op.gap {
            Gap::Forward(g) => {
                let limit = written.map_or(u64::MAX, |w| w.saturating_add(horizon / 2));
                now.saturating_add(g).min(limit.max(latest)).max(now).min(i64::MAX as u64)
            }
            // Any step back: the backend stays at the latest reading it acted on.
            Gap::Back(g) => now.saturating_sub(g),
        };
        latest = latest.max(now);
        let got = if op.peek { backend.peek(now, op.cost) } else { backend.check(now, op.cost) };
        let got = got.map_err(|e| format!("{name}: step {i} ({op:?}) at t={now}: {e}"))?;
        if !op.peek && got.is_admitted() {
            written = Some(written.map_or(latest, |w| w.max(latest)));
        }
        let want = expect(&mut model, latest.into(), op.cost.into(), !op.peek);
        if Expected::of(&got) != want {
            return Err(format!(
                "{name}: step {i} ({op:?}) at t={now} (latest {latest}), policy `{policy}`:\n  got  {:?}\n  want {want:?}",
                Expected::of(&got)
            ));
        }
    }
    Ok(())
}

/// A duration as the policy grammar spells it: the largest unit that divides it exactly.
pub fn duration_text(ns: u64) -> String {
    const S: u64 = 1_000_000_000;
    let units = [
        ("d", 86_400 * S),
        ("h", 3_600 * S),
        ("m", 60 * S),
        ("s", S),
        ("ms", 1_000_000),
        ("us", 1_000),
    ];
    for (unit, size) in units {
        if ns.is_multiple_of(size) {
            return format!("{}{unit}", ns / size);
        }
    }
    format!("{ns}ns")
}

/// Any algorithm's model, for layered scenarios whose layers mix algorithms.
#[derive(Clone, Debug)]
pub enum AnyModel {
    Gcra(Gcra),
    Leaky(Leaky),
    Nginx(Nginx),
    Discrete(Discrete),
    Fixed(Fixed),
    Sliding(Sliding),
    Log(Log),
}

macro_rules! any_model {
    ($m:expr, $x:ident => $body:expr) => {
        match $m {
            AnyModel::Gcra($x) => $body,
            AnyModel::Leaky($x) => $body,
            AnyModel::Nginx($x) => $body,
            AnyModel::Discrete($x) => $body,
            AnyModel::Fixed($x) => $body,
            AnyModel::Sliding($x) => $body,
            AnyModel::Log($x) => $body,
        }
    };
}

impl Model for AnyModel {
    fn limit(&self) -> u128 {
        any_model!(self, m => m.limit())
    }
    fn step(&mut self, now: u128, cost: u128) -> Verdict {
        any_model!(self, m => m.step(now, cost))
    }
    fn is_full(&self, now: u128) -> bool {
        any_model!(self, m => m.is_full(now))
    }
}

/// A small policy of algorithm `kind` (0..7: token bucket, discrete bucket, leaky bucket,
/// delaying leaky bucket, `compat=nginx`, fixed window (`align=first` for odd `variant`),
/// sliding window, sliding log), with limits from 1 to 4 and periods around a second, and its
/// model; `dry_run` adds the flag.
pub fn small_layer(kind: u8, limit: u8, variant: u8, dry_run: bool) -> (Policy, AnyModel) {
    const S: u128 = 1_000_000_000;
    let n = u128::from(limit % 4 + 1);
    let period = [S, 1_500_000_000, 250_000_000, 7 * S][usize::from(variant % 4)];
    let p = duration_text(period as u64);
    let (text, model) = match kind % 8 {
        0 => (
            format!("token-bucket capacity={n} rate={}/{p}", variant % 3 + 1),
            AnyModel::Gcra(Gcra {
                capacity: n,
                count: u128::from(variant % 3 + 1),
                period,
                tat: None,
            }),
        ),
        1 => (
            format!("token-bucket capacity={n} refill={} every={p}", variant % 2 + 1),
            AnyModel::Discrete(Discrete {
                capacity: n,
                refill: u128::from(variant % 2 + 1),
                every: period,
                state: None,
            }),
        ),
        2 => (
            format!("leaky-bucket rate=1/{p} burst={} nodelay", n - 1),
            AnyModel::Leaky(Leaky { burst: n - 1, count: 1, period, delay: None, state: None }),
        ),
        3 => (
            format!("leaky-bucket rate=2/{p} burst={} delay={}", n, variant % 2),
            AnyModel::Leaky(Leaky {
                burst: n,
                count: 2,
                period,
                delay: Some(u128::from(variant % 2)),
                state: None,
            }),
        ),
        4 => (
            format!("leaky-bucket rate=3/s burst={} nodelay compat=nginx", n - 1),
            AnyModel::Nginx(Nginx::new(3, S, n - 1, None)),
        ),
        5 => (
            format!(
                "fixed-window limit={n} window={p}{}",
                if variant % 2 == 1 { " align=first" } else { "" }
            ),
            AnyModel::Fixed(Fixed {
                limit: n,
                window: period,
                first: variant % 2 == 1,
                state: None,
            }),
        ),
        6 => (
            format!("sliding-window limit={n} window={p}"),
            AnyModel::Sliding(Sliding { limit: n, window: period, state: (0, 0, 0) }),
        ),
        _ => (
            format!("sliding-log limit={n} window={p}"),
            AnyModel::Log(Log { limit: n, window: period, entries: vec![] }),
        ),
    };
    let text = if dry_run { format!("{text} dry-run") } else { text };
    let policy = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
    (policy, model)
}

/// One step of a layered scenario.
#[derive(Clone, Copy, Debug)]
pub struct LayeredOp {
    /// Forward by this many ns.
    pub gap: u64,
    /// Layer `i`'s key is `keys[i] % 3` (`None`: the layer is skipped), or with `one_key`, every
    /// layer uses `keys[0]`.
    pub keys: [Option<u8>; 2],
    pub one_key: bool,
    pub cost: u32,
    pub action: Action,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// `check`: decided and kept.
    Check,
    /// `reserve`, then cancel at the same instant: exact, as if never asked (only the decision
    /// is compared).
    CancelNow,
    /// `reserve` and hold the reservation (kept, like a check, until released).
    Hold,
    /// Cancel the oldest reservation held, now: the scenario then checks the refund's bound and
    /// ends.
    Release,
}

/// The naive layered model of docs/SEMANTICS.md, *Layered limits*: each layer's model per key;
/// a request is admitted iff every enforcing layer's model admits it, and then charged to every
/// layer that admits it (dry-run layers included), else to none.
struct Layers {
    models: Vec<Vec<AnyModel>>,
    fresh: Vec<AnyModel>,
    dry: Vec<bool>,
    /// Every charge kept: `(now, layer, key, cost, request)`.
    history: Vec<(u128, usize, usize, u128, usize)>,
}

impl Layers {
    /// The layers' models with request `skip`'s charges left out (every other charge replayed;
    /// `None` if one of them would not be admitted without it).
    fn without(&self, skip: usize) -> Option<Vec<Vec<AnyModel>>> {
        let mut models: Vec<Vec<AnyModel>> =
            self.fresh.iter().map(|m| vec![m.clone(); 3]).collect();
        for &(now, layer, key, cost, request) in &self.history {
            if request == skip {
                continue;
            }
            if !matches!(models[layer][key].step(now, cost), Verdict::Admitted { .. }) {
                return None;
            }
        }
        Some(models)
    }
}

/// Drive a layered scenario through [`ratewell::LayeredLimiter`] and the naive model; the first
/// difference, or a refund that restores more than the request took, as an error.
pub fn run_layered(
    specs: &[(Policy, AnyModel)],
    start: u64,
    ops: &[LayeredOp],
) -> Result<(), String> {
    use ratewell::{Absent, Layer, LayerKey, LayeredLimiter};
    let clock = ManualClock::new(start);
    let layers: Vec<Layer> = specs
        .iter()
        .enumerate()
        .map(|(i, (p, _))| Layer::new(format!("l{i}"), p).capacity(64))
        .collect();
    let limiter =
        LayeredLimiter::with_clock(layers.clone(), clock.clone()).map_err(|e| e.to_string())?;
    // The lean path (`allow`), kept in lockstep: it must admit exactly what `check` admits.
    let lean = LayeredLimiter::with_clock(layers, clock.clone()).map_err(|e| e.to_string())?;
    let mut lean_held = std::collections::VecDeque::new();
    let mut model = Layers {
        models: specs.iter().map(|(_, m)| vec![m.clone(); 3]).collect(),
        fresh: specs.iter().map(|(_, m)| m.clone()).collect(),
        dry: specs.iter().map(|(p, _)| p.is_dry_run()).collect(),
        history: vec![],
    };
    let names = ["a", "b", "c"];
    let mut held = std::collections::VecDeque::new();
    let mut now = u128::from(start);
    for (step, op) in ops.iter().enumerate() {
        now = (now + u128::from(op.gap)).min(1 << 62);
        clock.set(now as u64);
        let keys: Vec<Option<usize>> = (0..specs.len())
            .map(|i| {
                if op.one_key { op.keys[0] } else { op.keys[i % 2] }.map(|k| usize::from(k % 3))
            })
            .collect();
        let key_refs: Vec<&dyn LayerKey> =
            keys.iter().map(|k| k.map_or(&Absent as &dyn LayerKey, |k| &names[k])).collect();
        let at = |what: &str| format!("step {step} ({op:?}) at {now}: {what}");
        if op.action == Action::Release {
            let Some((reservation, request)) = held.pop_front() else { continue };
            drop(reservation);
            drop(lean_held.pop_front());
            return check_refund(&limiter, &clock, &model, request, now, &names)
                .map_err(|e| at(&e));
        }
        // The model's decision.
        let cost = u128::from(op.cost.max(1));
        let verdicts: Vec<Option<Verdict>> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| k.map(|k| model.models[i][k].clone().step(now, cost)))
            .collect();
        let admitted = verdicts
            .iter()
            .zip(&model.dry)
            .all(|(v, &dry)| dry || v.is_none_or(|v| matches!(v, Verdict::Admitted { .. })));
        let keep = admitted && op.action != Action::CancelNow;
        let mut expected = vec![None; specs.len()];
        for (i, k) in keys.iter().enumerate() {
            let Some(k) = *k else { continue };
            let takes = admitted && matches!(verdicts[i], Some(Verdict::Admitted { .. }));
            let mut m = model.models[i][k].clone();
            expected[i] = Some(expect(&mut m, now, cost, takes));
            if takes && keep {
                model.models[i][k] = m;
                model.history.push((now, i, k, cost, step));
            }
        }
        // The library's.
        let decision = match op.action {
            Action::Check => limiter.check(&key_refs, op.cost).map_err(|e| at(&e.to_string()))?,
            _ => {
                let r = limiter.reserve(&key_refs, op.cost).map_err(|e| at(&e.to_string()))?;
                let d = *r.decision();
                if op.action == Action::Hold && d.is_admitted() {
                    held.push_back((r, step));
                }
                d
            }
        };
        let lean_admitted = match op.action {
            Action::Check => lean.allow(&key_refs, op.cost).map_err(|e| at(&e.to_string()))?,
            _ => {
                let r = lean.reserve(&key_refs, op.cost).map_err(|e| at(&e.to_string()))?;
                let admitted = r.decision().is_admitted();
                if op.action == Action::Hold && admitted {
                    lean_held.push_back(r);
                }
                admitted
            }
        };
        if lean_admitted != decision.is_admitted() {
            return Err(at(&format!("allow says {lean_admitted}, check {decision:?}")));
        }
        if decision.is_admitted() != admitted {
            return Err(at(&format!(
                "admitted {}, the model says {admitted}: {decision:?}",
                decision.is_admitted()
            )));
        }
        for (i, e) in expected.iter().enumerate() {
            let got = decision.layer(i).map(Expected::of);
            if got != *e {
                return Err(at(&format!("layer {i}: {got:?}, the model expects {e:?}")));
            }
            let would = decision.would_reject().any(|j| j == i);
            let expect_would = model.dry[i] && e.is_some_and(|e| e.outcome != Outcome::Admitted);
            if would != expect_would {
                return Err(at(&format!("layer {i}: would_reject {would}")));
            }
        }
        // The combination: over the enforcing layers that decided.
        let enforcing: Vec<&Expected> = expected
            .iter()
            .zip(&model.dry)
            .filter(|(_, d)| !**d)
            .filter_map(|(e, _)| e.as_ref())
            .collect();
        if let Some(least) = enforcing.iter().min_by_key(|e| e.remaining) {
            let c = Expected::of(&decision.decision());
            let worst = enforcing.iter().map(|e| e.outcome).max_by_key(|o| match o {
                Outcome::Impossible => 3,
                Outcome::Rejected => 2,
                Outcome::TableFull => 1,
                _ => 0,
            });
            let retry = enforcing.iter().filter_map(|e| e.retry_after).max();
            let want = (
                worst,
                least.remaining,
                enforcing.iter().map(|e| e.reset_after).max().unwrap_or(0),
                if worst == Some(Outcome::Impossible) { None } else { retry },
                if admitted { enforcing.iter().map(|e| e.delay).max().unwrap_or(0) } else { 0 },
            );
            let got = (Some(c.outcome), c.remaining, c.reset_after, c.retry_after, c.delay);
            if got != want {
                return Err(at(&format!("combined {got:?}, expected {want:?}")));
            }
        }
    }
    Ok(())
}

/// After the refund of `request` at `now`: every layer's state, at `now` and at later instants,
/// holds no more than the model without the request (when that model admits every other
/// charge), and no less than the model with it.
fn check_refund(
    limiter: &ratewell::LayeredLimiter<ManualClock>,
    clock: &ManualClock,
    model: &Layers,
    request: usize,
    now: u128,
    names: &[&str; 3],
) -> Result<(), String> {
    let Some(without) = model.without(request) else { return Ok(()) };
    let largest = |m: &AnyModel, at: u128| remaining_at(m, at);
    for wait in [0u128, 1, 1_000_000, 250_000_000, 1_000_000_000, 1_500_000_000, 7_000_000_000] {
        let at = now + wait;
        clock.set(at as u64);
        for (i, per_key) in without.iter().enumerate() {
            for (k, name) in names.iter().enumerate() {
                let peek = limiter
                    .peek(&[name as &dyn ratewell::LayerKey], 1)
                    .map_err(|e| e.to_string())?;
                let got = u128::from(peek.layer(i).map_or(0, |d| d.remaining()));
                let most = largest(&per_key[k], at);
                let least = largest(&model.models[i][k], at);
                // `align=first` windows move with the request: without it, a later window can be
                // stricter than with it, and a refund may then give nothing back.
                if got > most.max(least) || got < least.min(most) {
                    return Err(format!(
                        "after the refund of step {request}, layer {i} key {name} at +{wait} ns \
                         has {got} remaining: the model has {least} with the request, {most} without"
                    ));
                }
            }
        }
    }
    Ok(())
}
