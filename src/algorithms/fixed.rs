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

use super::{
    Invalid, MAX_COUNT_BITS, MIN_IDLE_HORIZON_NS, OneWord, bits_for, invalid, low_mask, sat64,
    wrap_diff,
};
use crate::decision::Decision;

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
    window: u64,
    align: Align,
    /// Bits of the low field (`INDEX` or `END`).
    low_bits: u32,
}

impl Fixed {
    pub(crate) fn new(limit: u32, window_ns: u64, align: Align) -> Result<Self, Invalid> {
        let low_bits = 64 - bits_for(u64::from(limit));
        let f = Fixed { limit: u64::from(limit), window: window_ns, align, low_bits };
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
}
