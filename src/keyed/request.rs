//! [`Request`]: one decision for one key with its options (a cost, a registered policy, a limit
//! per call, a prefetch), decided by one of its verbs ([`check`](Request::check),
//! [`allow`](Request::allow), [`peek`](Request::peek), [`take`](Request::take)); and
//! [`KeyedLimiter::refund`], which takes back what [`take`](Request::take) charged.

use std::fmt;
use std::hash::Hash;

#[cfg(doc)]
use super::Metrics;
use super::registry::{Pinned, Policies, Within};
use super::store::{Backend, Receipt, Store};
use super::{Charge, KeyedLimiter, PolicyId};
use crate::algorithms::Narrow;
use crate::cas::{Report, Taken};
use crate::clock::Clock;
use crate::decision::Decision;

/// `$body` with `$policies` bound to the policies `$request` is decided under (the key's own or a
/// registered one, narrowed by the request's limit or burst) and `$store` to its limiter's
/// store.
macro_rules! under {
    ($request:expr, $policies:ident, $store:ident => $body:expr) => {{
        let request = $request;
        let limiter = request.limiter;
        match request.policy {
            None => {
                let narrowed = request.narrow.and_then(|narrow| {
                    let idx = limiter.registry.default_idx();
                    let algorithm = limiter.registry.algorithm(idx)?.narrowed(narrow)?;
                    Some(Within { inner: &limiter.registry, idx, algorithm })
                });
                match narrowed {
                    Some(within) => {
                        let $policies = &within;
                        with_store!(limiter, $store => $body)
                    }
                    None => {
                        let $policies = &limiter.registry;
                        with_store!(limiter, $store => $body)
                    }
                }
            }
            Some(id) => {
                limiter.check_owner(id.owner);
                let pinned = || Pinned { registry: &limiter.registry, idx: id.idx, word: id.word };
                let narrowed = request.narrow.and_then(|narrow| {
                    let algorithm = limiter.registry.algorithm(id.idx)?.narrowed(narrow)?;
                    Some(Within { inner: pinned(), idx: id.idx, algorithm })
                });
                match narrowed {
                    Some(within) => {
                        let $policies = &within;
                        with_store!(limiter, $store => $body)
                    }
                    None => {
                        let $policies = &pinned();
                        with_store!(limiter, $store => $body)
                    }
                }
            }
        }
    }};
}

/// A request to decide for one key, from [`KeyedLimiter::request`]: cost 1 under the key's own
/// policy unless its options say otherwise, decided by one of its verbs. The key is hashed once,
/// when the request is made.
///
/// | option | what it changes |
/// |---|---|
/// | [`cost`](Self::cost) | the units the request takes (0 is taken as 1) |
/// | [`policy`](Self::policy) | decided under a registered policy instead of the key's own |
/// | [`within`](Self::within) | under a registered fixed window, at a limit chosen for this call |
/// | [`burst`](Self::burst) | a leaky bucket at a burst and delay chosen for this call |
/// | [`prefetch`](Self::prefetch) | start fetching the key's bucket now, to decide a little later |
///
/// | verb | takes the request if admitted | returns |
/// |---|---|---|
/// | [`check`](Self::check) | yes | the [`Decision`] |
/// | [`allow`](Self::allow) | yes | whether admitted (the lean path) |
/// | [`take`](Self::take) | yes | the [`Decision`] and the [`Charge`] that [`KeyedLimiter::refund`] takes back |
/// | [`peek`](Self::peek) | no (nothing is stored, nothing counted) | the [`Decision`] as of now |
///
/// # Examples
///
/// ```
/// use ratewell::{KeyedLimiter, ManualClock, Policy};
///
/// let p = |s: &str| s.parse::<Policy>().expect("a valid policy");
/// let limiter = KeyedLimiter::<str, _>::with_clock(&p("fixed-window limit=1 window=1s"), 1_000, ManualClock::new(0));
/// let per_minute = limiter.register(&p("fixed-window limit=5 window=1m"))?;
/// let (decision, charge) = limiter.request("route").policy(&per_minute).cost(2).take();
/// assert_eq!(decision.remaining(), 3);
/// // Another limit of the same request rejected it: take the charge back.
/// limiter.refund(charge.expect("admitted"));
/// assert_eq!(limiter.request("route").policy(&per_minute).peek().remaining(), 5);
/// # limiter.release(per_minute);
/// # Ok::<(), ratewell::PolicyError>(())
/// ```
#[must_use = "a request decides nothing until one of its verbs is called"]
pub struct Request<'a, K: ?Sized, C: Clock> {
    limiter: &'a KeyedLimiter<K, C>,
    hash: u64,
    cost: u32,
    policy: Option<&'a PolicyId>,
    narrow: Option<Narrow>,
}

impl<K: ?Sized, C: Clock> Clone for Request<'_, K, C> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K: ?Sized, C: Clock> Copy for Request<'_, K, C> {}

