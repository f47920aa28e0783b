//! Fixed window: one counter per key and window; admit iff `count + c <= N`.
//!
//! `align=clock` (default): windows are `[kW, (k+1)W)` on the clock. `align=first`: a key's window
//! opens at `s`, its first request at or after the previous window's end, and is `[s, s+W)` (the
//! placement of Redis `INCR`+`EXPIRE`). Only admitted cost counts; an impossible request opens no
//! window.
//!
//! # State word, `align=clock`
//!
//! | field   | bits                        | unit    | wrap / range                            | fresh |
//! |---------|-----------------------------|---------|-----------------------------------------|-------|
//! | `COUNT` | `IB..64` (`bits(N)` bits)   | cost    | 0 ..= N                                 | 0     |
//! | `INDEX` | `0..IB`, `IB = 64 - bits(N)`| windows | `floor(now/W) mod 2^IB`, read as signed | any   |
//!
//! Idle horizon `2^(IB-1) * W`: for `N = 100`, `W = 1 s`, 2.3 billion years; for `N = 2^32-1`,
//! `W = 1 s`, 68 years.
//!
//! # State word, `align=first`
//!
//! | field   | bits                        | unit | wrap / range                                | fresh |
//! |---------|-----------------------------|------|---------------------------------------------|-------|
//! | `COUNT` | `EB..64` (`bits(N)` bits)   | cost | 1 ..= N while a window is open              | 0     |
//! | `END`   | `0..EB`, `EB = 64 - bits(N)`| ns   | `s + W mod 2^EB`, read as signed vs `now`   | any   |
//!
//! Idle horizon `2^(EB-1)` ns: 73 years for `N <= 7`, 2.3 years for `N = 100`; the limit is at
//! most 131,071 (2^17 - 1) so that it is at least 19.5 hours, and `W <= 2^(EB-2)` ns.
//!
//! In both, a count of 0 is an empty window: the word `0` is a fresh key. A clock reading earlier
//! than the stored window (index below the stored one, or before `s = END - W`) is counted in the
//! stored window. After a silence longer than the horizon the stored window can alias as current:
//! its count then still applies, which is stricter, never looser.
//!
//! # Fields
//!
//! The state ratewell-redis's function library stores for the key (`make_fixed` in
//! `ratewell-redis/src/decide.lua`), with `u = now / 1000` and `W_us = W / 1000` (µs):
//!
//! | field   | unit                   | range         | meaning                                       |
//! |---------|------------------------|---------------|-----------------------------------------------|
//! | `count` | cost                   | `1..=N`       | `COUNT`                                       |
//! | `k`     | windows                | `0..=2^53`    | `align=clock`: `INDEX`, absolute: `floor(u / W_us)` |
//! | `end`   | µs since `now`'s epoch | `W_us..=2^53` | `align=first`: `END`, absolute, in µs: `s + W` |
//!
//! The word holds the same two values, `k` modulo `2^IB` and `end` in ns modulo `2^EB`;
//! [`to_fields`](OneWord::to_fields) reads them back from `now` and the signed difference, so the
//! fields of a word are the values the function library writes after the same decisions
//! (`{count + c, k}` or `{count + c, end}` after an admission, `{count - back, k}` or
//! `{count - back, end}` after a refund; an empty window is a deleted key, never `count = 0`).
//! `N` is the policy's own limit: under a lower limit for one call ([`Fixed::within`]) the fields
//! are the same. It answers `None` when no window is open at `now` (`k < floor(now / W)`,
//! `end <= u`), and for a `k` or `end` beyond 2^53, where no fields exist. The function library
//! takes windows of whole µs only; under `align=clock` the fields of another window follow the
//! same formula (`k = floor(now / W)`), under `align=first` `end` is rounded up to the next µs.
//!
//! [`read_fields`](OneWord::read_fields) answers `None` for: a length other than 2; a value beyond
//! ±2^53; `count` outside `1..=N`; `k < 0` (every index written is a `floor(u / W_us)`, and
//! `u >= 0`); `end` before `W_us` (every end written is a `u + W_us`); `k` more than `2^(IB-1)`
//! windows ahead of `floor(now / W)`, or `end` `2^(EB-1)` ns or more ahead of `now`: further than
//! the low field reads ahead. Within that bound a window ahead of `now` (a writer whose clock ran
//! ahead) is kept: its count applies until it ends, in the function library too. Fields of a
//! window that has ended at `now` give a word that decides as a fresh key does: the same values
//! while the low field reads them back as past (a receipt read back this way still matches its
//! window), else `0`.

