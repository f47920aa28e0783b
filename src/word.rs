//! The pure decision, as an API: a one-word policy applied to a state word a caller stores
//! wherever it likes (another backend, a simulation, a benchmark).

use crate::algorithms::Algorithm;
use crate::decision::Decision;
use crate::policy::Policy;

/// The whole state of one key under a one-word policy: 64 bits, in the layout its algorithm
/// documents. [`State::FRESH`] (all zero) is a key that has taken nothing.
///
/// A state means something only to the [`WordPolicy`] that produced it: decide it under another
/// policy and the answer is unspecified (never a panic). The bits are stable within one version of
/// the crate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct State(u64);

impl State {
    /// A key that has taken nothing: a full bucket, an empty window.
    pub const FRESH: State = State(0);

    /// The state stored as `bits` (for example in an `AtomicU64` or a Redis string).
    #[inline]
    pub const fn from_bits(bits: u64) -> Self {
        State(bits)
    }

    /// The bits to store.
    #[inline]
    pub const fn to_bits(self) -> u64 {
        self.0
    }

    /// `true` for [`State::FRESH`]. A state that is not fresh may still decide like a fresh one
    /// (see [`WordPolicy::reset_after_ns`]).
    #[inline]
    pub const fn is_fresh(self) -> bool {
        self.0 == 0
    }
}

/// A one-word state as up to three integers on a time line of whole microseconds: the form
/// ratewell-redis's function library stores (its Lua numbers are doubles, exact below 2^53), so
/// that another decider on the same keys (the native Redis module) reads and writes the same
/// values. What the integers mean is each algorithm's (`src/algorithms/`, *Fields*); every
/// absolute time among them is in microseconds (or milliseconds, under `compat=nginx`) since
/// the epoch of the [`Nanos`] they were made at.
///
/// # Examples
///
/// ```
/// use ratewell::{Fields, Nanos, State, WordPolicy};
///
/// let pure = WordPolicy::new(&"fixed-window limit=5 window=1s".parse()?).unwrap();
/// let now = Nanos::new(3_500_000_000); // 3.5 s, a whole number of microseconds
/// let (_, state) = pure.decide(State::FRESH, now, 2);
/// // Two taken in the window that began at 3 s: the count, then the window's index.
/// let fields = pure.to_fields(state.unwrap(), now).unwrap();
/// assert_eq!(fields.as_slice(), &[2, 3]);
/// assert_eq!(pure.read_fields(fields.as_slice(), now), state);
/// # Ok::<(), ratewell::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fields {
    len: u8,
    values: [i64; 3],
}

impl Fields {
    /// The largest magnitude a field may have: 2^53, where doubles stop being exact.
    pub const MAX: i64 = 1 << 53;

    /// Fields of one to three values, each within [`Fields::MAX`] in magnitude; `None` else.
    pub fn new(values: &[i64]) -> Option<Fields> {
        if values.is_empty()
            || values.len() > 3
            || values.iter().any(|v| v.unsigned_abs() > Self::MAX as u64)
        {
            return None;
        }
        let mut out = Fields { len: values.len() as u8, values: [0; 3] };
        out.values[..values.len()].copy_from_slice(values);
        Some(out)
    }

    /// The values.
    pub fn as_slice(&self) -> &[i64] {
        &self.values[..usize::from(self.len)]
    }
}

/// An instant in nanoseconds since the epoch of whatever clock the caller reads (a
/// [`Clock`](crate::Clock)'s `now()`, a server's `TIME`, a trace's timestamps). One state must be
/// decided on one clock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Nanos(u64);

impl Nanos {
    /// The instant `ns` nanoseconds after the epoch.
    #[inline]
    pub const fn new(ns: u64) -> Self {
        Nanos(ns)
    }

