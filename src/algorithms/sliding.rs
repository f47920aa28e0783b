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

use super::{
    Invalid, MAX_COUNT_BITS, MIN_IDLE_HORIZON_NS, OneWord, bits_for, invalid, low_mask, sat64,
    wrap_diff,
};
use crate::decision::Decision;

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
    fn wait_until(&self, k: u64, r: u64, now: u64) -> u64 {
        let t = u128::from(k) * u128::from(self.window) + u128::from(r);
        sat64(t.saturating_sub(u128::from(now)))
    }

    /// Wait until a request of `cost` fits, the estimate only falling as time passes.
    fn next_admit(&self, at: &At, cost: u64, now: u64) -> u64 {
        if let Some(a) = self.limit.checked_sub(at.cur + cost) {
            let r = self.first_r(at.prev, a).max(at.r);
            if r < self.window {
                return self.wait_until(at.k, r, now);
            }
        }
        let r = self.first_r(at.cur, self.limit - cost);
        if r < self.window {
            return self.wait_until(at.k + 1, r, now);
        }
        self.wait_until(at.k + 2, 0, now)
    }

    /// Wait until the estimate is 0 with an empty current window (then no decision differs from a
    /// fresh key's).
    fn reset(&self, at: &At, now: u64) -> u64 {
        if at.cur == 0 {
            let r = self.first_r(at.prev, 0).max(at.r);
            return self.wait_until(at.k, r.min(self.window), now);
        }
        let r = self.first_r(at.cur, 0);
        if r < self.window {
            self.wait_until(at.k + 1, r, now)
        } else {
            self.wait_until(at.k + 2, 0, now)
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
}
