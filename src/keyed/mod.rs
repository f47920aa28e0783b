//! Per-key limiting: a bounded table of per-key states, per-key policy overrides, run-time policy
//! changes, and metrics.

mod counts;
mod ip;
pub(crate) mod log_table;
pub(crate) mod registry;
pub(crate) mod table;
#[macro_use]
mod store;
mod snapshot;

use std::hash::Hash;
use std::marker::PhantomData;

use crate::algorithms::Algorithm;
use crossbeam_utils::CachePadded;

pub use self::ip::{IpKey, IpPrefixes};
pub use self::table::{CapacityError, OnFull};

use self::counts::Counts;
use self::log_table::LogTable;
use self::registry::{Locked, Pinned, Policies, Registry, Within};
use self::store::{Backend, batch_in};
pub(crate) use self::store::{GROUP, Receipt, Store, shard_count};
use self::table::{MAX_CAPACITY, Table};
use crate::cas::{Charged, Report, Taken};
use crate::clock::{Clock, Floor, QuantaClock};
use crate::decision::Decision;
use crate::policy::{Policy, PolicyError};

/// A rate limiter with one state per key, in a table of bounded size.
///
/// Memory is allocated once, for `capacity` keys (16 bytes each, see [`KeyedLimiter::memory_bytes`]),
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
/// For keys out of cache (millions of them), [`check_batch`](Self::check_batch) decides a slice
/// of requests with their memory accesses overlapped, and [`prehash`](Self::prehash) lets a
/// caller pipeline single decisions by hand.
///
/// Keys are hashed with a per-process-seeded `ahash` and stored as 54-bit fingerprints: hash the
/// same type for the same key (`&str` and `String` hash alike; `u32` and `u64` do not).
///
/// # Examples
///
/// ```
/// use ratewell::{KeyedLimiter, ManualClock, Policy};
///
/// let policy: Policy = "sliding-window limit=2 window=1m".parse()?;
/// let limiter = KeyedLimiter::with_clock(&policy, 10_000, ManualClock::new(0));
/// assert!(limiter.check("alice").is_admitted());
/// assert!(limiter.check("alice").is_admitted());
/// assert!(!limiter.check("alice").is_admitted());
/// assert!(limiter.check("bob").is_admitted());
///
/// // A premium key gets another quota.
/// limiter.set_override("carol", &"sliding-window limit=100 window=1m".parse()?)?;
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
    counts: Counts,
    /// Admissions taken back (a slow path: one plain counter).
    refunds: std::sync::atomic::AtomicU64,
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

/// A policy registered with a keyed limiter ([`KeyedLimiter::register`]), for decisions that
/// name their policy per call ([`KeyedLimiter::check_with`]). Not `Clone`: it is handed back
/// once, to [`KeyedLimiter::release`].
#[derive(Debug, PartialEq, Eq)]
pub struct PolicyId {
    idx: u8,
    word: u32,
    /// Which limiter registered it (the address of its registry's slots, stable for its life).
    owner: usize,
}

/// An admission made by [`KeyedLimiter::take_with`], which [`KeyedLimiter::refund`] takes
/// back: what several decisions that stand or fall together need when a later one rejects.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "an admission is kept unless refunded; drop the charge to keep it"]
pub struct Charge {
    receipt: Receipt,
    owner: usize,
}

/// A key hashed by [`KeyedLimiter::prehash`], its bucket on its way into the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prehashed {
    hash: u64,
}

/// Counters of a keyed limiter. Reading them sums per-shard and per-thread cells; updating them
/// writes no line shared between threads (see [`KeyedLimiter::metrics`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Metrics {
    /// Keys holding state now.
    pub keys: u64,
    /// Keys the table can hold.
    pub capacity: u64,
    /// Keys dropped because their state was indistinguishable from a fresh key's (no decision
    /// changed).
    pub reclaims: u64,
    /// Live keys evicted to make room (each may have been granted extra capacity).
    pub evictions: u64,
    /// New keys refused because every candidate slot was live (with [`OnFull::Refuse`]).
    pub refused: u64,
    /// New keys placed by moving keys already present to their other candidate bucket (no
    /// decision changes: a moved key keeps its state).
    pub relocations: u64,
    /// Keys moved by those relocations (a relocation may move a chain of keys).
    pub moves: u64,
    /// Whether the kernel took the advice to back the table with transparent huge pages
    /// (Linux `madvise(MADV_HUGEPAGE)`, asked for the whole 2 MiB pages of a table's memory;
    /// whether it then finds huge pages is the kernel's: `AnonHugePages` in
    /// `/proc/self/smaps`).
    pub huge_pages: bool,
    /// Admitted decisions (`check`, not `peek`).
    pub admitted: u64,
    /// Rejected and impossible decisions (`check`, not `peek`).
    pub rejected: u64,
    /// Admissions taken back by a [`LayeredLimiter`](crate::LayeredLimiter) (another layer
    /// rejected the request, or a reservation was cancelled) on a key that still held them (not
    /// evicted, reset or moved to another policy since); they stay counted in `admitted`.
    pub refunds: u64,
}

