//! The answer to "may this key do this now?", with what a client needs to act on it.

use std::time::Duration;

/// What happened to a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// The request was admitted (possibly with a delay: see [`Decision::delay_ns`]).
    Admitted,
    /// Not now: the same request would be admitted after [`Decision::retry_after_ns`].
    Rejected,
    /// Never: the cost exceeds what the policy can ever admit at once (the capacity, the limit,
    /// or a leaky bucket's `burst + 1`). Waiting does not help, so there is no retry time.
    Impossible,
}

/// One rate-limiting decision.
///
/// All durations are nanoseconds relative to the instant the decision was taken; one longer than
/// `u64::MAX` ns (584 years, e.g. the refill time of a 2^32-token bucket filled once a minute)
/// saturates at `u64::MAX`.
///
/// # Examples
///
/// ```
/// use ratewell::{Limiter, ManualClock, Outcome, Policy};
///
/// let policy: Policy = "fixed-window limit=2 window=1s".parse()?;
/// let limiter = Limiter::with_clock(&policy, ManualClock::new(0));
/// let d = limiter.check();
/// assert!(d.is_admitted());
/// assert_eq!((d.limit(), d.remaining()), (2, 1));
/// assert_eq!(d.reset_after_ns(), 1_000_000_000);
/// limiter.check();
/// let d = limiter.check();
/// assert_eq!(d.outcome(), Outcome::Rejected);
/// assert_eq!(d.retry_after_ns(), Some(1_000_000_000));
/// # Ok::<(), ratewell::PolicyError>(())
/// ```
#[derive(Clone, Copy)]
pub struct Decision {
    outcome: Outcome,
    limit: u64,
    /// `remaining * per` plus less than `per`: the division is left to [`Decision::remaining`],
    /// so that a decision whose remaining count nobody reads does not pay for it (a 64-bit
    /// division is the dearest instruction of a token bucket's decision).
    remaining: u64,
    /// At least 1.
    per: u64,
    reset_after: u64,
    /// Retry time for `Rejected`, delay for `Admitted`, 0 for `Impossible`.
    wait: u64,
}

impl Decision {
    pub(crate) fn admitted(limit: u64, remaining: u64, reset_after: u64, delay: u64) -> Self {
        let outcome = Outcome::Admitted;
        Decision { outcome, limit, remaining, per: 1, reset_after, wait: delay }
    }

    pub(crate) fn rejected(limit: u64, remaining: u64, reset_after: u64, retry_after: u64) -> Self {
        let outcome = Outcome::Rejected;
        Decision { outcome, limit, remaining, per: 1, reset_after, wait: retry_after }
    }

    pub(crate) fn impossible(limit: u64, remaining: u64, reset_after: u64) -> Self {
        Decision { outcome: Outcome::Impossible, limit, remaining, per: 1, reset_after, wait: 0 }
    }

    /// The same decision with `floor(units / per)` remaining (`per >= 1`), divided when read.
    #[inline]
    pub(crate) fn remaining_over(mut self, units: u64, per: u64) -> Self {
        self.remaining = units;
        self.per = per.max(1);
        self
    }

    /// The fields as they read: what equality, hashing and `Debug` look at.
    fn fields(&self) -> (Outcome, u64, u64, u64, u64) {
        (self.outcome, self.limit, self.remaining(), self.reset_after, self.wait)
    }

    /// Admitted, rejected for now, or impossible.
    pub fn outcome(&self) -> Outcome {
        self.outcome
    }

    /// `true` if the request was admitted.
    pub fn is_admitted(&self) -> bool {
        self.outcome == Outcome::Admitted
    }

    /// `true` if the request can never be admitted (its cost exceeds the policy's capacity).
    pub fn is_impossible(&self) -> bool {
        self.outcome == Outcome::Impossible
    }

    /// The most the policy admits at once: the bucket capacity, the window limit, or a leaky
    /// bucket's `burst + 1`.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The largest cost that would be admitted right after this decision, at the same instant.
    pub fn remaining(&self) -> u64 {
        if self.per == 1 { self.remaining } else { self.remaining / self.per }
    }

    /// Nanoseconds until the key is back to full (indistinguishable from a fresh key) if nothing
    /// else arrives.
    pub fn reset_after_ns(&self) -> u64 {
        self.reset_after
    }

    /// [`reset_after_ns`](Self::reset_after_ns) as a [`Duration`].
    pub fn reset_after(&self) -> Duration {
        Duration::from_nanos(self.reset_after)
    }

    /// For a rejection, the smallest wait in nanoseconds after which the same request would be
    /// admitted if nothing else arrived; `None` when admitted or impossible.
    pub fn retry_after_ns(&self) -> Option<u64> {
        (self.outcome == Outcome::Rejected).then_some(self.wait)
    }

    /// [`retry_after_ns`](Self::retry_after_ns) as a [`Duration`].
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after_ns().map(Duration::from_nanos)
    }

    /// For an admitted request of a delaying leaky bucket, how long to hold it before serving it
    /// (nanoseconds); 0 otherwise.
    pub fn delay_ns(&self) -> u64 {
        if self.outcome == Outcome::Admitted { self.wait } else { 0 }
    }

    /// [`delay_ns`](Self::delay_ns) as a [`Duration`].
    pub fn delay(&self) -> Duration {
        Duration::from_nanos(self.delay_ns())
    }
}

impl PartialEq for Decision {
    fn eq(&self, other: &Self) -> bool {
        self.fields() == other.fields()
    }
}

impl Eq for Decision {}

impl std::hash::Hash for Decision {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.fields().hash(state);
    }
}

impl std::fmt::Debug for Decision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decision")
            .field("outcome", &self.outcome)
            .field("limit", &self.limit)
            .field("remaining", &self.remaining())
            .field("reset_after", &self.reset_after)
            .field("wait", &self.wait)
            .finish()
    }
}