use super::{
    Invalid, MAX_COUNT_BITS, MIN_IDLE_HORIZON_NS, OneWord, bits_for, invalid, low_mask, sat64,
    wrap_diff,
};
use crate::decision::Decision;
use crate::word::Fields;

/// The low field keeps at least this many bits: the widest count is 32 bits.
const MIN_LOW_BITS: u32 = 32;
const _: () = assert!(MAX_COUNT_BITS + MIN_LOW_BITS <= u64::BITS);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Align {
    Clock,
    First,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Fixed {
    limit: u64,
    /// The policy's own limit, which [`within`](Fixed::within) keeps: the largest count its words
    /// hold.
    word_limit: u64,
    window: u64,
    align: Align,
    /// Bits of the low field (`INDEX` or `END`).
    low_bits: u32,
}

impl Fixed {
    pub(crate) fn new(limit: u32, window_ns: u64, align: Align) -> Result<Self, Invalid> {
        let low_bits = 64 - bits_for(u64::from(limit));
        let f = Fixed {
            limit: u64::from(limit),
            word_limit: u64::from(limit),
            window: window_ns,
            align,
            low_bits,
        };
        match align {
            Align::Clock if f.idle_horizon_ns() < MIN_IDLE_HORIZON_NS => invalid(
                "window",
                format!(
                    "a window of at least {} ns for a limit of {limit}",
                    MIN_IDLE_HORIZON_NS.div_ceil(1 << (low_bits - 1))
                ),
            ),
            Align::First if low_bits < 47 => invalid(
                "limit",
                "a limit of at most 131071 with align=first (the window end needs 47 bits)",
            ),
            Align::First if u128::from(window_ns) > 1u128 << (low_bits - 2) => invalid(
                "window",
                format!(
                    "a window of at most 2^{} ns with align=first and a limit of {limit}",
                    low_bits - 2
                ),
            ),
            _ => Ok(f),
        }
    }

    /// This window decided at a limit of `limit` (at most its own) for one call, its word laid
    /// out as before: the count field keeps its width, so a state stored under either is read
    /// the same under the other. A count above `limit` (stored at a higher one) reads as a full
    /// window.
    #[inline]
    pub(crate) fn within(&self, limit: u32) -> Fixed {
        Fixed { limit: self.limit.min(u64::from(limit)), ..self.clone() }
    }

    /// `(count, window end in ns from now)` of the window a request at `now` falls in, and the
    /// low field to store with it.
    #[inline]
    fn window(&self, word: u64, now: u64) -> (u64, u64, u64) {
        // At most `N` in any word the algorithm stored; more (a word from a corrupted store)
        // reads as a full window.
        let count = (word >> self.low_bits).min(self.limit);
        let low = word & low_mask(self.low_bits);
        match self.align {
            Align::Clock => {
                let k_now = now / self.window;
                let gap = if count == 0 { 1 } else { wrap_diff(k_now, low, self.low_bits) };
                let (count, k) = match gap {
                    0 => (count, k_now),
                    g if g > 0 => (0, k_now),
                    g => (count, k_now.wrapping_add(g.unsigned_abs())),
                };
                let end = (u128::from(k) + 1) * u128::from(self.window) - u128::from(now);
                (count, sat64(end), k & low_mask(self.low_bits))
            }
            Align::First => {
                let left = if count == 0 { 0 } else { wrap_diff(low, now, self.low_bits) };
                if left <= 0 {
                    // No window open: a request now opens [now, now + W).
                    (0, self.window, now.wrapping_add(self.window) & low_mask(self.low_bits))
                } else {
                    // Open (or, for `left > W`, a reading from before it opened: counted in it).
                    (count, left as u64, low)
                }
            }
        }
    }
}

impl OneWord for Fixed {
    fn idle_horizon_ns(&self) -> u128 {
        match self.align {
            Align::Clock => (1u128 << (self.low_bits - 1)) * u128::from(self.window),
            Align::First => 1u128 << (self.low_bits - 1),
        }
    }

    #[inline(always)]
    fn run(&self, word: u64, now: u64, cost: u64) -> (Decision, Option<u64>) {
        let (count, end, low) = self.window(word, now);
        // More quota comes only when the window ends, and only if something was counted in it.
        let reset = if count == 0 { 0 } else { end };
        if cost > self.limit {
            let d = Decision::impossible(self.limit, self.limit - count, reset);
            return (d.replenish(reset), None);
        }
        if count + cost <= self.limit {
            let count = count + cost;
            let word = (count << self.low_bits) | low;
            (Decision::admitted(self.limit, self.limit - count, end, 0).replenish(end), Some(word))
        } else {
            (Decision::rejected(self.limit, self.limit - count, reset, end).replenish(end), None)
        }
    }

    fn reset_after(&self, word: u64, now: u64) -> u64 {
        let (count, end, _) = self.window(word, now);
        if count == 0 { 0 } else { end }
    }

    /// A charge counts in its window only: while that window is open, its cost comes off the
    /// count (exact); once it has ended nothing is left to give back. Under `align=first` a window
    /// opened by the charge itself ends where it would not have without it, so the charge comes
    /// back only while it is alone in its window (the key is then fresh again); the window's
    /// later requests keep it otherwise.
    fn give_back(&self, word: u64, now: u64, charged: u64, cost: u64) -> u64 {
        let (count, _, low) = self.window(word, now);
        let mask = low_mask(self.low_bits);
        if count == 0 || low != charged & mask {
            return word;
        }
        let back = cost.min(count);
        if self.align == Align::First && charged >> self.low_bits == cost {
            // The charge opened the window.
            return if count == back { 0 } else { word };
        }
        let count = count - back;
        if count == 0 { 0 } else { (count << self.low_bits) | low }
    }

    /// `[count, k]` (`align=clock`) or `[count, end]` (`align=first`); see *Fields*.
    fn to_fields(&self, word: u64, now: u64) -> Option<Fields> {
        // The policy's own limit, not this call's: the fields are the same under `within`.
        let count = (word >> self.low_bits).min(self.word_limit);
        if count == 0 {
            return None;
        }
        let low = word & low_mask(self.low_bits);
        let second = match self.align {
            Align::Clock => {
                let k_now = now / self.window;
                let gap = wrap_diff(k_now, low, self.low_bits);
                if gap > 0 {
                    return None;
                }
                i128::from(k_now) - i128::from(gap)
            }
            Align::First => {
                let left = wrap_diff(low, now, self.low_bits);
                if left <= 0 {
                    return None;
                }
                // In µs, rounded up: exact for a window of whole µs.
                (i128::from(now) + i128::from(left) + 999) / 1000
            }
        };
        // `count <= N < 2^32`.
        Fields::new(&[count as i64, i64::try_from(second).ok()?])
    }

    /// The word of `{count, k}` or `{count, end}`; see *Fields* for what is refused.
    fn read_fields(&self, fields: &[i64], now: u64) -> Option<u64> {
        let &[count, second] = fields else { return None };
        // `N < 2^32`.
        if Fields::new(fields).is_none() || !(1..=self.word_limit as i64).contains(&count) {
            return None;
        }
        let half = 1i128 << (self.low_bits - 1);
        // The low field's value (within 2^63), whether its window is open at `now`, and whether
        // the word reads it back: how far it lies ahead of `now` (windows or ns) is in range.
        let (low, open, readable) = match self.align {
            Align::Clock => {
                if second < 0 {
                    return None;
                }
                let k = i128::from(second);
                let ahead = k - i128::from(now / self.window);
                // `wrap_diff(k_now, k)` reads `-ahead` back when it is in `-half..half`.
                (k, ahead >= 0, -half < ahead && ahead <= half)
            }
            Align::First => {
                let end = i128::from(second) * 1000;
                if end < i128::from(self.window) {
                    return None;
                }
                let ahead = end - i128::from(now);
                // `wrap_diff(end, now)` reads `ahead` back when it is in `-half..half`.
                (end, ahead > 0, -half <= ahead && ahead < half)
            }
        };
        if !readable {
            // Open: more than the word reads ahead. Ended: too long ago to keep.
            return if open { None } else { Some(0) };
        }
        // `1 <= count <= N < 2^(64 - low_bits)`, `0 <= low < 2^63`.
        Some(((count as u64) << self.low_bits) | (low as u64 & low_mask(self.low_bits)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn clock_windows_reset_at_boundaries() {
        let f = Fixed::new(2, S, Align::Clock).unwrap();
        let (_, w) = f.decide(0, S - 1, 2);
        let w = w.unwrap();
        assert_eq!(f.decide(w, S - 1, 1).0.retry_after_ns(), Some(1));
        assert!(f.decide(w, S, 2).0.is_admitted());
    }

    #[test]
    fn first_aligned_windows_open_at_the_first_request() {
        let f = Fixed::new(2, S, Align::First).unwrap();
        let (_, w) = f.decide(0, S - 1, 2);
        let w = w.unwrap();
        // The window is [S-1, 2S-1): still closed at S.
        assert_eq!(f.decide(w, S, 1).0.retry_after_ns(), Some(S - 1));
        assert!(!f.decide(w, 2 * S - 2, 1).0.is_admitted());
        assert!(f.decide(w, 2 * S - 1, 2).0.is_admitted());
        // A reading before the window opened counts in it.
        assert!(!f.decide(w, S - 5, 1).0.is_admitted());
    }

    #[test]
    fn a_lower_limit_per_call_reads_the_same_words() {
        let wide = Fixed::new(u32::MAX, S, Align::Clock).unwrap();
        let three = wide.within(3);
        let (d, w) = three.decide(0, 0, 2);
        assert_eq!((d.limit(), d.remaining()), (3, 1));
        // The word is the wide layout's: the wide window sees the same count.
        assert_eq!(wide.probe(w.unwrap(), 0).remaining(), u64::from(u32::MAX) - 2);
        assert!(!three.decide(w.unwrap(), 0, 2).0.is_admitted());
        // A count above the call's limit (stored under a higher one) reads as full.
        let (_, w) = wide.decide(0, 0, 10);
        let d = three.decide(w.unwrap(), 0, 1).0;
        assert!(!d.is_admitted() && d.remaining() == 0);
        assert_eq!(wide.within(u32::MAX), wide, "no lower: the window as it is");
    }

    #[test]
    fn limits_on_layouts() {
        assert!(Fixed::new(131_071, S, Align::First).is_ok());
        assert!(Fixed::new(131_072, S, Align::First).is_err());
        assert!(Fixed::new(u32::MAX, S, Align::Clock).is_ok());
        assert!(Fixed::new(u32::MAX, 1_000, Align::Clock).is_err());
    }

    const US: u64 = 1_000;

    fn fixed(text: &str) -> Fixed {
        match text.parse::<crate::policy::Policy>().unwrap().algorithm {
            crate::algorithms::Algorithm::Fixed(f) => f,
            other => panic!("{text}: {other:?}"),
        }
    }

    use crate::algorithms::testing::Rng;

    /// A time at or after `now`, in whole µs: the same instant, the next µs, on or next to a
    /// window boundary (of the clock, or `edge`), a few windows on, or (rarely) hours later.
    fn later(now: u64, w: u64, edge: Option<u64>, rng: &mut Rng) -> u64 {
        let near = |b: u64, rng: &mut Rng| (b + US * rng.below(3)).saturating_sub(US).max(now);
        match rng.below(40) {
            0..=7 => now,
            8..=11 => now + US,
            12..=19 => near((now / w + 1 + rng.below(2)) * w, rng),
            20..=23 => near(edge.unwrap_or(now + w), rng),
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

    /// `make_fixed` of `ratewell-redis/src/decide.lua`, on its own state: `p = {N, W_us, first}`.
    struct Lua {
        n: i128,
        w: i128,
        first: bool,
    }

    type LuaState = Option<[i128; 2]>;

    impl Lua {
        fn of(f: &Fixed) -> Lua {
            assert_eq!(f.window % US, 0);
            let w = i128::from(f.window / US);
            Lua { n: i128::from(f.limit), w, first: f.align == Align::First }
        }

        /// `fixed_window`: the count and the low value (`k` or the end).
        fn window(&self, st: LuaState, u: i128) -> (i128, i128) {
            let count = st.map_or(0, |st| st[0].min(self.n));
            if !self.first {
                let k_now = u / self.w;
                let mut k = k_now;
                let mut count = count;
                if let Some(st) = st.filter(|_| count > 0) {
                    let gap = k_now - st[1];
                    if gap > 0 {
                        count = 0;
                    } else if gap < 0 {
                        k = st[1];
                    }
                }
                return (count, k);
            }
            match st {
                Some(st) if count > 0 && st[1] > u => (count, st[1]),
                _ => (0, u + self.w),
            }
        }

        /// `fixed`: whether it admits, and the state it stores.
        fn take(&self, st: LuaState, u: i128, c: u64) -> (bool, LuaState) {
            let (count, low) = self.window(st, u);
            let c = i128::from(c);
            if c > self.n || count + c > self.n {
                return (false, None);
            }
            (true, Some([count + c, low]))
        }

        /// `fixed_refund`: the state it stores (`None` inside: deleted), or `None` (unchanged).
        fn refund(&self, st: LuaState, u: i128, c: u64, receipt: [i128; 2]) -> Option<LuaState> {
            let (count, low) = self.window(st, u);
            st?;
            if count == 0 || low != receipt[1] {
                return None;
            }
            let c = i128::from(c);
            let back = c.min(count);
            if self.first && receipt[0] == c {
                return if count == back { Some(None) } else { None };
            }
            let count = count - back;
            Some(if count == 0 { None } else { Some([count, low]) })
        }

        /// What `to_fields` must give for the key holding `st` at `u`: `None` when no window is
        /// open (the state decides as no state does).
        fn view(&self, st: LuaState, u: i128) -> Option<Vec<i64>> {
            let (count, low) = self.window(st, u);
            (count > 0).then(|| vec![count as i64, low as i64])
        }
    }

    /// Checks the fields of `word` at `now` against later decisions: `None` decides as `0` does,
    /// and fields read back into a word that decides as `word` does and has the same fields.
    fn check_fields(f: &Fixed, word: u64, now: u64, rng: &mut Rng) -> Option<Fields> {
        let fields = f.to_fields(word, now);
        let twin = match fields {
            None => 0,
            Some(fl) => {
                let w2 = f.read_fields(fl.as_slice(), now);
                assert!(w2.is_some(), "{fl:?} at {now} do not read back");
                assert_eq!(f.to_fields(w2.unwrap(), now), fields, "{fl:?} at {now}");
                w2.unwrap()
            }
        };
        let edge = values(fields).filter(|_| f.align == Align::First).map(|v| v[1] as u64 * US);
        for i in 0..6 {
            let t = if i == 0 { now } else { later(now, f.window, edge, rng) };
            let c = cost(f.limit, rng);
            let (d1, n1) = f.run(word, t, c);
            let (d2, n2) = f.run(twin, t, c);
            let ctx = format!("{word:#x} ({fields:?} at {now}) vs {twin:#x}, at {t}, cost {c}");
            assert_eq!(d1, d2, "{ctx}");
            assert_eq!(n1.map(|w| f.to_fields(w, t)), n2.map(|w| f.to_fields(w, t)), "{ctx}");
        }
        fields
    }

    struct Charge {
        before: u64,
        after: u64,
        lua_before: LuaState,
        lua_after: [i128; 2],
        cost: u64,
    }

    #[test]
    fn fields_round_trip_and_are_the_function_librarys() {
        let configs = [
            "fixed-window limit=5 window=1s",
            "fixed-window limit=3 window=1m align=first",
            "fixed-window limit=10 window=1500ms",
        ];
        for (seed, text) in configs.into_iter().enumerate() {
            let f = fixed(text);
            let lua = Lua::of(&f);
            let mut rng = Rng(0x9E37_79B9_7F4A_7C15 + seed as u64);
            let mut now = US * rng.below(1 << 40);
            let (mut word, mut st) = (0u64, None);
            let mut charges: Vec<Charge> = Vec::new();
            // Admitted, refused, refunds that changed the state, open windows, ended ones.
            let mut seen = [0u32; 5];
            for step in 0..4_000 {
                let edge = lua.view(st, i128::from(now / US)).map(|v| v[1] as u64 * US);
                now = if rng.below(30) == 0 {
                    // A clock reading earlier than the last (by up to two windows).
                    now.saturating_sub(US * rng.below(2 * f.window / US))
                } else {
                    later(now, f.window, edge.filter(|_| lua.first), &mut rng)
                };
                let u = i128::from(now / US);
                let ctx = format!("{text}, step {step}, at {now}");
                let fields = check_fields(&f, word, now, &mut rng);
                assert_eq!(values(fields), lua.view(st, u), "{ctx}");
                seen[if fields.is_some() { 3 } else { 4 }] += u32::from(word != 0);
                match rng.below(5) {
                    0..=2 => {
                        let c = cost(f.limit, &mut rng);
                        let (d, next) = f.run(word, now, c);
                        let (admitted, written) = lua.take(st, u, c);
                        assert_eq!(d.is_admitted(), admitted, "{ctx}, cost {c}");
                        seen[usize::from(!admitted)] += 1;
                        if let Some(next) = next {
                            // Exactly what the function library writes.
                            let lua_after = written.unwrap();
                            let expected = lua_after.map(|v| v as i64).to_vec();
                            assert_eq!(values(f.to_fields(next, now)), Some(expected), "{ctx}");
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
                            // charge's, else `fixed_refund`.
                            word = f.refund(word, now, ch.before, ch.after, ch.cost);
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
                            let charged = f.read_fields(&receipt, now).expect("a receipt");
                            let back = f.give_back(word, now, charged, ch.cost);
                            let same = f.give_back(word, now, ch.after, ch.cost);
                            assert_eq!(f.to_fields(back, now), f.to_fields(same, now), "{ctx}");
                            word = back;
                            if let Some(ns) = lua.refund(st, u, ch.cost, ch.lua_after) {
                                st = ns;
                            }
                        }
                        // Exactly what the function library's refund leaves.
                        assert_eq!(values(f.to_fields(word, now)), lua.view(st, u), "{ctx}");
                        seen[2] += u32::from(word != before);
                    }
                }
            }
            assert!(seen.iter().all(|&n| n > 100), "{text}: {seen:?}");
        }
    }

    #[test]
    fn fields_by_hand() {
        // fixed-window limit=5 window=1s: p = {5, 1000000, 0}.
        let f = fixed("fixed-window limit=5 window=1s");
        // A take of 2 at u = 3500000 µs on no state: count 0, k = floor(3500000 / 1000000) = 3;
        // 0 + 2 <= 5 stores {0 + 2, 3}.
        let a = f.decide(0, 3_500_000 * US, 2).1.unwrap();
        assert_eq!(f.to_fields(a, 3_500_000 * US).unwrap().as_slice(), &[2, 3]);
        // A take of 3 at u = 3999999: k_now = floor(3999999 / 1000000) = 3 = st[2], count 2;
        // 2 + 3 <= 5 stores {5, 3}.
        let b = f.decide(a, 3_999_999 * US, 3).1.unwrap();
        assert_eq!(f.to_fields(b, 3_999_999 * US).unwrap().as_slice(), &[5, 3]);
        // A refund of 2 on the receipt {2, 3} at the same u: fixed_refund's count 5, low 3 =
        // receipt[2], back = min(2, 5) = 2, p[3] = 0: stores {5 - 2, 3}.
        let back = f.give_back(b, 3_999_999 * US, a, 2);
        assert_eq!(f.to_fields(back, 3_999_999 * US).unwrap().as_slice(), &[3, 3]);
        // At u = 4000000: k_now = 4, gap = 4 - 3 > 0, count 0: no window open.
        assert_eq!(f.to_fields(b, 4_000_000 * US), None);
        assert_eq!(f.read_fields(&[5, 3], 3_999_999 * US), Some(b));

        // fixed-window limit=3 window=1m align=first: p = {3, 60000000, 1}.
        let f = fixed("fixed-window limit=3 window=1m align=first");
        // A take of 1 at u = 90000000 on no state opens a window: low = u + W = 150000000;
        // stores {1, 150000000}.
        let a = f.decide(0, 90_000_000 * US, 1).1.unwrap();
        assert_eq!(f.to_fields(a, 90_000_000 * US).unwrap().as_slice(), &[1, 150_000_000]);
        // A take of 2 at u = 149999999: st[2] = 150000000 > u, count 1; 1 + 2 <= 3 stores
        // {3, 150000000}.
        let b = f.decide(a, 149_999_999 * US, 2).1.unwrap();
        assert_eq!(f.to_fields(b, 149_999_999 * US).unwrap().as_slice(), &[3, 150_000_000]);
        // Refunding the first charge: receipt[1] = 1 = c (it opened the window) and count 3 is
        // not back = 1: fixed_refund leaves the state.
        assert_eq!(f.give_back(b, 149_999_999 * US, a, 1), b);
        // At u = 150000000, st[2] > u fails: no window open.
        assert_eq!(f.to_fields(b, 150_000_000 * US), None);
    }

    #[test]
    fn fields_out_of_range_are_refused() {
        let f = fixed("fixed-window limit=5 window=1s");
        let now = 3_500_000 * US;
        assert_eq!(f.read_fields(&[2, 3], now), f.decide(0, now, 2).1);
        for bad in [&[][..], &[2], &[2, 3, 0], &[0, 3], &[6, 3], &[-1, 3], &[2, -1], &[2, 1 << 54]]
        {
            assert_eq!(f.read_fields(bad, now), None, "{bad:?}");
        }
        // As far ahead as `INDEX` reads (2^51 windows for `N = 4000`), and no further.
        let f = fixed("fixed-window limit=4000 window=1s");
        let half = 1i64 << (f.low_bits - 1);
        assert_eq!(half, 1 << 51);
        assert!(f.read_fields(&[2, half + 3], now).is_some());
        assert_eq!(f.read_fields(&[2, half + 4], now), None);
        // A window ended `2^(IB-1)` windows ago or more decides as a fresh key: the word `0`.
        let f = fixed("fixed-window limit=1 window=1ns");
        let half = 1u64 << (f.low_bits - 1);
        assert_ne!(f.read_fields(&[1, 3], half + 2), Some(0));
        assert_eq!(f.to_fields(f.read_fields(&[1, 3], half + 2).unwrap(), half + 2), None);
        assert_eq!(f.read_fields(&[1, 3], half + 3), Some(0));

        let f = fixed("fixed-window limit=3 window=1m align=first");
        let now = 90_000_000 * US;
        for bad in [&[1, 59_999_999][..], &[4, 150_000_000], &[0, 150_000_000], &[1, -5]] {
            assert_eq!(f.read_fields(bad, now), None, "{bad:?}");
        }
        // An end further than `2^(EB-1)` ns ahead is beyond what `END` reads.
        let half_us = (1i64 << (f.low_bits - 1)) / 1_000;
        assert!(f.read_fields(&[1, 90_000_000 + half_us], now).is_some());
        assert_eq!(f.read_fields(&[1, 90_000_000 + half_us + 1], now), None);
        // An ended window keeps its end while `END` reads it as past: a receipt still matches.
        let ended = f.read_fields(&[1, 60_000_000], now).unwrap();
        assert_ne!(ended, 0);
        assert_eq!(f.to_fields(ended, now), None);
        assert_eq!(f.read_fields(&[1, 60_000_000], u64::MAX / 2), Some(0));
    }

    #[test]
    fn fields_do_not_depend_on_the_limit_of_a_call() {
        let wide = fixed("fixed-window limit=10 window=1s");
        let three = wide.within(3);
        let w = wide.decide(0, 0, 8).1.unwrap();
        assert_eq!(three.to_fields(w, 0).unwrap().as_slice(), &[8, 0]);
        assert_eq!(three.read_fields(&[8, 0], 0), Some(w));
        assert_eq!(three.read_fields(&[11, 0], 0), None);
        // A refund within 3 reads the count as 3, as fixed_refund with p[1] = 3 does: {2, 0}.
        let back = three.give_back(w, 0, w, 1);
        assert_eq!(three.to_fields(back, 0).unwrap().as_slice(), &[2, 0]);
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
            3,
            5,
            131_071,
            u32::MAX as i64,
            1 << 52,
            (1 << 53) - 1,
            1 << 53,
            (1 << 53) + 1,
            i64::MAX - 1,
            i64::MAX,
        ];
        let configs = [
            "fixed-window limit=5 window=1s",
            "fixed-window limit=3 window=1m align=first",
            "fixed-window limit=10 window=1500ms",
            "fixed-window limit=131071 window=1us align=first",
            "fixed-window limit=4294967295 window=52d",
            "fixed-window limit=1 window=1ns",
        ];
        let mut rng = Rng(0xDEAD_BEEF_CAFE_F00D);
        for text in configs {
            let f = fixed(text);
            let nows = [0, US, 3_500_000 * US, 1 << 62, u64::MAX - 1, u64::MAX, rng.next()];
            for now in nows {
                let read = |fields: &[i64]| {
                    if let Some(w) = f.read_fields(fields, now) {
                        let _ = (f.to_fields(w, now), f.probe(w, now), f.decide(w, now, 1));
                    }
                };
                for a in extremes {
                    read(&[a]);
                    for b in extremes {
                        read(&[a, b]);
                        read(&[a, b, a]);
                    }
                }
                for _ in 0..2_000 {
                    let small = |rng: &mut Rng| (rng.next() % (1 << 55)) as i64 - (1 << 54);
                    read(&[rng.next() as i64, rng.next() as i64]);
                    read(&[small(&mut rng), small(&mut rng)]);
                    read(&[1 + rng.below(5) as i64, small(&mut rng)]);
                    let _ = f.to_fields(rng.next(), now);
                }
            }
        }
    }
}
