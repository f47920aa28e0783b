//! Token bucket with discrete fill (Envoy's `max_tokens`, `tokens_per_fill`, `fill_interval`).
//!
//! Starts full. At every instant `k*I` (k = 1, 2, ...) from the clock's epoch,
//! `tokens = min(B, tokens + K)`; a fill due at `t` applies before a request at `t`. A cost `c` is
//! admitted iff `tokens >= c`, then `tokens -= c`. Fills are computed lazily from the index of the
//! last fill the state has seen.
//!
//! # State word
//!
//! The token count is stored as a *deficit* (`B - tokens`), so that `0` is a full bucket whatever
//! the fill index says: a fresh key needs no sentinel, and every full bucket is the word `0`.
//!
//! | field     | bits                  | unit           | wrap / range                         | fresh |
//! |-----------|-----------------------|----------------|--------------------------------------|-------|
//! | `DEFICIT` | `64-IB..64` (`bits(B)`)| tokens        | 0 ..= B                              | 0     |
//! | `INDEX`   | `0..IB`, `IB = 64 - bits(B)` | fill intervals | `floor(now/I) mod 2^IB`, signed | any   |
//!
//! Idle horizon: `2^(IB-1) * I` (for `B = 100`, `I = 50 ms`: 228 million years; for `B = 2^32-1`,
//! `I = 1 s`: 68 years). A configuration whose horizon would be under
//! [`MIN_IDLE_HORIZON_NS`](super::MIN_IDLE_HORIZON_NS) is rejected. After a longer silence the index
//! can alias and count too few fills: stricter, never looser. A clock reading whose index is earlier
//! than the stored one applies no fills (the later of the two).
//!
//! # Fields
//!
//! The state ratewell-redis's function library stores for the key (`make_discrete` in
//! `ratewell-redis/src/decide.lua`), with `I = 1000 I_us` and `u = now / 1000` (µs), so that
//! `floor(now / I) = floor(u / I_us)`:
//!
//! | field     | unit           | range      | meaning                                  |
//! |-----------|----------------|------------|------------------------------------------|
//! | `deficit` | tokens         | `1..=B`    | `DEFICIT`: `B - tokens` after fill `k`   |
//! | `k`       | fill intervals | `0..=2^53` | `INDEX`, absolute: a `floor(now / I)`    |
//!
//! The word holds the same two values, `k` modulo `2^IB`; [`to_fields`](OneWord::to_fields) reads
//! `k` back as `floor(now / I)` less the signed difference, so the fields of a word are the values
//! the function library writes after the same decisions (`{B - left, k}` after an admission,
//! `{B - (t + back), k}` after a refund; a full bucket is a deleted key, never `deficit = 0`). It
//! answers `None` when the bucket is full at `now` (every decision on it is a fresh key's), and
//! for an index beyond 2^53, where no fields exist (`now` past 2^53 intervals; the function
//! library's times stay below 2^53 µs). The function library takes intervals of whole µs only; the fields of another interval
//! follow the same formula.
//!
//! [`read_fields`](OneWord::read_fields) answers `None` for: a length other than 2; a value beyond
//! ±2^53; `deficit` outside `1..=B`; `k < 0` (every index written is a `floor(now / I)`, and
//! `now >= 0`); `k` more than `2^(IB-1)` intervals ahead of `floor(now / I)`, the furthest `INDEX`
//! reads ahead. Fields whose bucket is full at `now` give the word `0`. A `k` `2^(IB-2)` or more
//! intervals behind (a large bucket not yet full after that long) moves to `floor(now / I)`,
//! `deficit` less the fills since: the same state, so every later decision is the same; that
//! word's fields are the moved pair. The word decides as the fields do at every instant up to
//! `2^(IB-2)` intervals after `now` (half the idle horizon).

use super::{
    Invalid, MAX_COUNT_BITS, MIN_IDLE_HORIZON_NS, OneWord, bits_for, div_ceil, invalid, low_mask,
    sat64, wrap_diff,
};
use crate::decision::Decision;
use crate::word::Fields;

/// The index keeps at least this many bits: the widest deficit is 32 bits.
const MIN_INDEX_BITS: u32 = 32;
const _: () = assert!(MAX_COUNT_BITS + MIN_INDEX_BITS <= u64::BITS);

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Discrete {
    capacity: u64,
    refill: u64,
    interval: u64,
    index_bits: u32,
}

