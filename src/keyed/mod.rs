//! Per-key limiting: a bounded table of per-key states, per-key policy overrides, run-time policy
//! changes, and metrics.
//!
//! [`KeyedLimiter`]'s API, one concern per file:
//!
//! - this file: the limiter, its constructors, and its two plain decisions (`check`, `allow`),
//!   with the crate's paths by hash;
//! - `builder.rs`: [`Builder`], for a limiter's clock, seed and full-table behaviour;
//! - `request.rs`: [`Request`], a decision with its options (cost, registered policy, a limit per
//!   call, prefetching) and its verbs (`check`, `allow`, `peek`, `take`), and `refund`;
//! - `batch.rs`: deciding keys out of cache (`batch`);
//! - `policies.rs`: its policies (`set_policy`, the overrides, `register` and `release`);
//! - `admin.rs`: forgetting keys and metrics;
//! - `snapshot.rs`: snapshots and restores;
//! - `values.rs`: the values its methods take and return ([`PolicyId`], [`Charge`],
//!   [`Metrics`]).

pub(crate) mod counts;
mod ip;
pub(crate) mod log_table;
pub(crate) mod registry;
pub(crate) mod shared;
pub(crate) mod table;
#[macro_use]
mod store;
pub(crate) mod snapshot;
// After `store`: they use its `with_store!`.
mod admin;
mod batch;
mod builder;
mod policies;
mod request;
mod values;

use std::hash::Hash;
use std::marker::PhantomData;

use crate::algorithms::Algorithm;
use crossbeam_utils::CachePadded;

pub use self::builder::Builder;
pub use self::ip::{IpKey, IpPrefixes};
pub use self::request::Request;
#[cfg(all(target_os = "linux", not(ratewell_loom)))]
pub use self::shared::{SharedError, SharedInfo};
pub use self::table::{CapacityError, OnFull};
pub use self::values::{Charge, Metrics, PolicyId};

use self::counts::Counts;
use self::log_table::LogTable;
use self::registry::Registry;
use self::store::Backend;
pub(crate) use self::store::{GROUP, Receipt, Store, shard_count};
use self::table::{MAX_CAPACITY, Table};
use crate::cas::{Charged, Report, Taken};
use crate::clock::{Clock, Floor, QuantaClock};
use crate::decision::Decision;
use crate::policy::Policy;

/// The four hash seeds a [`Builder::seed`] stands for.
pub(crate) fn reseeded(seed: u64) -> [u64; 4] {
    // Four words from one (the constants are the digits of pi, as in `table.rs`).
    [
        seed,
        seed ^ 0x243f_6a88_85a3_08d3,
        seed.rotate_left(32) ^ 0x1319_8a2e_0370_7344,
        seed.rotate_left(16) ^ 0xa409_3822_299f_31d0,
    ]
}

