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
//! | `X`        | 1..64 | `1/N'` ns  | `TAT * N' mod 2^63`                           | 0     |
//! | `OCCUPIED` | 0     | flag       | set once a request was admitted               | 0     |
//!
//! The word `0` (flag clear) is a fresh key: `TAT <= now`, a full bucket.
//!
//! Read as a number, an occupied word is `2X + 1`: the arithmetic runs in half units, with `now`
//! scaled by `2N'` (an even number). Then `word - 2 now*N'` (mod 2^64, read as a signed 64-bit
//! number) is `2(TAT - now)*N' + 1`: the debt plus one, with no masking and no 63-bit sign
//! extension, and the next word `2 now*N' + 2 debt' + 1` is odd by construction, so setting the flag
//! costs nothing (`Gcra::run`).
//!
//! Idle horizon: the difference is exact while `|TAT - now| < 2^62/N'` ns: 146 years when
//! `N' = 1`, 21 years for `7/s`. After a longer silence the stale `TAT` may read as a debt
//! (probability at most `B*D'/2^62`): stricter, never looser. Configurations whose horizon would be
//! under [`MIN_IDLE_HORIZON_NS`] (`N' > 2^16`) or whose full-bucket debt `B*D'` exceeds 2^60 units
//! (the bucket would take decades to refill) are rejected.
//!
//! A clock reading earlier than a previous one needs no special case: `TAT` only grows, and an
//! earlier `now` sees less refill.

use std::num::NonZeroU64;

use super::{Invalid, MIN_IDLE_HORIZON_NS, OneWord, div_ceil, invalid};
use crate::decision::{Decision, SCALE_SHIFT, SCALED};

/// Largest `B * D'` (the debt of an empty bucket, in `1/N'` ns) a configuration may have.
pub(crate) const MAX_DEBT: u128 = 1 << 60;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Gcra {
    /// At least 1 (the policy grammar's counts are), and typed so: a request of cost 1 then needs
    /// no capacity check at all.
    capacity: NonZeroU64,
    /// `2N'`: `now` in half units (`N'` is the period's denominator in lowest terms).
    n2: u64,
    /// `2D'`: the cost of one token in half units (`D' = T * N'`).
    d2: u64,
    /// `2B*D' + 1`: the largest `debt + 1` an admission may leave (`<= 2^61 + 1`).
    cap2_plus_one: u64,
    /// The decision's tag for tokens counted in half units, `n2` a nanosecond.
    tag: u64,
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
    if count == 0 || period_ns == 0 {
        // The grammar rejects both; `n` and `d` below are then at least 1.
        return invalid("rate", "a count and a period above zero");
    }
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
        // `n <= 2^16` (the horizon check) and `cap <= 2^60`: the doubled values fit.
        let tag = SCALED | (2 * n) << SCALE_SHIFT;
        Ok(Gcra { capacity, n2: 2 * n, d2: 2 * d, cap2_plus_one: 2 * cap + 1, tag })
    }

    /// `(2 now*N' mod 2^64, debt + 1)`, the debt `max(0, TAT - now)` in half units (even): `1` for
    /// a fresh word. At most `2^63`.
    #[inline(always)]
    fn debt_plus_one(&self, word: u64, now: u64) -> (u64, u64) {
        let now2 = now.wrapping_mul(self.n2);
        // An occupied word is `2X + 1`: the difference is `2(TAT - now)*N' + 1`, read signed.
        let diff = word.wrapping_sub(now2) as i64;
        let lifted = if word & 1 == 0 { 1 } else { diff.max(1) as u64 };
        (now2, lifted)
    }

    /// `decision` with the whole tokens left with `debt_1 - 1` (half units) outstanding, divided
    /// when read, and when the next one is due.
    #[inline]
    fn tokens(&self, decision: Decision, debt_1: u64) -> Decision {
        // The next token is due when the remainder of the division has accrued, in half units:
        // `n2` a nanosecond.
        decision.remaining_over(self.cap2_plus_one.saturating_sub(debt_1), self.d2, self.tag)
    }

    /// `x - 1` half units (`x` odd) in whole ns, rounded up.
    #[inline]
    fn to_ns(&self, x: u64) -> u64 {
        // `N' = 1` for every period that is a whole number of ns: `(x - 1) / 2` is a shift.
        if self.n2 == 2 { x >> 1 } else { div_ceil(x - 1, self.n2) }
    }
}

impl OneWord for Gcra {
    fn idle_horizon_ns(&self) -> u128 {
        (1u128 << 63) / u128::from(self.n2)
    }