impl Discrete {
    pub(crate) fn new(capacity: u32, refill: u32, interval_ns: u64) -> Result<Self, Invalid> {
        let index_bits = 64 - bits_for(u64::from(capacity));
        let d = Discrete {
            capacity: u64::from(capacity),
            refill: u64::from(refill),
            interval: interval_ns,
            index_bits,
        };
        if d.idle_horizon_ns() < MIN_IDLE_HORIZON_NS {
            return invalid(
                "every",
                format!(
                    "a fill interval of at least {} ns for a capacity of {capacity} (2^{} intervals \
                 must cover 19.5 hours)",
                    MIN_IDLE_HORIZON_NS.div_ceil(1 << (index_bits - 1)),
                    index_bits - 1
                ),
            );
        }
        Ok(d)
    }

    /// `(tokens, absolute index of the last fill applied)` at `now`.
    #[inline]
    fn tokens(&self, word: u64, now: u64) -> (u64, u64) {
        let k_now = now / self.interval;
        // At most `B` in any word the algorithm stored; a word from elsewhere (a corrupted store)
        // with more reads as an empty bucket.
        let deficit = (word >> self.index_bits).min(self.capacity);
        if deficit == 0 {
            return (self.capacity, k_now);
        }
        let gap = wrap_diff(k_now, word & low_mask(self.index_bits), self.index_bits);
        if gap <= 0 {
            // Same interval, or a reading earlier than the state: no fill, keep the later index.
            return (self.capacity - deficit, k_now.wrapping_add(gap.unsigned_abs()));
        }
        let filled = u128::from(self.capacity - deficit) + u128::from(self.refill) * gap as u128;
        (filled.min(u128::from(self.capacity)) as u64, k_now)
    }

    /// Nanoseconds from `now` to the next fill after index `k` with `tokens` in the bucket; 0
    /// when it is full (no fill adds anything).
    #[inline]
    fn next_fill(&self, k: u64, tokens: u64, now: u64) -> u64 {
        if tokens >= self.capacity {
            return 0;
        }
        let at = (u128::from(k) + 1) * u128::from(self.interval);
        sat64(at.saturating_sub(u128::from(now)))
    }

    /// Nanoseconds from `now` until enough fills after index `k` have added `tokens` tokens.
    #[inline]
    fn until_fills(&self, k: u64, tokens: u64, now: u64) -> u64 {
        if tokens == 0 {
            return 0;
        }
        let fills = div_ceil(tokens, self.refill);
        let at = (u128::from(k) + u128::from(fills)) * u128::from(self.interval);
        sat64(at.saturating_sub(u128::from(now)))
    }
}

impl OneWord for Discrete {
    fn idle_horizon_ns(&self) -> u128 {
        (1u128 << (self.index_bits - 1)) * u128::from(self.interval)
    }

    #[inline(always)]
    fn run(&self, word: u64, now: u64, cost: u64) -> (Decision, Option<u64>) {
        let (tokens, k) = self.tokens(word, now);
        if cost > self.capacity {
            let reset = self.until_fills(k, self.capacity - tokens, now);
            let d = Decision::impossible(self.capacity, tokens, reset);
            return (d.replenish(self.next_fill(k, tokens, now)), None);
        }
        if tokens >= cost {
            let left = tokens - cost;
            let deficit = self.capacity - left;
            let word = if deficit == 0 {
                0
            } else {
                (deficit << self.index_bits) | (k & low_mask(self.index_bits))
            };
            let reset = self.until_fills(k, deficit, now);
            let d = Decision::admitted(self.capacity, left, reset, 0);
            (d.replenish(self.next_fill(k, left, now)), Some(word))
        } else {
            let retry = self.until_fills(k, cost - tokens, now);
            let reset = self.until_fills(k, self.capacity - tokens, now);
            let d = Decision::rejected(self.capacity, tokens, reset, retry);
            (d.replenish(self.next_fill(k, tokens, now)), None)
        }
    }

    fn reset_after(&self, word: u64, now: u64) -> u64 {
        let (tokens, k) = self.tokens(word, now);
        self.until_fills(k, self.capacity - tokens, now)
    }

