//! Sliding-window counter (Cloudflare's approximation of a sliding window).
//!
//! Windows `[kW, (k+1)W)` on the clock; `prev` and `cur` are the admitted costs of the previous and
//! the current window, `r = now mod W`. Admit iff `floor((prev*(W - r) + cur*W) / W) + c <= N`, in
//! exact integer arithmetic, then `cur += c`. At `r = 0` the previous window counts fully.
//!
//! # State word
//!
//! | field   | bits                          | unit    | wrap / range                            | fresh |
//! |---------|-------------------------------|---------|-----------------------------------------|-------|
//! | `PREV`  | `64-CB..64` (`CB = bits(N)`)  | cost    | 0 ..= N                                 | 0     |
//! | `CUR`   | `IB..IB+CB`                   | cost    | 0 ..= N                                 | 0     |
//! | `INDEX` | `0..IB`, `IB = 64 - 2*CB`     | windows | `floor(now/W) mod 2^IB`, read as signed | any   |
//!
//! Idle horizon `2^(IB-1) * W`: for `N = 1000`, `W = 1 s`, 17 years; it must be at least 19.5 hours,
//! which bounds the limit (`N < 2^24` at `W = 1 s`). A reading earlier than the stored window counts
//! at the start of the stored window (the later of the two). After a longer silence the index can
//! alias and stale counts apply: stricter, never looser.
//!
//! # Fields
//!
//! The state ratewell-redis's function library stores for the key (`make_sliding` in
//! `ratewell-redis/src/decide.lua`), with `u = now / 1000` and `W_us = W / 1000` (µs):
//!
//! | field  | unit    | range      | meaning                                                 |
//! |--------|---------|------------|---------------------------------------------------------|
//! | `prev` | cost    | `0..=N`    | `PREV`                                                  |
//! | `cur`  | cost    | `0..=N`    | `CUR`; `prev + cur >= 1`                                |
//! | `k`    | windows | `0..=2^53` | `INDEX`, absolute: `floor(now / W)`, `floor(u / W_us)`  |
//!
//! The word holds the same three values, `k` modulo `2^IB`; [`to_fields`](OneWord::to_fields)
//! gives the counts as they stand at `now` (moved on one window when `k` is the previous window's,
//! as `sl_at` moves them) and reads `k` back as `floor(now / W)`, or as the stored window when it
//! is ahead of `now`. The fields of a word are so the values the function library writes after
//! the same decisions (`{prev, cur + c, k}` after an admission, the counts less what comes back
//! after a refund; no counts left is a deleted key, never `{0, 0, k}`). It answers `None` once
//! both counts have slid out at `now`, and for a `k` beyond 2^53, where no fields exist. The
//! function library takes windows of whole µs only; the fields of another window follow the same
//! formula.
//!
//! [`read_fields`](OneWord::read_fields) answers `None` for: a length other than 3; a value beyond
//! ±2^53; a count outside `0..=N`; `prev = cur = 0`; `k < 0` (every index written is a
//! `floor(u / W_us)`, and `u >= 0`); `k` more than `2^(IB-1)` windows ahead of `floor(now / W)`,
//! the furthest `INDEX` reads ahead. Within that bound a window ahead of `now` (a writer whose
//! clock ran ahead) is kept: both counts apply in full until it starts, in the function library
//! too. The counts are not checked against each other: the estimate they give depends on the
//! instant they were written at, which the fields do not hold. Fields `2^(IB-1)` windows or more
//! behind `now` give the word `0`; fields less far behind keep their values, `k` included (a
//! receipt read back this way still matches its window), slid out or not.

use super::{
    Invalid, MAX_COUNT_BITS, MIN_IDLE_HORIZON_NS, OneWord, bits_for, invalid, low_mask, sat64,
    wrap_diff,
};
use crate::decision::Decision;
use crate::word::Fields;

/// Two counts of up to 31 bits (the widest accepted; 32-bit limits are refused) leave 2 bits of
/// index, the least `wrap_diff` can read.
const MAX_ACCEPTED_COUNT_BITS: u32 = MAX_COUNT_BITS - 1;
const _: () = assert!(2 * MAX_ACCEPTED_COUNT_BITS + 2 <= u64::BITS);

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Sliding {
    limit: u64,
    window: u64,
    count_bits: u32,
    index_bits: u32,
}

