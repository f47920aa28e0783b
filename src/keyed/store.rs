//! The keyed limiter's storage and the one dispatch on it: [`Backend`] (the one-word table or the
//! sliding log's table, chosen by the policy at run time), [`with_store!`] (the one match on it),
//! the [`Store`] trait both tables implement, the [`Receipt`] a refund needs, and the batch loop
//! over a store.

use std::hash::Hash;

use super::log_table::LogTable;
use super::registry::{Policies, Registry};
use super::table::{OnFull, Table, TableStats};
use crate::cas::Report;
use crate::decision::Decision;

/// Where a keyed limiter keeps its keys: the one-word algorithms' table of atomic words (on the
/// heap or in a shared region), or the sliding log's table of logs (on the heap, or a shared
/// table's logs in its region). Not a type parameter: the policy, a run-time value, says which.
pub(crate) enum Backend {
    Words(Table),
    Logs(LogTable),
    #[cfg(all(target_os = "linux", not(ratewell_loom)))]
    // Boxed: held inline, its fields make every keyed decision on the word table dearer
    // (keyed.hit_1k 147.9 instructions inline, 143.4 boxed).
    SharedLogs(Box<super::shared::LogRegion>),
}

/// `$body` with `$store` bound to the limiter's [`Store`] (the one match on [`Backend`]);
/// `mut` binds it mutably.
macro_rules! with_store {
    ($limiter:expr, $store:ident => $body:expr) => {
        // The word table first, on its own test: a match of three arms compiles to a jump
        // table, a few instructions dearer on every keyed decision.
        if let Backend::Words($store) = &$limiter.backend {
            $body
        } else {
            match &$limiter.backend {
                Backend::Words(_) => unreachable!("tested above"),
                Backend::Logs($store) => $body,
                #[cfg(all(target_os = "linux", not(ratewell_loom)))]
                Backend::SharedLogs($store) => {
                    let $store = &**$store;
                    $body
                }
            }
        }
    };
    (mut $limiter:expr, $store:ident => $body:expr) => {
        match &mut $limiter.backend {
            Backend::Words($store) => $body,
            Backend::Logs($store) => $body,
            #[cfg(all(target_os = "linux", not(ratewell_loom)))]
            Backend::SharedLogs($store) => {
                let $store = &mut **$store;
                $body
            }
        }
    };
}

/// What a keyed limiter needs of its key storage. Keys are known by their 64-bit hash; the
/// policies by the registry's slots ([`Policies`]). Every method but `decide` and `peek` is an
/// administrative path that may lock every shard.
pub(crate) trait Store {
    /// Decide a request for the key and take it if admitted: the hot path.
    fn decide<R: Report, P: Policies>(&self, policies: &P, hash: u64, now: u64, cost: u32) -> R;
    /// Start fetching what deciding the key hashed `hash` reads first (a hint; by default none).
    #[inline]
    fn prefetch(&self, hash: u64) {
        let _ = hash;
    }
    /// Decide the requests `(hash, cost)` of `group` (at most [`GROUP`]) in order at `now`,
    /// each as [`decide`](Self::decide) would, handing the reports to `each` in order. By
    /// default one by one; the one-word table probes the whole group before its first
    /// compare-exchange.
    #[inline]
    fn decide_group<R: Report, P: Policies>(
        &self,
        policies: &P,
        group: &[(u64, u32)],
        now: u64,
        mut each: impl FnMut(R),
    ) {
        for &(hash, cost) in group {
            each(self.decide(policies, hash, now, cost));
        }
    }
    /// Take back an admission made by [`decide`](Self::decide) with the report `Taken`, if the
    /// key still holds state under the same policy (see `OneWord::refund`): whether it did.
    fn refund<P: Policies>(&self, policies: &P, receipt: &Receipt, now: u64) -> bool;
    /// Decide without taking anything, reporting the key's state as it is (a new key stays
    /// absent, decided as a fresh one).
    fn peek<P: Policies>(&self, policies: &P, hash: u64, now: u64, cost: u32) -> Decision;
    /// Forget the key: its next request is decided as a fresh key's. Whether it was present.
    fn reset(&self, hash: u64) -> bool;
    /// Move the key to the policy it resolves to now, keeping what it consumed.
    fn migrate<P: Policies>(&self, policies: &P, hash: u64, now: u64);
    /// Move every key stored under a retired policy slot to its current policy (under the
    /// registry's lock, before it frees those slots).
    fn sweep<P: Policies>(&self, policies: &P, now: u64);
    /// Drop every key indistinguishable from a fresh one at `now`; how many.
    fn reclaim_fresh<P: Policies>(&self, policies: &P, now: u64) -> u64;
    /// What the registry knows the key by (an override is registered under it).
    fn fingerprint(&self, hash: u64) -> u64;
    /// Forget every key, and place keys from `secret` from now on.
    fn reseed(&mut self, secret: u64);
    fn set_on_full(&mut self, on_full: OnFull);
    /// Keys the store can hold.
    fn capacity(&self) -> u64;
    /// Bytes of per-key storage now.
    fn memory_bytes(&self) -> u64;
    fn stats(&self) -> TableStats;
}

/// What taking back one admission on a keyed limiter needs: the key, the policy it was decided
/// under, the state before and after (for the sliding log, the time of its entry), and the cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Receipt {
    pub(crate) hash: u64,
    pub(crate) idx: u8,
    pub(crate) before: u64,
    pub(crate) after: u64,
    pub(crate) cost: u32,
}

impl Receipt {
    /// The receipt of an admission that replaced `before` with `after` (`charge`), if there was
    /// one.
    #[inline]
    pub(super) fn of(hash: u64, idx: u8, charge: Option<(u64, u64)>, cost: u32) -> Option<Self> {
        charge.map(|(before, after)| Receipt { hash, idx, before, after, cost })
    }
}

/// Requests of a batch hashed and prefetched together (see [`KeyedLimiter::BATCH_GROUP`]).
pub(crate) const GROUP: usize = 16;

/// [`KeyedLimiter::batch`] on one store: group by group, hash and prefetch, then decide.
#[inline]
pub(super) fn batch_in<K: Hash + ?Sized, S: Store, R: Report>(
    store: &S,
    policies: &Registry,
    hasher: &ahash::RandomState,
    requests: &[(&K, u32)],
    now: u64,
    mut each: impl FnMut(R),
) {
    for group in requests.chunks(GROUP) {
        let mut hashed = [(0u64, 0u32); GROUP];
        for (h, &(key, cost)) in hashed.iter_mut().zip(group) {
            let hash = hasher.hash_one(key);
            store.prefetch(hash);
            *h = (hash, cost.max(1));
        }
        store.decide_group(policies, &hashed[..group.len()], now, &mut each);
    }
}

/// Shards for a table of `capacity` keys: about 1024 keys a shard, a power of two, at most 256.
pub(crate) fn shard_count(capacity: u64) -> u64 {
    (capacity / 1024).clamp(1, 256).next_power_of_two()
}
