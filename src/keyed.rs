//! Per-key limiting: a map from keys to state words.
//!
//! This first table is a plain, correct map behind a reader-writer lock: a key already present is
//! decided under the read lock with the same CAS loop as the direct limiter; a new key is inserted
//! under the write lock, and only when its first request is admitted (a rejection changes no state,
//! so a flood of impossible requests allocates nothing). It grows with the number of distinct keys;
//! the lock-free bounded table replaces it.

use std::collections::HashMap;
use std::hash::Hash;

use crate::clock::{Clock, QuantaClock};
use crate::decision::Decision;
use crate::limiter::Cell;
use crate::policy::Policy;
use crate::sync::RwLock;

/// A rate limiter with one state per key.
///
/// # Examples
///
/// ```
/// use ratewell::{KeyedLimiter, ManualClock, Policy};
///
/// let policy: Policy = "sliding-window limit=2 window=1m".parse()?;
/// let limiter = KeyedLimiter::with_clock(&policy, ManualClock::new(0));
/// assert!(limiter.check(&"alice").is_admitted());
/// assert!(limiter.check(&"alice").is_admitted());
/// assert!(!limiter.check(&"alice").is_admitted());
/// assert!(limiter.check(&"bob").is_admitted());
/// assert_eq!(limiter.len(), 2);
/// # Ok::<(), ratewell::PolicyError>(())
/// ```
#[derive(Debug)]
pub struct KeyedLimiter<K, C: Clock = QuantaClock> {
    policy: Policy,
    map: RwLock<HashMap<K, Cell, ahash::RandomState>>,
    clock: C,
}

impl<K: Hash + Eq + Clone> KeyedLimiter<K, QuantaClock> {
    /// A keyed limiter on the TSC clock.
    pub fn new(policy: &Policy) -> Self {
        Self::with_clock(policy, QuantaClock::new())
    }
}

impl<K: Hash + Eq + Clone, C: Clock> KeyedLimiter<K, C> {
    /// A keyed limiter reading time from `clock`.
    pub fn with_clock(policy: &Policy, clock: C) -> Self {
        KeyedLimiter {
            policy: policy.clone(),
            map: RwLock::new(HashMap::default()),
            clock,
        }
    }

    /// Decide a request of cost 1 for `key` and take it if admitted.
    #[inline]
    pub fn check(&self, key: &K) -> Decision {
        self.check_n(key, 1)
    }

    /// Decide a request of `cost` for `key` and take it if admitted. `cost` 0 is treated as 1.
    pub fn check_n(&self, key: &K, cost: u32) -> Decision {
        self.decide(key, cost.max(1), true)
    }

    /// Decide a request of `cost` for `key` without taking anything.
    pub fn peek_n(&self, key: &K, cost: u32) -> Decision {
        self.decide(key, cost.max(1), false)
    }

    fn decide(&self, key: &K, cost: u32, commit: bool) -> Decision {
        let algorithm = &self.policy.algorithm;
        let now = self.clock.now();
        {
            let map = self.map.read().unwrap_or_else(|p| p.into_inner());
            if let Some(cell) = map.get(key) {
                return cell.decide(algorithm, now, cost, commit);
            }
        }
        // A new key: decide against a fresh state first, and insert only if something is taken.
        let fresh = Cell::new(algorithm, 0);
        let decision = fresh.decide(algorithm, now, cost, false);
        if !commit || !decision.is_admitted() {
            return decision;
        }
        let mut map = self.map.write().unwrap_or_else(|p| p.into_inner());
        let cell = map
            .entry(key.clone())
            .or_insert_with(|| Cell::new(algorithm, 0));
        cell.decide(algorithm, now, cost, true)
    }

    /// Drop every key whose state is indistinguishable from a fresh key's (a full bucket, expired
    /// windows, an empty log): no later decision changes. Returns how many were dropped.
    pub fn forget_fresh(&self) -> usize {
        let algorithm = &self.policy.algorithm;
        let now = self.clock.now();
        let mut map = self.map.write().unwrap_or_else(|p| p.into_inner());
        let before = map.len();
        map.retain(|_, cell| !cell.is_fresh(algorithm, now));
        before - map.len()
    }

    /// Forget `key`: its next request is decided as a fresh key's.
    pub fn reset(&self, key: &K) {
        self.map
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }

    /// Number of keys holding state.
    pub fn len(&self) -> usize {
        self.map.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// `true` if no key holds state.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The policy this limiter enforces.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }
}
