//! [`Leases`]: a hot key's units charged to the server in bulk and spent in process.

use ahash::RandomState;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
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
    /// Requests decided by one round trip (no lease: the key's table is full, the server had
    /// less than a lease left, or it failed over).
    pub round_trips: u64,
}

/// One key's lease. `left` and `until` are read and spent lock-free; a new lease is taken under
/// `renew`, which one task holds at a time.
struct Lease {
    key: Box<str>,
    /// Units left to spend.
    left: AtomicU64,
    /// When the lease ends (the clock's ns); 0 when there is none.
    until: AtomicU64,
    renew: tokio::sync::Mutex<Renewal>,
}

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
    slots: Box<[OnceLock<Lease>]>,
    hasher: RandomState,
    clock: QuantaClock,
    max_units: u64,
    max_length: Duration,
    leases: AtomicU64,
    leased_units: AtomicU64,
    returned_units: AtomicU64,
    round_trips: AtomicU64,
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
    /// keys (others decide by round trip), each lease at most `max_units` units and
    /// `max_length` long.
    pub fn new(
        limiter: RedisLimiter,
        capacity: usize,
        max_units: u32,
        max_length: Duration,
    ) -> Self {
        let limit = limiter.policy(0).map_or(1, |p| p.limit());
        Leases {
            limiter,
            slots: (0..capacity.max(1)).map(|_| OnceLock::new()).collect(),
            hasher: RandomState::new(),
            clock: QuantaClock::new(),
            max_units: u64::from(max_units.max(1)).min(limit),
            max_length: max_length.max(Duration::from_micros(8)),
            leases: AtomicU64::new(0),
            leased_units: AtomicU64::new(0),
            returned_units: AtomicU64::new(0),
            round_trips: AtomicU64::new(0),
        }
    }

    /// The counts so far.
    pub fn metrics(&self) -> LeaseMetrics {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        // No counter on the path that spends a lease: what was spent is what was leased and is
        // neither held nor given back.
        let held: u64 = self
            .slots
            .iter()
            .filter_map(OnceLock::get)
            .map(|lease| lease.left.load(Ordering::Relaxed))
            .sum();
        let (leased, returned) = (l(&self.leased_units), l(&self.returned_units));
        LeaseMetrics {
            local_units: leased.saturating_sub(returned).saturating_sub(held),
            leases: l(&self.leases),
            leased_units: leased,
            returned_units: returned,
            round_trips: l(&self.round_trips),
        }
    }

    /// The lease slot of `key`: found, or claimed if a probe finds an empty slot.
    fn slot(&self, key: &str) -> Option<&Lease> {
        let n = self.slots.len();
        let home = (self.hasher.hash_one(key) as usize) % n;
        for i in 0..PROBES.min(n) {
            let slot = &self.slots[(home + i) % n];
            let lease = slot.get_or_init(|| Lease {
                key: key.into(),
                left: AtomicU64::new(0),
                until: AtomicU64::new(0),
                renew: tokio::sync::Mutex::new(Renewal {
                    receipt: None,
                    units: 0,
                    since: 0,
                    next_units: 1,
                }),
            });
            if &*lease.key == key {
                return Some(lease);
            }
        }
        None
    }

    /// Spend `cost` units of the key's lease, in process: `true` if it had them and has not
    /// ended. Never a round trip.
    pub fn try_acquire(&self, key: &str, cost: u32) -> bool {
        match self.slot(key) {
            Some(lease) => self.spend(lease, u64::from(cost.max(1))),
            None => false,
        }
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
        let lease = self.slot(key);
        if let Some(lease) = lease {
            if self.spend(lease, cost) {
                return true;
            }
        }
        // The slow path in a box of its own: the future of a call that spends a lease stays a
        // few words, not the size of a round trip's.
        Box::pin(self.renew(key, lease, cost)).await
    }

    async fn renew(&self, key: &str, lease: Option<&Lease>, cost: u64) -> bool {
        let Some(lease) = lease else {
            return self.round_trip(key, cost).await;
        };
        let mut renewal = lease.renew.lock().await;
        // Another task may have renewed while this one waited.
        if self.spend(lease, cost) {
            return true;
        }
        let now = self.clock.now();
        self.end(lease, &mut renewal, now).await;
        let units = renewal.next_units.max(cost).min(self.max_units.max(cost));
        let verdict = self.limiter.check(key, units as u32).await;
        if verdict.source() != Source::Server || !verdict.is_admitted() {
            // Less than a lease left (or no server): the next lease is smaller, and this request
            // is decided alone.
            renewal.next_units = (units / 2).max(1);
            drop(renewal);
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
        lease.until.store(0, Ordering::Release);
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
        for slot in self.slots.iter() {
            if let Some(lease) = slot.get() {
                let mut renewal = lease.renew.lock().await;
                let now = self.clock.now();
                self.end(lease, &mut renewal, now).await;
            }
        }
    }
}