/// Where a key stands: counts, absolute window index and offset into it.
struct At {
    prev: u64,
    cur: u64,
    k: u64,
    r: u64,
}

impl Sliding {
    pub(crate) fn new(limit: u32, window_ns: u64) -> Result<Self, Invalid> {
        let count_bits = bits_for(u64::from(limit));
        let index_bits = 64 - 2 * count_bits;
        let s = Sliding { limit: u64::from(limit), window: window_ns, count_bits, index_bits };
        if index_bits < 2 || s.idle_horizon_ns() < MIN_IDLE_HORIZON_NS {
            return invalid(
                "limit",
                format!(
                    "a smaller limit or a longer window: two {count_bits}-bit counts leave \
                 {index_bits} bits of window index, less than 19.5 hours of windows of \
                 {window_ns} ns"
                ),
            );
        }
        Ok(s)
    }

    #[inline]
    fn at(&self, word: u64, now: u64) -> At {
        let k_now = now / self.window;
        let r = now % self.window;
        let counts = low_mask(self.count_bits);
        let prev = word >> (self.index_bits + self.count_bits);
        let cur = (word >> self.index_bits) & counts;
        if prev == 0 && cur == 0 {
            return At { prev: 0, cur: 0, k: k_now, r };
        }
        match wrap_diff(k_now, word & low_mask(self.index_bits), self.index_bits) {
            0 => At { prev, cur, k: k_now, r },
            1 => At { prev: cur, cur: 0, k: k_now, r },
            g if g > 1 => At { prev: 0, cur: 0, k: k_now, r },
            g => At { prev, cur, k: k_now.wrapping_add(g.unsigned_abs()), r: 0 },
        }
    }

    /// `floor(prev*(W - r)/W) + cur`.
    #[inline]
    fn estimate(&self, at: &At) -> u64 {
        let weighted =
            u128::from(at.prev) * u128::from(self.window - at.r) / u128::from(self.window);
        weighted as u64 + at.cur
    }

    /// Nanoseconds until the estimate `est` at `at` falls (one more unit fits); 0 if it is 0.
    #[inline]
    fn next_unit(&self, at: &At, est: u64, now: u64) -> u64 {
        if est == 0 {
            return 0;
        }
        // The estimate is at most `limit`... unless `at` was read from a state counted above it
        // (a later reading's state): then one unit fits once it falls to `limit - 1`.
        let cost = (self.limit + 1).saturating_sub(est).max(1);
        self.next_admit(at, cost, now)
    }

    /// The smallest `r` in `0..=W` with `floor(p*(W - r)/W) <= a`.
    #[inline]
    fn first_r(&self, p: u64, a: u64) -> u64 {
        if p == 0 {
            return 0;
        }
        // In 64 bits when the product fits (a 128-bit division is a call of ~50 instructions).
        if let Some(product) = (a + 1).checked_mul(self.window) {
            return self.window.saturating_sub((product - 1) / p);
        }
        let w = u128::from(self.window);
        let span = ((u128::from(a) + 1) * w - 1) / u128::from(p);
        (w.saturating_sub(span)) as u64
    }

    /// Nanoseconds from `now` to the instant `k*W + r`.
    #[inline]
    fn wait_until(&self, k: u128, r: u64, now: u64) -> u64 {
        // `k` is a window index plus at most 2: in u128, it cannot overflow at the clock's end.
        let t = k * u128::from(self.window) + u128::from(r);
        sat64(t.saturating_sub(u128::from(now)))
    }

    /// Wait until a request of `cost` fits, the estimate only falling as time passes.
    fn next_admit(&self, at: &At, cost: u64, now: u64) -> u64 {
        if let Some(a) = self.limit.checked_sub(at.cur + cost) {
            let r = self.first_r(at.prev, a).max(at.r);
            if r < self.window {
                return self.wait_until(u128::from(at.k), r, now);
            }
        }
        let r = self.first_r(at.cur, self.limit - cost);
        if r < self.window {
            return self.wait_until(u128::from(at.k) + 1, r, now);
        }
        self.wait_until(u128::from(at.k) + 2, 0, now)
    }

