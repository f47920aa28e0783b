//! The direct (single-key) limiter: a policy, one cache-padded state word, and a clock.

use crossbeam_utils::CachePadded;

use crate::algorithms::sliding_log::{Log, SlidingLog};
use crate::algorithms::{Algorithm, dispatch};
use crate::cas;
use crate::clock::{Clock, Floor, QuantaClock};
use crate::decision::Decision;
use crate::policy::Policy;
use crate::sync::{AtomicU64, Mutex, Ordering, lock};

/// Where one key's state lives: a word for every algorithm but the sliding log, which has a log
/// instead. Not an enum: the algorithm already says which, and one match on it (not two) is what
/// a decision costs.
#[derive(Debug)]
struct Cell {
    word: AtomicU64,
    /// The latest reading acted on, in the state's cache line (which an admission writes anyway).
    floor: Floor,
    log: Option<Mutex<Log>>,
}

impl Cell {
    fn new(algorithm: &Algorithm) -> Self {
        let log = matches!(algorithm, Algorithm::Log(_)).then(|| Mutex::new(Log::default()));
        Cell { word: AtomicU64::new(0), floor: Floor::default(), log }
    }

    /// The log of a sliding-log limiter.
    fn log(&self) -> &Mutex<Log> {
        self.log.as_ref().expect("a sliding-log limiter has a log")
    }

    #[inline]
    pub(crate) fn decide(
        &self,
        algorithm: &Algorithm,
        now: u64,
        cost: u32,
        commit: bool,
    ) -> Decision {
        if !commit {
            return match algorithm {
                Algorithm::Log(a) => a.decide(&mut *lock(self.log()), now, cost, false),
                _ => cas::peek(algorithm, &self.word, now, cost),
            };
        }
        dispatch!(algorithm,
            a => cas::apply_one::<Decision, _>(a, &self.word, now, cost),
            log a => self.decide_log(a, now, cost)
        )
    }

    fn decide_log(&self, a: &SlidingLog, now: u64, cost: u32) -> Decision {
        take_log(a, self.log(), now, cost)
    }

    // Always: LLVM's inliner weighs every algorithm's arm and has left it out of line (about 20
    // instructions a decision of call and spill) after changes elsewhere in the crate.
    #[inline(always)]
    fn allow(&self, algorithm: &Algorithm, now: u64, cost: u32) -> bool {
        dispatch!(algorithm,
            a => cas::apply_one::<bool, _>(a, &self.word, now, cost),
            log a => self.decide_log(a, now, cost).is_admitted()
        )
    }

    fn reset(&self) {
        self.word.store(0, Ordering::Relaxed);
        if let Some(log) = &self.log {
            *lock(log) = Log::default();
        }
    }
}

/// Lock a key's log; a panic while holding it cannot leave a log half-updated in a way that breaks
/// the limiter's invariants (every mutation keeps `total` equal to the sum), so poisoning is ignored.
/// Decide a request on a sliding log and log it if admitted, under one lock.
pub(crate) fn log_under_one_lock(
    a: &SlidingLog,
    log: &Mutex<Log>,
    now: u64,
    cost: u32,
) -> Decision {
    a.decide(&mut *lock(log), now, cost, true)
}

// The protocol's step: this or, compiled with `--cfg ratewell_broken="..."`, the deliberately broken
// one of that name (`broken.rs`), for the loom models to catch.
#[cfg(not(ratewell_broken_protocol))]
use self::log_under_one_lock as take_log;
#[cfg(ratewell_broken_protocol)]
use crate::broken::log_under_one_lock as take_log;

