//! Deciding under a registered policy named per call: [`KeyedLimiter`]'s [`check_with`],
//! [`take_with`] and [`peek_with`], the same at a limit chosen per call ([`take_within`],
//! [`peek_within`]), and [`refund`], which takes back a [`Charge`].
//!
//! [`check_with`]: KeyedLimiter::check_with
//! [`take_with`]: KeyedLimiter::take_with
//! [`peek_with`]: KeyedLimiter::peek_with
//! [`take_within`]: KeyedLimiter::take_within
//! [`peek_within`]: KeyedLimiter::peek_within
//! [`refund`]: KeyedLimiter::refund

use std::hash::Hash;

#[cfg(doc)]
use super::Metrics;
use super::registry::{Pinned, Policies, Within};
use super::store::{Backend, Receipt, Store};
use super::{Charge, KeyedLimiter, PolicyId};
use crate::cas::Taken;
use crate::clock::Clock;
use crate::decision::Decision;

impl<K: Hash + ?Sized, C: Clock> KeyedLimiter<K, C> {
    /// Decide a request of `cost` for `key` under the registered policy `id` (rather than the
    /// key's own), and take it if admitted. `cost` 0 is treated as 1.
    ///
    /// # Panics
    ///
    /// If `id` was registered with another limiter.
    #[inline]
    pub fn check_with(&self, key: &K, id: &PolicyId, cost: u32) -> Decision {
        self.take_with_inner(key, id, cost, |taken, _| taken.decision)
    }

    /// [`check_with`](Self::check_with), and if admitted the [`Charge`] that
    /// [`refund`](Self::refund) takes back: for decisions on several keys that stand or fall
    /// together (charge each in turn; if one rejects, refund the ones before it).
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{KeyedLimiter, ManualClock, Policy};
    ///
    /// let p = |s: &str| s.parse::<Policy>().expect("a valid policy");
    /// let limiter = KeyedLimiter::<str, _>::with_clock(&p("fixed-window limit=1 window=1s"), 1_000, ManualClock::new(0));
    /// let id = limiter.register(&p("fixed-window limit=5 window=1m"))?;
    /// let (decision, charge) = limiter.take_with("route", &id, 2);
    /// assert_eq!(decision.remaining(), 3);
    /// // Another limit of the same request rejected it: take the charge back.
    /// limiter.refund(charge.expect("admitted"));
    /// assert_eq!(limiter.peek_with("route", &id, 1).remaining(), 5);
    /// # limiter.release(id);
    /// # Ok::<(), ratewell::PolicyError>(())
    /// ```
    ///
    /// # Panics
    ///
    /// If `id` was registered with another limiter.
    #[inline]
    pub fn take_with(&self, key: &K, id: &PolicyId, cost: u32) -> (Decision, Option<Charge>) {
        let owner = self.owner();
        self.take_with_inner(key, id, cost, |taken, hash| {
            let receipt = Receipt::of(hash, taken.idx, taken.charge, cost.max(1));
            (taken.decision, receipt.map(|receipt| Charge { receipt, owner }))
        })
    }

    #[inline]
    fn take_with_inner<R>(
        &self,
        key: &K,
        id: &PolicyId,
        cost: u32,
        report: impl FnOnce(Taken, u64) -> R,
    ) -> R {
        self.check_owner(id.owner);
        let pinned = Pinned { registry: &self.registry, idx: id.idx, word: id.word };
        let hash = self.hasher.hash_one(key);
        let now = self.floor.now(&self.clock);
        let taken: Taken =
            with_store!(self, store => store.decide::<Taken, _>(&pinned, hash, now, cost.max(1)));
        self.counts.record(taken.decision.is_admitted());
        report(taken, hash)
    }

