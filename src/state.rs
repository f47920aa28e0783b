//! The one CAS loop that applies a pure decision to an atomic state word.
//!
//! # Memory ordering
//!
//! A state word holds the whole state of its key and publishes no other memory: no reader of the
//! word goes on to read data written before the word was stored. So every access is `Relaxed`. The
//! atomicity of `compare_exchange` alone gives what the limiter promises: all read-modify-writes of
//! one word are totally ordered (its modification order), each decision is computed from the value
//! it replaces, and none is lost. The loom models in `loom-tests/` check exactly that.
//!
//! A rejection returns before any write, so a key under attack is only read: its cache line stays
//! shared between cores.

use crate::algorithms::Algorithm;
use crate::decision::Decision;
use crate::sync::{AtomicU64, Ordering};

/// Decide a request of `cost` at `now` against `word`, and store the new state if admitted.
#[inline]
pub(crate) fn apply(algorithm: &Algorithm, word: &AtomicU64, now: u64, cost: u32) -> Decision {
    let mut current = word.load(Ordering::Relaxed);
    loop {
        let (decision, next) = algorithm.decide(current, now, cost);
        let Some(next) = next else { return decision };
        // `compare_exchange_weak` may fail spuriously; the loop recomputes from the value it
        // returns, which is the freshest one anyway.
        match word.compare_exchange_weak(current, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return decision,
            Err(actual) => current = actual,
        }
    }
}

/// Decide without taking anything.
#[inline]
pub(crate) fn peek(algorithm: &Algorithm, word: &AtomicU64, now: u64, cost: u32) -> Decision {
    algorithm.decide(word.load(Ordering::Relaxed), now, cost).0
}
