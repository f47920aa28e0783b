//! The algorithms as pure functions: `decide(config, word, now, cost) -> (Decision, Option<word>)`.
//!
//! No atomics, no clock, no allocation. Every one-word algorithm implements [`OneWord`]; the
//! sliding log, whose state is a list, has its own small contract (`sliding_log.rs`). The public
//! face of this layer is [`WordPolicy`](crate::WordPolicy), which the benchmarks, the model tests
//! and other backends drive. Each module documents its packed word as a table; all of them share
//! these conventions:
//!
//! - the word `0` is a *fresh* key (a full bucket, an empty window), so resetting a key is storing
//!   `0`, and a key whose word is `0` can be forgotten without changing any decision;
//! - time fields are stored modulo `2^bits` and read back as a signed difference from `now`
//!   ([`wrap_diff`]), so a field never overflows however long the process runs. A decision is exact
//!   while the gap between two decisions on a key is below the layout's *idle horizon* (at least
//!   [`MIN_IDLE_HORIZON_NS`], about 19.5 hours, and 146 years for the common configurations; every
//!   layout documents its own). After a longer silence the stored time can alias: the decision is then
//!   computed from a stale state, which can only be stricter, never more permissive;
//! - a reading of the clock earlier than the time the state reflects (TSC skew between cores, a
//!   clock change) is replaced by that time: the state never moves backwards and no capacity is
//!   minted. This holds for readings earlier by less than the idle horizon: a field read modulo
//!   `2^bits` cannot tell a reading earlier by more than that from a later one. The limiters never
//!   pass such a reading: for a clock that is not [`Clock::MONOTONIC`](crate::Clock::MONOTONIC)
//!   they decide at the running maximum of its readings, and the monotonic clocks' skew is
//!   microseconds.

pub(crate) mod discrete;
pub(crate) mod fixed;
pub(crate) mod gcra;
pub(crate) mod leaky;
pub(crate) mod nginx;
pub(crate) mod sliding;
pub(crate) mod sliding_log;

use crate::decision::Decision;
use crate::word::Fields;

/// The shortest idle horizon a configuration may have; below it the policy is rejected.
///
/// 2^46 ns is 19.5 hours: a key silent for longer than its layout's horizon may see one stricter
/// decision. Most configurations have horizons of years (each layout documents its own).
pub(crate) const MIN_IDLE_HORIZON_NS: u128 = 1 << 46;

/// A configuration the state word cannot hold exactly: which policy key is at fault and what was
/// expected of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Invalid {
    pub(crate) key: &'static str,
    pub(crate) expected: String,
}

pub(crate) fn invalid<T>(key: &'static str, expected: impl Into<String>) -> Result<T, Invalid> {
    Err(Invalid { key, expected: expected.into() })
}

/// `(a - b) mod 2^bits`, read as a signed number of `bits` bits.
#[inline]
pub(crate) fn wrap_diff(a: u64, b: u64, bits: u32) -> i64 {
    debug_assert!((1..=64).contains(&bits));
    let shift = 64 - bits;
    ((a.wrapping_sub(b) << shift) as i64) >> shift
}

/// The widest count field: counts are at most `u32::MAX`.
pub(crate) const MAX_COUNT_BITS: u32 = bits_for(u32::MAX as u64);

/// Mask of the low `bits` bits (`bits` in 0..=64).
#[inline]
pub(crate) const fn low_mask(bits: u32) -> u64 {
    if bits >= 64 { u64::MAX } else { (1u64 << bits) - 1 }
}

/// Number of bits needed to hold `n`.
#[inline]
pub(crate) const fn bits_for(n: u64) -> u32 {
    64 - n.leading_zeros()
}

/// `ceil(a / b)`, or 0 for `b == 0` (never the case here): a division that cannot panic is free
/// of side effects, so the compiler can drop it when only the admission is wanted (the `admit`
/// paths).
#[inline]
pub(crate) fn div_ceil(a: u64, b: u64) -> u64 {
    if b == 0 { 0 } else { a.div_ceil(b) }
}

