//! [`Leases`]: a hot key's units charged to the server in bulk and spent in process.

use ahash::RandomState;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use arc_swap::ArcSwapOption;
use std::time::Duration;

use ratewell::{Clock, QuantaClock};

use crate::limiter::RedisLimiter;
use crate::verdict::{Receipt, Source};

/// How far a key's slot may lie from its home slot.
const PROBES: usize = 8;

/// Counts of what the leases did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseMetrics {
    /// Units spent from leases, in process (requests, when each costs 1): leased, less given
    /// back, less what the current leases still hold.
    pub local_units: u64,
    /// Leases taken from the server.
    pub leases: u64,
    /// Units leased in total.
    pub leased_units: u64,
    /// Units given back to the server when leases ended.
    pub returned_units: u64,
    /// Requests decided by one round trip (no lease: every slot the key may take holds a key
    /// still in use, the server had less than a lease left, or it failed over).
    pub round_trips: u64,
    /// Keys that went cold and gave their slot to another (what their leases held given back).
    pub evictions: u64,
}

/// One key's lease. `left` and `until` are read and spent lock-free; a new lease is taken under
/// `renew`, which one task holds at a time.
struct Lease {
    key: Box<str>,
    /// Units left to spend.
    left: AtomicU64,
    /// When the lease ends, or ended (the clock's ns); 0 when there never was one.
    until: AtomicU64,
    renew: tokio::sync::Mutex<Renewal>,
    /// Set (under `renew`) when the key lost its slot: a renewal that finds it set starts over.
    evicted: AtomicBool,
}

impl Lease {
    fn new(key: &str) -> Self {
        Lease {
            key: key.into(),
            left: AtomicU64::new(0),
            until: AtomicU64::new(0),
            renew: tokio::sync::Mutex::new(Renewal {
                receipt: None,
                units: 0,
                since: 0,
                next_units: 1,
            }),
            evicted: AtomicBool::new(false),
        }
    }
}

/// A slot of the table: empty, or one key's lease.
type Slot = ArcSwapOption<Lease>;

/// What a renewal knows about the lease it replaces.
struct Renewal {
    receipt: Option<Receipt>,
    /// Units the current lease had.
    units: u64,
    /// When it started.
    since: u64,
    /// The next lease's size.
    next_units: u64,
}

/// Leases on one limiter's keys: see the crate documentation.
///
/// `acquire` spends a unit of the key's lease when it has one (an atomic decrement, no round
/// trip); otherwise it takes a new lease of `k` units from the server, as one ordinary decision
/// of cost `k`. `k` follows the key's demand: doubled when a lease is spent before it ends,
/// halved when one ends with more than half unspent, between 1 and `max_units`. A lease lasts the
/// time its demand would take to spend it twice, between an eighth of `max_length` and
/// `max_length`. At most one lease per key per instance is outstanding, so the shared policy
/// under-admits by at most `instances * max_units` units at any instant, and never
/// over-admits: every unit spent was charged to the server.
///
/// A lease answers admitted or not: a delaying leaky bucket's delay does not apply to units
/// spent from a lease (give such a policy `nodelay`, or decide it by round trip).
pub struct Leases {
    limiter: RedisLimiter,
    slots: Box<[Slot]>,
    hasher: RandomState,
    clock: QuantaClock,
    max_units: u64,
    max_length: Duration,
    leases: AtomicU64,
    leased_units: AtomicU64,
    returned_units: AtomicU64,
    round_trips: AtomicU64,
    evictions: AtomicU64,
}

impl std::fmt::Debug for Leases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leases")
            .field("capacity", &self.slots.len())
            .field("max_units", &self.max_units)
            .field("max_length", &self.max_length)
            .finish()
    }
}

impl Leases {
    /// Leases on `limiter`'s keys (its first layer: a one-layer limiter), for up to `capacity`
    /// keys at once, each lease at most `max_units` units and `max_length` long. A key whose
    /// slots are all taken takes the slot of a key gone cold (its last lease ended at least
    /// `max_length` ago; what it held is given back), else decides by round trip.
    pub fn new(
        limiter: RedisLimiter,
        capacity: usize,
        max_units: u32,
        max_length: Duration,
    ) -> Self {
        let limit = limiter.policy(0).map_or(1, |p| p.limit());
        Leases {
            limiter,
            slots: (0..capacity.max(1)).map(|_| ArcSwapOption::empty()).collect(),
            hasher: RandomState::new(),
            clock: QuantaClock::new(),
            max_units: u64::from(max_units.max(1)).min(limit),
            max_length: max_length.max(Duration::from_micros(8)),
            leases: AtomicU64::new(0),
            leased_units: AtomicU64::new(0),
            returned_units: AtomicU64::new(0),
            round_trips: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
        }
    }

