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
//!
//! # Fields
//!
//! The state ratewell-redis's function library stores for the key (`make_gcra` in
//! `ratewell-redis/src/decide.lua`), `k = 1000 N'` the units of `1/N'` ns in a microsecond:
//!
//! | field | unit                   | range          | meaning                              |
//! |-------|------------------------|----------------|--------------------------------------|
//! | `tu`  | µs since `now`'s epoch | `0..=2^53`     | `TAT` in whole µs, rounded down      |
//! | `tf`  | `1/N'` ns              | `0..k`         | the rest: `TAT = tu µs + tf/N' ns`   |
//!
//! With `u = now / 1000` (µs), the debt is `(tu - u) k + tf` units when `tu >= u`, else 0. The pair
//! is the unique such split of `TAT`, so the fields of a word are the values the function library
//! writes after the same decisions (`{u + q, r}`, `q, r = divmod(debt, k)`, after an admission or a
//! refund). [`to_fields`](OneWord::to_fields) answers `None` when `TAT <= now` (a fresh key), and
//! for a `TAT` beyond 2^53 µs, where no fields exist (`now` must stay below that, as the function
//! library's times do). A word whose `TAT` lies further ahead of `now` than `floor(2^52 / k)` µs (a
//! clock stepped back that far, or an alias past the idle horizon) gets its exact fields, which
//! [`read_fields`](OneWord::read_fields) refuses.
//!
//! [`read_fields`](OneWord::read_fields) answers `None` for: a length other than 2; a value beyond
//! ±2^53; `tu < 0` (every `TAT` written is at or after a `now`, and `now >= 0`); `tf` outside
//! `0..k`; `tu - u > floor(2^52 / k)`, the span beyond which the function library clamps the debt
//! (it never writes such a state, and the clamp has no one-word form). A debt above `B*D'` within
//! that span (a writer whose clock ran ahead of `now`) is kept: it rejects until the clock catches
//! up, in the function library too. Fields with `TAT <= now` give the word `0`.

use std::num::NonZeroU64;

use super::{Invalid, MIN_IDLE_HORIZON_NS, OneWord, div_ceil, invalid};
use crate::decision::{Decision, SCALE_SHIFT, SCALED};
use crate::word::Fields;

/// Largest `B * D'` (the debt of an empty bucket, in `1/N'` ns) a configuration may have.
pub(crate) const MAX_DEBT: u128 = 1 << 60;

/// 2^52 units of `1/N'` ns: the function library's `MAX_SPAN_UNITS`, the furthest ahead of `now`
/// (rounded down to whole µs) a stored `TAT` is read without clamping.
pub(crate) const MAX_SPAN_UNITS: i128 = 1 << 52;

/// `TAT * N'` (units of `1/N'` ns since the epoch) as the fields `[tu, tf]`, `k = 1000 N'`; `None`
/// when `tu` is beyond ±2^53.
pub(crate) fn split_tat(tat: i128, k: i128) -> Option<Fields> {
    let tu = i64::try_from(tat.div_euclid(k)).ok()?;
    // `0 <= tf < k <= 2^26`.
    Fields::new(&[tu, tat.rem_euclid(k) as i64])
}