impl<K: ?Sized, C: Clock> fmt::Debug for Request<'_, K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Request")
            .field("hash", &format_args!("{:#018x}", self.hash))
            .field("cost", &self.cost)
            .field("policy", &self.policy)
            .field("narrow", &self.narrow)
            .finish()
    }
}

impl<'a, K: Hash + ?Sized, C: Clock> Request<'a, K, C> {
    #[inline]
    pub(super) fn new(limiter: &'a KeyedLimiter<K, C>, hash: u64) -> Self {
        Request { limiter, hash, cost: 1, policy: None, narrow: None }
    }

    /// Take `cost` units instead of 1 (0 is taken as 1).
    #[inline]
    pub fn cost(mut self, cost: u32) -> Self {
        self.cost = cost.max(1);
        self
    }

    /// Decide under the registered policy `id` (see [`KeyedLimiter::register`]) rather than the
    /// key's own. A key stored under another policy is converted to `id`'s first, keeping what
    /// it consumed (as [`KeyedLimiter::set_policy`] converts).
    ///
    /// The verb panics if `id` was registered with another limiter.
    #[inline]
    pub fn policy(mut self, id: &'a PolicyId) -> Self {
        self.policy = Some(id);
        if let Some(Narrow::Limit(_)) = self.narrow {
            self.narrow = None;
        }
        self
    }

    /// Decide under the registered fixed window `id` with its limit lowered to `limit` for this
    /// call: admitted iff the key's count in the current window plus the cost is at most
    /// `limit`, and the [`Decision`] reports `limit` as its limit.
    ///
    /// So one registered window decides keys whose limits are chosen per call, as many distinct
    /// limits as there are keys, with no slot for each: register the window at the widest limit
    /// the calls may name (`fixed-window limit=4294967295 window=1m`), and pass each key's own.
    /// The key's state is the registered window's, whatever the limit: a call at another limit
    /// (a configuration reloaded) reads the same count, a count above the call's limit reads as a
    /// full window, [`KeyedLimiter::refund`] and snapshots work as for
    /// [`policy`](Self::policy). Call after call on one key, the limit may change.
    ///
    /// A `limit` above the window's own is the window's. Under a policy that is not a fixed
    /// window (whose state's meaning depends on its limit), `limit` is not applied: the request
    /// is [`policy`](Self::policy)`(id)`'s.
    ///
    /// The verb panics if `id` was registered with another limiter.
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
    /// let d = limiter.request("tenant-a").within(&per_minute, 3).cost(3).check();
    /// assert_eq!((d.is_admitted(), d.limit(), d.remaining()), (true, 3, 0));
    /// assert!(!limiter.request("tenant-a").within(&per_minute, 3).allow());
    /// let (d, charge) = limiter.request("tenant-b").within(&per_minute, 1_000).cost(3).take();
    /// assert_eq!(d.remaining(), 997);
    /// limiter.refund(charge.expect("admitted"));
    /// assert_eq!(limiter.request("tenant-b").within(&per_minute, 1_000).peek().remaining(), 1_000);
    /// # limiter.release(per_minute);
    /// # Ok::<(), ratewell::PolicyError>(())
    /// ```
    #[inline]
    pub fn within(mut self, id: &'a PolicyId, limit: u32) -> Self {
        self.policy = Some(id);
        self.narrow = Some(Narrow::Limit(limit));
        self
    }

    /// Decide a leaky bucket at a burst of at most its own, with `delay` requests of the excess
    /// free of delay (`None`: `nodelay`), for this call: as nginx decides one `limit_req_zone`
    /// under each location's `limit_req zone=Z burst=N [nodelay | delay=D]`, on one state per
    /// key whatever the burst.
    ///
    /// The bucket is the key's own policy, or the registered one [`policy`](Self::policy)
    /// names; under any other algorithm (a key under an override of another kind) the burst is
    /// not applied. The key's state is the policy's, whatever the burst: an excess stored at a
    /// higher burst reads as a fuller bucket, and [`KeyedLimiter::refund`] and snapshots work as
    /// for the policy itself. Make the policy's own burst the widest the calls name (a burst
    /// above it is the policy's); calls on one key may name different ones. The [`Decision`]
    /// reports `burst + 1` as its limit.
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{KeyedLimiter, ManualClock, Policy};
    ///
    /// // One zone at 1 request a second; a burst of 5 at one location, none at another.
    /// let zone: Policy = "leaky-bucket rate=1r/s burst=100 nodelay compat=nginx".parse()?;
    /// let limiter = KeyedLimiter::<str, _>::with_clock(&zone, 1_000, ManualClock::new(0));
    /// let admitted = (0..10).filter(|_| limiter.request("ip").burst(5, None).allow()).count();
    /// assert_eq!(admitted, 6);
    /// // The same key's state, at burst 0: full.
    /// assert!(!limiter.request("ip").burst(0, Some(0)).allow());
    /// let d = limiter.request("other").burst(5, Some(2)).cost(4).check();
    /// assert_eq!((d.limit(), d.remaining(), d.delay_ns()), (6, 2, 1_000_000_000));
    /// # Ok::<(), ratewell::PolicyError>(())
    /// ```
    #[inline]
    pub fn burst(mut self, burst: u32, delay: Option<u32>) -> Self {
        self.narrow = Some(Narrow::Burst { burst, delay });
        self
    }