/// The contract of a one-word algorithm: its whole per-key state is one `u64` (the word `0` a fresh
/// key), and a decision is a pure function of `(configuration, word, now, cost)`.
///
/// An implementation provides [`run`](Self::run) (always inlined), [`reset_after`](Self::reset_after)
/// and [`idle_horizon_ns`](Self::idle_horizon_ns); the entry points are derived from `run`, each
/// compiled once per algorithm:
///
/// - [`decide`](Self::decide), [`admit`](Self::admit) and [`probe`](Self::probe) are never
///   inlined into the dispatch of [`Algorithm`]: inlining every algorithm into one caller lets the
///   compiler hoist each one's arithmetic ahead of the match (measured: ~100 wasted instructions a
///   decision);
/// - [`decide_inline`](Self::decide_inline) and [`admit_inline`](Self::admit_inline) are always
///   inlined, so that the CAS loop is compiled once per algorithm, after a single match on
///   [`Algorithm`] (see [`dispatch`]), with no call and no second match inside it. `admit` drops
///   the arithmetic of the decision's fields: only the word to store is wanted.
pub(crate) trait OneWord {
    /// The decision of a request of `cost` at `now` on the state `word`, and the word to store if
    /// admitted (never for a rejection). `cost` may exceed every limit (`u64::MAX` is a probe).
    fn run(&self, word: u64, now: u64, cost: u64) -> (Decision, Option<u64>);

    /// Nanoseconds from `now` until `word` is back to full if nothing arrives; 0 means the word is
    /// indistinguishable from a fresh key's and may be dropped.
    fn reset_after(&self, word: u64, now: u64) -> u64;

    /// The longest gap between two decisions on a key over which every decision is exact.
    fn idle_horizon_ns(&self) -> u128;

    /// The state `word` at `now` with a charge of `cost` taken back, the charge having stored
    /// `charged` (the word its admission wrote) and other decisions having changed the state
    /// since (when nothing did, [`refund`](Self::refund) restores the word before the charge).
    ///
    /// The contract: the result holds at most what the state would hold had the charge never
    /// been admitted (with every other admission kept), at any later instant and under any later
    /// requests; and never more than a fresh key. Each algorithm documents how much it restores.
    fn give_back(&self, word: u64, now: u64, charged: u64, cost: u64) -> u64;

    /// Take back a charge of `cost` that turned `before` into `after`, from the state `word` at
    /// `now`: exactly `before` while the word is still `after` (nothing happened since, or only
    /// charges that were taken back exactly), else [`give_back`](Self::give_back).
    #[inline]
    fn refund(&self, word: u64, now: u64, before: u64, after: u64, cost: u64) -> u64 {
        if word == after { before } else { self.give_back(word, now, after, cost) }
    }

    /// `word` at `now` (a whole number of microseconds, in ns) as the fields ratewell-redis's
    /// function library stores; `None` when the word decides as a fresh one does.
    fn to_fields(&self, word: u64, now: u64) -> Option<Fields>;

    /// The word that `fields` describe at `now`; `None` when they are not a state of this
    /// configuration.
    fn read_fields(&self, fields: &[i64], now: u64) -> Option<u64>;

    /// The decision, and the word to store if admitted.
    #[inline(never)]
    fn decide(&self, word: u64, now: u64, cost: u32) -> (Decision, Option<u64>) {
        self.run(word, now, u64::from(cost))
    }

    /// The word to store if admitted; `None` if not.
    #[inline(never)]
    fn admit(&self, word: u64, now: u64, cost: u32) -> Option<u64> {
        self.run(word, now, u64::from(cost)).1
    }

    /// The state as it is at `now`, as a decision that takes nothing (a cost above every
    /// limit: impossible): its remaining, reset and replenish times are the key's.
    #[inline(never)]
    fn probe(&self, word: u64, now: u64) -> Decision {
        self.run(word, now, u64::MAX).0
    }

    /// [`decide`](Self::decide), inlined into the caller (the CAS loops).
    #[inline(always)]
    fn decide_inline(&self, word: u64, now: u64, cost: u32) -> (Decision, Option<u64>) {
        self.run(word, now, u64::from(cost))
    }

    /// [`admit`](Self::admit), inlined into the caller (the lean CAS loops).
    #[inline(always)]
    fn admit_inline(&self, word: u64, now: u64, cost: u32) -> Option<u64> {
        self.run(word, now, u64::from(cost)).1
    }
}