/// A rate limiter with one state per key, in a table of bounded size.
///
/// Memory is allocated once, for `capacity` keys (16 bytes each, see [`Metrics::memory_bytes`]),
/// and never grows. A decision for a key already present takes no lock and allocates nothing; a
/// new key takes its shard's insert lock. When a new key's candidate slots are all taken, keys
/// whose state is indistinguishable from a fresh key's are reclaimed first (no decision changes);
/// only if all are live is one evicted (the one whose loss grants the least extra capacity) or,
/// with [`OnFull::Refuse`], the new key refused. The sliding log keeps a log per key and locks its
/// shard for every decision.
///
/// A new key that finds its candidate slots live moves keys already present to their other
/// bucket to make room (no decision changes), so live keys are first evicted above 90% of
/// capacity (95-97% from 1M slots up, random keys). With many threads admitting on a small set
/// of keys, a sparser table also keeps keys of different threads from sharing cache lines (an
/// admission writes its key's line; see `benches/README.md`, *Contention*).
///
/// Keys are hashed with a per-process-seeded `ahash` and stored as 54-bit fingerprints: hash the
/// same type for the same key (`&str` and `String` hash alike; `u32` and `u64` do not).
///
/// # The API on one screen
///
/// | to | call |
/// |---|---|
/// | build | [`new`](Self::new), [`with_clock`](Self::with_clock), [`builder`](Self::builder) (seed, full-table behaviour, errors as values) |
/// | decide one request of cost 1 | [`check`](Self::check) (a [`Decision`]), [`allow`](Self::allow) (a `bool`, the lean path) |
/// | decide anything else | [`request`](Self::request)`(key)`, then its options ([`cost`](Request::cost), [`policy`](Request::policy), [`within`](Request::within), [`prefetch`](Request::prefetch)) and one verb ([`check`](Request::check), [`allow`](Request::allow), [`peek`](Request::peek), [`take`](Request::take)) |
/// | decide many keys out of cache | [`batch`](Self::batch) |
/// | take an admission back | [`refund`](Self::refund) a [`Charge`] from [`Request::take`] |
/// | policies | [`set_policy`](Self::set_policy), [`set_override`](Self::set_override), [`policy`](Self::policy), [`policy_of`](Self::policy_of), [`register`](Self::register), [`release`](Self::release) |
/// | administer | [`reset`](Self::reset), [`reclaim_fresh`](Self::reclaim_fresh), [`metrics`](Self::metrics) |
/// | persist | [`snapshot`](Self::snapshot), [`save`](Self::save), [`restore`](Self::restore) |
///
/// # Examples
///
/// ```
/// use ratewell::{KeyedLimiter, ManualClock, Policy};
///
/// let policy: Policy = "sliding-window limit=2 window=1m".parse()?;
/// let limiter = KeyedLimiter::with_clock(&policy, 10_000, ManualClock::new(0));
/// assert!(limiter.check("alice").is_admitted());
/// assert!(limiter.allow("alice"));
/// assert!(!limiter.check("alice").is_admitted());
/// assert!(limiter.request("bob").cost(2).check().is_admitted());
/// assert_eq!(limiter.request("bob").peek().remaining(), 0);
///
/// // A premium key gets another quota.
/// limiter.set_override("carol", Some(&"sliding-window limit=100 window=1m".parse()?))?;
/// assert_eq!(limiter.check("carol").limit(), 100);
///
/// let m = limiter.metrics();
/// assert_eq!((m.keys, m.admitted, m.rejected), (3, 4, 1));
/// # Ok::<(), ratewell::PolicyError>(())
/// ```
pub struct KeyedLimiter<K: ?Sized = str, C: Clock = QuantaClock> {
    registry: Registry,
    backend: Backend,
    hasher: ahash::RandomState,
    /// The seeds of `hasher`, which a snapshot records.
    seeds: [u64; 4],
    clock: C,
    /// The latest reading acted on (see [`Clock::MONOTONIC`]).
    floor: CachePadded<Floor>,
    /// Admitted, rejected and refunded.
    counts: Counts,
    /// The shared region the table and counts are in (`shared/`), if they are.
    #[cfg_attr(not(all(target_os = "linux", not(ratewell_loom))), allow(dead_code))]
    // shared tables only
    region: Option<std::sync::Arc<crate::mem::Region>>,
    _key: PhantomData<fn(&K)>,
}

impl<K: Hash + ?Sized, C: Clock + std::fmt::Debug> std::fmt::Debug for KeyedLimiter<K, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyedLimiter")
            .field("policy", &self.policy())
            .field("metrics", &self.metrics())
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

impl<K: Hash + ?Sized> KeyedLimiter<K, QuantaClock> {
    /// A keyed limiter for up to `capacity` keys, on the TSC clock.
    ///
    /// # Panics
    ///
    /// If `capacity` is above [`MAX_CAPACITY`](Self::MAX_CAPACITY) or the table cannot be
    /// allocated; [`Builder::build`] returns either as an error instead.
    pub fn new(policy: &Policy, capacity: usize) -> Self {
        Self::with_clock(policy, capacity, QuantaClock::new())
    }

    /// A builder of a keyed limiter for up to `capacity` keys under `policy`, for what
    /// [`new`](Self::new) does not set: another clock, a fixed seed, what a full table does, and
    /// a capacity it cannot allocate as an error rather than a panic.
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{CapacityError, KeyedLimiter, ManualClock, OnFull, Policy};
    ///
    /// let policy: Policy = "token-bucket capacity=10 rate=1/s".parse()?;
    /// let err = KeyedLimiter::<str>::builder(&policy, usize::MAX).build().unwrap_err();
    /// assert!(matches!(err, CapacityError::TooLarge { .. }));
    ///
    /// let clock = ManualClock::new(0);
    /// let limiter = KeyedLimiter::<str>::builder(&policy, 1_000)
    ///     .clock(clock.clone())
    ///     .seed(7)
    ///     .on_full(OnFull::Refuse)
    ///     .build()?;
    /// assert!(limiter.allow("k"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn builder(policy: &Policy, capacity: usize) -> Builder<K, QuantaClock> {
        Builder::new(policy, capacity, Err(QuantaClock::new))
    }
}

