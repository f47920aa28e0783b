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
    /// Not decided by the policy: the key is new and a keyed limiter built with
    /// [`OnFull::Refuse`](crate::OnFull::Refuse) has no slot for it (every candidate slot holds a
    /// live key). [`Decision::retry_after_ns`] says when a candidate slot frees up. A proxy that
    /// prefers to fail open on a full table admits these.
    TableFull,
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
    /// The limit in the low bits ([`LIMIT_MASK`]: limits are at most 2^32). With [`SCALED`] set,
    /// the payload of `per_outcome` is the divisor of `remaining` and bits [`SCALE_SHIFT`]..63
    /// hold the scale of the replenish time (see `per_outcome`).
    limit: u64,
    /// `remaining * per` plus less than `per`: the division is left to [`Decision::remaining`],
    /// so that a decision whose remaining count nobody reads does not pay for it (a 64-bit
    /// division is the dearest instruction of a token bucket's decision).
    remaining: u64,
    /// The outcome in the top two bits ([`OUTCOME_SHIFT`]), a payload in the rest: with
    /// [`SCALED`] (the buckets), the divisor `per` of `remaining` (at least 1, below 2^62), the
    /// next whole unit then coming in `per - remaining % per` units of `1 / scale` ns, computed
    /// when read like `remaining`; else the replenish time in ns itself (saturated at 2^62 - 1; 0:
    /// none, the key is full), `remaining` being whole units. One word, not an enum and two
    /// words: a decision is five words with no padding, which the compiler returns and copies as
    /// five moves (a sixth costs a copy through the stack: measured, 20 instructions a decision).
    per_outcome: u64,
    reset_after: u64,
    /// Retry time for `Rejected` and `TableFull`, delay for `Admitted`, 0 for `Impossible`.
    wait: u64,
}

const OUTCOME_SHIFT: u32 = 62;
const PER_MASK: u64 = (1 << OUTCOME_SHIFT) - 1;
const ADMITTED: u64 = 0;
const REJECTED: u64 = 1 << OUTCOME_SHIFT;
const IMPOSSIBLE: u64 = 2 << OUTCOME_SHIFT;
const TABLE_FULL: u64 = 3 << OUTCOME_SHIFT;
/// In `limit`: `remaining` is divided by `per` and the replenish time scaled.
pub(crate) const SCALED: u64 = 1 << 63;
/// In `limit`: where the scale starts (30 bits: the algorithms' scales are at most 2^17).
pub(crate) const SCALE_SHIFT: u32 = 33;
const LIMIT_MASK: u64 = (1 << SCALE_SHIFT) - 1;

impl Decision {
    #[inline]
    pub(crate) const fn admitted(limit: u64, remaining: u64, reset_after: u64, delay: u64) -> Self {
        Decision { limit, remaining, per_outcome: ADMITTED, reset_after, wait: delay }
    }

    #[inline]
    pub(crate) fn rejected(limit: u64, remaining: u64, reset_after: u64, retry_after: u64) -> Self {
        Decision { limit, remaining, per_outcome: REJECTED, reset_after, wait: retry_after }
    }

    #[inline]
    pub(crate) fn impossible(limit: u64, remaining: u64, reset_after: u64) -> Self {
        Decision { limit, remaining, per_outcome: IMPOSSIBLE, reset_after, wait: 0 }
    }

    /// A decision made elsewhere (another store deciding the same policy, such as a Redis
    /// script), from the fields it reports: `wait` is the delay when admitted and the retry time
    /// when rejected (ignored otherwise); `replenish_after` is `None` when the key is full.
    /// `Outcome::TableFull` reads as a rejection by the table, with `wait` as its retry time.
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{Decision, Outcome};
    ///
    /// let d = Decision::from_parts(Outcome::Rejected, 10, 0, 5_000, 1_000, Some(500));
    /// assert_eq!(d.retry_after_ns(), Some(1_000));
    /// assert_eq!(d.replenish_after_ns(), Some(500));
    /// assert_eq!((d.limit(), d.remaining(), d.reset_after_ns()), (10, 0, 5_000));
    /// ```
    pub fn from_parts(
        outcome: Outcome,
        limit: u64,
        remaining: u64,
        reset_after_ns: u64,
        wait_ns: u64,
        replenish_after_ns: Option<u64>,
    ) -> Self {
        let limit = limit.min(LIMIT_MASK);
        let d = match outcome {
            Outcome::Admitted => Decision::admitted(limit, remaining, reset_after_ns, wait_ns),
            Outcome::Rejected => Decision::rejected(limit, remaining, reset_after_ns, wait_ns),
            Outcome::Impossible => Decision::impossible(limit, remaining, reset_after_ns),
            Outcome::TableFull => {
                return Decision { remaining, ..Decision::table_full(limit, wait_ns) }
                    .replenish(replenish_after_ns.unwrap_or(0).max(1));
            }
        };
        // `0` in the replenish field reads as "none"; a real replenish time is at least 1 ns.
        d.replenish(replenish_after_ns.map_or(0, |ns| ns.max(1)))
    }