    /// With `a` tokens left by the charge and `F` tokens of fills due since, the charged and the
    /// uncharged history differ by `c` until a fill caps the uncharged one at `B`; after a fill
    /// that left the charged bucket at `x`, by at most `B - x`, and `x <= a + F`. So
    /// `min(c, B - a - F)` (and never beyond full) comes back: all of it before the next fill,
    /// less as fills arrive.
    fn give_back(&self, word: u64, now: u64, charged: u64, cost: u64) -> u64 {
        let (tokens, k) = self.tokens(word, now);
        let deficit = charged >> self.index_bits;
        let left = self.capacity.saturating_sub(deficit);
        let gap = wrap_diff(k, charged & low_mask(self.index_bits), self.index_bits).max(0);
        let fills = u128::from(self.refill) * gap as u128;
        let room = u128::from(self.capacity - left).saturating_sub(fills) as u64;
        let back = cost.min(room).min(self.capacity - tokens);
        let deficit = self.capacity - (tokens + back);
        if deficit == 0 {
            0
        } else {
            (deficit << self.index_bits) | (k & low_mask(self.index_bits))
        }
    }

    /// `[deficit, k]` (see *Fields*); `None` while the bucket is full.
    fn to_fields(&self, word: u64, now: u64) -> Option<Fields> {
        if self.tokens(word, now).0 >= self.capacity {
            return None;
        }
        // At most `B < 2^32` (`tokens` reads a larger field as `B`).
        let deficit = (word >> self.index_bits).min(self.capacity) as i64;
        let k_now = now / self.interval;
        let gap = wrap_diff(k_now, word & low_mask(self.index_bits), self.index_bits);
        let k = i64::try_from(i128::from(k_now) - i128::from(gap)).ok()?;
        Fields::new(&[deficit, k])
    }

