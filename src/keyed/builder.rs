//! [`Builder`]: a keyed limiter with what [`KeyedLimiter::new`] does not set.

use std::hash::Hash;
use std::marker::PhantomData;

use super::{CapacityError, KeyedLimiter, OnFull};
use crate::clock::Clock;
use crate::policy::Policy;

/// A [`KeyedLimiter`] to build, from [`KeyedLimiter::builder`]: its clock, a fixed seed for its
/// key hash, and what a full table does; [`build`](Self::build) returns a capacity that cannot
/// be had as an error.
#[derive(Debug)]
#[must_use = "a builder builds nothing until `build` is called"]
pub struct Builder<K: ?Sized, C> {
    pub(super) policy: Policy,
    pub(super) capacity: usize,
    /// The clock given, or how to make the default one (made only if none is given: the TSC
    /// clock calibrates when made).
    clock: Result<C, fn() -> C>,
    pub(super) seed: Option<u64>,
    pub(super) on_full: Option<OnFull>,
    _key: PhantomData<fn(&K)>,
}

impl<K: Hash + ?Sized, C: Clock> Builder<K, C> {
    pub(super) fn new(policy: &Policy, capacity: usize, clock: Result<C, fn() -> C>) -> Self {
        Builder {
            policy: policy.clone(),
            capacity,
            clock,
            seed: None,
            on_full: None,
            _key: PhantomData,
        }
    }

    /// Read time from `clock` (keep a clone of a [`ManualClock`](crate::ManualClock) to set it).
    pub fn clock<D: Clock>(self, clock: D) -> Builder<K, D> {
        let Builder { policy, capacity, seed, on_full, .. } = self;
        Builder { policy, capacity, clock: Ok(clock), seed, on_full, _key: PhantomData }
    }

    /// Hash keys from `seed` instead of a seed drawn per process: the same keys then take the
    /// same slots in every run, so which keys are evicted (and so every decision) is
    /// reproducible. `ratewell replay` and `compare` use it.
    ///
    /// Whoever knows the seed can choose keys that share candidate slots: a limiter keyed by
    /// what clients send (addresses, API keys) should keep the default, random seed.
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{KeyedLimiter, ManualClock, Policy};
    ///
    /// let policy: Policy = "token-bucket capacity=1 rate=1/h".parse()?;
    /// let run = || -> Result<Vec<bool>, ratewell::CapacityError> {
    ///     let limiter = KeyedLimiter::<u32>::builder(&policy, 8).clock(ManualClock::new(0)).seed(7).build()?;
    ///     Ok((0..100u32).map(|k| limiter.allow(&(k % 40))).collect())
    /// };
    /// assert_eq!(run()?, run()?); // the same evictions, the same decisions
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// What to do when a new key finds every candidate slot live (default: evict the one whose
    /// loss grants the least extra capacity).
    pub fn on_full(mut self, on_full: OnFull) -> Self {
        self.on_full = Some(on_full);
        self
    }

    /// The limiter, or why it cannot be built: a capacity above
    /// [`KeyedLimiter::MAX_CAPACITY`], or a table the allocator refused (the memory is
    /// allocated here, once: [`Metrics::memory_bytes`](crate::Metrics::memory_bytes)).
    pub fn build(self) -> Result<KeyedLimiter<K, C>, CapacityError> {
        let clock = self.clock.unwrap_or_else(|make| make());
        let mut limiter = KeyedLimiter::try_with_clock(&self.policy, self.capacity, clock)?;
        if let Some(seed) = self.seed {
            limiter.reseed(seed);
        }
        if let Some(on_full) = self.on_full {
            limiter.set_on_full(on_full);
        }
        Ok(limiter)
    }
}