impl<K: Hash + ?Sized> KeyedLimiter<K, QuantaClock> {
    /// A keyed limiter for up to `capacity` keys, on the TSC clock.
    ///
    /// # Panics
    ///
    /// If `capacity` is above [`MAX_CAPACITY`](Self::MAX_CAPACITY) or the table cannot be
    /// allocated; [`try_new`](Self::try_new) returns either as an error instead.
    pub fn new(policy: &Policy, capacity: usize) -> Self {
        Self::with_clock(policy, capacity, QuantaClock::new())
    }

    /// A keyed limiter for up to `capacity` keys, on the TSC clock, or why it cannot be built.
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{CapacityError, KeyedLimiter, Policy};
    ///
    /// let policy: Policy = "token-bucket capacity=10 rate=1/s".parse()?;
    /// let err = KeyedLimiter::<str>::try_new(&policy, usize::MAX).unwrap_err();
    /// assert!(matches!(err, CapacityError::TooLarge { .. }));
    /// assert!(KeyedLimiter::<str>::try_new(&policy, 1_000).is_ok());
    /// # Ok::<(), ratewell::PolicyError>(())
    /// ```
    pub fn try_new(policy: &Policy, capacity: usize) -> Result<Self, CapacityError> {
        Self::try_with_clock(policy, capacity, QuantaClock::new())
    }
}

impl<K: Hash + ?Sized, C: Clock> KeyedLimiter<K, C> {
    /// The most keys a keyed limiter holds: 2^39 (8 TiB of slots). A capacity of 0 is taken as 1.
    pub const MAX_CAPACITY: u64 = MAX_CAPACITY;

    /// A keyed limiter for up to `capacity` keys (rounded up to whole 128-byte buckets of eight
    /// keys), reading time from `clock`.
    ///
    /// # Panics
    ///
    /// If `capacity` is above [`MAX_CAPACITY`](Self::MAX_CAPACITY) or the table cannot be
    /// allocated; [`try_with_clock`](Self::try_with_clock) returns either as an error instead.
    pub fn with_clock(policy: &Policy, capacity: usize, clock: C) -> Self {
        match Self::try_with_clock(policy, capacity, clock) {
            Ok(limiter) => limiter,
            Err(e) => panic!("KeyedLimiter: {e}"),
        }
    }