/// A rate limiter for one key (one client, one route, one whole service).
///
/// Every algorithm but the sliding log keeps its state in one cache-padded `AtomicU64` updated by a
/// compare-exchange loop: no lock, no allocation, and a rejection writes nothing.
///
/// # Examples
///
/// ```
/// use ratewell::{Limiter, ManualClock, Policy};
///
/// let clock = ManualClock::new(0);
/// let limiter = Limiter::with_clock(&"token-bucket capacity=2 rate=1/s".parse::<Policy>()?, clock.clone());
/// assert!(limiter.check().is_admitted());
/// assert!(limiter.check().is_admitted());
/// let d = limiter.check();
/// assert!(!d.is_admitted());
/// assert_eq!(d.retry_after_ns(), Some(1_000_000_000));
/// clock.advance(1_000_000_000);
/// assert!(limiter.check().is_admitted());
///
/// // A cost above the capacity can never pass.
/// assert!(limiter.check_n(3).is_impossible());
/// # Ok::<(), ratewell::PolicyError>(())
/// ```
#[derive(Debug)]
pub struct Limiter<C: Clock = QuantaClock> {
    policy: Policy,
    cell: CachePadded<Cell>,
    clock: C,
}

impl Limiter<QuantaClock> {
    /// A limiter on the TSC clock.
    pub fn new(policy: &Policy) -> Self {
        Self::with_clock(policy, QuantaClock::new())
    }
}

impl<C: Clock> Limiter<C> {
    /// A limiter reading time from `clock`.
    pub fn with_clock(policy: &Policy, clock: C) -> Self {
        let cell = CachePadded::new(Cell::new(&policy.algorithm));
        Limiter { policy: policy.clone(), cell, clock }
    }

    /// Decide a request of cost 1 and take it if admitted.
    #[inline]
    pub fn check(&self) -> Decision {
        self.check_n(1)
    }

    /// Decide a request of `cost` and take it if admitted. `cost` 0 is treated as 1.
    #[inline]
    pub fn check_n(&self, cost: u32) -> Decision {
        self.cell.decide(&self.policy.algorithm, self.now(), cost.max(1), true)
    }

    /// Whether a request of cost 1 is admitted, taking it if so: the lean path.
    #[inline]
    pub fn allow(&self) -> bool {
        self.allow_n(1)
    }

    /// Whether a request of `cost` is admitted, taking it if so: the lean path, for callers that
    /// need only yes or no. It computes none of the decision's details (remaining, retry and reset
    /// times, a leaky bucket's delay: use [`check_n`](Self::check_n) for those), which makes it
    /// cheaper; the admission itself is the same.
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{Limiter, ManualClock, Policy};
    ///
    /// let limiter = Limiter::with_clock(&"fixed-window limit=2 window=1s".parse::<Policy>()?, ManualClock::new(0));
    /// assert!(limiter.allow_n(2));
    /// assert!(!limiter.allow());
    /// # Ok::<(), ratewell::PolicyError>(())
    /// ```
    #[inline]
    pub fn allow_n(&self, cost: u32) -> bool {
        self.cell.allow(&self.policy.algorithm, self.now(), cost.max(1))
    }

    /// Decide a request of `cost` without taking anything, and report the state as it is:
    /// whether the request would be admitted now (and if not, when it would be), with the
    /// remaining quota, reset and replenish times *before* it, not after it. `peek_n(1)` is the
    /// current quota, for `RateLimit` fields on a response the limiter did not decide.
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{Limiter, ManualClock, Policy};
    ///
    /// let limiter = Limiter::with_clock(&"token-bucket capacity=10 rate=1/s".parse::<Policy>()?, ManualClock::new(0));
    /// let d = limiter.peek_n(1);
    /// assert!(d.is_admitted());
    /// assert_eq!(d.remaining(), 10); // a fresh bucket: nothing was taken
    /// assert_eq!(limiter.check().remaining(), 9);
    /// # Ok::<(), ratewell::PolicyError>(())
    /// ```
    #[inline]
    pub fn peek_n(&self, cost: u32) -> Decision {
        self.cell.decide(&self.policy.algorithm, self.now(), cost.max(1), false)
    }

    /// The time to decide at: the clock's reading, never below one already acted on.
    #[inline]
    fn now(&self) -> u64 {
        self.cell.floor.reading(&self.clock)
    }

    /// Forget everything: the key is fresh again (a full bucket, an empty window).
    pub fn reset(&self) {
        self.cell.reset();
    }

    /// The policy this limiter enforces.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }
}
