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
//!
//! # Fields
//!
//! The state ratewell-redis's function library stores for the key (`make_leaky` in
//! `ratewell-redis/src/decide.lua`), `k = 1000 N'` the units of `1/N'` ns in a microsecond:
//!
//! | field | unit                   | range          | meaning                              |
//! |-------|------------------------|----------------|--------------------------------------|
//! | `tu`  | µs since `now`'s epoch | `-2^53..=2^53` | `TAT` in whole µs, rounded down      |
//! | `tf`  | `1/N'` ns              | `0..k`         | the rest: `TAT = tu µs + tf/N' ns`   |
//!
//! With `u = now / 1000` (µs), the backlog a request joins is `max(0, (TAT + T - now) N')` units,
//! the function library's `leaky_backlog`. The pair is the unique split of `TAT` with `tf` in
//! `0..k` (`tu` rounded towards minus infinity, below `u` while `TAT < now`), so the fields of a
//! word are the values the function library writes after the same decisions (`{u + q, r}`,
//! `q, r = divmod(excess, k)` after an admission, `divmod(left - D', k)` after a refund).
//! [`to_fields`](OneWord::to_fields) answers `None` when the backlog is 0 (`TAT + T <= now`: a
//! fresh key), and for a `TAT` beyond ±2^53 µs, where no fields exist (`now` must stay below 2^53
//! µs, as the function library's times do). A word whose `TAT` lies further ahead of `now` than
//! `floor(2^52 / k)` µs (a clock stepped back that far, or an alias past the idle horizon) gets its
//! exact fields, which [`read_fields`](OneWord::read_fields) refuses.
//!
//! [`read_fields`](OneWord::read_fields) answers `None` for: a length other than 2; a value beyond
//! ±2^53; `tf` outside `0..k`; `TAT + T < 0` (every `TAT` written is at least `now - T`, and
//! `now >= 0`); `tu - u > floor(2^52 / k)`, the span beyond which the function library clamps the
//! backlog (it never writes such a state, and the clamp has no one-word form). A backlog above
//! `(B + 1) D'` within that span (a writer whose clock ran ahead of `now`) is kept: it rejects
//! until the clock catches up, in the function library too. Fields whose backlog is 0 at `now`
//! give the word `0`.

