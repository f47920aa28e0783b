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

use super::{
    Invalid, MAX_COUNT_BITS, MIN_IDLE_HORIZON_NS, OneWord, bits_for, div_ceil, invalid, low_mask,
    sat64, wrap_diff,
};
use crate::decision::Decision;

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
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