    /// Wait until the estimate is 0 with an empty current window (then no decision differs from a
    /// fresh key's).
    fn reset(&self, at: &At, now: u64) -> u64 {
        if at.cur == 0 {
            let r = self.first_r(at.prev, 0).max(at.r);
            return self.wait_until(u128::from(at.k), r.min(self.window), now);
        }
        let r = self.first_r(at.cur, 0);
        if r < self.window {
            self.wait_until(u128::from(at.k) + 1, r, now)
        } else {
            self.wait_until(u128::from(at.k) + 2, 0, now)
        }
    }
}

impl OneWord for Sliding {
    fn idle_horizon_ns(&self) -> u128 {
        if self.index_bits < 2 {
            return 0;
        }
        (1u128 << (self.index_bits - 1)) * u128::from(self.window)
    }

    #[inline(always)]
    fn run(&self, word: u64, now: u64, cost: u64) -> (Decision, Option<u64>) {
        let at = self.at(word, now);
        let est = self.estimate(&at);
        let remaining = self.limit.saturating_sub(est);
        if cost > self.limit {
            let d = Decision::impossible(self.limit, remaining, self.reset(&at, now));
            return (d.replenish(self.next_unit(&at, est, now)), None);
        }
        if est + cost <= self.limit {
            let after = At { cur: at.cur + cost, ..at };
            let word = (after.prev << (self.index_bits + self.count_bits))
                | (after.cur << self.index_bits)
                | (after.k & low_mask(self.index_bits));
            let next = self.next_unit(&after, est + cost, now);
            let d = Decision::admitted(self.limit, remaining - cost, self.reset(&after, now), 0);
            (d.replenish(next), Some(word))
        } else {
            let retry = self.next_admit(&at, cost, now);
            let d = Decision::rejected(self.limit, remaining, self.reset(&at, now), retry);
            (d.replenish(self.next_unit(&at, est, now)), None)
        }
    }

    fn reset_after(&self, word: u64, now: u64) -> u64 {
        self.reset(&self.at(word, now), now)
    }

    /// A charge counts in its window's count: in the current window (`cur`) or, one window on,
    /// in `prev`; its cost comes off whichever holds it (exact, since the estimate is a function
    /// of the two counts). Two windows on, nothing is left to give back.
    fn give_back(&self, word: u64, now: u64, charged: u64, cost: u64) -> u64 {
        let mut at = self.at(word, now);
        let index = low_mask(self.index_bits);
        match wrap_diff(at.k & index, charged & index, self.index_bits) {
            0 => at.cur -= cost.min(at.cur),
            1 => at.prev -= cost.min(at.prev),
            _ => return word,
        }
        if at.prev == 0 && at.cur == 0 {
            return 0;
        }
        (at.prev << (self.index_bits + self.count_bits))
            | (at.cur << self.index_bits)
            | (at.k & index)
    }

    /// `[prev, cur, k]` as they stand at `now`; see *Fields*.
    fn to_fields(&self, word: u64, now: u64) -> Option<Fields> {
        let at = self.at(word, now);
        if at.prev == 0 && at.cur == 0 {
            return None;
        }
        // `at.k`, without wrapping: `k_now`, or the stored window when it is ahead of `now`.
        let k_now = now / self.window;
        let gap = wrap_diff(k_now, word & low_mask(self.index_bits), self.index_bits);
        let k = i128::from(k_now) - i128::from(gap.min(0));
        // Counts of at most 31 bits.
        Fields::new(&[at.prev as i64, at.cur as i64, i64::try_from(k).ok()?])
    }