/// `$body` with `$a` bound to the one-word algorithm inside `$algorithm` (each arm is compiled
/// for its own type). The sliding log has no single word: it must not get here.
///
/// `dispatch!(algorithm, a => word_body, log l => log_body)` also takes the sliding log, in the
/// same match.
macro_rules! dispatch {
    ($algorithm:expr, $a:ident => $body:expr) => {
        $crate::algorithms::dispatch!($algorithm, $a => $body, log _log => {
            unreachable!("the sliding log has no single-word state")
        })
    };
    ($algorithm:expr, $a:ident => $body:expr, log $l:ident => $log:expr) => {
        match $algorithm {
            $crate::algorithms::Algorithm::Gcra($a) => $body,
            $crate::algorithms::Algorithm::Discrete($a) => $body,
            $crate::algorithms::Algorithm::Leaky($a) => $body,
            $crate::algorithms::Algorithm::Nginx($a) => $body,
            $crate::algorithms::Algorithm::Fixed($a) => $body,
            $crate::algorithms::Algorithm::Sliding($a) => $body,
            $crate::algorithms::Algorithm::Log($l) => $log,
        }
    };
}
pub(crate) use dispatch;

/// Clamp a u128 nanosecond count into u64.
#[inline]
pub(crate) fn sat64(x: u128) -> u64 {
    u64::try_from(x).unwrap_or(u64::MAX)
}

/// How one call narrows the policy it is decided under (`Request::within`,
/// `Request::burst`), on the same state words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Narrow {
    /// A fixed window's limit.
    Limit(u32),
    /// A leaky bucket's burst, and its delay (`None`: `nodelay`).
    Burst { burst: u32, delay: Option<u32> },
}

/// An algorithm with its configuration compiled into the constants of its packed word.
///
/// `repr(u8)`: a plain tag byte, so that a dispatch is a jump through a table on it (without
/// it, the tag hides in a niche of a field and takes three more instructions to decode).
#[derive(Clone, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Algorithm {
    Gcra(gcra::Gcra),
    Discrete(discrete::Discrete),
    Leaky(leaky::Leaky),
    Nginx(nginx::Nginx),
    Fixed(fixed::Fixed),
    Sliding(sliding::Sliding),
    Log(sliding_log::SlidingLog),
}

impl Algorithm {
    /// Decide on a one-word algorithm. Returns the decision and, when the request is admitted, the
    /// word to store. A rejection never returns a word.
    ///
    /// Must not be called for the sliding log (it has no single word).
    #[inline]
    pub(crate) fn decide(&self, word: u64, now: u64, cost: u32) -> (Decision, Option<u64>) {
        dispatch!(self, a => a.decide(word, now, cost))
    }

    /// The state of a one-word algorithm's `word` at `now`, as a decision that takes nothing.
    pub(crate) fn probe(&self, word: u64, now: u64) -> Decision {
        dispatch!(self, a => a.probe(word, now))
    }

    /// A peek: `decide` without taking anything, reporting the state as it is (remaining before
    /// the request, not after it).
    pub(crate) fn peek(&self, word: u64, now: u64, cost: u32) -> Decision {
        let (decision, next) = self.decide(word, now, cost);
        // A decision that takes nothing already reports the state as it is.
        if next.is_none() { decision } else { decision.with_state_of(self.probe(word, now)) }
    }

    /// Only whether a one-word algorithm admits, and the word to store (the lean path).
    #[inline]
    pub(crate) fn admit(&self, word: u64, now: u64, cost: u32) -> Option<u64> {
        dispatch!(self, a => a.admit(word, now, cost))
    }

    /// Nanoseconds from `now` until `word` is back to full if nothing arrives; 0 means the word is
    /// indistinguishable from a fresh key's and may be dropped.
    pub(crate) fn reset_after(&self, word: u64, now: u64) -> u64 {
        dispatch!(self, a => a.reset_after(word, now))
    }

    /// [`OneWord::refund`] on a one-word algorithm.
    pub(crate) fn refund(&self, word: u64, now: u64, before: u64, after: u64, cost: u32) -> u64 {
        dispatch!(self, a => a.refund(word, now, before, after, u64::from(cost)))
    }