/// The fields `[tu, tf]` as `(TAT * N', tu)`, `k = 1000 N'`, if they are two values within ±2^53
/// with `0 <= tf < k` and `TAT` at most [`MAX_SPAN_UNITS`] past `now` (whole µs); `None` else.
pub(crate) fn join_tat(fields: &[i64], now: u64, k: i128) -> Option<(i128, i128)> {
    let &[tu, tf] = fields else { return None };
    if Fields::new(fields).is_none() || !(0..k).contains(&i128::from(tf)) {
        return None;
    }
    let tu = i128::from(tu);
    if tu - i128::from(now / 1000) > MAX_SPAN_UNITS / k {
        return None;
    }
    // |tu| <= 2^53, k <= 2^26: no overflow.
    Some((tu * k + i128::from(tf), tu))
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Gcra {
    /// At least 1 (the policy grammar's counts are), and typed so: a request of cost 1 then needs
    /// no capacity check at all.
    capacity: NonZeroU64,
    /// `2N'`: `now` in half units (`N'` is the period's denominator in lowest terms). Typed
    /// nonzero: a division by it needs no zero check.
    n2: NonZeroU64,
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
        let n2 = NonZeroU64::new(2 * n).expect("a period's denominator is at least 1");
        Ok(Gcra { capacity, n2, d2: 2 * d, cap2_plus_one: 2 * cap + 1, tag })
    }

    /// `(2 now*N' mod 2^64, debt + 1)`, the debt `max(0, TAT - now)` in half units (even): `1` for
    /// a fresh word. At most `2^63`.
    #[inline(always)]
    fn debt_plus_one(&self, word: u64, now: u64) -> (u64, u64) {
        let now2 = now.wrapping_mul(self.n2.get());
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
        if self.n2.get() == 2 { x >> 1 } else { div_ceil(x - 1, self.n2.get()) }
    }
}

