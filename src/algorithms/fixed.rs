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
mod tests;