    /// The counts so far.
    pub fn metrics(&self) -> LeaseMetrics {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        // No counter on the path that spends a lease: what was spent is what was leased and is
        // neither held nor given back.
        let held: u64 = self.leases().iter().map(|lease| lease.left.load(Ordering::Relaxed)).sum();
        let (leased, returned) = (l(&self.leased_units), l(&self.returned_units));
        LeaseMetrics {
            local_units: leased.saturating_sub(returned).saturating_sub(held),
            leases: l(&self.leases),
            leased_units: leased,
            returned_units: returned,
            round_trips: l(&self.round_trips),
            evictions: l(&self.evictions),
        }
    }

    /// Every lease in the table now.
    fn leases(&self) -> Vec<Arc<Lease>> {
        self.slots.iter().filter_map(ArcSwapOption::load_full).collect()
    }

    /// The slots `key` may take: its home slot and the next ones.
    fn probes(&self, key: &str) -> impl Iterator<Item = &Slot> {
        let n = self.slots.len();
        let home = (self.hasher.hash_one(key) as usize) % n;
        (0..PROBES.min(n)).map(move |i| &self.slots[(home + i) % n])
    }

    /// `f` on the key's lease, found, or made in an empty slot; `None` if every slot the key may
    /// take holds another key. Lock-free: a slot is read as one atomic pointer.
    fn with_lease<R>(&self, key: &str, f: impl FnOnce(&Arc<Lease>) -> R) -> Option<R> {
        let mut empty = None;
        for slot in self.probes(key) {
            let current = slot.load();
            match &*current {
                Some(lease) if &*lease.key == key => return Some(f(lease)),
                Some(_) => {}
                None => {
                    if empty.is_none() {
                        empty = Some(slot);
                    }
                }
            }
        }
        let slot = empty?;
        let lease = Arc::new(Lease::new(key));
        let previous = slot.compare_and_swap(&None::<Arc<Lease>>, Some(lease.clone()));
        match &*previous {
            // Claimed.
            None => Some(f(&lease)),
            // Another task filled it meanwhile: with this key, or another.
            Some(other) if &*other.key == key => Some(f(other)),
            Some(_) => None,
        }
    }

    /// A slot for `key` taken from a key gone cold (its last lease ended `max_length` ago or
    /// more, and no renewal of it under way): the coldest, its lease given back first.
    async fn evict_for(&self, key: &str) -> Option<Arc<Lease>> {
        let now = self.clock.now();
        let cold_after = self.max_length.as_nanos() as u64;
        let (slot, victim) = self
            .probes(key)
            .filter_map(|slot| {
                let lease = slot.load_full()?;
                let until = lease.until.load(Ordering::Acquire);
                (now >= until.saturating_add(cold_after)).then_some((until, slot, lease))
            })
            .min_by_key(|(until, _, _)| *until)
            .map(|(_, slot, lease)| (slot, lease))?;
        let mut renewal = victim.renew.try_lock().ok()?;
        if victim.evicted.swap(true, Ordering::AcqRel) {
            return None;
        }
        self.end(&victim, &mut renewal, now).await;
        drop(renewal);
        let lease = Arc::new(Lease::new(key));
        let previous = slot.compare_and_swap(&victim, Some(lease.clone()));
        match &*previous {
            Some(current) if Arc::ptr_eq(current, &victim) => {
                self.evictions.fetch_add(1, Ordering::Relaxed);
                Some(lease)
            }
            _ => None,
        }
    }

    /// Spend `cost` units of the key's lease, in process: `true` if it had them and has not
    /// ended. Never a round trip.
    pub fn try_acquire(&self, key: &str, cost: u32) -> bool {
        self.with_lease(key, |lease| self.spend(lease, u64::from(cost.max(1)))).unwrap_or(false)
    }

    fn spend(&self, lease: &Lease, cost: u64) -> bool {
        let now = self.clock.now();
        if now >= lease.until.load(Ordering::Acquire) {
            return false;
        }
        let mut left = lease.left.load(Ordering::Relaxed);
        loop {
            if left < cost {
                return false;
            }
            match lease.left.compare_exchange_weak(
                left,
                left - cost,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(actual) => left = actual,
            }
        }
    }

