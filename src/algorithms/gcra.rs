//! Token bucket with continuous refill, as GCRA (virtual scheduling).
//!
//! With `T = 1/R` (an exact rational `D/N` ns) and the theoretical arrival time `TAT`, a request of
//! cost `c` at `now` is admitted iff `max(TAT, now) + c*T - now <= B*T`, and then
//! `TAT = max(TAT, now) + c*T`.
//!
//! To stay exact when `T` is not a whole number of nanoseconds, times are kept in units of `1/N'`
//! ns, where `T = D'/N'` is the period in lowest terms (`N' = 1` for every rate whose period is a
//! whole number of ns: `100/s`, `10r/s`, `60/m`, ...). `X = TAT * N'` is then an integer.
//!
//! # State word
//!
//! | field      | bits  | unit       | wrap / range                                  | fresh |
//! |------------|-------|------------|-----------------------------------------------|-------|
//! | `OCCUPIED` | 63    | flag       | set once a request was admitted               | 0     |
//! | `X`        | 0..63 | `1/N'` ns  | `TAT * N' mod 2^63`; read as `X - now*N'`     | 0     |
//!
//! The word `0` (flag clear) is a fresh key: `TAT <= now`, a full bucket.
//!
//! Idle horizon: `X - now*N'` is read as a signed 63-bit number, exact while `|TAT - now| < 2^62/N'`
//! ns: 146 years when `N' = 1`, 21 years for `7/s`. After a longer silence the stale `TAT` may read
//! as a debt (probability at most `B*D'/2^62`): stricter, never looser. Configurations whose
//! horizon would be under [`MIN_IDLE_HORIZON_NS`] (`N' > 2^16`) or whose full-bucket debt `B*D'`
//! exceeds 2^60 units (the bucket would take decades to refill) are rejected.
//!
//! A clock reading earlier than a previous one needs no special case: `TAT` only grows, and an
//! earlier `now` sees less refill.

use std::num::NonZeroU64;

use super::{Invalid, MIN_IDLE_HORIZON_NS, div_ceil, invalid, wrap_diff};
use crate::decision::Decision;

const OCCUPIED: u64 = 1 << 63;
const X_BITS: u32 = 63;
const X_MASK: u64 = OCCUPIED - 1;
/// Largest `B * D'` (the debt of an empty bucket, in `1/N'` ns) a configuration may have.
pub(crate) const MAX_DEBT: u128 = 1 << 60;
const _: () = assert!(X_BITS + 1 == 64);

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Gcra {
    /// At least 1 (the policy grammar's counts are), and typed so: a request of cost 1 then needs
    /// no capacity check at all.
    capacity: NonZeroU64,
    /// `N'`: the period's denominator in lowest terms.
    n: u64,
    /// `D'`: `T * N'`, the cost of one token in `1/N'` ns.
    d: u64,
    /// `B * D'`: the debt of an empty bucket.
    cap: u64,
}