impl OneWord for Gcra {
    fn idle_horizon_ns(&self) -> u128 {
        (1u128 << 63) / u128::from(self.n2.get())
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

    /// `TAT` split into `[tu, tf]` (see *Fields*); `None` while `TAT <= now`.
    fn to_fields(&self, word: u64, now: u64) -> Option<Fields> {
        let debt_1 = self.debt_plus_one(word, now).1;
        if debt_1 <= 1 {
            return None;
        }
        let n = i128::from(self.n2.get() / 2);
        // `debt_1 - 1` is twice the debt `(TAT - now) N'` (even: an occupied word is odd).
        split_tat(i128::from(now) * n + i128::from((debt_1 - 1) / 2), 1000 * n)
    }

    /// The word of `TAT = tu µs + tf/N' ns`; see *Fields* for what is refused.
    fn read_fields(&self, fields: &[i64], now: u64) -> Option<u64> {
        let n = i128::from(self.n2.get() / 2);
        let (tat, tu) = join_tat(fields, now, 1000 * n)?;
        if tu < 0 {
            return None;
        }
        // At most 2^52 + 2^26 units (`join_tat`): twice it, plus one, fits.
        let debt = tat - i128::from(now) * n;
        if debt <= 0 {
            return Some(0);
        }
        Some(now.wrapping_mul(self.n2.get()).wrapping_add(2 * debt as u64 + 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithms::Algorithm;

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

    use crate::algorithms::testing::Rng;

    fn gcra(spec: &str) -> Gcra {
        match spec.parse::<crate::policy::Policy>().unwrap().algorithm {
            Algorithm::Gcra(g) => g,
            other => panic!("{spec}: {other:?}"),
        }
    }

    /// A state of the function library: `[tu, tf]`.
    type St = Option<[i128; 2]>;

    /// `make_gcra` of `decide.lua`, transcribed: `p = {B, n, d}`, `k = p[7]`, `bd = p[8]`, the
    /// span clamp `p[9]`.
    struct Lua {
        b: i128,
        n: i128,
        d: i128,
    }

    impl Lua {
        fn of(g: &Gcra) -> Lua {
            let c = i128::from(g.capacity.get());
            Lua { b: c, n: i128::from(g.n2.get() / 2), d: i128::from(g.d2 / 2) }
        }

        fn k(&self) -> i128 {
            1000 * self.n
        }

        /// `gcra_debt`.
        fn debt(&self, st: St, u: i128) -> i128 {
            match st {
                Some([tu, tf]) if tu >= u => (tu - u).min((1 << 52) / self.k()) * self.k() + tf,
                _ => 0,
            }
        }

        fn split(&self, x: i128, u: i128) -> [i128; 2] {
            [u + x.div_euclid(self.k()), x.rem_euclid(self.k())]
        }

        /// `gcra`: outcome (0 admitted, 1 rejected, 2 impossible), remaining, reset, wait and
        /// the state written.
        fn decide(&self, st: St, u: i128, c: i128) -> ([i128; 4], St) {
            let debt = self.debt(st, u);
            let bd = self.b * self.d;
            let rem = |x: i128| x.max(0) / self.d;
            let ceil = |x: i128| (x + self.n - 1).div_euclid(self.n);
            if c > self.b {
                return ([2, rem(bd - debt), ceil(debt), 0], None);
            }
            let after = debt + c * self.d;
            if after <= bd {
                return ([0, rem(bd - after), ceil(after), 0], Some(self.split(after, u)));
            }
            ([1, rem(bd - debt), ceil(debt), ceil(after - bd)], None)
        }

        /// `gcra_refund`; `None` deletes the key.
        fn refund(&self, st: St, u: i128, c: i128, receipt: St) -> St {
            let debt = self.debt(st, u);
            let unpaid = self.debt(receipt, u).min((c * self.d).min(self.b * self.d));
            let left = debt - unpaid;
            (left > 0).then(|| self.split(left, u))
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
    fn check(g: &Gcra, lua: &Lua, rng: &mut Rng, word: u64, now: u64, st: St) {
        let u = i128::from(now / 1000);
        let f = g.to_fields(word, now);
        let expected = st.filter(|_| lua.debt(st, u) > 0).map(fields);
        assert_eq!(f, expected, "word {word:#x} at {now}");
        let fill_us = (lua.b * lua.d / lua.n / 1000) as u64 + 1;
        let cap = g.capacity.get();
        for _ in 0..4 {
            let later = now
                + 1000
                    * match rng.below(4) {
                        0 => 0,
                        1 => rng.below(1000),
                        2 => rng.below(2 * fill_us),
                        _ => rng.below(10_000_000_000),
                    };
            for c in [1, 1 + rng.below(cap + 1), cap, cap + 1, u64::MAX] {
                let (d1, n1) = g.run(word, later, c);
                match f {
                    None => assert_eq!((d1, n1), g.run(0, later, c), "fresh at {later}, cost {c}"),
                    Some(f) => {
                        let w2 = g.read_fields(f.as_slice(), now).expect("fields read back");
                        assert_eq!(g.to_fields(w2, now), Some(f));
                        let (d2, n2) = g.run(w2, later, c);
                        assert_eq!(d1, d2, "{f:?} at {later}, cost {c}");
                        let at = |w: u64| g.to_fields(w, later);
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
            "token-bucket capacity=5 rate=7/s",
            "token-bucket capacity=1 rate=3/s",
            "token-bucket capacity=100 rate=1000/s",
            "token-bucket capacity=10 rate=10/m",
        ] {
            let g = gcra(spec);
            let lua = Lua::of(&g);
            let cap = g.capacity.get();
            let fill_us = (lua.b * lua.d / lua.n / 1000) as u64 + 1;
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
                        word = g.refund(word, now, before, after, cost);
                        // `decide_one`'s refund: the state before, bit for bit, while the key
                        // still holds the charge's; else `gcra_refund`.
                        if st.is_some() {
                            st = if st == st_after {
                                st_before
                            } else {
                                lua.refund(st, u, i128::from(cost), st_after)
                            };
                        }
                    } else {
                        let cost = match rng.below(10) {
                            0 => cap + 1 + rng.below(3),
                            1 => u64::from(u32::MAX),
                            _ => 1 + rng.below(cap),
                        };
                        let (d, next) = g.run(word, now, cost);
                        let (l, next_st) = lua.decide(st, u, i128::from(cost));
                        assert_eq!(engine(&d), l, "{spec}: cost {cost} at {now}");
                        seen[4] += u32::from(l[0] == 1);
                        if let Some(next) = next {
                            receipts.push((word, next, cost, st, next_st));
                            (word, st) = (next, next_st);
                        }
                    }
                    check(&g, &lua, &mut rng, word, now, st);
                    seen[usize::from(g.to_fields(word, now).is_none())] += 1;
                }
            }
            assert!(seen.iter().all(|&n| n > 0), "{spec}: {seen:?}");
        }
    }

    #[test]
    fn fields_of_one_admission_by_hand() {
        // capacity=5 rate=7/s: N' = 7, D' = 10^9, k = 7000, bd = 5*10^9. A fresh key takes 3 at
        // u = 1_000_000_000_123 µs: debt 0, after = 3*10^9; divmod(3*10^9, 7000) = (428571, 3000)
        // (428571*7000 = 2_999_997_000), so {u + 428571, 3000}: TAT = now + 3*10^9/7 ns.
        let g = gcra("token-bucket capacity=5 rate=7/s");
        let now = 1_000_000_000_123_000;
        let w = g.run(0, now, 3).1.unwrap();
        let f = g.to_fields(w, now).unwrap();
        assert_eq!(f.as_slice(), &[1_000_000_000_123 + 428_571, 3000]);
        assert_eq!(g.read_fields(f.as_slice(), now), Some(w));
        // 100 ms later, one more: debt = (428571 - 100000)*7000 + 3000 = 2_300_000_000, after =
        // 3_300_000_000 <= bd; divmod(3.3*10^9, 7000) = (471428, 4000), so {u' + 471428, 4000}.
        let later = now + 100_000_000;
        let w = g.run(w, later, 1).1.unwrap();
        assert_eq!(g.to_fields(w, later).unwrap().as_slice(), &[1_000_000_100_123 + 471_428, 4000]);
        // The same state read at any instant: the split of TAT does not depend on `now`.
        assert_eq!(g.to_fields(w, now).unwrap().as_slice(), &[1_000_000_100_123 + 471_428, 4000]);
        // Past TAT: fresh.
        assert_eq!(g.to_fields(w, later + 1_000_000_000), None);
    }

    #[test]
    fn garbage_fields_never_panic() {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        for spec in ["token-bucket capacity=5 rate=7/s", "token-bucket capacity=100 rate=1000/s"] {
            let g = gcra(spec);
            let k = 1000 * (g.n2.get() / 2) as i64;
            let span = (1i64 << 52) / k;
            for now in [0, 1000, 1_700_000_000_000_000_000, ((1 << 53) - 1) * 1000, u64::MAX] {
                let u = (now / 1000) as i64;
                let mut values = vec![i64::MIN, i64::MIN + 1, -(1 << 53) - 1, -(1 << 53), -1, 0, 1];
                values.extend([k - 1, k, 1 << 53, (1 << 53) + 1, i64::MAX - 1, i64::MAX]);
                values.extend([u - 1, u, u + 1, u + span, u + span + 1]);
                for &a in &values {
                    assert_eq!(g.read_fields(&[a], now), None);
                    for &b in &values {
                        assert_eq!(g.read_fields(&[a, b, 0], now), None);
                        if let Some(w) = g.read_fields(&[a, b], now) {
                            assert!((0..k).contains(&b) && (0..=span + u).contains(&a));
                            let back = g.to_fields(w, now);
                            assert_eq!(
                                back.map(|f| f.as_slice().to_vec()),
                                (w != 0).then(|| vec![a, b])
                            );
                        }
                    }
                }
                assert_eq!(g.read_fields(&[], now), None);
                // The edges: tf must be below k, and TAT at most the span ahead.
                if now < 1 << 62 {
                    assert!(g.read_fields(&[u + span, k - 1], now).is_some());
                    assert_eq!(g.read_fields(&[u + span + 1, 0], now), None);
                    assert_eq!(g.read_fields(&[u + 1, k], now), None);
                    assert_eq!(g.read_fields(&[u, 0], now), Some(0));
                    assert_eq!(g.read_fields(&[-1, 0], now), None);
                }
            }
            for _ in 0..100_000 {
                let len = rng.below(4) as usize;
                let v = [rng.next() as i64, rng.next() as i64 >> rng.below(64), rng.next() as i64];
                let now = rng.next() >> rng.below(64);
                let _ = g.read_fields(&v[..len], now);
                let _ = g.to_fields(rng.next(), now);
            }
        }
    }
}
