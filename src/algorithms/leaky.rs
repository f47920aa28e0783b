//! Leaky bucket with nginx `limit_req` semantics, in exact arithmetic.
//!
//! nginx keeps `excess` (requests) and `last`; a request at `now` computes
//! `excess' = max(0, excess - R*(now - last) + 1)` and is rejected iff `excess' > B`. A cost `c`
//! counts as `c` requests at once: `excess' = max(0, excess - R*(now - last) + 1) + (c - 1)`. A new
//! key's first request is free (`excess' = c - 1`).
//!
//! This is GCRA in disguise: with `T = 1/R` and `TAT = last + excess*T` (a new key has
//! `TAT = -inf`), `TAT' = max(now, TAT + T) + (c - 1)*T` and `excess' = (TAT' - now)/T`. Reject iff
//! `TAT' - now > B*T`; an admitted request waits `max(0, excess' - D)/R`, rounded up to a whole ns.
//! From idle, `B + 1` requests pass at once, exactly as in nginx.
//!
//! # State word
//!
//! `OCCUPIED` (bit 63) and `X = TAT * N' mod 2^63` in units of `1/N'` ns (bits 0..63), read as
//! `X - now*N'` in signed 63-bit arithmetic: the idle horizon is [`gcra`](super::gcra)'s
//! (`2^62/N'` ns: 146 years for periods that are whole ns). (GCRA's word has since moved its flag
//! to bit 0 and its time to half units; here that made the full decision dearer: its three
//! conversions to ns, identities for whole-ns periods, would become shifts.) The word `0` is a new
//! key (`TAT = -inf`). A key is back to fresh once `TAT + T <= now`: then `max(now, TAT + T) =
//! now`, exactly as for a new key.

use super::gcra::compile_period;
use super::{Invalid, OneWord, div_ceil, wrap_diff};
use crate::decision::{Decision, SCALE_SHIFT, SCALED};

const OCCUPIED: u64 = 1 << 63;
const X_BITS: u32 = 63;
const X_MASK: u64 = OCCUPIED - 1;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Leaky {
    burst: u64,
    /// `None`: `nodelay`. `Some(D)`: requests beyond the first `D` of excess are delayed.
    delay: Option<u64>,
    n: u64,
    d: u64,
    /// `B * D'`: the most excess (in `1/N'` ns) the bucket holds.
    cap: u64,
    /// The decision's tag for requests counted in `1/N'` ns, `n` a nanosecond.
    tag: u64,
}

impl Leaky {
    pub(crate) fn new(
        count: u64,
        period_ns: u64,
        burst: u32,
        delay: Option<u32>,
    ) -> Result<Self, Invalid> {
        let (n, d, cap_plus_one) = compile_period(count, period_ns, u64::from(burst) + 1, "burst")?;
        Ok(Leaky {
            burst: u64::from(burst),
            delay: delay.map(u64::from),
            n,
            d,
            cap: cap_plus_one - d,
            tag: SCALED | n << SCALE_SHIFT,
        })
    }

    /// `(now * N' mod 2^63, max(0, TAT + T - now))`: the backlog a new request would join.
    #[inline]
    fn backlog(&self, word: u64, now: u64) -> (u64, u64) {
        let now_x = now.wrapping_mul(self.n) & X_MASK;
        if word & OCCUPIED == 0 {
            return (now_x, 0);
        }
        let diff = wrap_diff(word & X_MASK, now_x, X_BITS);
        (now_x, (diff + self.d as i64).max(0) as u64)
    }

    /// `decision` with the largest cost admitted now with `backlog` outstanding:
    /// `floor((cap - backlog) / d) + 1`, that is `floor((cap + d - backlog) / d)`, divided when
    /// read, and when the next one fits.
    #[inline]
    fn remaining_before(&self, decision: Decision, backlog: u64) -> Decision {
        // `backlog <= cap + d` but after an alias of the wrapped time (beyond the idle horizon).
        let units = (self.cap + self.d).saturating_sub(backlog);
        // The next request fits when the remainder has leaked, `n` units a nanosecond.
        decision.remaining_over(units, self.d, self.tag)
    }

    #[inline]
    fn to_ns(&self, x: u64) -> u64 {
        // `N' = 1` for every period that is a whole number of ns: no division at all.
        if self.n == 1 { x } else { div_ceil(x, self.n) }
    }
}