/// Reduce the rate `count per period_ns` to `T = d/n` ns in lowest terms.
pub(crate) fn reduced_period(count: u64, period_ns: u64) -> (u64, u64) {
    let g = gcd(count, period_ns);
    (count / g, period_ns / g)
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Checks shared by GCRA and the exact leaky bucket; returns `(n, d, B*d)`.
pub(crate) fn compile_period(
    count: u64,
    period_ns: u64,
    tokens: u64,
    tokens_key: &'static str,
) -> Result<(u64, u64, u64), Invalid> {
    let (n, d) = reduced_period(count, period_ns);
    let horizon = (1u128 << 62) / u128::from(n);
    if horizon < MIN_IDLE_HORIZON_NS {
        return invalid(
            "rate",
            format!(
                "a rate whose period is a multiple of 1/65536 ns (this one is {period_ns}/{count} ns, \
             in lowest terms {d}/{n}): exact state would wrap within a day"
            ),
        );
    }
    let cap = u128::from(tokens) * u128::from(d);
    if cap > MAX_DEBT {
        return invalid(
            tokens_key,
            format!(
                "a bucket that refills within 2^60/{n} ns (~{} years); {tokens} tokens at one per \
             {period_ns}/{count} ns take longer",
                (MAX_DEBT / u128::from(n)) / 31_557_600_000_000_000
            ),
        );
    }
    Ok((n, d, cap as u64))
}

impl Gcra {
    pub(crate) fn new(capacity: u32, count: u64, period_ns: u64) -> Result<Self, Invalid> {
        let (n, d, cap) = compile_period(count, period_ns, u64::from(capacity), "capacity")?;
        let Some(capacity) = NonZeroU64::new(u64::from(capacity)) else {
            return invalid("capacity", "a count of at least 1");
        };
        Ok(Gcra { capacity, n, d, cap })
    }

    pub(crate) fn idle_horizon_ns(&self) -> u128 {
        (1u128 << 62) / u128::from(self.n)
    }

    /// `(now * N' mod 2^63, TAT - now in 1/N' ns)`; the difference is `<= 0` for a fresh word.
    #[inline]
    fn debt(&self, word: u64, now: u64) -> (u64, i64) {
        let now_x = now.wrapping_mul(self.n) & X_MASK;
        if word & OCCUPIED == 0 {
            return (now_x, 0);
        }
        (now_x, wrap_diff(word & X_MASK, now_x, X_BITS))
    }

    super::entry_points!();

    #[inline(always)]
    fn run(&self, word: u64, now: u64, cost: u32) -> (Decision, Option<u64>) {
        let (now_x, diff) = self.debt(word, now);
        // `diff` may exceed `cap` only after an earlier clock reading; it is at most 2^62.
        let debt = diff.max(0) as u64;
        let cost = u64::from(cost);
        if cost > self.capacity.get() {
            return (
                self.tokens(Decision::impossible(self.capacity.get(), 0, self.to_ns(debt)), debt),
                None,
            );
        }
        let need = cost * self.d; // <= cap <= 2^60
        let after = debt + need; // < 2^63
        if after <= self.cap {
            let word = OCCUPIED | (now_x.wrapping_add(after) & X_MASK);
            (
                self.tokens(
                    Decision::admitted(self.capacity.get(), 0, self.to_ns(after), 0),
                    after,
                ),
                Some(word),
            )
        } else {
            let retry = self.to_ns(after - self.cap);
            let d = Decision::rejected(self.capacity.get(), 0, self.to_ns(debt), retry);
            (self.tokens(d, debt), None)
        }
    }

    pub(crate) fn reset_after(&self, word: u64, now: u64) -> u64 {
        let (_, diff) = self.debt(word, now);
        self.to_ns(diff.max(0) as u64)
    }

    /// `decision` with the whole tokens left with `debt` outstanding (divided when read).
    #[inline]
    fn tokens(&self, decision: Decision, debt: u64) -> Decision {
        decision.remaining_over(self.cap.saturating_sub(debt), self.d)
    }

    /// `1/N'` ns units to whole ns, rounded up.
    #[inline]
    fn to_ns(&self, x: u64) -> u64 {
        // `N' = 1` for every period that is a whole number of ns: no division at all.
        if self.n == 1 { x } else { div_ceil(x, self.n) }
    }
}

super::one_word!(Gcra);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seven_per_second_is_exact() {
        // T = 10^9/7 ns = 142857142.857... ns. Seven tokens taken at 0 put TAT at exactly 10^9 ns.
        let g = Gcra::new(7, 7, 1_000_000_000).unwrap();
        let (d, w) = g.decide(0, 0, 7);
        assert!(d.is_admitted());
        assert_eq!(d.reset_after_ns(), 1_000_000_000);
        let w = w.unwrap();
        // One token is back at 10^9/7, rounded up to the next whole ns.
        assert!(!g.decide(w, 142_857_142, 1).0.is_admitted());
        assert!(g.decide(w, 142_857_143, 1).0.is_admitted());
        // All seven at exactly 10^9, not a nanosecond earlier.
        let (d, _) = g.decide(w, 999_999_999, 7);
        assert_eq!(d.retry_after_ns(), Some(1));
        assert!(g.decide(w, 1_000_000_000, 7).0.is_admitted());
    }

    #[test]
    fn rejects_tiny_fractions_and_absurd_buckets() {
        assert!(Gcra::new(10, 4_294_967_291, 1_000_000_000).is_err());
        assert!(Gcra::new(u32::MAX, 1, 86_400_000_000_000).is_err());
        assert!(Gcra::new(u32::MAX, 1_000_000_000, 1_000_000_000).is_ok());
    }
}