    /// [`take_with`](Self::take_with) under the registered fixed window `id` with its limit
    /// lowered to `limit` for this call: admitted iff the key's count in the current window plus
    /// `cost` is at most `limit`, and the [`Decision`] reports `limit` as its limit.
    ///
    /// So one registered window decides keys whose limits are chosen per call, as many distinct
    /// limits as there are keys, with no slot for each: register the window at the widest limit
    /// the calls may name (`fixed-window limit=4294967295 window=1m`), and pass each key's own.
    /// The key's state is the registered window's, whatever the limit: a call at another limit
    /// (a configuration reloaded) reads the same count, a count above the call's limit reads as a
    /// full window, [`refund`](Self::refund) and snapshots work as for
    /// [`take_with`](Self::take_with). Call after call on one key, the limit may change.
    ///
    /// A `limit` above the window's own is the window's. Under a policy that is not a fixed
    /// window (whose state's meaning depends on its limit), `limit` is not applied: the call is
    /// [`take_with`](Self::take_with)'s. `cost` 0 is treated as 1.
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{KeyedLimiter, ManualClock, Policy};
    ///
    /// let p = |s: &str| s.parse::<Policy>().expect("a valid policy");
    /// let limiter = KeyedLimiter::<str, _>::with_clock(&p("fixed-window limit=1 window=1s"), 1_000, ManualClock::new(0));
    /// let per_minute = limiter.register(&p("fixed-window limit=4294967295 window=1m"))?;
    /// // Two tenants, two limits, one registered window.
    /// let (d, _) = limiter.take_within("tenant-a", &per_minute, 3, 3);
    /// assert_eq!((d.is_admitted(), d.limit(), d.remaining()), (true, 3, 0));
    /// assert!(!limiter.take_within("tenant-a", &per_minute, 1, 3).0.is_admitted());
    /// let (d, charge) = limiter.take_within("tenant-b", &per_minute, 3, 1_000);
    /// assert_eq!(d.remaining(), 997);
    /// limiter.refund(charge.expect("admitted"));
    /// assert_eq!(limiter.peek_within("tenant-b", &per_minute, 1, 1_000).remaining(), 1_000);
    /// # limiter.release(per_minute);
    /// # Ok::<(), ratewell::PolicyError>(())
    /// ```
    ///
    /// # Panics
    ///
    /// If `id` was registered with another limiter.
    #[inline]
    pub fn take_within(
        &self,
        key: &K,
        id: &PolicyId,
        cost: u32,
        limit: u32,
    ) -> (Decision, Option<Charge>) {
        self.check_owner(id.owner);
        let pinned = Pinned { registry: &self.registry, idx: id.idx, word: id.word };
        let Some(within) = self.within(pinned, limit) else { return self.take_with(key, id, cost) };
        let hash = self.hasher.hash_one(key);
        let now = self.floor.now(&self.clock);
        let taken: Taken =
            with_store!(self, store => store.decide::<Taken, _>(&within, hash, now, cost.max(1)));
        self.counts.record(taken.decision.is_admitted());
        let receipt = Receipt::of(hash, taken.idx, taken.charge, cost.max(1));
        (taken.decision, receipt.map(|receipt| Charge { receipt, owner: self.owner() }))
    }

    /// [`peek_with`](Self::peek_with) at a limit of `limit` for this call, as
    /// [`take_within`](Self::take_within) decides: the key's state as it is, taking nothing.
    ///
    /// # Panics
    ///
    /// If `id` was registered with another limiter.
    pub fn peek_within(&self, key: &K, id: &PolicyId, cost: u32, limit: u32) -> Decision {
        self.check_owner(id.owner);
        let pinned = Pinned { registry: &self.registry, idx: id.idx, word: id.word };
        let Some(within) = self.within(pinned, limit) else { return self.peek_with(key, id, cost) };
        let hash = self.hasher.hash_one(key);
        let now = self.floor.now(&self.clock);
        with_store!(self, store => store.peek(&within, hash, now, cost.max(1)))
    }

    /// The pinned slot's policy at `limit`, if it is a fixed window.
    #[inline]
    fn within<'a>(&self, pinned: Pinned<'a>, limit: u32) -> Option<Within<'a>> {
        let algorithm = pinned.registry.algorithm(pinned.idx)?.within(limit)?;
        Some(Within { pinned, algorithm })
    }

    /// [`peek_n`](Self::peek_n) under the registered policy `id`: the key's state as it is,
    /// taking nothing. A key stored under another policy is converted to `id`'s first, as the
    /// next [`check_with`](Self::check_with) would.
    ///
    /// # Panics
    ///
    /// If `id` was registered with another limiter.
    pub fn peek_with(&self, key: &K, id: &PolicyId, cost: u32) -> Decision {
        self.check_owner(id.owner);
        let pinned = Pinned { registry: &self.registry, idx: id.idx, word: id.word };
        let hash = self.hasher.hash_one(key);
        let now = self.floor.now(&self.clock);
        with_store!(self, store => store.peek(&pinned, hash, now, cost.max(1)))
    }

    /// Take back an admission made by [`take_with`](Self::take_with) (counted in
    /// [`Metrics::refunds`]). Right after its charge this restores the key's state exactly;
    /// later it gives back what of the charge is still outstanding, never more (see
    /// `SEMANTICS.md`, *Layered limits*). A key evicted, reset or moved to another policy since
    /// has nothing to take back.
    ///
    /// # Panics
    ///
    /// If `charge` was taken from another limiter.
    pub fn refund(&self, charge: Charge) {
        self.check_owner(charge.owner);
        let now = self.floor.now(&self.clock);
        self.refund_at(&charge.receipt, now);
    }
}