    /// Decide a request of `cost` on `key`: from the key's lease when it has one, else by a new
    /// lease (or, when the server has less than a lease left, one round trip for this request).
    pub async fn acquire(&self, key: &str, cost: u32) -> bool {
        let cost = u64::from(cost.max(1));
        if self.with_lease(key, |lease| self.spend(lease, cost)) == Some(true) {
            return true;
        }
        // The slow path in a box of its own: the future of a call that spends a lease stays a
        // few words, not the size of a round trip's.
        Box::pin(self.renew(key, cost)).await
    }

    async fn renew(&self, key: &str, cost: u64) -> bool {
        // Twice at most: a lease evicted while this task waited for its renewal is looked up
        // again (found in its new slot, or in none).
        for _ in 0..2 {
            let lease = match self.with_lease(key, Arc::clone) {
                Some(lease) => lease,
                None => match self.evict_for(key).await {
                    Some(lease) => lease,
                    None => return self.round_trip(key, cost).await,
                },
            };
            let mut renewal = lease.renew.lock().await;
            if lease.evicted.load(Ordering::Acquire) {
                continue;
            }
            // Another task may have renewed while this one waited.
            if self.spend(&lease, cost) {
                return true;
            }
            return self.renew_locked(key, &lease, &mut renewal, cost).await;
        }
        self.round_trip(key, cost).await
    }

    async fn renew_locked(
        &self,
        key: &str,
        lease: &Lease,
        renewal: &mut Renewal,
        cost: u64,
    ) -> bool {
        let now = self.clock.now();
        self.end(lease, renewal, now).await;
        let units = renewal.next_units.max(cost).min(self.max_units.max(cost));
        let verdict = self.limiter.check(key, units as u32).await;
        if verdict.source() != Source::Server || !verdict.is_admitted() {
            // Less than a lease left (or no server): the next lease is smaller, and this request
            // is decided alone.
            renewal.next_units = (units / 2).max(1);
            if units == cost && verdict.source() == Source::Server {
                self.round_trips.fetch_add(1, Ordering::Relaxed);
                return false;
            }
            return self.round_trip(key, cost).await;
        }
        self.leases.fetch_add(1, Ordering::Relaxed);
        self.leased_units.fetch_add(units, Ordering::Relaxed);
        renewal.receipt = verdict.receipt().cloned();
        renewal.units = units;
        renewal.since = now;
        let length = self.length(renewal.next_units, units);
        lease.left.store(units - cost, Ordering::Release);
        lease.until.store(now.saturating_add(length), Ordering::Release);
        true
    }

    /// The length of a lease of `units` when the last lease's demand was `demand` units per
    /// `max_length`: twice the time that demand takes to spend it, within bounds.
    fn length(&self, demand: u64, units: u64) -> u64 {
        let max = self.max_length.as_nanos() as u64;
        let spend = (u128::from(max) * u128::from(units) * 2 / u128::from(demand.max(1))) as u64;
        spend.clamp(max / 8, max)
    }

    /// End `lease` (the renewal lock held): stop spending it, give back what is left, and size
    /// the next one from how this one went.
    async fn end(&self, lease: &Lease, renewal: &mut Renewal, now: u64) {
        // Ended now: nothing is spent from it after this (the clock never goes back), and it
        // goes cold `max_length` from now unless renewed.
        lease.until.fetch_min(now, Ordering::AcqRel);
        let left = lease.left.swap(0, Ordering::AcqRel);
        let Some(receipt) = renewal.receipt.take() else { return };
        let spent = renewal.units - left.min(renewal.units);
        let elapsed = now.saturating_sub(renewal.since).max(1);
        let max = self.max_length.as_nanos() as u64;
        // Demand over one `max_length`, from this lease's spending.
        let demand = (u128::from(spent) * u128::from(max) / u128::from(elapsed)) as u64;
        renewal.next_units = if left == 0 {
            (renewal.units * 2).min(self.max_units)
        } else if left * 2 > renewal.units {
            (renewal.units / 2).max(1)
        } else {
            renewal.units
        }
        .min(demand.max(1).saturating_mul(2))
        .max(1);
        if left > 0 {
            let part = receipt.with_cost(left as u32);
            if self.limiter.refund(&part).await.is_ok() {
                self.returned_units.fetch_add(left, Ordering::Relaxed);
            }
        }
    }

    async fn round_trip(&self, key: &str, cost: u64) -> bool {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        self.limiter.check(key, cost as u32).await.is_admitted()
    }

    /// End every lease and give back what is left (call before a process stops: a lease not
    /// given back only ends, and its units are unavailable to other instances until the
    /// policy refills them).
    pub async fn close(&self) {
        for lease in self.leases() {
            let mut renewal = lease.renew.lock().await;
            let now = self.clock.now();
            self.end(&lease, &mut renewal, now).await;
        }
    }
}