    /// The word of `{prev, cur, k}`; see *Fields* for what is refused.
    fn read_fields(&self, fields: &[i64], now: u64) -> Option<u64> {
        let &[prev, cur, k] = fields else { return None };
        // `N < 2^31`.
        let counts = 0..=self.limit as i64;
        if Fields::new(fields).is_none()
            || !counts.contains(&prev)
            || !counts.contains(&cur)
            || prev + cur == 0
            || k < 0
        {
            return None;
        }
        let gap = i128::from(now / self.window) - i128::from(k);
        let half = 1i128 << (self.index_bits - 1);
        if gap < -half {
            // Further ahead than the index reads.
            return None;
        }
        if gap >= half {
            // Both counts slid out long ago (`half >= 2`): a fresh key.
            return Some(0);
        }
        // `wrap_diff(k_now, k)` reads `gap` back; `prev, cur <= N < 2^CB`, `k >= 0`.
        Some(
            ((prev as u64) << (self.index_bits + self.count_bits))
                | ((cur as u64) << self.index_bits)
                | (k as u64 & low_mask(self.index_bits)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn previous_window_weighs_by_overlap() {
        // N = 10, W = 100 ns; 10 admitted in window 0.
        // (Built directly: a 100 ns window is below the configuration's horizon floor.)
        let s = Sliding { limit: 10, window: 100, count_bits: 4, index_bits: 56 };
        let (_, w) = s.decide(0, 0, 10);
        let w = w.unwrap();
        // At 100 (r = 0) the previous window counts fully.
        assert!(!s.decide(w, 100, 1).0.is_admitted());
        // floor(10 * (100 - r)/100) + 1 <= 10 iff 10*(100 - r) < 1000 iff r >= 1.
        assert_eq!(s.decide(w, 100, 1).0.retry_after_ns(), Some(1));
        assert!(s.decide(w, 101, 1).0.is_admitted());
        // Five fit once floor(10*(100-r)/100) <= 5, i.e. r >= 41.
        assert_eq!(s.decide(w, 101, 5).0.retry_after_ns(), Some(40));
        // Empty once 10*(100 - r) < 100, i.e. r >= 91.
        assert_eq!(s.reset_after(w, 101), 90);
    }

    #[test]
    fn big_limits_are_refused() {
        assert!(Sliding::new(u32::MAX, 1_000_000_000).is_err());
        assert!(Sliding::new(1 << 20, 1_000_000_000).is_ok());
    }

    const US: u64 = 1_000;

    fn sliding(text: &str) -> Sliding {
        match text.parse::<crate::policy::Policy>().unwrap().algorithm {
            crate::algorithms::Algorithm::Sliding(s) => s,
            other => panic!("{text}: {other:?}"),
        }
    }

    use crate::algorithms::testing::Rng;

    /// A time at or after `now`, in whole µs: the same instant, the next µs, on or next to a
    /// window boundary, a few windows on, or (rarely) hours later.
    fn later(now: u64, w: u64, rng: &mut Rng) -> u64 {
        let near = |b: u64, rng: &mut Rng| (b + US * rng.below(3)).saturating_sub(US).max(now);
        match rng.below(40) {
            0..=7 => now,
            8..=11 => now + US,
            12..=23 => near((now / w + 1 + rng.below(2)) * w, rng),
            24..=27 => near(now + w, rng),
            28..=32 => now + US * rng.below(3 * w / US),
            33..=38 => now + US * rng.below(1_000),
            _ => now + US * rng.below(6 * 3_600_000_000),
        }
    }

    /// A cost: 1 to 3, any up to the limit, the limit, above it, or a probe's.
    fn cost(limit: u64, rng: &mut Rng) -> u64 {
        match rng.below(10) {
            0 => limit,
            1 => limit + 1 + rng.below(3),
            2 => u64::MAX,
            3 | 4 => 1 + rng.below(limit),
            _ => 1 + rng.below(limit.min(3)),
        }
    }

    fn values(fields: Option<Fields>) -> Option<Vec<i64>> {
        fields.map(|f| f.as_slice().to_vec())
    }

    /// `make_sliding` of `ratewell-redis/src/decide.lua`, on its own state: `p = {N, W_us}`.
    struct Lua {
        n: i128,
        w: i128,
    }

    type LuaState = Option<[i128; 3]>;

    impl Lua {
        fn of(s: &Sliding) -> Lua {
            assert_eq!(s.window % US, 0);
            Lua { n: i128::from(s.limit), w: i128::from(s.window / US) }
        }

        /// `sl_at`: `{prev, cur, k, r}`.
        fn at(&self, st: LuaState, u: i128) -> [i128; 4] {
            let (k_now, r) = (u / self.w, u % self.w);
            match st {
                Some(st) if st[0] != 0 || st[1] != 0 => match k_now - st[2] {
                    0 => [st[0], st[1], k_now, r],
                    1 => [st[1], 0, k_now, r],
                    g if g > 1 => [0, 0, k_now, r],
                    _ => [st[0], st[1], st[2], 0],
                },
                _ => [0, 0, k_now, r],
            }
        }

        /// `sliding`: whether it admits, and the state it stores.
        fn take(&self, st: LuaState, u: i128, c: u64) -> (bool, LuaState) {
            let at = self.at(st, u);
            // `sl_estimate`: `muldiv` is exact.
            let est = at[0] * (self.w - at[3]) / self.w + at[1];
            let c = i128::from(c);
            if c > self.n || est + c > self.n {
                return (false, None);
            }
            (true, Some([at[0], at[1] + c, at[2]]))
        }

        /// `sliding_refund`: the state it stores (`None` inside: deleted), or `None`
        /// (unchanged).
        fn refund(&self, st: LuaState, u: i128, c: u64, receipt: [i128; 3]) -> Option<LuaState> {
            st?;
            let mut at = self.at(st, u);
            let c = i128::from(c);
            match at[2] - receipt[2] {
                0 => at[1] -= c.min(at[1]),
                1 => at[0] -= c.min(at[0]),
                _ => return None,
            }
            Some(if at[0] == 0 && at[1] == 0 { None } else { Some([at[0], at[1], at[2]]) })
        }

        /// What `to_fields` must give for the key holding `st` at `u`: `None` once both counts
        /// have slid out (the state decides as no state does).
        fn view(&self, st: LuaState, u: i128) -> Option<Vec<i64>> {
            let at = self.at(st, u);
            (at[0] != 0 || at[1] != 0).then(|| vec![at[0] as i64, at[1] as i64, at[2] as i64])
        }
    }

    /// Checks the fields of `word` at `now` against later decisions: `None` decides as `0` does,
    /// and fields read back into a word that decides as `word` does and has the same fields.
    fn check_fields(s: &Sliding, word: u64, now: u64, rng: &mut Rng) -> Option<Fields> {
        let fields = s.to_fields(word, now);
        let twin = match fields {
            None => 0,
            Some(fl) => {
                let w2 = s.read_fields(fl.as_slice(), now);
                assert!(w2.is_some(), "{fl:?} at {now} do not read back");
                assert_eq!(s.to_fields(w2.unwrap(), now), fields, "{fl:?} at {now}");
                w2.unwrap()
            }
        };
        for i in 0..6 {
            let t = if i == 0 { now } else { later(now, s.window, rng) };
            let c = cost(s.limit, rng);
            let (d1, n1) = s.run(word, t, c);
            let (d2, n2) = s.run(twin, t, c);
            let ctx = format!("{word:#x} ({fields:?} at {now}) vs {twin:#x}, at {t}, cost {c}");
            assert_eq!(d1, d2, "{ctx}");
            assert_eq!(n1.map(|w| s.to_fields(w, t)), n2.map(|w| s.to_fields(w, t)), "{ctx}");
        }
        fields
    }

    struct Charge {
        before: u64,
        after: u64,
        lua_before: LuaState,
        lua_after: [i128; 3],
        cost: u64,
    }

    #[test]
    fn fields_round_trip_and_are_the_function_librarys() {
        let configs = [
            "sliding-window limit=5 window=1s",
            "sliding-window limit=100 window=1500ms",
            "sliding-window limit=7 window=3s",
            "sliding-window limit=100000 window=1d",
        ];
        for (seed, text) in configs.into_iter().enumerate() {
            let s = sliding(text);
            let lua = Lua::of(&s);
            let mut rng = Rng(0x9E37_79B9_7F4A_7C15 + seed as u64);
            let mut now = US * rng.below(1 << 40);
            let (mut word, mut st) = (0u64, None);
            let mut charges: Vec<Charge> = Vec::new();
            // Admitted, refused, refunds that changed the state, counts that apply, slid out.
            let mut seen = [0u32; 5];
            for step in 0..4_000 {
                now = if rng.below(30) == 0 {
                    // A clock reading earlier than the last (by up to two windows).
                    now.saturating_sub(US * rng.below(2 * s.window / US))
                } else {
                    later(now, s.window, &mut rng)
                };
                let u = i128::from(now / US);
                let ctx = format!("{text}, step {step}, at {now}");
                let fields = check_fields(&s, word, now, &mut rng);
                assert_eq!(values(fields), lua.view(st, u), "{ctx}");
                seen[if fields.is_some() { 3 } else { 4 }] += u32::from(word != 0);
                match rng.below(5) {
                    0..=2 => {
                        let c = cost(s.limit, &mut rng);
                        let (d, next) = s.run(word, now, c);
                        let (admitted, written) = lua.take(st, u, c);
                        assert_eq!(d.is_admitted(), admitted, "{ctx}, cost {c}");
                        seen[usize::from(!admitted)] += 1;
                        if let Some(next) = next {
                            // Exactly what the function library writes.
                            let lua_after = written.unwrap();
                            let expected = lua_after.map(|v| v as i64).to_vec();
                            assert_eq!(values(s.to_fields(next, now)), Some(expected), "{ctx}");
                            charges.push(Charge {
                                before: word,
                                after: next,
                                lua_before: st,
                                lua_after,
                                cost: c,
                            });
                            (word, st) = (next, written);
                        }
                    }
                    _ if charges.is_empty() => {}
                    op => {
                        let before = word;
                        let recent = rng.below(charges.len().min(4) as u64) as usize;
                        let ch = &charges[charges.len() - 1 - recent];
                        if op == 3 {
                            // A whole receipt: the state before while the key holds the
                            // charge's, else `sliding_refund`.
                            word = s.refund(word, now, ch.before, ch.after, ch.cost);
                            if st.is_some() {
                                st = if st == Some(ch.lua_after) {
                                    ch.lua_before
                                } else {
                                    lua.refund(st, u, ch.cost, ch.lua_after).unwrap_or(st)
                                };
                            }
                        } else {
                            // A receipt of the charged state alone, read back from its fields
                            // as another decider on the key reads it.
                            let receipt = ch.lua_after.map(|v| v as i64);
                            let charged = s.read_fields(&receipt, now).expect("a receipt");
                            let back = s.give_back(word, now, charged, ch.cost);
                            let same = s.give_back(word, now, ch.after, ch.cost);
                            assert_eq!(s.to_fields(back, now), s.to_fields(same, now), "{ctx}");
                            word = back;
                            if let Some(ns) = lua.refund(st, u, ch.cost, ch.lua_after) {
                                st = ns;
                            }
                        }
                        // Exactly what the function library's refund leaves.
                        assert_eq!(values(s.to_fields(word, now)), lua.view(st, u), "{ctx}");
                        seen[2] += u32::from(word != before);
                    }
                }
            }
            assert!(seen.iter().all(|&n| n > 100), "{text}: {seen:?}");
        }
    }

    #[test]
    fn fields_by_hand() {
        // sliding-window limit=5 window=1s: p = {5, 1000000}.
        let s = sliding("sliding-window limit=5 window=1s");
        // A take of 3 at u = 250000 µs on no state: sl_at gives {0, 0, 0, 250000} (k_now =
        // floor(250000 / 1000000) = 0), the estimate is 0; 0 + 3 <= 5 stores {0, 0 + 3, 0}.
        let a = s.decide(0, 250_000 * US, 3).1.unwrap();
        assert_eq!(s.to_fields(a, 250_000 * US).unwrap().as_slice(), &[0, 3, 0]);
        // At u = 1250000: k_now = 1, r = 250000, g = 1 - 0 = 1: sl_at gives {3, 0, 1, 250000};
        // the estimate is floor(3 * (1000000 - 250000) / 1000000) + 0 = floor(2.25) = 2.
        // A take of 4: 2 + 4 > 5, refused, nothing stored. A take of 3: 2 + 3 <= 5 stores
        // {3, 0 + 3, 1}.
        let now = 1_250_000 * US;
        assert_eq!(s.decide(a, now, 4).1, None);
        let b = s.decide(a, now, 3).1.unwrap();
        assert_eq!(s.to_fields(b, now).unwrap().as_slice(), &[3, 3, 1]);
        assert_eq!(s.read_fields(&[3, 3, 1], now), Some(b));
        // A refund of the first charge (receipt {0, 3, 0}, c = 3) at the same u: sl_at gives
        // {3, 3, 1, 250000}, g = 1 - 0 = 1, so prev loses min(3, 3): stores {0, 3, 1}.
        let back = s.give_back(b, now, a, 3);
        assert_eq!(s.to_fields(back, now).unwrap().as_slice(), &[0, 3, 1]);
        // At u = 2000000 (g = 1) the counts move on: {3, 0, 2}; at u = 3000000 (g = 2) both have
        // slid out.
        assert_eq!(s.to_fields(b, 2_000_000 * US).unwrap().as_slice(), &[3, 0, 2]);
        assert_eq!(s.to_fields(b, 3_000_000 * US), None);
    }

    #[test]
    fn fields_out_of_range_are_refused() {
        let s = sliding("sliding-window limit=5 window=1s");
        let now = 1_250_000 * US;
        assert!(s.read_fields(&[3, 3, 1], now).is_some());
        let bad: [&[i64]; 10] = [
            &[],
            &[3, 1],
            &[3, 3, 1, 0],
            &[0, 0, 1],
            &[6, 0, 1],
            &[0, 6, 1],
            &[-1, 3, 1],
            &[3, -1, 1],
            &[3, 3, -1],
            &[3, 3, 1 << 54],
        ];
        for fields in bad {
            assert_eq!(s.read_fields(fields, now), None, "{fields:?}");
        }
        // Windows of 3 s under a limit of 2^24 - 1: 16 bits of index, read up to 2^15 ahead.
        let s = sliding("sliding-window limit=16777215 window=3s");
        let half = 1i64 << (s.index_bits - 1);
        assert_eq!(half, 1 << 15);
        assert!(s.read_fields(&[1, 1, half], 0).is_some());
        assert_eq!(s.read_fields(&[1, 1, half + 1], 0), None);
        // Counts slid out `2^15` windows ago or more are a fresh key: the word `0`; less, the
        // fields' own values (a receipt read back this way still matches its window).
        let at = |k: u64| k * s.window;
        let kept = s.read_fields(&[1, 1, 5], at(half as u64 + 4)).unwrap();
        assert_ne!(kept, 0);
        assert_eq!(s.to_fields(kept, at(half as u64 + 4)), None);
        assert_eq!(s.read_fields(&[1, 1, 5], at(half as u64 + 5)), Some(0));
    }

    #[test]
    fn any_fields_are_refused_or_read_without_panic() {
        let extremes = [
            i64::MIN,
            i64::MIN + 1,
            -(1 << 53) - 1,
            -(1 << 53),
            -1,
            0,
            1,
            2,
            5,
            7,
            100_000,
            16_777_215,
            1 << 52,
            (1 << 53) - 1,
            1 << 53,
            (1 << 53) + 1,
            i64::MAX - 1,
            i64::MAX,
        ];
        let configs = [
            "sliding-window limit=5 window=1s",
            "sliding-window limit=100 window=1500ms",
            "sliding-window limit=7 window=3s",
            "sliding-window limit=100000 window=1d",
            "sliding-window limit=16777215 window=3s",
            "sliding-window limit=1 window=1ns",
        ];
        let mut rng = Rng(0xDEAD_BEEF_CAFE_F00D);
        for text in configs {
            let s = sliding(text);
            let nows = [0, US, 1_250_000 * US, 1 << 62, u64::MAX - 1, u64::MAX, rng.next()];
            for now in nows {
                let read = |fields: &[i64]| {
                    if let Some(w) = s.read_fields(fields, now) {
                        let _ = s.to_fields(w, now);
                        let _ = (s.probe(w, now), s.decide(w, now, 1));
                    }
                };
                for a in extremes {
                    read(&[a, a]);
                    for b in extremes {
                        read(&[a, b]);
                        for c in [i64::MIN, -1, 0, 1, 1 << 53, i64::MAX] {
                            read(&[a, b, c]);
                            read(&[c, a, b]);
                        }
                    }
                }
                for _ in 0..2_000 {
                    let small = |rng: &mut Rng| (rng.next() % (1 << 55)) as i64 - (1 << 54);
                    read(&[rng.next() as i64, rng.next() as i64, rng.next() as i64]);
                    read(&[small(&mut rng), small(&mut rng), small(&mut rng)]);
                    let count = |rng: &mut Rng| rng.below(s.limit + 1) as i64;
                    read(&[count(&mut rng), count(&mut rng), small(&mut rng)]);
                    let _ = s.to_fields(rng.next(), now);
                }
            }
        }
    }
}
