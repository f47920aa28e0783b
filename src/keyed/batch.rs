//! Deciding keys out of cache: [`KeyedLimiter`]'s batches ([`check_batch`], [`allow_batch`]),
//! their groups overlapping the memory accesses of their keys, and the same pipelining by hand
//! ([`prehash`], then [`check_prehashed`] or [`allow_prehashed`]).
//!
//! [`check_batch`]: KeyedLimiter::check_batch
//! [`allow_batch`]: KeyedLimiter::allow_batch
//! [`prehash`]: KeyedLimiter::prehash
//! [`check_prehashed`]: KeyedLimiter::check_prehashed
//! [`allow_prehashed`]: KeyedLimiter::allow_prehashed

use std::hash::Hash;

use super::store::{Backend, GROUP, Store, batch_in};
use super::{KeyedLimiter, Prehashed};
use crate::cas::Report;
use crate::clock::Clock;
use crate::decision::Decision;

impl<K: Hash + ?Sized, C: Clock> KeyedLimiter<K, C> {
    /// Decide a batch of requests `(key, cost)` in order, and write one decision per request
    /// into `out` (cleared first; reuse it from batch to batch and it allocates once): the
    /// same decisions, state and metrics as [`check_n`](Self::check_n) on each request in
    /// slice order, a key repeated in the batch included, except that the whole batch is
    /// decided at one instant (the clock is read once).
    ///
    /// Faster than one call per request when the keys are not in cache (a table of millions of
    /// keys): requests are taken in groups of [`BATCH_GROUP`](Self::BATCH_GROUP), and each
    /// group's keys are hashed and their buckets prefetched before the first is looked up, so
    /// that the group's memory accesses overlap instead of each waiting for the one before (see
    /// `benches/README.md`, *Batches*).
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{KeyedLimiter, ManualClock, Policy};
    ///
    /// let policy: Policy = "fixed-window limit=2 window=1m".parse()?;
    /// let limiter = KeyedLimiter::with_clock(&policy, 10_000, ManualClock::new(0));
    /// let mut decisions = Vec::new();
    /// limiter.check_batch(&[("alice", 1), ("bob", 1), ("alice", 1), ("alice", 1)], &mut decisions);
    /// let admitted: Vec<bool> = decisions.iter().map(|d| d.is_admitted()).collect();
    /// assert_eq!(admitted, [true, true, true, false]);
    /// assert_eq!(decisions[2].remaining(), 0);
    /// # Ok::<(), ratewell::PolicyError>(())
    /// ```
    pub fn check_batch(&self, requests: &[(&K, u32)], out: &mut Vec<Decision>) {
        out.clear();
        out.reserve(requests.len());
        self.batch::<Decision>(requests, |d| {
            self.counts.record(d.is_admitted());
            out.push(d);
        });
    }

    /// [`check_batch`](Self::check_batch) on the lean path of [`allow_n`](Self::allow_n):
    /// whether each request is admitted (taking it if so), into `out` (cleared first).
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{KeyedLimiter, ManualClock, Policy};
    ///
    /// let policy: Policy = "token-bucket capacity=3 rate=1/h".parse()?;
    /// let limiter = KeyedLimiter::<u64, _>::with_clock(&policy, 10_000, ManualClock::new(0));
    /// let requests: Vec<(&u64, u32)> = [7, 8, 7].iter().map(|k| (k, 2)).collect();
    /// let mut admitted = Vec::new();
    /// limiter.allow_batch(&requests, &mut admitted);
    /// assert_eq!(admitted, [true, true, false]); // key 7 had 3, then 1 left
    /// # Ok::<(), ratewell::PolicyError>(())
    /// ```
    pub fn allow_batch(&self, requests: &[(&K, u32)], out: &mut Vec<bool>) {
        out.clear();
        out.reserve(requests.len());
        self.batch::<bool>(requests, |admitted| {
            self.counts.record(admitted);
            out.push(admitted);
        });
    }

    /// Requests a batch is taken in: hashed and prefetched together, then decided in order.
    /// Chosen by measurement (`benches/README.md`, *Batches*): enough misses in flight to cover
    /// a DRAM access, few enough that the first bucket is still in cache when it is scanned.
    pub const BATCH_GROUP: usize = GROUP;

    /// Hash `key` and start fetching its bucket, for a decision a little later
    /// ([`check_prehashed`](Self::check_prehashed)): manual pipelining, for a caller that
    /// cannot hand its requests over as one batch (one that must do other work between
    /// decisions, such as setting a [`ManualClock`](crate::ManualClock) per request). Prehash
    /// the next few keys (about [`BATCH_GROUP`](Self::BATCH_GROUP)) before deciding the current
    /// one.
    ///
    /// A [`Prehashed`] names its key only in the limiter that made it: in another limiter it
    /// decides for an unrelated key.
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{KeyedLimiter, ManualClock, Policy};
    ///
    /// let policy: Policy = "fixed-window limit=1 window=1m".parse()?;
    /// let limiter = KeyedLimiter::with_clock(&policy, 10_000, ManualClock::new(0));
    /// let ahead: Vec<_> = ["a", "b", "a"].into_iter().map(|k| limiter.prehash(k)).collect();
    /// let admitted: Vec<bool> = ahead.iter().map(|&p| limiter.allow_prehashed(p, 1)).collect();
    /// assert_eq!(admitted, [true, true, false]);
    /// assert_eq!(ahead[0], limiter.prehash("a"));
    /// # Ok::<(), ratewell::PolicyError>(())
    /// ```
    #[inline]
    pub fn prehash(&self, key: &K) -> Prehashed {
        let hash = self.hasher.hash_one(key);
        with_store!(self, store => store.prefetch(hash));
        Prehashed { hash }
    }

    /// [`check_n`](Self::check_n) for the key of a [`Prehashed`] from [`prehash`](Self::prehash).
    #[inline]
    pub fn check_prehashed(&self, key: Prehashed, cost: u32) -> Decision {
        let now = self.floor.now(&self.clock);
        let decision = with_store!(self, store => store.decide::<Decision, _>(&self.registry, key.hash, now, cost.max(1)));
        self.counts.record(decision.is_admitted());
        decision
    }

    /// [`allow_n`](Self::allow_n) for the key of a [`Prehashed`] from [`prehash`](Self::prehash).
    #[inline]
    pub fn allow_prehashed(&self, key: Prehashed, cost: u32) -> bool {
        let now = self.floor.now(&self.clock);
        let admitted = with_store!(self, store => store.decide::<bool, _>(&self.registry, key.hash, now, cost.max(1)));
        self.counts.record(admitted);
        admitted
    }

    /// The batch protocol of [`check_batch`](Self::check_batch), reports to `each` in order.
    #[inline]
    fn batch<R: Report>(&self, requests: &[(&K, u32)], each: impl FnMut(R)) {
        let now = self.floor.now(&self.clock);
        with_store!(self, store => batch_in(store, &self.registry, &self.hasher, requests, now, each))
    }
}
