//! Deciding keys out of cache: [`KeyedLimiter::batch`], its groups overlapping the memory
//! accesses of their keys (the same pipelining by hand is [`Request::prefetch`]).

use std::hash::Hash;

use super::KeyedLimiter;
#[cfg(doc)]
use super::Request;
use super::store::{Backend, GROUP, batch_in};
use crate::clock::Clock;
use crate::decision::Decision;

impl<K: Hash + ?Sized, C: Clock> KeyedLimiter<K, C> {
    /// Decide a batch of requests `(key, cost)` in order, and write one decision per request
    /// into `out` (cleared first; reuse it from batch to batch and it allocates once): the
    /// same decisions, state and metrics as [`request`](Self::request)`(key).cost(cost).check()`
    /// on each request in slice order, a key repeated in the batch included, except that the
    /// whole batch is decided at one instant (the clock is read once). For the lean answer of
    /// [`allow`](Self::allow), read [`Decision::is_admitted`].
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
    /// limiter.batch(&[("alice", 1), ("bob", 1), ("alice", 1), ("alice", 1)], &mut decisions);
    /// let admitted: Vec<bool> = decisions.iter().map(|d| d.is_admitted()).collect();
    /// assert_eq!(admitted, [true, true, true, false]);
    /// assert_eq!(decisions[2].remaining(), 0);
    /// # Ok::<(), ratewell::PolicyError>(())
    /// ```
    pub fn batch(&self, requests: &[(&K, u32)], out: &mut Vec<Decision>) {
        out.clear();
        out.reserve(requests.len());
        let now = self.floor.now(&self.clock);
        let each = |d: Decision| {
            self.counts.record(d.is_admitted());
            out.push(d);
        };
        with_store!(self, store => batch_in(store, &self.registry, &self.hasher, requests, now, each));
    }

    /// Requests a batch is taken in: hashed and prefetched together, then decided in order.
    /// Chosen by measurement (`benches/README.md`, *Batches*): enough misses in flight to cover
    /// a DRAM access, few enough that the first bucket is still in cache when it is scanned.
    pub const BATCH_GROUP: usize = GROUP;
}