    /// Nanoseconds since the epoch.
    #[inline]
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl From<u64> for Nanos {
    #[inline]
    fn from(ns: u64) -> Self {
        Nanos(ns)
    }
}

/// A policy whose state is one word: every algorithm but the sliding log (whose state is a list).
///
/// Its decisions are pure functions of `(policy, state, now, cost)`: no clock, no atomics, no
/// allocation. [`Limiter`](crate::Limiter) and [`KeyedLimiter`](crate::KeyedLimiter) apply them
/// to atomic words with one compare-exchange; another store applies them the same way: read the
/// state, decide, and write the new state only if the state read is still the one stored
/// (`None` is returned for a rejection, which writes nothing).
///
/// Times earlier than the state's own (a clock that stepped back) are taken at the state's time
/// as long as the step is under the [idle horizon](Self::idle_horizon_ns); a caller whose clock
/// may step back further decides at the running maximum of its readings, as the limiters do.
///
/// # Examples
///
/// ```
/// use ratewell::{Nanos, Policy, State, WordPolicy};
///
/// let policy: Policy = "token-bucket capacity=2 rate=1/s".parse()?;
/// let pure = WordPolicy::new(&policy).expect("a token bucket is one word");
/// let mut state = State::FRESH;
/// for expected in [true, true, false] {
///     let (decision, next) = pure.decide(state, Nanos::new(0), 1);
///     assert_eq!(decision.is_admitted(), expected);
///     state = next.unwrap_or(state);
/// }
/// // One token is back after a second.
/// assert_eq!(pure.decide(state, Nanos::new(999_999_999), 1).0.retry_after_ns(), Some(1));
/// assert!(pure.decide(state, Nanos::new(1_000_000_000), 1).0.is_admitted());
///
/// assert!(WordPolicy::new(&"sliding-log limit=5 window=1s".parse()?).is_none());
/// # Ok::<(), ratewell::PolicyError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WordPolicy {
    /// Never `Algorithm::Log`.
    policy: Policy,
}