    /// [`OneWord::give_back`] on a one-word algorithm.
    pub(crate) fn give_back(&self, word: u64, now: u64, charged: u64, cost: u32) -> u64 {
        dispatch!(self, a => a.give_back(word, now, charged, u64::from(cost)))
    }

    /// [`OneWord::to_fields`] on a one-word algorithm.
    pub(crate) fn to_fields(&self, word: u64, now: u64) -> Option<Fields> {
        dispatch!(self, a => a.to_fields(word, now))
    }

    /// [`OneWord::read_fields`] on a one-word algorithm.
    pub(crate) fn read_fields(&self, fields: &[i64], now: u64) -> Option<u64> {
        dispatch!(self, a => a.read_fields(fields, now))
    }

    /// This algorithm narrowed for one call, on the same state words: a fixed window at a limit
    /// of at most `limit` ([`fixed::Fixed::within`]), a leaky bucket at a burst of at most its
    /// own and another delay ([`leaky::Leaky::with_burst`], [`nginx::Nginx::with_burst`]);
    /// `None` where the narrowing does not apply (the other algorithms, whose words' meaning
    /// depends on their limit).
    #[inline]
    pub(crate) fn narrowed(&self, narrow: Narrow) -> Option<Algorithm> {
        match (self, narrow) {
            (Algorithm::Fixed(f), Narrow::Limit(limit)) => Some(Algorithm::Fixed(f.within(limit))),
            (Algorithm::Leaky(l), Narrow::Burst { burst, delay }) => {
                Some(Algorithm::Leaky(l.with_burst(burst, delay)))
            }
            (Algorithm::Nginx(n), Narrow::Burst { burst, delay }) => {
                Some(Algorithm::Nginx(n.with_burst(burst, delay)))
            }
            _ => None,
        }
    }

    /// The longest gap between two decisions on a key over which every decision is exact.
    pub(crate) fn idle_horizon_ns(&self) -> u128 {
        dispatch!(self, a => a.idle_horizon_ns(), log _l => u128::from(u64::MAX))
    }
}

/// The state under `to` of a key whose state under `from` is `word` at `now`: what the key
/// consumed under `from` (its limit less what remains, in whole units: rounded against the key)
/// taken from a fresh state of `to` at `now`, at most `to`'s limit. A key that consumed nothing
/// is fresh. Time phases (a window, a fill schedule) restart at `now`. Between equal policies
/// the state is kept as it is.
pub(crate) fn convert(from: &Algorithm, to: &Algorithm, word: u64, now: u64) -> u64 {
    if from == to {
        return word;
    }
    let state = from.probe(word, now);
    let consumed = state.limit().saturating_sub(state.remaining());
    if consumed == 0 {
        return 0;
    }
    let cost = consumed.min(to.probe(0, now).limit()).min(u64::from(u32::MAX)) as u32;
    // A fresh state admits any cost up to the limit.
    to.decide(0, now, cost).1.unwrap_or(0)
}

/// What the algorithms' property tests share.
#[cfg(test)]
pub(crate) mod testing {
    /// xorshift64: a tiny deterministic generator.
    pub(crate) struct Rng(pub(crate) u64);

    impl Rng {
        pub(crate) fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        /// In `0..n`, `n > 0`.
        pub(crate) fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrap_diff_reads_signed_differences() {
        assert_eq!(wrap_diff(5, 3, 8), 2);
        assert_eq!(wrap_diff(3, 5, 8), -2);
        assert_eq!(wrap_diff(1, 255, 8), 2);
        assert_eq!(wrap_diff(255, 1, 8), -2);
        assert_eq!(wrap_diff(0, 1 << 62, 64), -(1 << 62));
        assert_eq!(wrap_diff(u64::MAX, 0, 64), -1);
    }

    #[test]
    fn bit_helpers() {
        assert_eq!(bits_for(0), 0);
        assert_eq!(bits_for(1), 1);
        assert_eq!(bits_for(u32::MAX as u64), 32);
        assert_eq!(low_mask(64), u64::MAX);
        assert_eq!(low_mask(3), 7);
    }
}
