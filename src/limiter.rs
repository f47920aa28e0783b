//! The direct (single-key) limiter: a policy, one cache-padded state word, and a clock.

use crossbeam_utils::CachePadded;

use crate::algorithms::{Algorithm, sliding_log::Log};
use crate::clock::{Clock, QuantaClock};
use crate::decision::Decision;
use crate::policy::Policy;
use crate::state;
use crate::sync::{AtomicU64, Mutex, MutexGuard, Ordering};

/// Where one key's state lives: a word for every algorithm but the sliding log.
#[derive(Debug)]
enum Cell {
    Word(AtomicU64),
    Log(Mutex<Log>),
}

impl Cell {
    fn new(algorithm: &Algorithm, word: u64) -> Self {
        match algorithm {
            Algorithm::Log(_) => Cell::Log(Mutex::new(Log::default())),
            _ => Cell::Word(AtomicU64::new(word)),
        }
    }

    #[inline]
    pub(crate) fn decide(
        &self,
        algorithm: &Algorithm,
        now: u64,
        cost: u32,
        commit: bool,
    ) -> Decision {
        match (self, algorithm) {
            (Cell::Word(word), _) if commit => state::apply::<Decision>(algorithm, word, now, cost),
            (Cell::Word(word), _) => state::peek(algorithm, word, now, cost),
            #[cfg(not(ratewell_broken = "log_split_lock"))]
            (Cell::Log(log), Algorithm::Log(a)) => a.decide(&mut lock(log), now, cost, commit),
            // Broken on purpose: check under one lock, take under another.
            #[cfg(ratewell_broken = "log_split_lock")]
            (Cell::Log(log), Algorithm::Log(a)) => {
                let decision = a.decide(&mut lock(log), now, cost, false);
                if commit && decision.is_admitted() {
                    let mut l = lock(log);
                    l.force_push(now, u64::from(cost));
                }
                decision
            }
            (Cell::Log(_), _) => unreachable!("a log cell belongs to a sliding-log policy"),
        }
    }

    #[inline]
    fn allow(&self, algorithm: &Algorithm, now: u64, cost: u32) -> bool {
        match (self, algorithm) {
            (Cell::Word(word), _) => state::apply::<bool>(algorithm, word, now, cost),
            (Cell::Log(log), Algorithm::Log(a)) => {
                a.decide(&mut lock(log), now, cost, true).is_admitted()
            }
            (Cell::Log(_), _) => unreachable!("a log cell belongs to a sliding-log policy"),
        }
    }

    fn reset(&self) {
        match self {
            Cell::Word(word) => word.store(0, Ordering::Relaxed),
            Cell::Log(log) => *lock(log) = Log::default(),
        }
    }
}

/// Lock a key's log; a panic while holding it cannot leave a log half-updated in a way that breaks
/// the limiter's invariants (every mutation keeps `total` equal to the sum), so poisoning is ignored.
fn lock(log: &Mutex<Log>) -> MutexGuard<'_, Log> {
    log.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

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
        let cell = CachePadded::new(Cell::new(&policy.algorithm, 0));
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
        self.cell.decide(&self.policy.algorithm, self.clock.now(), cost.max(1), true)
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
        self.cell.allow(&self.policy.algorithm, self.clock.now(), cost.max(1))
    }

    /// Decide a request of `cost` without taking anything.
    #[inline]
    pub fn peek_n(&self, cost: u32) -> Decision {
        self.cell.decide(&self.policy.algorithm, self.clock.now(), cost.max(1), false)
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