    /// Start fetching the key's bucket, to decide the request a little later: manual
    /// pipelining, for a caller that cannot hand its requests over as one
    /// [`batch`](KeyedLimiter::batch) (one that must do other work between decisions, such as
    /// setting a [`ManualClock`](crate::ManualClock) per request). Make and prefetch the next
    /// few requests (about [`KeyedLimiter::BATCH_GROUP`]) before deciding the current one.
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{KeyedLimiter, ManualClock, Policy};
    ///
    /// let policy: Policy = "fixed-window limit=1 window=1m".parse()?;
    /// let limiter = KeyedLimiter::with_clock(&policy, 10_000, ManualClock::new(0));
    /// let ahead: Vec<_> = ["a", "b", "a"].into_iter().map(|k| limiter.request(k).prefetch()).collect();
    /// let admitted: Vec<bool> = ahead.into_iter().map(|r| r.allow()).collect();
    /// assert_eq!(admitted, [true, true, false]);
    /// # Ok::<(), ratewell::PolicyError>(())
    /// ```
    #[inline]
    pub fn prefetch(self) -> Self {
        self.limiter.prefetch_hashed(self.hash);
        self
    }

    /// Decide the request and take it if admitted.
    #[inline]
    pub fn check(self) -> Decision {
        let decision = self.decide::<Decision>();
        self.limiter.counts.record(decision.is_admitted());
        decision
    }

    /// Whether the request is admitted, taking it if so: the lean path, computing none of the
    /// decision's details; the admission itself is [`check`](Self::check)'s.
    #[inline]
    pub fn allow(self) -> bool {
        let admitted = self.decide::<bool>();
        self.limiter.counts.record(admitted);
        admitted
    }

    /// [`check`](Self::check), and if admitted the [`Charge`] that [`KeyedLimiter::refund`]
    /// takes back: for decisions on several keys that stand or fall together (charge each in
    /// turn; if one rejects, refund the ones before it).
    #[inline]
    pub fn take(self) -> (Decision, Option<Charge>) {
        let taken = self.decide::<Taken>();
        self.limiter.counts.record(taken.decision.is_admitted());
        let receipt = Receipt::of(self.hash, taken.idx, taken.charge, self.cost);
        let owner = self.limiter.owner();
        (taken.decision, receipt.map(|receipt| Charge { receipt, owner }))
    }

    /// Decide the request without taking anything, and report the key's state as it is: whether
    /// it would be admitted now (and if not, when it would be), with the remaining quota, reset
    /// and replenish times *before* it, not after it. A peek of cost 1 is the key's current
    /// quota, for `RateLimit` fields on a response the limiter did not decide. A peek is not
    /// counted in [`Metrics`] and stores nothing (a new key stays absent).
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{KeyedLimiter, ManualClock, Policy};
    ///
    /// let policy: Policy = "fixed-window limit=10 window=1m".parse()?;
    /// let limiter = KeyedLimiter::with_clock(&policy, 1_000, ManualClock::new(0));
    /// assert_eq!(limiter.request("k").peek().remaining(), 10); // nothing taken yet
    /// assert_eq!(limiter.check("k").remaining(), 9); // after taking one
    /// assert_eq!(limiter.request("k").peek().remaining(), 9);
    /// assert!(!limiter.request("k").cost(10).peek().is_admitted());
    /// # Ok::<(), ratewell::PolicyError>(())
    /// ```
    #[inline]
    pub fn peek(self) -> Decision {
        let now = self.limiter.floor.now(&self.limiter.clock);
        under!(self, policies, store => store.peek(policies, self.hash, now, self.cost))
    }

    #[inline]
    fn decide<R: Report>(&self) -> R {
        let now = self.limiter.floor.now(&self.limiter.clock);
        under!(self, policies, store => store.decide::<R, _>(policies, self.hash, now, self.cost))
    }
}

impl<K: Hash + ?Sized, C: Clock> KeyedLimiter<K, C> {
    /// Take back an admission made by [`Request::take`] (counted in [`Metrics::refunds`]). Right
    /// after its charge this restores the key's state exactly; later it gives back what of the
    /// charge is still outstanding, never more (see `SEMANTICS.md`, *Layered limits*). A key
    /// evicted, reset or moved to another policy since has nothing to take back.
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