impl<K: Hash + ?Sized, C: Clock> KeyedLimiter<K, C> {
    /// The most keys a keyed limiter holds: 2^39 (8 TiB of slots). A capacity of 0 is taken as 1.
    pub const MAX_CAPACITY: u64 = MAX_CAPACITY;

    /// A keyed limiter for up to `capacity` keys (rounded up to whole 128-byte buckets of eight
    /// keys), reading time from `clock`. Keep a handle on a clock you set by hand
    /// ([`ManualClock`](crate::ManualClock) is one, shared by its clones).
    ///
    /// # Panics
    ///
    /// If `capacity` is above [`MAX_CAPACITY`](Self::MAX_CAPACITY) or the table cannot be
    /// allocated; [`Builder::build`] returns either as an error instead.
    pub fn with_clock(policy: &Policy, capacity: usize, clock: C) -> Self {
        match Builder::new(policy, capacity, Ok(clock)).build() {
            Ok(limiter) => limiter,
            Err(e) => panic!("KeyedLimiter: {e}"),
        }
    }

    /// A keyed limiter for up to `capacity` keys reading time from `clock`, or why it cannot be
    /// built: a capacity above [`MAX_CAPACITY`](Self::MAX_CAPACITY), or a table the allocator
    /// refused (the memory is allocated here, once).
    pub(crate) fn try_with_clock(
        policy: &Policy,
        capacity: usize,
        clock: C,
    ) -> Result<Self, CapacityError> {
        // Model checking and fuzzing replay executions: their hashes must not vary between runs.
        #[cfg(any(ratewell_loom, fuzzing))]
        let seeds = [1, 2, 3, 4];
        // Drawn per process, and kept: a snapshot records them.
        #[cfg(not(any(ratewell_loom, fuzzing)))]
        let seeds = {
            let random = ahash::RandomState::new();
            [1u64, 2, 3, 4].map(|i| random.hash_one(i))
        };
        let hasher = snapshot::hasher_of(seeds);
        let secret = hasher.hash_one(0x5eed_u64);
        let backend = match policy.algorithm {
            Algorithm::Log(_) => Backend::Logs(LogTable::new(capacity)?),
            _ => Backend::Words(Table::new(capacity, secret)?),
        };
        Ok(KeyedLimiter {
            registry: Registry::new(policy),
            backend,
            hasher,
            seeds,
            clock,
            floor: CachePadded::new(Floor::default()),
            counts: Counts::new(),
            region: None,
            _key: PhantomData,
        })
    }

    /// Hash keys from `seed` instead of a seed drawn per process (see [`Builder::seed`]),
    /// forgetting every key and override.
    pub(crate) fn reseed(&mut self, seed: u64) {
        self.seeds = reseeded(seed);
        self.hasher = snapshot::hasher_of(self.seeds);
        let secret = self.hasher.hash_one(0x5eed_u64);
        with_store!(mut self, store => store.reseed(secret));
        self.registry.clear_overrides();
    }

    /// What a new key does when every candidate slot is live (see [`Builder::on_full`]).
    pub(crate) fn set_on_full(&mut self, on_full: OnFull) {
        with_store!(mut self, store => store.set_on_full(on_full));
    }

    /// Decide a request of cost 1 for `key` under its policy, and take it if admitted. For
    /// another cost, policy or a peek, see [`request`](Self::request).
    #[inline]
    pub fn check(&self, key: &K) -> Decision {
        let decision = self.decide::<Decision>(key, 1);
        self.counts.record(decision.is_admitted());
        decision
    }

    /// Whether a request of cost 1 for `key` is admitted, taking it if so: the lean path, for
    /// callers that need only yes or no. It computes none of the decision's details (see
    /// [`Limiter::allow_n`](crate::Limiter::allow_n)); the admission itself is
    /// [`check`](Self::check)'s.
    #[inline]
    pub fn allow(&self, key: &K) -> bool {
        let admitted = self.decide::<bool>(key, 1);
        self.counts.record(admitted);
        admitted
    }