    /// A new key refused for want of a slot; a slot frees up after `retry_after`.
    pub(crate) fn table_full(limit: u64, retry_after: u64) -> Self {
        let next = retry_after.min(PER_MASK);
        Decision {
            limit,
            remaining: 0,
            per_outcome: TABLE_FULL | next,
            reset_after: retry_after,
            wait: retry_after,
        }
    }

    /// The same decision (whole units remaining), more quota coming in `ns` (0: none, the key is
    /// full).
    #[inline]
    pub(crate) fn replenish(mut self, ns: u64) -> Self {
        self.per_outcome = (self.per_outcome & !PER_MASK) | ns.min(PER_MASK);
        self
    }

    /// The same decision with `floor(units / per)` remaining (`1 <= per < 2^62`; the algorithms'
    /// per-token costs are at most 2^61, GCRA's in half units), divided when read, and the next
    /// whole unit coming when the remainder has accrued at `scale` units a nanosecond. `tag` is
    /// `SCALED | scale << SCALE_SHIFT` (`1 <= scale < 2^30`), which the algorithms keep computed.
    #[inline]
    pub(crate) fn remaining_over(mut self, units: u64, per: u64, tag: u64) -> Self {
        // Every caller's `per` is a per-token cost that its constructor checked (at least 1 and
        // at most 2^61): no clamping on the hot path.
        debug_assert!((1..=PER_MASK).contains(&per));
        debug_assert!(tag & SCALED != 0 && (tag & !SCALED) >> SCALE_SHIFT >= 1);
        self.remaining = units;
        self.per_outcome = (self.per_outcome & !PER_MASK) | per;
        self.limit |= tag;
        self
    }

    /// `self`'s outcome and wait with `state`'s remaining, reset and replenish times: what a peek
    /// reports (`state` is a decision that took nothing: an impossible probe).
    pub(crate) fn with_state_of(self, state: Decision) -> Self {
        Decision {
            per_outcome: (self.per_outcome & !PER_MASK) | (state.per_outcome & PER_MASK),
            wait: self.wait,
            ..state
        }
    }

    /// `self`'s limit, remaining and replenish time with another outcome, reset time and wait
    /// (the delay when admitted, the retry time when rejected): a layered decision's combination.
    pub(crate) fn combined(self, outcome: Outcome, reset_after: u64, wait: u64) -> Self {
        let bits = match outcome {
            Outcome::Admitted => ADMITTED,
            Outcome::Rejected => REJECTED,
            Outcome::Impossible => IMPOSSIBLE,
            Outcome::TableFull => TABLE_FULL,
        };
        Decision { per_outcome: (self.per_outcome & PER_MASK) | bits, reset_after, wait, ..self }
    }

    #[inline]
    fn per(&self) -> u64 {
        if self.limit & SCALED != 0 { (self.per_outcome & PER_MASK).max(1) } else { 1 }
    }

    /// The fields as they read: what equality, hashing and `Debug` look at.
    fn fields(&self) -> (Outcome, u64, u64, u64, u64, Option<u64>) {
        let next = self.replenish_after_ns();
        (self.outcome(), self.limit(), self.remaining(), self.reset_after, self.wait, next)
    }

    /// Admitted, rejected for now, impossible, or refused for want of a table slot.
    pub fn outcome(&self) -> Outcome {
        match self.per_outcome & !PER_MASK {
            ADMITTED => Outcome::Admitted,
            REJECTED => Outcome::Rejected,
            IMPOSSIBLE => Outcome::Impossible,
            _ => Outcome::TableFull,
        }
    }

    /// `true` if the request was admitted.
    pub fn is_admitted(&self) -> bool {
        self.per_outcome & !PER_MASK == ADMITTED
    }

    /// `true` if the request can never be admitted (its cost exceeds the policy's capacity).
    pub fn is_impossible(&self) -> bool {
        self.per_outcome & !PER_MASK == IMPOSSIBLE
    }

    /// The most the policy admits at once: the bucket capacity, the window limit, or a leaky
    /// bucket's `burst + 1`.
    #[inline]
    pub fn limit(&self) -> u64 {
        self.limit & LIMIT_MASK
    }

    /// `true` if a keyed limiter refused the key for want of a slot ([`Outcome::TableFull`]).
    pub fn is_table_full(&self) -> bool {
        self.per_outcome & !PER_MASK == TABLE_FULL
    }