    /// The word of `{deficit, k}`; see *Fields* for what is refused.
    fn read_fields(&self, fields: &[i64], now: u64) -> Option<u64> {
        let &[deficit, k] = fields else { return None };
        // `B < 2^32`.
        let deficits = 1..=self.capacity as i64;
        if Fields::new(fields).is_none() || k < 0 || !deficits.contains(&deficit) {
            return None;
        }
        let (mut deficit, mut k) = (i128::from(deficit), i128::from(k));
        let k_now = i128::from(now / self.interval);
        let gap = k_now - k;
        let half = 1i128 << (self.index_bits - 1);
        if gap < -half {
            return None;
        }
        if gap > 0 {
            // `refill < 2^32`, `gap <= 2^64`: no overflow.
            let fills = i128::from(self.refill) * gap;
            if fills >= deficit {
                return Some(0);
            }
            if gap >= half / 2 {
                // The same state, as of `k_now`.
                (deficit, k) = (deficit - fills, k_now);
            }
        }
        // `1 <= deficit <= B < 2^(64 - IB)`, `k >= 0`.
        Some(((deficit as u64) << self.index_bits) | (k as u64 & low_mask(self.index_bits)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithms::Algorithm;
    use crate::decision::Outcome;

    const S: u64 = 1_000_000_000;

    #[test]
    fn fill_due_at_t_applies_before_a_request_at_t() {
        // Envoy: max_tokens 2, tokens_per_fill 1, fill_interval 1 s.
        let b = Discrete::new(2, 1, S).unwrap();
        let (_, w) = b.decide(0, 0, 2);
        let w = w.unwrap();
        let (d, _) = b.decide(w, S - 1, 1);
        assert_eq!(d.retry_after_ns(), Some(1));
        assert_eq!(d.reset_after_ns(), S + 1);
        let (d, w) = b.decide(w, S, 1);
        assert!(d.is_admitted());
        assert_eq!(d.remaining(), 0);
        // The next fill is at 2 s, whatever the time of the last request.
        assert_eq!(b.decide(w.unwrap(), S + 10, 1).0.retry_after_ns(), Some(S - 10));
    }

    #[test]
    fn full_bucket_is_word_zero() {
        let b = Discrete::new(3, 3, S).unwrap();
        let (_, w) = b.decide(0, 5, 3);
        let (d, w) = b.decide(w.unwrap(), S, 3);
        assert!(d.is_admitted());
        let (_, w) = b.decide(w.unwrap(), 3 * S, 1);
        assert_ne!(w, Some(0));
        assert_eq!(b.reset_after(w.unwrap(), 3 * S), S);
        assert_eq!(b.reset_after(w.unwrap(), 4 * S), 0);
    }

    #[test]
    fn tiny_intervals_with_huge_buckets_are_refused() {
        assert!(Discrete::new(u32::MAX, 1, 1_000).is_err());
        assert!(Discrete::new(u32::MAX, 1, S).is_ok());
        assert!(Discrete::new(3, 1, 1).is_ok());
    }

    use crate::algorithms::testing::Rng;

    fn discrete(spec: &str) -> Discrete {
        match spec.parse::<crate::policy::Policy>().unwrap().algorithm {
            Algorithm::Discrete(d) => d,
            other => panic!("{spec}: {other:?}"),
        }
    }

    /// A state of the function library: `[deficit, k]`.
    type St = Option<[i128; 2]>;

    /// `make_discrete` of `decide.lua`, transcribed: `p = {B, K, I_us}`.
    struct Lua {
        b: i128,
        k: i128,
        i: i128,
    }

    impl Lua {
        fn of(d: &Discrete) -> Lua {
            assert_eq!(d.interval % 1000, 0);
            let (b, k) = (i128::from(d.capacity), i128::from(d.refill));
            Lua { b, k, i: i128::from(d.interval / 1000) }
        }

        fn ceil(a: i128, b: i128) -> i128 {
            (a + b - 1).div_euclid(b)
        }

        /// `disc_tokens`: the tokens and the index of the last fill.
        fn tokens(&self, st: St, u: i128) -> (i128, i128) {
            let k_now = u.div_euclid(self.i);
            let Some([deficit, k]) = st else { return (self.b, k_now) };
            let deficit = deficit.min(self.b);
            if deficit == 0 {
                return (self.b, k_now);
            }
            let gap = k_now - k;
            if gap <= 0 {
                return (self.b - deficit, k);
            }
            if gap >= Self::ceil(deficit, self.k) {
                return (self.b, k_now);
            }
            (self.b - deficit + self.k * gap, k_now)
        }

        /// `disc_next`.
        fn next(&self, k: i128, t: i128, u: i128) -> i128 {
            if t >= self.b {
                return 0;
            }
            (((k + 1) * self.i - u) * 1000).max(0)
        }

        /// `disc_until`.
        fn until(&self, k: i128, t: i128, u: i128) -> i128 {
            if t <= 0 {
                return 0;
            }
            (((k + Self::ceil(t, self.k)) * self.i - u) * 1000).max(0)
        }

        /// `discrete`: the reply's outcome, remaining, reset, wait and replenish, and the state
        /// written.
        fn decide(&self, st: St, u: i128, c: i128) -> ([i128; 5], St) {
            let b = self.b;
            let (t, k) = self.tokens(st, u);
            if c > b {
                return ([2, t, self.until(k, b - t, u), 0, self.next(k, t, u)], None);
            }
            if t >= c {
                let left = t - c;
                let deficit = b - left;
                let reply = [0, left, self.until(k, deficit, u), 0, self.next(k, left, u)];
                return (reply, (deficit > 0).then_some([deficit, k]));
            }
            let retry = self.until(k, c - t, u);
            ([1, t, self.until(k, b - t, u), retry, self.next(k, t, u)], None)
        }

        /// `discrete_refund` (on a key that holds a state); `None` deletes the key.
        fn refund(&self, st: St, u: i128, c: i128, receipt: St) -> St {
            st?;
            let b = self.b;
            let (t, k) = self.tokens(st, u);
            let Some([charged, at]) = receipt else { return st };
            let left = (b - charged).max(0);
            let gap = (k - at).max(0);
            let room = ((b - left) - self.k * gap).max(0);
            let back = c.min(room).min(b - t);
            let deficit = b - (t + back);
            (deficit != 0).then_some([deficit, k])
        }

        /// The bucket is full: the state decides as no state does.
        fn is_fresh(&self, st: St, u: i128) -> bool {
            self.tokens(st, u).0 >= self.b
        }
    }

    /// The decision the function library's reply fields describe (`Compiled::decision`).
    fn reply(limit: u64, r: [i128; 5]) -> Decision {
        let outcome = match r[0] {
            0 => Outcome::Admitted,
            1 => Outcome::Rejected,
            _ => Outcome::Impossible,
        };
        let ns = |v: i128| u64::try_from(v).unwrap();
        Decision::from_parts(
            outcome,
            limit,
            ns(r[1]),
            ns(r[2]),
            ns(r[3]),
            (r[4] > 0).then(|| ns(r[4])),
        )
    }

    fn fields(st: [i128; 2]) -> Fields {
        Fields::new(&[st[0] as i64, st[1] as i64]).unwrap()
    }

    /// A step of whole µs from `u` (µs): none (a burst), under a ms, onto or next to one of the
    /// next fills, up to twice the time an empty bucket takes to fill, seconds, or hours.
    fn step_us(rng: &mut Rng, lua: &Lua, u: u64) -> u64 {
        let i = lua.i as u64;
        let full_us = Lua::ceil(lua.b, lua.k) as u64 * i;
        match rng.below(20) {
            0..6 => 0,
            6..9 => 1 + rng.below(1000),
            9..13 => (u / i + 1 + rng.below(3)) * i + rng.below(3) - 1 - u,
            13..16 => rng.below(2 * full_us),
            16..19 => rng.below(10_000_000),
            _ => rng.below(5 * 3_600_000_000),
        }
    }

    /// At `now`: `word`'s fields are the function library's state (none where that decides as no
    /// state), they read back as a word that decides as `word` does, and as the function library
    /// does, at later instants, and the next states agree.
    fn check(d: &Discrete, lua: &Lua, rng: &mut Rng, word: u64, now: u64, st: St) {
        let u = i128::from(now / 1000);
        let f = d.to_fields(word, now);
        let expected = st.filter(|_| !lua.is_fresh(st, u)).map(fields);
        assert_eq!(f, expected, "word {word:#x} at {now}");
        let w2 = f.map(|f| d.read_fields(f.as_slice(), now).expect("fields read back"));
        if let (Some(f), Some(w2)) = (f, w2) {
            assert_eq!(d.to_fields(w2, now), Some(f));
        }
        let cap = d.capacity;
        for _ in 0..4 {
            let later = match rng.below(5) {
                // The instant the bucket is full again, and the µs before it.
                0 => now + d.reset_after(word, now).saturating_sub(rng.below(2) * 1000),
                _ => now + 1000 * step_us(rng, lua, now / 1000),
            };
            let ul = i128::from(later / 1000);
            for c in [1, 1 + rng.below(cap + 1), cap, cap + 1, u64::MAX] {
                let (d1, n1) = d.run(word, later, c);
                let (lo, lua_next) = lua.decide(st, ul, i128::from(c));
                assert_eq!(d1, reply(cap, lo), "{st:?} at {later}, cost {c}");
                let at = |w: u64| d.to_fields(w, later);
                assert_eq!(n1.map(at), lua_next.map(|s| Some(fields(s))));
                match w2 {
                    None => assert_eq!((d1, n1), d.run(0, later, c), "fresh at {later}, cost {c}"),
                    Some(w2) => {
                        let (d2, n2) = d.run(w2, later, c);
                        assert_eq!(d1, d2, "{f:?} at {later}, cost {c}");
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
            "token-bucket capacity=4 refill=2 every=1s",
            "token-bucket capacity=7 refill=3 every=250ms",
            "token-bucket capacity=3 refill=5 every=1ms",
        ] {
            let d = discrete(spec);
            let lua = Lua::of(&d);
            let cap = d.capacity;
            // Steps that left fields, none; exact refunds, other refunds; rejections.
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
                for _ in 0..300 {
                    now = match rng.below(10) {
                        0 => now + d.reset_after(word, now).saturating_sub(rng.below(2) * 1000),
                        _ => now + 1000 * step_us(&mut rng, &lua, now / 1000),
                    };
                    let u = i128::from(now / 1000);
                    if rng.below(4) == 0 && !receipts.is_empty() {
                        let i = rng.below(receipts.len() as u64) as usize;
                        let (before, after, cost, st_before, st_after) = receipts.swap_remove(i);
                        let c = i128::from(cost);
                        if rng.below(3) == 0 {
                            // A receipt of the stored state alone: always `discrete_refund`.
                            seen[3] += 1;
                            word = d.give_back(word, now, after, cost);
                            st = lua.refund(st, u, c, st_after);
                        } else {
                            // `decide_one`'s refund: the state before, bit for bit, while the
                            // key still holds the charge's; else `discrete_refund`.
                            seen[if word == after { 2 } else { 3 }] += 1;
                            word = d.refund(word, now, before, after, cost);
                            if st.is_some() {
                                st = if st == st_after {
                                    st_before
                                } else {
                                    lua.refund(st, u, c, st_after)
                                };
                            }
                        }
                    } else {
                        let cost = match rng.below(10) {
                            0 => cap + 1 + rng.below(3),
                            1 => u64::from(u32::MAX),
                            _ => 1 + rng.below(cap),
                        };
                        let (decision, next) = d.run(word, now, cost);
                        let (lo, next_st) = lua.decide(st, u, i128::from(cost));
                        assert_eq!(decision, reply(cap, lo), "{spec}: cost {cost} at {now}");
                        seen[4] += u32::from(lo[0] == 1);
                        if let Some(next) = next {
                            receipts.push((word, next, cost, st, next_st));
                            (word, st) = (next, next_st);
                        }
                    }
                    check(&d, &lua, &mut rng, word, now, st);
                    seen[usize::from(d.to_fields(word, now).is_none())] += 1;
                }
            }
            assert!(seen.iter().all(|&n| n > 0), "{spec}: {seen:?}");
        }
    }

    #[test]
    fn fields_of_admissions_and_a_refund_by_hand() {
        // capacity=7 refill=3 every=250ms: B = 7, K = 3, I_us = 250_000. A new key takes 5 at
        // u = 1_000_000_000_123 µs: k = floor(u / 250_000) = 4_000_000, t = 7, left = 2, deficit
        // = 7 - 2 = 5: {5, 4_000_000}. Its reset: ceil(5 / 3) = 2 fills, at (4_000_002 *
        // 250_000 - u) * 1000 = 499_877 * 1000 ns.
        let b = discrete("token-bucket capacity=7 refill=3 every=250ms");
        let now = 1_000_000_000_123_000;
        let (d, a) = b.run(0, now, 5);
        assert_eq!(d.reset_after_ns(), 499_877_000);
        let a = a.unwrap();
        assert_eq!(b.to_fields(a, now).unwrap().as_slice(), &[5, 4_000_000]);
        assert_eq!(b.read_fields(&[5, 4_000_000], now), Some(a));
        // At the next fill, u = 1_000_000_250_000: gap = 1 < ceil(5 / 3) = 2, t = 7 - 5 + 3 = 5,
        // k = 4_000_001; 4 taken: left = 1, {6, 4_000_001}.
        let later = 1_000_000_250_000_000;
        let c = b.run(a, later, 4).1.unwrap();
        assert_eq!(b.to_fields(c, later).unwrap().as_slice(), &[6, 4_000_001]);
        // The first charge given back (its receipt {5, 4_000_000} alone): t = 1 at k =
        // 4_000_001; left = 7 - 5 = 2, gap = 1, room = (7 - 2) - 3*1 = 2, back = min(5, 2, 7 - 1)
        // = 2, deficit = 7 - (1 + 2) = 4: {4, 4_000_001}.
        let back = b.give_back(c, later, a, 5);
        assert_eq!(b.to_fields(back, later).unwrap().as_slice(), &[4, 4_000_001]);
        // Full again after ceil(4 / 3) = 2 fills, at k = 4_000_003.
        assert!(b.to_fields(back, 1_000_000_750_000_000 - 1000).is_some());
        assert_eq!(b.to_fields(back, 1_000_000_750_000_000), None);
        assert_eq!(b.read_fields(&[4, 4_000_001], 1_000_000_750_000_000), Some(0));
    }

    #[test]
    fn an_index_long_behind_moves_to_now() {
        // B = 2^32 - 1, one token a ms: an empty bucket takes 49.7 days to fill, and the index has
        // 32 bits (`IB - 2 = 30`: 12.4 days).
        let b = Discrete::new(u32::MAX, 1, 1_000_000).unwrap();
        let lua = Lua::of(&b);
        let mut rng = Rng(0x1234_5678_9abc_def1);
        let quarter = 1i64 << (b.index_bits - 2);
        let k_now = 20 * quarter;
        let now = k_now as u64 * 1_000_000 + 123_000;
        let full = i64::from(u32::MAX);
        for (gap, deficit) in [
            (quarter - 1, full),
            (quarter, full),
            (2 * quarter + 12_345, full),
            (3 * quarter, full),
            (quarter, quarter + 1),
            (3 * quarter + 7, 3 * quarter + 10),
        ] {
            let st = [deficit, k_now - gap];
            let w = b.read_fields(&st, now).unwrap();
            let f = b.to_fields(w, now).unwrap();
            if gap < quarter {
                assert_eq!(f.as_slice(), &st);
            } else {
                assert_eq!(f.as_slice(), &[deficit - gap, k_now]);
            }
            let st = Some([i128::from(st[0]), i128::from(st[1])]);
            for _ in 0..300 {
                let later = now
                    + match rng.below(3) {
                        0 => 1000 * rng.below(10_000_000_000),
                        1 => 1_000_000 * rng.below(quarter as u64),
                        _ => 1_000_000 * (quarter as u64 - rng.below(1000)),
                    };
                let c = 1 + rng.below(1 << 33);
                let (lo, next) = lua.decide(st, i128::from(later / 1000), i128::from(c));
                let (d, w2) = b.run(w, later, c);
                assert_eq!(d, reply(b.capacity, lo), "{st:?}: cost {c} at {later}");
                assert_eq!(w2.map(|w| b.to_fields(w, later)), next.map(|s| Some(fields(s))));
            }
        }
    }

    #[test]
    fn garbage_fields_never_panic() {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        for b in [
            discrete("token-bucket capacity=7 refill=3 every=250ms"),
            discrete("token-bucket capacity=3 refill=5 every=1ms"),
            Discrete::new(u32::MAX, 1, 1_000_000).unwrap(),
            Discrete::new(3, 1, 1).unwrap(),
        ] {
            let cap = b.capacity as i64;
            let half = 1i64 << (b.index_bits - 1).min(62);
            for now in [0, 1000, 1_700_000_000_000_000_000, ((1 << 53) - 1) * 1000, u64::MAX] {
                let k = (now / b.interval).min(1 << 60) as i64;
                let mut values = vec![i64::MIN, i64::MIN + 1, -(1 << 53) - 1, -(1 << 53), -1, 0, 1];
                values.extend([cap - 1, cap, cap + 1, 1 << 53, (1 << 53) + 1, i64::MAX]);
                values.extend([k - half, k - half / 2 - 1, k - half / 2, k - 1, k, k + 1]);
                values.extend([k.saturating_add(half), k.saturating_add(half + 1)]);
                for &x in &values {
                    assert_eq!(b.read_fields(&[x], now), None);
                    for &y in &values {
                        assert_eq!(b.read_fields(&[x, y, 0], now), None);
                        let Some(w) = b.read_fields(&[x, y], now) else { continue };
                        assert!((1..=cap).contains(&x) && y >= 0 && y - k <= half);
                        match b.to_fields(w, now) {
                            None => assert_eq!(w, 0),
                            Some(f) if y > k - half / 2 => assert_eq!(f.as_slice(), &[x, y]),
                            Some(f) => {
                                assert_eq!(f.as_slice(), &[x - (k - y) * b.refill as i64, k])
                            }
                        }
                    }
                }
                assert_eq!(b.read_fields(&[], now), None);
                // The edges: `k` at most `2^(IB-1)` ahead, never negative, `deficit` in 1..=B.
                if k + half < 1 << 53 {
                    assert!(b.read_fields(&[cap, k + half], now).is_some());
                    assert_eq!(b.read_fields(&[cap, k + half + 1], now), None);
                    assert_eq!(b.read_fields(&[cap + 1, k], now), None);
                    assert_eq!(b.read_fields(&[0, k], now), None);
                    assert_eq!(b.read_fields(&[1, -1], now), None);
                }
            }
            for _ in 0..100_000 {
                let len = rng.below(4) as usize;
                let v = [rng.next() as i64, rng.next() as i64 >> rng.below(64), rng.next() as i64];
                let now = rng.next() >> rng.below(64);
                let _ = b.read_fields(&v[..len], now);
                let _ = b.to_fields(rng.next(), now);
            }
        }
    }
}