    #[inline(always)]
    fn run(&self, word: u64, now: u64, cost: u64) -> (Decision, Option<u64>) {
        // Quantities `_1` are half units plus one (odd): `debt_1 - 1` may exceed the capacity
        // only after an earlier clock reading.
        let (now2, debt_1) = self.debt_plus_one(word, now);
        if cost > self.capacity.get() {
            let d = Decision::impossible(self.capacity.get(), 0, self.to_ns(debt_1));
            return (self.tokens(d, debt_1), None);
        }
        // `cost * d2 <= 2 cap <= 2^61` and `debt_1 <= 2^63`: no overflow.
        let after_1 = debt_1 + cost * self.d2;
        if after_1 <= self.cap2_plus_one {
            // `now2` even, `after_1` odd: the flag is set.
            let word = now2.wrapping_add(after_1);
            let d = Decision::admitted(self.capacity.get(), 0, self.to_ns(after_1), 0);
            (self.tokens(d, after_1), Some(word))
        } else {
            // The excess `after_1 - cap2_plus_one` is even: whole half units.
            let retry = self.to_ns(after_1 - self.cap2_plus_one + 1);
            let d = Decision::rejected(self.capacity.get(), 0, self.to_ns(debt_1), retry);
            (self.tokens(d, debt_1), None)
        }
    }

    fn reset_after(&self, word: u64, now: u64) -> u64 {
        self.to_ns(self.debt_plus_one(word, now).1)
    }

    /// The part of the charge not yet refilled at `now`: the charge took the stretch
    /// `[A - c*T, A)` of the TAT line (`A` the TAT it stored), and refill reaches its end last,
    /// so `min(c*T, max(0, A - now))` is unpaid. Later admissions only push the TAT further, and a
    /// request at `t` maps `TAT -> max(TAT, t) + c'*T`, which never narrows the gap between the
    /// charged and the uncharged history below that unpaid part (`max(TAT, t) - max(TAT', t) >=
    /// max(0, A - t)` when `TAT >= A`): subtracting it never mints. A charge refilled in full has
    /// nothing left to take back.
    fn give_back(&self, word: u64, now: u64, charged: u64, cost: u64) -> u64 {
        let (now2, debt_1) = self.debt_plus_one(word, now);
        // `charged - now2` is `2(A - now)*N' + 1` (charged is occupied, so odd).
        let end_1 = charged.wrapping_sub(now2) as i64;
        let charge = cost.saturating_mul(self.d2).min(self.cap2_plus_one);
        let unpaid = if charged & 1 == 0 {
            0
        } else {
            end_1.saturating_sub(1).clamp(0, charge as i64) as u64
        };
        let left_1 = debt_1.saturating_sub(unpaid).max(1);
        if left_1 == 1 { 0 } else { now2.wrapping_add(left_1) }
    }
}

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
    fn exact_across_the_wrap_of_the_scaled_clock() {
        // 1000/s (T = 1 ms, N' = 1), capacity 3: `2 now` wraps 2^64 at now = 2^63 ns.
        let t = 1_000_000;
        let g = Gcra::new(3, 1000, 1_000_000_000).unwrap();
        let start = (1u64 << 63) - t;
        let mut w = 0;
        for _ in 0..3 {
            let (d, next) = g.decide(w, start, 1);
            assert!(d.is_admitted());
            w = next.unwrap();
            assert_eq!(w & 1, 1, "an occupied word is odd");
        }
        // TAT = start + 3T lies past the wrap.
        assert_eq!(g.decide(w, start, 1).0.retry_after_ns(), Some(t));
        assert!(!g.decide(w, start + t - 1, 1).0.is_admitted());
        let (d, next) = g.decide(w, start + t, 1);
        assert!(d.is_admitted());
        assert_eq!((d.reset_after_ns(), d.remaining()), (3 * t, 0));
        // Idle past TAT: a full bucket again, on both sides of the wrap.
        let (d, _) = g.decide(next.unwrap(), start + 10 * t, 3);
        assert!(d.is_admitted());
        assert_eq!(g.reset_after(next.unwrap(), start + 10 * t), 0);
    }

    #[test]
    fn rejects_tiny_fractions_and_absurd_buckets() {
        assert!(Gcra::new(10, 4_294_967_291, 1_000_000_000).is_err());
        assert!(Gcra::new(u32::MAX, 1, 86_400_000_000_000).is_err());
        assert!(Gcra::new(u32::MAX, 1_000_000_000, 1_000_000_000).is_ok());
    }
}