use super::gcra::{compile_period, join_tat, split_tat};
use super::{Invalid, OneWord, div_ceil, wrap_diff};
use crate::decision::{Decision, SCALE_SHIFT, SCALED};
use crate::word::Fields;

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

    /// This bucket decided at a burst of at most its own and with `delay` (`None`: `nodelay`)
    /// for one call: the word keeps its meaning (`TAT` in units of `1/N'` ns, whatever the
    /// burst), so a state stored under either is read the same under the other; one stored at
    /// a higher burst reads as a fuller bucket.
    #[inline]
    pub(crate) fn with_burst(&self, burst: u32, delay: Option<u32>) -> Leaky {
        let burst = self.burst.min(u64::from(burst));
        // At most the policy's own `cap`, which fits.
        Leaky { burst, delay: delay.map(u64::from), cap: burst * self.d, ..self.clone() }
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

    /// `TAT` split into `[tu, tf]` (see *Fields*); `None` while the backlog is 0.
    fn to_fields(&self, word: u64, now: u64) -> Option<Fields> {
        let backlog = self.backlog(word, now).1;
        if backlog == 0 {
            return None;
        }
        let n = i128::from(self.n);
        // The backlog is `(TAT - now) N' + D'`.
        split_tat(i128::from(now) * n + i128::from(backlog) - i128::from(self.d), 1000 * n)
    }

    /// The word of `TAT = tu µs + tf/N' ns`; see *Fields* for what is refused.
    fn read_fields(&self, fields: &[i64], now: u64) -> Option<u64> {
        let n = i128::from(self.n);
        let d = i128::from(self.d);
        let tat = join_tat(fields, now, 1000 * n)?.0;
        if tat + d < 0 {
            return None;
        }
        // `(TAT - now) N'`: from `1 - D'` (a positive backlog) to 2^52 + 2^26 (`join_tat`).
        let x = tat - i128::from(now) * n;
        if x + d <= 0 {
            return Some(0);
        }
        Some(OCCUPIED | (now.wrapping_mul(self.n).wrapping_add(x as i64 as u64) & X_MASK))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithms::Algorithm;

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

    use crate::algorithms::testing::Rng;

    fn leaky(spec: &str) -> Leaky {
        match spec.parse::<crate::policy::Policy>().unwrap().algorithm {
            Algorithm::Leaky(l) => l,
            other => panic!("{spec}: {other:?}"),
        }
    }

    /// A state of the function library: `[tu, tf]`.
    type St = Option<[i128; 2]>;

    /// `make_leaky` of `decide.lua`, transcribed: `p = {burst, n, d, delay}` (`delay` -1 for
    /// nodelay, else at most `burst + 1`), `k = p[7]`, `(burst + 1) d = p[8]`, the span clamp
    /// `p[9]`, one period `p[10]` (µs).
    struct Lua {
        burst: i128,
        n: i128,
        d: i128,
        delay: i128,
    }

    impl Lua {
        fn of(l: &Leaky) -> Lua {
            let burst = i128::from(l.burst);
            let delay = l.delay.map_or(-1, |free| i128::from(free).min(burst + 1));
            Lua { burst, n: i128::from(l.n), d: i128::from(l.d), delay }
        }

        fn k(&self) -> i128 {
            1000 * self.n
        }

        /// `leaky_backlog`.
        fn backlog(&self, st: St, u: i128) -> i128 {
            let Some([tu, tf]) = st else { return 0 };
            if tu < u {
                let behind = u - tu;
                if behind > self.d / self.k() + 1 {
                    return 0;
                }
                return (self.d - (behind * self.k() - tf)).max(0);
            }
            (tu - u).min((1 << 52) / self.k()) * self.k() + tf + self.d
        }

        fn split(&self, x: i128, u: i128) -> [i128; 2] {
            [u + x.div_euclid(self.k()), x.rem_euclid(self.k())]
        }

        /// `leaky`: outcome (0 admitted, 1 rejected, 2 impossible), remaining, reset, wait and
        /// the state written.
        fn decide(&self, st: St, u: i128, c: i128) -> ([i128; 4], St) {
            let (n, d) = (self.n, self.d);
            let (limit, cap) = (self.burst + 1, self.burst * d);
            let backlog = self.backlog(st, u);
            let rem = |x: i128| x.max(0) / d;
            let ceil = |x: i128| (x + n - 1).div_euclid(n);
            if c > limit {
                return ([2, rem(cap + d - backlog), ceil(backlog), 0], None);
            }
            let excess = backlog + (c - 1) * d;
            if excess <= cap {
                let delay =
                    if self.delay >= 0 { ceil((excess - self.delay * d).max(0)) } else { 0 };
                let st = Some(self.split(excess, u));
                return ([0, rem(cap - excess), ceil(excess + d), delay], st);
            }
            ([1, rem(cap + d - backlog), ceil(backlog), ceil(excess - cap)], None)
        }

        /// `leaky_refund`; `None` deletes the key.
        fn refund(&self, st: St, u: i128, c: i128, receipt: St) -> St {
            let backlog = self.backlog(st, u);
            let charge = (c * self.d).min((self.burst + 1) * self.d);
            let left = backlog - self.backlog(receipt, u).min(charge);
            (left > 0).then(|| self.split(left - self.d, u))
        }
    }

    fn engine(d: &Decision) -> [i128; 4] {
        let wait = d.retry_after_ns().unwrap_or(d.delay_ns());
        let outcome = if d.is_admitted() {
            0
        } else if d.is_impossible() {
            2
        } else {
            1
        };
        [outcome, i128::from(d.remaining()), i128::from(d.reset_after_ns()), i128::from(wait)]
    }

    fn fields(st: [i128; 2]) -> Fields {
        Fields::new(&[st[0] as i64, st[1] as i64]).unwrap()
    }

    /// At `now`: `word`'s fields are the function library's state (none where it is equivalent to
    /// no state), and decide as `word` does at later instants.
    fn check(l: &Leaky, lua: &Lua, rng: &mut Rng, word: u64, now: u64, st: St) {
        let u = i128::from(now / 1000);
        let f = l.to_fields(word, now);
        let expected = st.filter(|_| lua.backlog(st, u) > 0).map(fields);
        assert_eq!(f, expected, "word {word:#x} at {now}");
        let fill_us = ((lua.burst + 1) * lua.d / lua.n / 1000) as u64 + 1;
        let limit = l.burst + 1;
        for _ in 0..4 {
            let later = now
                + 1000
                    * match rng.below(4) {
                        0 => 0,
                        1 => rng.below(1000),
                        2 => rng.below(2 * fill_us),
                        _ => rng.below(10_000_000_000),
                    };
            for c in [1, 1 + rng.below(limit + 1), limit, limit + 1, u64::MAX] {
                let (d1, n1) = l.run(word, later, c);
                match f {
                    None => assert_eq!((d1, n1), l.run(0, later, c), "fresh at {later}, cost {c}"),
                    Some(f) => {
                        let w2 = l.read_fields(f.as_slice(), now).expect("fields read back");
                        assert_eq!(l.to_fields(w2, now), Some(f));
                        let (d2, n2) = l.run(w2, later, c);
                        assert_eq!(d1, d2, "{f:?} at {later}, cost {c}");
                        let at = |w: u64| l.to_fields(w, later);
                        assert_eq!(n1.map(at), n2.map(at));
                    }
                }
            }
        }
    }

    #[test]
    fn fields_are_the_function_librarys_state() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for spec in [
            "leaky-bucket rate=10r/s burst=5",
            "leaky-bucket rate=3/s burst=4 delay=2",
            "leaky-bucket rate=30r/m burst=2 nodelay",
            "leaky-bucket rate=7/s burst=0",
        ] {
            let l = leaky(spec);
            let lua = Lua::of(&l);
            let limit = l.burst + 1;
            let fill_us = ((lua.burst + 1) * lua.d / lua.n / 1000) as u64 + 1;
            // Steps that left fields, none; refunds exact, partial; rejections.
            let mut seen = [0u32; 5];
            for run in 0..32 {
                // The function library's times stay below 2^53 µs.
                let mut now = match run % 4 {
                    0 => 0,
                    1 => rng.below(10_000_000) * 1000,
                    2 => 1_700_000_000_000_000_000 + rng.below(1 << 40) * 1000,
                    _ => ((1 << 53) - 10_000_000_000_000) * 1000,
                };
                let (mut word, mut st) = (0u64, None);
                // (before, after, cost, the library's before and after)
                let mut receipts: Vec<(u64, u64, u64, St, St)> = vec![];
                for _ in 0..400 {
                    now += 1000
                        * match rng.below(20) {
                            0..8 => 0,
                            8..13 => 1 + rng.below(1000),
                            13..17 => rng.below(2 * fill_us),
                            17..19 => rng.below(10_000_000),
                            _ => rng.below(5 * 3_600_000_000),
                        };
                    let u = i128::from(now / 1000);
                    if rng.below(4) == 0 && !receipts.is_empty() {
                        let i = rng.below(receipts.len() as u64) as usize;
                        let (before, after, cost, st_before, st_after) = receipts.swap_remove(i);
                        seen[if word == after { 2 } else { 3 }] += 1;
                        word = l.refund(word, now, before, after, cost);
                        // `decide_one`'s refund: the state before, bit for bit, while the key
                        // still holds the charge's; else `leaky_refund`.
                        if st.is_some() {
                            st = if st == st_after {
                                st_before
                            } else {
                                lua.refund(st, u, i128::from(cost), st_after)
                            };
                        }
                    } else {
                        let cost = match rng.below(10) {
                            0 => limit + 1 + rng.below(3),
                            1 => u64::from(u32::MAX),
                            _ => 1 + rng.below(limit),
                        };
                        let (d, next) = l.run(word, now, cost);
                        let (lo, next_st) = lua.decide(st, u, i128::from(cost));
                        assert_eq!(engine(&d), lo, "{spec}: cost {cost} at {now}");
                        seen[4] += u32::from(lo[0] == 1);
                        if let Some(next) = next {
                            receipts.push((word, next, cost, st, next_st));
                            (word, st) = (next, next_st);
                        }
                    }
                    check(&l, &lua, &mut rng, word, now, st);
                    seen[usize::from(l.to_fields(word, now).is_none())] += 1;
                }
            }
            assert!(seen.iter().all(|&n| n > 0), "{spec}: {seen:?}");
        }
    }

    #[test]
    fn fields_of_admissions_and_a_refund_by_hand() {
        // rate=3/s burst=4 delay=2: N' = 3, D' = 10^9, k = 3000, cap = 4*10^9. A fresh key takes
        // 2 at u = 1_000_000_000_000 µs: backlog 0, excess = 0 + 1*10^9; divmod(10^9, 3000) =
        // (333333, 1000) (333333*3000 = 999_999_000), so {u + 333333, 1000}.
        let l = leaky("leaky-bucket rate=3/s burst=4 delay=2");
        let u = 1_000_000_000_000;
        let now = u as u64 * 1000;
        let a = l.run(0, now, 2).1.unwrap();
        assert_eq!(l.to_fields(a, now).unwrap().as_slice(), &[u + 333_333, 1000]);
        // One more at the same instant: tu - u = 333333, so backlog = `gcra_debt` + d =
        // (333333*3000 + 1000) + 10^9 = 2*10^9, and excess = 2*10^9 + 0*d; divmod(2*10^9, 3000) =
        // (666666, 2000) (666666*3000 = 1_999_998_000), so {u + 666666, 2000}.
        let b = l.run(a, now, 1).1.unwrap();
        assert_eq!(l.to_fields(b, now).unwrap().as_slice(), &[u + 666_666, 2000]);
        // Refund the first (cost 2) 0.5 s later (the key holds the second's state: `leaky_refund`).
        // u' = u + 500000: backlog = (666666 - 500000)*3000 + 2000 + 10^9 = 1.5*10^9. The receipt
        // {u + 333333, 1000} is behind by 166667 µs (<= p[10] + 1 = 333334): its backlog is
        // 10^9 - (166667*3000 - 1000) = 5*10^8; charge min(2*10^9, 5*10^9). left = 10^9, x =
        // left - d = 0: {u', 0}.
        let later = now + 500_000_000;
        let back = l.refund(b, later, 0, a, 2);
        assert_eq!(l.to_fields(back, later).unwrap().as_slice(), &[u + 500_000, 0]);
        assert_eq!(l.read_fields(&[u + 500_000, 0], later), Some(back));
        // TAT = u': its backlog of one period leaks in 10^9/3 ns; at u' + 333333 µs it is
        // 10^9 - 333333*3000 = 1000 units, gone one µs later (fresh: no fields).
        let f = l.to_fields(back, later + 333_333_000).unwrap();
        assert_eq!(f.as_slice(), &[u + 500_000, 0]);
        assert_eq!(l.to_fields(back, later + 333_334_000), None);
    }

    #[test]
    fn a_tat_before_the_epoch_reads_back() {
        // A TAT behind `now` splits with `tu` rounded towards minus infinity (a refund's
        // `divmod(left - d, k)`), below 0 near the epoch; it reads back while TAT + T >= 0.
        // rate=3/s burst=4 (k = 3000, d = 10^9): {-1, 1} is TAT = -2999/3 ns.
        let l = leaky("leaky-bucket rate=3/s burst=4");
        // TAT = -2999/3 ns: the backlog at 0 is 10^9 - 2999 units. A request of 1 makes TAT' =
        // TAT + T and waits for nothing; its reset is TAT' + T - 0 = (2*10^9 - 2999)/3 ns,
        // 666_665_667 rounded up.
        let w = l.read_fields(&[-1, 1], 0).unwrap();
        assert_eq!(l.to_fields(w, 0).unwrap().as_slice(), &[-1, 1]);
        assert_eq!(l.run(w, 0, 1).0.reset_after_ns(), 666_665_667);
        // TAT + T = -1/3 ns: refused; TAT + T = 0: accepted, and fresh at 0.
        assert_eq!(l.read_fields(&[-333_334, 1999], 0), None);
        assert_eq!(l.read_fields(&[-333_334, 2000], 0), Some(0));
    }

    #[test]
    fn garbage_fields_never_panic() {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        for spec in ["leaky-bucket rate=7/s burst=5 delay=1", "leaky-bucket rate=10r/s burst=0"] {
            let l = leaky(spec);
            let k = 1000 * l.n as i64;
            let span = (1i64 << 52) / k;
            for now in [0, 1000, 1_700_000_000_000_000_000, ((1 << 53) - 1) * 1000, u64::MAX] {
                let u = (now / 1000) as i64;
                let mut values = vec![i64::MIN, i64::MIN + 1, -(1 << 53) - 1, -(1 << 53), -1, 0, 1];
                values.extend([k - 1, k, 1 << 53, (1 << 53) + 1, i64::MAX - 1, i64::MAX]);
                values.extend([u - 1, u, u + 1, u + span, u + span + 1]);
                for &a in &values {
                    assert_eq!(l.read_fields(&[a], now), None);
                    for &b in &values {
                        assert_eq!(l.read_fields(&[a, b, 0], now), None);
                        if let Some(w) = l.read_fields(&[a, b], now) {
                            assert!((0..k).contains(&b) && a <= span + u);
                            let back = l.to_fields(w, now);
                            let expected = (w != 0).then(|| vec![a, b]);
                            assert_eq!(back.map(|f| f.as_slice().to_vec()), expected);
                        }
                    }
                }
                assert_eq!(l.read_fields(&[], now), None);
                // The edges: tf must be below k, and TAT at most the span ahead.
                if now < 1 << 62 {
                    assert!(l.read_fields(&[u + span, k - 1], now).is_some());
                    assert_eq!(l.read_fields(&[u + span + 1, 0], now), None);
                    assert_eq!(l.read_fields(&[u + 1, k], now), None);
                    assert_ne!(l.read_fields(&[u, 0], now), Some(0));
                    if u > 1_000_000_000 {
                        // A period and a µs behind: nothing left.
                        let behind = u - 1 - l.d as i64 / 1000;
                        assert_eq!(l.read_fields(&[behind, 0], now), Some(0));
                    }
                }
            }
            for _ in 0..100_000 {
                let len = rng.below(4) as usize;
                let v = [rng.next() as i64, rng.next() as i64 >> rng.below(64), rng.next() as i64];
                let now = rng.next() >> rng.below(64);
                let _ = l.read_fields(&v[..len], now);
                let _ = l.to_fields(rng.next(), now);
            }
        }
    }
}