    /// A request for `key`: cost 1 under the key's policy until its options say otherwise, and
    /// decided by one of its verbs ([`Request::check`], [`Request::allow`], [`Request::peek`],
    /// [`Request::take`]). The key is hashed here, once.
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{KeyedLimiter, ManualClock, Policy};
    ///
    /// let policy: Policy = "fixed-window limit=10 window=1m".parse()?;
    /// let limiter = KeyedLimiter::with_clock(&policy, 1_000, ManualClock::new(0));
    /// assert_eq!(limiter.request("k").peek().remaining(), 10); // nothing taken
    /// assert_eq!(limiter.request("k").cost(4).check().remaining(), 6);
    /// assert!(!limiter.request("k").cost(7).allow());
    /// # Ok::<(), ratewell::PolicyError>(())
    /// ```
    #[inline]
    pub fn request<'a>(&'a self, key: &K) -> Request<'a, K, C> {
        Request::new(self, self.hasher.hash_one(key))
    }

    /// The hasher the table knows keys by.
    #[inline]
    pub(crate) fn hasher(&self) -> &ahash::RandomState {
        &self.hasher
    }

    /// Decide a request of `cost` (at least 1) at `now` for the key hashed `hash`, counted in the
    /// metrics, and what taking it back needs if it was admitted.
    #[inline]
    pub(crate) fn take_hashed(
        &self,
        hash: u64,
        now: u64,
        cost: u32,
    ) -> (Decision, Option<Receipt>) {
        let taken: Taken =
            with_store!(self, store => store.decide::<Taken, _>(&self.registry, hash, now, cost));
        self.counts.record(taken.decision.is_admitted());
        (taken.decision, Receipt::of(hash, taken.idx, taken.charge, cost))
    }

    /// [`take_hashed`](Self::take_hashed) on the lean path: the receipt if admitted.
    #[inline]
    pub(crate) fn charge_hashed(&self, hash: u64, now: u64, cost: u32) -> Option<Receipt> {
        let charged: Charged =
            with_store!(self, store => store.decide::<Charged, _>(&self.registry, hash, now, cost));
        self.counts.record(charged.charge.is_some());
        Receipt::of(hash, charged.idx, charged.charge, cost)
    }

    /// [`allow`](Self::allow) for the key hashed `hash` at `now`: whether it was admitted
    /// (no receipt: an admission nothing will take back).
    #[inline]
    pub(crate) fn allow_hashed(&self, hash: u64, now: u64, cost: u32) -> bool {
        let admitted =
            with_store!(self, store => store.decide::<bool, _>(&self.registry, hash, now, cost));
        self.counts.record(admitted);
        admitted
    }

    /// [`Request::peek`] for the key hashed `hash` at `now`.
    #[inline]
    pub(crate) fn peek_hashed(&self, hash: u64, now: u64, cost: u32) -> Decision {
        with_store!(self, store => store.peek(&self.registry, hash, now, cost))
    }

    /// Start fetching the bucket of the key hashed `hash`.
    #[inline]
    pub(crate) fn prefetch_hashed(&self, hash: u64) {
        with_store!(self, store => store.prefetch(hash));
    }

    /// Take back the admission of `receipt` at `now` (counted if the key still held it). Out of
    /// line: a refund is a slow path, and inlined it makes its callers' loops over receipts (a
    /// layered decision's rollback, usually over none) save registers they do not need.
    #[inline(never)]
    pub(crate) fn refund_at(&self, receipt: &Receipt, now: u64) {
        if with_store!(self, store => store.refund(&self.registry, receipt, now)) {
            self.counts.refund();
        }
    }

    #[inline]
    fn decide<R: Report>(&self, key: &K, cost: u32) -> R {
        let hash = self.hasher.hash_one(key);
        let now = self.floor.now(&self.clock);
        with_store!(self, store => store.decide::<R, _>(&self.registry, hash, now, cost))
    }

    /// Which limiter this is, for its ids and charges.
    fn owner(&self) -> usize {
        self.registry.id()
    }

    #[inline]
    fn check_owner(&self, owner: usize) {
        assert!(owner == self.owner(), "a policy id or charge of another KeyedLimiter");
    }

    /// The candidate buckets of `key` in a one-word table, for the loom models (which need keys
    /// that share buckets); not part of the API.
    #[cfg(ratewell_loom)]
    #[doc(hidden)]
    pub fn buckets_of(&self, key: &K) -> Option<(usize, usize)> {
        match &self.backend {
            Backend::Words(table) => Some(table.buckets_of(self.hasher.hash_one(key))),
            _ => None,
        }
    }
}