impl WordPolicy {
    /// The one-word form of `policy`, or `None` for a sliding log.
    pub fn new(policy: &Policy) -> Option<Self> {
        match policy.algorithm {
            Algorithm::Log(_) => None,
            _ => Some(WordPolicy { policy: policy.clone() }),
        }
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Decide a request of `cost` (0 is taken as 1) at `now` on `state`: the decision and, if
    /// admitted, the state to store. A rejection returns `None`: nothing is to be written.
    #[inline]
    pub fn decide(&self, state: State, now: Nanos, cost: u32) -> (Decision, Option<State>) {
        let (decision, next) = self.policy.algorithm.decide(state.0, now.0, cost.max(1));
        (decision, next.map(State))
    }

    /// Only whether a request of `cost` (0 is taken as 1) is admitted: the state to store if so.
    /// The same admission as [`decide`](Self::decide), without computing the decision's fields.
    #[inline]
    pub fn admit(&self, state: State, now: Nanos, cost: u32) -> Option<State> {
        self.policy.algorithm.admit(state.0, now.0, cost.max(1)).map(State)
    }

    /// Take back an admission of `cost` (0 is taken as 1) that replaced `before` with `after`,
    /// from `state` at `now`: the state to store. Exactly `before` while `state` is still
    /// `after`; otherwise what the algorithm can give back without ever holding more than the
    /// state would had the admission never happened (every other admission kept), and never
    /// more than a fresh key (see `docs/SEMANTICS.md`, *Layered limits*, and each algorithm's
    /// `give_back` in `src/algorithms/`). The layered limiter's refunds are this, in a
    /// compare-exchange loop.
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{Nanos, State, WordPolicy};
    ///
    /// let pure = WordPolicy::new(&"token-bucket capacity=2 rate=1/s".parse()?).unwrap();
    /// let (_, a) = pure.decide(State::FRESH, Nanos::new(0), 2); // both tokens
    /// let a = a.unwrap();
    /// // Nothing happened since: back to the state before, exactly.
    /// assert_eq!(pure.refund(a, Nanos::new(0), State::FRESH, a, 2), State::FRESH);
    /// // At 1 s another request takes the token refilled meanwhile; then the first is refunded.
    /// let (_, b) = pure.decide(a, Nanos::new(1_000_000_000), 1);
    /// let back = pure.refund(b.unwrap(), Nanos::new(1_000_000_000), State::FRESH, a, 2);
    /// // One token of the charge had come back by refill; the other comes back now: one token
    /// // left, as if only the second request had come.
    /// assert_eq!(pure.peek(back, Nanos::new(1_000_000_000), 1).remaining(), 1);
    /// # Ok::<(), ratewell::PolicyError>(())
    /// ```
    pub fn refund(
        &self,
        state: State,
        now: Nanos,
        before: State,
        after: State,
        cost: u32,
    ) -> State {
        State(self.policy.algorithm.refund(state.0, now.0, before.0, after.0, cost.max(1)))
    }

    /// Take back a charge of `cost` (0 is taken as 1) whose admission stored `charged`, from
    /// `state` at `now`, when other decisions may have changed the state since: what the
    /// algorithm can give back without ever holding more than the state would had the charge
    /// never been admitted (the second case of [`refund`](Self::refund), which a caller holding
    /// only the stored state of a charge needs).
    pub fn give_back(&self, state: State, now: Nanos, charged: State, cost: u32) -> State {
        State(self.policy.algorithm.give_back(state.0, now.0, charged.0, cost.max(1)))
    }

    /// The state as it is at `now`, as a decision that takes nothing (impossible): its
    /// remaining quota, reset and replenish times.
    pub fn probe(&self, state: State, now: Nanos) -> Decision {
        self.policy.algorithm.probe(state.0, now.0)
    }

    /// Decide without taking anything, and report the state as it is: whether a request of
    /// `cost` would be admitted, with the remaining quota, reset and replenish times before it
    /// (as [`Limiter::peek_n`](crate::Limiter::peek_n)).
    pub fn peek(&self, state: State, now: Nanos, cost: u32) -> Decision {
        self.policy.algorithm.peek(state.0, now.0, cost.max(1))
    }

    /// Nanoseconds from `now` until `state` decides like [`State::FRESH`] if nothing arrives: 0
    /// when it already does (the state may then be dropped, or expired from a store: a TTL).
    pub fn reset_after_ns(&self, state: State, now: Nanos) -> u64 {
        self.policy.algorithm.reset_after(state.0, now.0)
    }

    /// The longest silence of a key over which every decision is exact (ns); see
    /// [`Policy::idle_horizon_ns`].
    pub fn idle_horizon_ns(&self) -> u128 {
        self.policy.algorithm.idle_horizon_ns()
    }

    /// `state` at `now` as [`Fields`], the integers ratewell-redis's function library stores
    /// for it; `None` when the state decides as a fresh key does (nothing is to be stored).
    /// `now` must be a whole number of microseconds (the fields' time line); the values are
    /// those the function library writes after the same decisions.
    pub fn to_fields(&self, state: State, now: Nanos) -> Option<Fields> {
        self.policy.algorithm.to_fields(state.0, now.0)
    }

    /// The state that `fields` (as [`to_fields`](Self::to_fields) or the function library
    /// wrote them) describe at `now`, a whole number of microseconds: it decides every later
    /// request as they do. `None` when they are not a state this policy writes (another
    /// policy's, or values out of range): a caller treats the key as corrupt, never as fresh.
    pub fn read_fields(&self, fields: &[i64], now: Nanos) -> Option<State> {
        self.policy.algorithm.read_fields(fields, now.0).map(State)
    }

    /// The state under `self` of a key whose state under `from` is `state` at `now`: what the key
    /// consumed under `from` taken from a fresh state of `self` (the rule of
    /// [`KeyedLimiter::set_policy`](crate::KeyedLimiter::set_policy)).
    pub fn convert(&self, from: &WordPolicy, state: State, now: Nanos) -> State {
        State(crate::algorithms::convert(
            &from.policy.algorithm,
            &self.policy.algorithm,
            state.0,
            now.0,
        ))
    }
}

impl TryFrom<&Policy> for WordPolicy {
    type Error = crate::PolicyError;