    /// A keyed limiter for up to `capacity` keys reading time from `clock`, or why it cannot be
    /// built: a capacity above [`MAX_CAPACITY`](Self::MAX_CAPACITY), or a table the allocator
    /// refused (the memory is allocated here, once: [`memory_bytes`](Self::memory_bytes)).
    pub fn try_with_clock(
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
            refunds: std::sync::atomic::AtomicU64::new(0),
            _key: PhantomData,
        })
    }

    /// The same limiter with its keys hashed from `seed` instead of a seed drawn per process:
    /// the same keys then take the same slots in every run, so which keys are evicted (and so
    /// every decision) is reproducible. `ratewell replay` and `compare` use it. Call it on a new
    /// limiter: it forgets every key and override the limiter holds.
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
    /// let run = || {
    ///     let limiter = KeyedLimiter::<u32, _>::with_clock(&policy, 8, ManualClock::new(0)).seeded(7);
    ///     (0..100u32).map(|k| limiter.allow(&(k % 40))).collect::<Vec<_>>()
    /// };
    /// assert_eq!(run(), run()); // the same evictions, the same decisions
    /// # Ok::<(), ratewell::PolicyError>(())
    /// ```
    pub fn seeded(mut self, seed: u64) -> Self {
        // Four words from one (the constants are the digits of pi, as in `table.rs`).
        self.seeds = [
            seed,
            seed ^ 0x243f_6a88_85a3_08d3,
            seed.rotate_left(32) ^ 0x1319_8a2e_0370_7344,
            seed.rotate_left(16) ^ 0xa409_3822_299f_31d0,
        ];
        self.hasher = snapshot::hasher_of(self.seeds);
        let secret = self.hasher.hash_one(0x5eed_u64);
        with_store!(mut self, store => store.reseed(secret));
        self.registry.clear_overrides();
        self
    }

    /// What to do when a new key finds every candidate slot live (default: evict the one whose
    /// loss grants the least extra capacity).
    pub fn on_full(mut self, on_full: OnFull) -> Self {
        with_store!(mut self, store => store.set_on_full(on_full));
        self
    }

    /// Decide a request of cost 1 for `key` and take it if admitted.
    #[inline]
    pub fn check(&self, key: &K) -> Decision {
        self.check_n(key, 1)
    }

    /// Decide a request of `cost` for `key` and take it if admitted. `cost` 0 is treated as 1.
    #[inline]
    pub fn check_n(&self, key: &K, cost: u32) -> Decision {
        let decision = self.decide::<Decision>(key, cost.max(1));
        self.counts.record(decision.is_admitted());
        decision
    }

    /// Whether a request of cost 1 for `key` is admitted, taking it if so: the lean path.
    #[inline]
    pub fn allow(&self, key: &K) -> bool {
        self.allow_n(key, 1)
    }

    /// Whether a request of `cost` for `key` is admitted, taking it if so: the lean path, for
    /// callers that need only yes or no. It computes none of the decision's details (see
    /// [`Limiter::allow_n`](crate::Limiter::allow_n)); the admission itself is the same.
    #[inline]
    pub fn allow_n(&self, key: &K, cost: u32) -> bool {
        let admitted = self.decide::<bool>(key, cost.max(1));
        self.counts.record(admitted);
        admitted
    }

    /// Decide a request of `cost` for `key` without taking anything, and report the key's state
    /// as it is: whether the request would be admitted now (and if not, when it would be), with
    /// the remaining quota, reset and replenish times *before* it, not after it. `peek_n(key, 1)`
    /// is the key's current quota, for `RateLimit` fields on a response the limiter did not
    /// decide. A peek is not counted in [`metrics`](Self::metrics) and stores nothing (a new key
    /// stays absent).
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{KeyedLimiter, ManualClock, Policy};
    ///
    /// let policy: Policy = "fixed-window limit=10 window=1m".parse()?;
    /// let limiter = KeyedLimiter::with_clock(&policy, 1_000, ManualClock::new(0));
    /// assert_eq!(limiter.peek_n("k", 1).remaining(), 10); // nothing taken yet
    /// assert_eq!(limiter.check("k").remaining(), 9); // after taking one
    /// assert_eq!(limiter.peek_n("k", 1).remaining(), 9);
    /// # Ok::<(), ratewell::PolicyError>(())
    /// ```
    #[inline]
    pub fn peek_n(&self, key: &K, cost: u32) -> Decision {
        let hash = self.hasher.hash_one(key);
        let now = self.floor.now(&self.clock);
        self.peek_hashed(hash, now, cost.max(1))
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

    /// [`allow_n`](Self::allow_n) for the key hashed `hash` at `now`: whether it was admitted
    /// (no receipt: an admission nothing will take back).
    #[inline]
    pub(crate) fn allow_hashed(&self, hash: u64, now: u64, cost: u32) -> bool {
        let admitted =
            with_store!(self, store => store.decide::<bool, _>(&self.registry, hash, now, cost));
        self.counts.record(admitted);
        admitted
    }

    /// [`peek_n`](Self::peek_n) for the key hashed `hash` at `now`.
    #[inline]
    pub(crate) fn peek_hashed(&self, hash: u64, now: u64, cost: u32) -> Decision {
        with_store!(self, store => store.peek(&self.registry, hash, now, cost))
    }

    /// Start fetching the bucket of the key hashed `hash`.
    #[inline]
    pub(crate) fn prefetch_hashed(&self, hash: u64) {
        with_store!(self, store => store.prefetch(hash));
    }

    /// Take back the admission of `receipt` at `now` (counted if the key still held it).
    pub(crate) fn refund_at(&self, receipt: &Receipt, now: u64) {
        if with_store!(self, store => store.refund(&self.registry, receipt, now)) {
            self.refunds.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    #[inline]
    fn decide<R: Report>(&self, key: &K, cost: u32) -> R {
        let hash = self.hasher.hash_one(key);
        let now = self.floor.now(&self.clock);
        with_store!(self, store => store.decide::<R, _>(&self.registry, hash, now, cost))
    }

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

    /// Replace the policy of every key without an override. Each key present keeps what it
    /// consumed: at its next decision its state is converted to the new policy
    /// ([`Policy`]'s limit less what remained under the old one, in whole units, rounded
    /// against the key, is taken from a fresh state of the new policy at that instant). So a new
    /// rate or capacity on the same algorithm keeps the consumed part, and an exhausted key
    /// stays exhausted under a policy no larger; across algorithms the same rule applies, and a
    /// window or refill schedule restarts at the conversion. A sliding log keeps its log.
    ///
    /// Fails if the policy's kind differs (a sliding log and the one-word algorithms do not share
    /// a table), or if 255 distinct policies are in use at once (the default and the overrides).
    /// Policies no longer in use free their slots for later ones: there is no limit on how many
    /// times a limiter's policies change.
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{KeyedLimiter, ManualClock, Policy};
    ///
    /// let limiter = KeyedLimiter::<str, _>::with_clock(&"token-bucket capacity=10 rate=1/h".parse()?, 100, ManualClock::new(0));
    /// assert!(limiter.check_n("k", 10).is_admitted()); // exhausted
    /// limiter.set_policy(&"token-bucket capacity=14 rate=1/h".parse()?)?;
    /// assert_eq!(limiter.peek_n("k", 1).remaining(), 4); // 10 consumed of 14, not a fresh 14
    /// # Ok::<(), ratewell::PolicyError>(())
    /// ```
    pub fn set_policy(&self, policy: &Policy) -> Result<(), PolicyError> {
        self.registry.set_default(policy, &|locked| self.sweep(locked))
    }

    /// Give `key` its own policy (a premium API key, an internal service). A key present keeps
    /// what it consumed (see [`set_policy`](Self::set_policy)).
    pub fn set_override(&self, key: &K, policy: &Policy) -> Result<(), PolicyError> {
        let hash = self.hasher.hash_one(key);
        self.registry.set_override(self.fingerprint(hash), Some(policy), &|l| self.sweep(l))?;
        self.migrate(hash);
        Ok(())
    }

    /// Return `key` to the limiter's policy, keeping what it consumed.
    pub fn clear_override(&self, key: &K) {
        let hash = self.hasher.hash_one(key);
        // Clearing cannot fail: it registers nothing.
        let _ = self.registry.set_override(self.fingerprint(hash), None, &|l| self.sweep(l));
        self.migrate(hash);
    }

    /// The policy `key` is decided under: its override, or the limiter's policy.
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{KeyedLimiter, Policy};
    ///
    /// let limiter = KeyedLimiter::<str>::new(&"fixed-window limit=10 window=1m".parse()?, 100);
    /// let premium: Policy = "fixed-window limit=1000 window=1m".parse()?;
    /// limiter.set_override("vip", &premium)?;
    /// assert_eq!(limiter.policy_of("vip"), premium);
    /// assert_eq!(limiter.policy_of("anyone"), limiter.policy());
    /// # Ok::<(), ratewell::PolicyError>(())
    /// ```
    pub fn policy_of(&self, key: &K) -> Policy {
        let hash = self.hasher.hash_one(key);
        let (idx, _) = self.registry.resolve(self.fingerprint(hash));
        self.registry.policy(idx).clone()
    }

    fn fingerprint(&self, hash: u64) -> u64 {
        with_store!(self, store => store.fingerprint(hash))
    }

    /// Move the key to the policy it resolves to now, keeping what it consumed.
    fn migrate(&self, hash: u64) {
        let now = self.floor.now(&self.clock);
        with_store!(self, store => store.migrate(&self.registry, hash, now))
    }

    /// Convert every key stored under a retired policy slot (under the registry's lock).
    fn sweep(&self, policies: &Locked<'_>) {
        let now = self.floor.now(&self.clock);
        with_store!(self, store => store.sweep(policies, now))
    }

    /// The policy of keys without an override.
    pub fn policy(&self) -> Policy {
        self.registry.default_policy().clone()
    }

    /// Keys the table can hold (the configured capacity rounded up to whole buckets).
    pub fn capacity(&self) -> u64 {
        with_store!(self, store => store.capacity())
    }

    /// Bytes of per-key storage: for the one-word algorithms, 16 bytes a key, allocated up front
    /// (plus a fixed overhead of a few KiB); for the sliding log, what is allocated now for its
    /// keys (a node and an index entry, about 80 bytes) and their logs (16 bytes an entry), which
    /// grows with use up to the capacity in keys and the limit in entries per key, and never
    /// beyond.
    pub fn memory_bytes(&self) -> u64 {
        with_store!(self, store => store.memory_bytes())
    }

    /// The counters. Cheap to update: table counters are per shard and written only under the
    /// shard's insert lock; admitted/rejected are per-thread cells.
    pub fn metrics(&self) -> Metrics {
        let stats = with_store!(self, store => store.stats());
        let (admitted, rejected) = self.counts.sum();
        Metrics {
            keys: stats.len,
            capacity: self.capacity(),
            reclaims: stats.reclaims,
            evictions: stats.evictions,
            refused: stats.refused,
            relocations: stats.relocations,
            moves: stats.moves,
            huge_pages: stats.huge_pages,
            admitted,
            rejected,
            refunds: self.refunds.load(std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// Register `policy` for decisions that name it per call, and return its id: the way to
    /// decide keys of one table under many policies chosen per request (a rate limit service
    /// whose rules each carry their own limit). Registering a policy registered already returns
    /// the same slot again; each id is handed back once to [`release`](Self::release).
    ///
    /// A key decided under a policy other than the one it is stored under is first converted to
    /// it, keeping what it consumed, as [`set_policy`](Self::set_policy) converts keys: a rule
    /// whose limit changes does not hand its keys a fresh budget. The registered policies, the
    /// default and the overrides share the limiter's 255 slots; fails when they are taken, or if
    /// the policy's kind differs from the limiter's (a sliding log and the one-word algorithms
    /// do not share a table).
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{KeyedLimiter, ManualClock, Policy};
    ///
    /// let p = |s: &str| s.parse::<Policy>().expect("a valid policy");
    /// let limiter = KeyedLimiter::<str, _>::with_clock(&p("fixed-window limit=1 window=1s"), 1_000, ManualClock::new(0));
    /// let per_minute = limiter.register(&p("fixed-window limit=3 window=1m"))?;
    /// let per_hour = limiter.register(&p("fixed-window limit=100 window=1h"))?;
    /// assert_eq!(limiter.check_with("alice", &per_minute, 3).remaining(), 0);
    /// assert!(!limiter.check_with("alice", &per_minute, 1).is_admitted());
    /// assert_eq!(limiter.check_with("bob", &per_hour, 1).remaining(), 99);
    /// limiter.release(per_minute);
    /// limiter.release(per_hour);
    /// # Ok::<(), ratewell::PolicyError>(())
    /// ```
    pub fn register(&self, policy: &Policy) -> Result<PolicyId, PolicyError> {
        let (idx, word) = self.registry.pin(policy, &|locked| self.sweep(locked))?;
        Ok(PolicyId { idx, word, owner: self.owner() })
    }

    /// Hand back an id from [`register`](Self::register). Once every id of a policy is
    /// released, its slot is retired: keys stored under it are converted to the policy they are
    /// next decided under, and the slot is reused when the limiter needs one.
    ///
    /// # Panics
    ///
    /// If `id` was registered with another limiter.
    pub fn release(&self, id: PolicyId) {
        self.check_owner(id.owner);
        self.registry.unpin(id.idx);
    }

    /// The policy `id` stands for.
    ///
    /// # Panics
    ///
    /// If `id` was registered with another limiter.
    pub fn policy_of_id(&self, id: &PolicyId) -> Policy {
        self.check_owner(id.owner);
        self.registry.policy(id.idx).clone()
    }

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
            Backend::Logs(_) => None,
        }
    }

    /// The clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }
}
