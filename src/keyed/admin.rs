//! Administering a [`KeyedLimiter`]: forgetting a key ([`reset`]), dropping fresh keys
//! ([`reclaim_fresh`]), and what the table holds ([`metrics`]).
//!
//! [`reset`]: KeyedLimiter::reset
//! [`reclaim_fresh`]: KeyedLimiter::reclaim_fresh
//! [`metrics`]: KeyedLimiter::metrics

use std::hash::Hash;

use super::store::{Backend, Store};
use super::{KeyedLimiter, Metrics};
use crate::clock::Clock;

impl<K: Hash + ?Sized, C: Clock> KeyedLimiter<K, C> {
    /// Forget `key`: its next request is decided as a fresh key's. Returns whether it was present.
    pub fn reset(&self, key: &K) -> bool {
        let hash = self.hasher.hash_one(key);
        with_store!(self, store => store.reset(hash))
    }

    /// Drop every key whose state is indistinguishable from a fresh key's now (no later decision
    /// changes); returns how many. The table also does this by itself whenever a new key needs
    /// one of their slots.
    pub fn reclaim_fresh(&self) -> u64 {
        let now = self.floor.now(&self.clock);
        with_store!(self, store => store.reclaim_fresh(&self.registry, now))
    }

    /// Keys the table can hold ([`Metrics::capacity`]).
    pub(crate) fn capacity(&self) -> u64 {
        with_store!(self, store => store.capacity())
    }

    /// The counters, the capacity and the memory held. Cheap to update: table counters are per shard and written only under the
    /// shard's insert lock; admitted/rejected are per-thread cells.
    pub fn metrics(&self) -> Metrics {
        let stats = with_store!(self, store => store.stats());
        let (admitted, rejected) = self.counts.sum();
        Metrics {
            keys: stats.len,
            capacity: self.capacity(),
            memory_bytes: with_store!(self, store => store.memory_bytes()),
            reclaims: stats.reclaims,
            evictions: stats.evictions,
            refused: stats.refused,
            relocations: stats.relocations,
            moves: stats.moves,
            huge_pages: stats.huge_pages,
            admitted,
            rejected,
            refunds: self.counts.refunds(),
        }
    }
}