    /// The one-word form of `policy`; a sliding log is an error naming it.
    fn try_from(policy: &Policy) -> Result<Self, Self::Error> {
        WordPolicy::new(policy).ok_or_else(|| {
            crate::PolicyError::new(
                "sliding-log",
                "a one-word algorithm (the sliding log's state is a list)",
            )
        })
    }
}

/// The sliding log's pure decision, on a log a caller keeps (another backend, a simulation): the
/// counterpart of [`WordPolicy`] for the one algorithm whose state is a list of `(time, cost)`
/// entries rather than a word.
///
/// # Examples
///
/// ```
/// use ratewell::{LogPolicy, LogState, Nanos};
///
/// let pure = LogPolicy::new(&"sliding-log limit=2 window=1s".parse()?).unwrap();
/// let mut log = LogState::default();
/// let (d, at) = pure.take(&mut log, Nanos::new(10), 2);
/// assert!(d.is_admitted());
/// assert_eq!(at, Some(Nanos::new(10)));
/// assert!(!pure.take(&mut log, Nanos::new(20), 1).0.is_admitted());
/// // The charge given back: the log is the one without it.
/// pure.give_back(&mut log, Nanos::new(10), 2);
/// assert_eq!(log.len(), 0);
/// # Ok::<(), ratewell::PolicyError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogPolicy {
    log: crate::algorithms::sliding_log::SlidingLog,
    policy: Policy,
}

/// One key's sliding log: its entries `(time, cost)`, oldest first, times strictly increasing.
#[derive(Debug, Default)]
pub struct LogState(crate::algorithms::sliding_log::Log);

impl LogState {
    /// The log of `entries` (oldest first), if `policy` could have written it: times strictly
    /// increasing, costs at least 1, at most the limit in all, every entry within the window of
    /// the newest. `None` otherwise (a corrupt store).
    pub fn from_entries(
        policy: &LogPolicy,
        entries: impl IntoIterator<Item = (Nanos, u64)>,
    ) -> Option<LogState> {
        let entries = entries.into_iter().map(|(t, c)| (t.0, c)).collect();
        crate::algorithms::sliding_log::Log::from_entries(&policy.log, entries).map(LogState)
    }

    /// The entries, oldest first.
    pub fn entries(&self) -> impl ExactSizeIterator<Item = (Nanos, u64)> + '_ {
        self.0.entries().map(|(t, c)| (Nanos(t), c))
    }

    /// The number of entries.
    pub fn len(&self) -> usize {
        self.0.entries().len()
    }

    /// `true` when the log holds no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl LogPolicy {
    /// The sliding log of `policy`, or `None` for a one-word algorithm (see [`WordPolicy`]).
    pub fn new(policy: &Policy) -> Option<Self> {
        match &policy.algorithm {
            Algorithm::Log(log) => Some(LogPolicy { log: log.clone(), policy: policy.clone() }),
            _ => None,
        }
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Decide a request of `cost` (0 is taken as 1) at `now`, and log it if admitted: the
    /// decision and the time of its entry (what [`give_back`](Self::give_back) needs). An
    /// admission drops the entries that can never count again; a rejection changes nothing.
    pub fn take(&self, log: &mut LogState, now: Nanos, cost: u32) -> (Decision, Option<Nanos>) {
        let (decision, at) = self.log.take(&mut log.0, now.0, cost.max(1));
        (decision, at.map(Nanos))
    }

    /// Decide without logging: whether a request of `cost` (0 is taken as 1) would be admitted,
    /// with the remaining quota, reset and replenish times as they are.
    pub fn peek(&self, log: &LogState, now: Nanos, cost: u32) -> Decision {
        self.log.peek(&log.0, now.0, cost.max(1))
    }

    /// The log as it is at `now`, as a decision that takes nothing (impossible): its remaining,
    /// reset and replenish times.
    pub fn probe(&self, log: &LogState, now: Nanos) -> Decision {
        self.log.probe(&log.0, now.0)
    }

    /// Take back an admission of `cost` logged at `at`: its cost comes off that entry, if the log
    /// still holds it (exact); an entry already dropped has nothing left to give back.
    pub fn give_back(&self, log: &mut LogState, at: Nanos, cost: u32) {
        self.log.give_back(&mut log.0, at.0, u64::from(cost.max(1)));
    }

    /// `true` once every entry has expired at `now`: the log decides as an empty one (it may be
    /// dropped).
    pub fn is_fresh(&self, log: &LogState, now: Nanos) -> bool {
        self.log.is_fresh(&log.0, now.0)
    }
}