impl OneWord for Leaky {
    fn idle_horizon_ns(&self) -> u128 {
        (1u128 << 62) / u128::from(self.n)
    }

    #[inline(always)]
    fn run(&self, word: u64, now: u64, cost: u64) -> (Decision, Option<u64>) {
        let limit = self.burst + 1;
        let (now_x, backlog) = self.backlog(word, now);
        if cost > limit {
            return (
                self.remaining_before(Decision::impossible(limit, 0, self.to_ns(backlog)), backlog),
                None,
            );
        }
        let excess = backlog + (cost - 1) * self.d; // (TAT' - now) * N', < 2^62
        if excess <= self.cap {
            let word = OCCUPIED | (now_x.wrapping_add(excess) & X_MASK);
            let delay = match self.delay {
                None => 0,
                Some(free) => {
                    let free = u128::from(free) * u128::from(self.d);
                    // At most `excess`: fits u64.
                    let queued = u128::from(excess).saturating_sub(free) as u64;
                    div_ceil(queued, self.n)
                }
            };
            let reset = self.to_ns(excess + self.d);
            let d = Decision::admitted(limit, 0, reset, delay).remaining_over(
                self.cap - excess,
                self.d,
                self.tag,
            );
            (d, Some(word))
        } else {
            let retry = self.to_ns(excess - self.cap);
            let d = Decision::rejected(limit, 0, self.to_ns(backlog), retry);
            (self.remaining_before(d, backlog), None)
        }
    }

    fn reset_after(&self, word: u64, now: u64) -> u64 {
        self.to_ns(self.backlog(word, now).1)
    }

    /// GCRA's argument with the backlog `max(0, TAT + T - now)` for the debt: the charge added
    /// the top `c*T` of the backlog, which drains last, so `min(c*T, backlog of the charged TAT)`
    /// is still unpaid at `now` and is what comes back. A backlog of 0 is a fresh key.
    fn give_back(&self, word: u64, now: u64, charged: u64, cost: u64) -> u64 {
        let (now_x, backlog) = self.backlog(word, now);
        let charge = cost.saturating_mul(self.d).min(self.cap + self.d);
        let unpaid = self.backlog(charged, now).1.min(charge);
        let left = backlog - unpaid.min(backlog);
        if left == 0 {
            return 0;
        }
        // TAT = now + left - T, read back by `backlog` as `left`.
        OCCUPIED | (now_x.wrapping_add(left).wrapping_sub(self.d) & X_MASK)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn burst_plus_one_from_idle_then_one_per_period() {
        // 10r/s burst=5 nodelay: six pass at once, the seventh waits 100 ms.
        let l = Leaky::new(10, S, 5, None).unwrap();
        let mut w = 0;
        for i in 0..6 {
            let (d, nw) = l.decide(w, 0, 1);
            assert!(d.is_admitted(), "request {i}");
            assert_eq!(d.remaining(), 5 - i);
            w = nw.unwrap();
        }
        let (d, none) = l.decide(w, 0, 1);
        assert!(none.is_none());
        assert_eq!(d.retry_after_ns(), Some(100_000_000));
        assert!(!l.decide(w, 99_999_999, 1).0.is_admitted());
        assert!(l.decide(w, 100_000_000, 1).0.is_admitted());
    }

    #[test]
    fn delay_counts_excess_beyond_d() {
        // 10r/s burst=5 delay=2: excess 0, 1, 2 go now; excess 3 waits 100 ms, 4 waits 200 ms.
        let l = Leaky::new(10, S, 5, Some(2)).unwrap();
        let mut w = 0;
        let mut delays = vec![];
        for _ in 0..6 {
            let (d, nw) = l.decide(w, 0, 1);
            delays.push(d.delay_ns() / 1_000_000);
            w = nw.unwrap();
        }
        assert_eq!(delays, [0, 0, 0, 100, 200, 300]);
    }

    #[test]
    fn burst_zero_admits_one_per_period() {
        let l = Leaky::new(1, S, 0, None).unwrap();
        let (d, w) = l.decide(0, 5, 1);
        assert!(d.is_admitted());
        assert_eq!(d.remaining(), 0);
        assert_eq!(d.reset_after_ns(), S);
        let w = w.unwrap();
        assert_eq!(l.decide(w, 5, 1).0.retry_after_ns(), Some(S));
        assert!(l.decide(w, 5 + S, 1).0.is_admitted());
        assert!(l.decide(0, 0, 2).0.is_impossible());
    }
}