    /// The largest cost that would be admitted right after this decision, at the same instant.
    /// For a peek, which takes nothing, the largest cost admitted now.
    #[inline]
    pub fn remaining(&self) -> u64 {
        let per = self.per();
        if per == 1 { self.remaining } else { self.remaining / per }
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

    /// Nanoseconds until more quota is made available if nothing else arrives: until
    /// [`remaining`](Self::remaining) grows (the next token, the window's end, the oldest logged
    /// request's expiry). `None` when the key is full: nothing more is to come. This is the `t`
    /// of draft-ietf-httpapi-ratelimit-headers; on a rejection it is never later than
    /// [`retry_after_ns`](Self::retry_after_ns).
    pub fn replenish_after_ns(&self) -> Option<u64> {
        let ns = if self.limit & SCALED != 0 {
            if self.remaining() >= self.limit() {
                return None;
            }
            let per = self.per();
            let scale = ((self.limit & !SCALED) >> SCALE_SHIFT).max(1);
            (per - self.remaining % per).div_ceil(scale)
        } else {
            match self.per_outcome & PER_MASK {
                0 => return None,
                ns => ns,
            }
        };
        Some(match self.retry_after_ns() {
            Some(retry) => ns.min(retry),
            None => ns,
        })
    }

    /// [`replenish_after_ns`](Self::replenish_after_ns) as a [`Duration`].
    pub fn replenish_after(&self) -> Option<Duration> {
        self.replenish_after_ns().map(Duration::from_nanos)
    }

    /// For a rejection (or a new key refused for want of a table slot), the smallest wait in
    /// nanoseconds after which the same request would be admitted (would find a slot) if nothing
    /// else arrived; `None` when admitted or impossible.
    pub fn retry_after_ns(&self) -> Option<u64> {
        let outcome = self.per_outcome & !PER_MASK;
        (outcome == REJECTED || outcome == TABLE_FULL).then_some(self.wait)
    }

    /// [`retry_after_ns`](Self::retry_after_ns) as a [`Duration`].
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after_ns().map(Duration::from_nanos)
    }

    /// For an admitted request of a delaying leaky bucket, how long to hold it before serving it
    /// (nanoseconds); 0 otherwise.
    pub fn delay_ns(&self) -> u64 {
        if self.is_admitted() { self.wait } else { 0 }
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
            .field("outcome", &self.outcome())
            .field("limit", &self.limit())
            .field("remaining", &self.remaining())
            .field("reset_after", &self.reset_after)
            .field("wait", &self.wait)
            .field("replenish_after", &self.replenish_after_ns())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn five_words_and_every_outcome_reads_back() {
        // The layout is what keeps a decision in registers (see `per_outcome`).
        assert_eq!(std::mem::size_of::<Decision>(), 40);
        let tag = |scale: u64| SCALED | scale << SCALE_SHIFT;
        let per = PER_MASK; // the largest divisor must not leak into the outcome bits
        let a = Decision::admitted(5, 0, 7, 3).remaining_over(3 * per + 1, per, tag(1));
        assert_eq!(
            (a.outcome(), a.remaining(), a.delay_ns(), a.retry_after_ns(), a.limit()),
            (Outcome::Admitted, 3, 3, None, 5)
        );
        // 3 units of 1/2 ns: 1 whole remaining, the next in (2 - 1) / 2 ns, rounded up.
        let r = Decision::rejected(5, 0, 7, 9).remaining_over(3, 2, tag(2));
        assert_eq!(
            (r.outcome(), r.remaining(), r.delay_ns(), r.retry_after_ns()),
            (Outcome::Rejected, 1, 0, Some(9))
        );
        assert_eq!(r.replenish_after_ns(), Some(1));
        let i = Decision::impossible(5, 4, 7).replenish(11);
        assert_eq!(
            (i.outcome(), i.is_impossible(), i.is_admitted(), i.retry_after_ns()),
            (Outcome::Impossible, true, false, None)
        );
        assert_eq!((i.limit(), i.reset_after_ns(), i.replenish_after_ns()), (5, 7, Some(11)));
        // A full key: nothing more to come.
        let full = Decision::admitted(5, 5, 0, 0).remaining_over(10, 2, tag(1));
        assert_eq!(full.replenish_after_ns(), None);
        assert_eq!(Decision::admitted(5, 5, 0, 0).replenish_after_ns(), None);
        let t = Decision::table_full(5, 30);
        assert_eq!(
            (t.outcome(), t.retry_after_ns(), t.replenish_after_ns()),
            (Outcome::TableFull, Some(30), Some(30))
        );
    }
}
