//! Layered limits: one request checked against several limits, admitted by all of them or
//! charged to none.
//!
//! # The protocol
//!
//! A [`LayeredLimiter`] holds up to [`MAX_LAYERS`] layers, each a policy with its own key table
//! (a [`KeyedLimiter`]). A request of cost `c` with one key per layer (or one key for every
//! layer: bands on one key) is decided at one instant `now`, layers in order:
//!
//! 1. **Take** on the layer: the keyed limiter's own decision, one compare-exchange on the key's
//!    state word when it admits, nothing written when it rejects. An admission leaves a
//!    *receipt*: the key, the state word before and after the exchange, the cost.
//! 2. A **dry-run** layer that would reject is charged nothing (its decision wrote nothing) and
//!    the request goes on; its rejection is recorded.
//! 3. An enforcing layer that rejects ends the taking: every receipt taken so far is **refunded**,
//!    latest first, and the remaining layers are only peeked (read), so that the decision reports
//!    every layer's verdict and the largest wait. A rejection by the first layer writes nothing.
//!
//! So an admitted request costs one compare-exchange a layer, no lock (but a sliding log's) and
//! no allocation: receipts and per-layer decisions live in fixed arrays of [`MAX_LAYERS`].
//!
//! # Refund
//!
//! A refund is a compare-exchange loop on the key's word (see `OneWord::refund` in
//! `src/algorithms/mod.rs`): while the word still holds what the charge stored, it goes back to
//! the word before the charge, exactly; when other decisions changed it since, the algorithm
//! gives back what of the charge is still outstanding, never more than the state would hold had
//! the charge not been admitted (every other admission kept), and never more than a fresh key.
//! A key evicted from its table (or reset, or moved to another policy) since its charge has
//! nothing to give back.
//!
//! # What holds under concurrency
//!
//! - **No layer ever admits more than its policy allows.** Every charge is a decision of the layer
//!   at its instant, and a refund only returns capacity that charge took: at every instant each
//!   layer's state is at least as strict as the sequence of its unrefunded admissions requires.
//! - **No refund is lost.** A refund is a compare-exchange loop like a decision: it retries on a
//!   changed word, so a concurrent charge and a refund of the same key both apply.
//! - **All or nothing.** A request is admitted only if every enforcing layer admitted it at its
//!   turn; a rejected request keeps no charge once its refunds are done.
//! - What can differ from a sequential order: between a charge and its refund, another request
//!   sharing that key sees the capacity taken, and may be rejected where a sequential order would
//!   have admitted it. Such a rejection is the price of taking without locks; the capacity comes
//!   back with the refund.
//!
//! The loom models `layered_refunds_are_never_lost` (two requests on two layers sharing a key)
//! and `layered_cancel_racing_a_request` (a reservation cancelled while another request decides)
//! in `loom-tests/` run through every interleaving; the broken variant `no_refund` (a rejection
//! that keeps the earlier layers' charges) is caught by both.

use std::fmt;
use std::hash::Hash;
use std::sync::Arc;

use crossbeam_utils::CachePadded;

use crate::clock::{Clock, Floor, ManualClock, QuantaClock};
use crate::decision::{Decision, Outcome};
use crate::keyed::{CapacityError, KeyedLimiter, Metrics, Receipt};
use crate::policy::Policy;
use crate::snapshot::{self, Restored, Resume, SnapshotError, SnapshotInfo};

/// The most layers a [`LayeredLimiter`] holds: enough for a client address, an API key, a route
/// and several bands, small enough that a request's receipts and decisions stay in fixed arrays
/// on the stack.
pub const MAX_LAYERS: usize = 8;

/// The key table of a layer unless [`Layer::capacity`] says otherwise.
const DEFAULT_CAPACITY: usize = 100_000;

/// One layer of a [`LayeredLimiter`]: a name (the item name of its `RateLimit` fields), a policy,
/// and the capacity of its key table.
#[derive(Clone, Debug)]
pub struct Layer {
    name: String,
    policy: Policy,
    capacity: usize,
    seed: Option<u64>,
}

impl Layer {
    /// A layer named `name` deciding by `policy`, with a table of 100,000 keys.
    pub fn new(name: impl Into<String>, policy: &Policy) -> Self {
        Layer { name: name.into(), policy: policy.clone(), capacity: DEFAULT_CAPACITY, seed: None }
    }

    /// The same layer with its keys hashed from `seed`: reproducible evictions (see
    /// [`KeyedLimiter::seeded`], and its caveat for keys clients choose).
    pub fn seeded(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// The same layer with a key table of `capacity` keys (see [`KeyedLimiter`]).
    pub fn capacity(mut self, capacity: usize) -> Self {
        self.capacity = capacity;
        self
    }
}

/// Why a [`LayeredLimiter`] cannot be built.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LayersError {
    /// No layer at all.
    NoLayers,
    /// More layers than [`MAX_LAYERS`].
    TooManyLayers {
        /// How many were given.
        layers: usize,
    },
    /// Two layers with the same name (their `RateLimit` items could not be told apart).
    DuplicateName(String),
    /// A layer's key table cannot be built.
    Capacity {
        /// The layer's name.
        layer: String,
        /// Why.
        error: CapacityError,
    },
}

impl fmt::Display for LayersError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LayersError::NoLayers => f.write_str("a layered limiter needs at least one layer"),
            LayersError::TooManyLayers { layers } => {
                write!(f, "{layers} layers: a layered limiter holds at most {MAX_LAYERS}")
            }
            LayersError::DuplicateName(name) => write!(f, "two layers are named {name:?}"),
            LayersError::Capacity { layer, error } => write!(f, "layer {layer:?}: {error}"),
        }
    }
}

impl std::error::Error for LayersError {}

/// A request gave neither one key for every layer nor one key per layer: nothing was decided or
/// charged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyCountError {
    /// Keys given.
    pub keys: usize,
    /// Layers of the limiter.
    pub layers: usize,
}

impl fmt::Display for KeyCountError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let KeyCountError { keys, layers } = self;
        write!(f, "{keys} keys for {layers} layers: give one key for every layer, or one per layer")
    }
}

impl std::error::Error for KeyCountError {}

/// Hashes a layer's key the way that layer's table does (see [`LayerKey`]).
pub struct KeyHasher<'a>(&'a ahash::RandomState);

impl KeyHasher<'_> {
    /// The hash of `key` in this layer's table.
    #[inline]
    pub fn hash<T: Hash + ?Sized>(&self, key: &T) -> u64 {
        self.0.hash_one(key)
    }
}

/// A key of one layer of a request: any [`Hash`] value (a `&str` API key, an
/// [`IpKey`](crate::IpKey), a route), or [`Absent`] to skip the layer for this request.
///
/// Each layer hashes its key with its own table's seed, so keys of different types may be mixed
/// in one request: `&[&ip, &api_key, &route]`. As in [`KeyedLimiter`], hash the same type for the
/// same key (`&str` and `String` hash alike).
pub trait LayerKey {
    /// The key's hash in a layer's table, or `None` to skip the layer.
    fn key_hash(&self, hasher: &KeyHasher<'_>) -> Option<u64>;
}

impl<T: Hash + ?Sized> LayerKey for T {
    #[inline]
    fn key_hash(&self, hasher: &KeyHasher<'_>) -> Option<u64> {
        Some(hasher.hash(self))
    }
}

/// The key of a layer that does not apply to a request (an anonymous request on an API-key
/// layer): the layer is skipped, charged nothing and reported as skipped.
#[derive(Clone, Copy, Debug, Default)]
pub struct Absent;

impl LayerKey for Absent {
    #[inline]
    fn key_hash(&self, _: &KeyHasher<'_>) -> Option<u64> {
        None
    }
}

#[derive(Debug)]
pub(crate) struct LayerState {
    name: String,
    policy: Policy,
    /// The layer's table; its clock is never read (the layered limiter decides every layer at
    /// one instant of its own clock).
    table: KeyedLimiter<(), ManualClock>,
}

/// A request's keys: `keys[i * step]` is layer `i`'s.
#[derive(Clone, Copy)]
struct Keys<'k> {
    keys: &'k [&'k dyn LayerKey],
    step: usize,
}

/// The admissions a request holds, to take back: one receipt per layer at most.
#[derive(Clone, Copy, Debug, Default)]
struct Receipts([Option<Receipt>; MAX_LAYERS]);

impl Receipts {
    fn is_empty(&self) -> bool {
        self.0.iter().all(Option::is_none)
    }
}

/// Several limits on one request, all or nothing: per client address, per API key, per route,
/// or several bands on one key (`10/s` and `1000/h`). See the module documentation of
/// `src/layered.rs` for the protocol and what it guarantees under concurrency.
///
/// # Examples
///
/// ```
/// use ratewell::{Absent, Layer, LayeredLimiter, ManualClock, Policy};
///
/// let layers = vec![
///     Layer::new("ip", &"token-bucket capacity=3 rate=1/s".parse::<Policy>()?),
///     Layer::new("key", &"fixed-window limit=100 window=1h".parse::<Policy>()?),
///     Layer::new("search", &"fixed-window limit=1 window=1m".parse::<Policy>()?),
/// ];
/// let limiter = LayeredLimiter::with_clock(layers, ManualClock::new(0))?;
/// let ip = "192.0.2.7";
/// // The route's budget admits one search a minute.
/// assert!(limiter.check(&[&ip, &"k-123", &"/search"], 1)?.is_admitted());
/// let d = limiter.check(&[&ip, &"k-123", &"/search"], 1)?;
/// assert!(!d.is_admitted());
/// assert_eq!(d.decided_by(), Some(2));
/// // ... and the rejected search charged neither the address nor the API key.
/// assert_eq!(limiter.peek(&[&ip, &"k-123", &"/search"], 1)?.layer(0).unwrap().remaining(), 2);
/// // An anonymous request skips the API-key layer.
/// assert!(limiter.check(&[&ip, &Absent, &"/"], 1)?.is_admitted());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct LayeredLimiter<C: Clock = QuantaClock> {
    layers: Box<[LayerState]>,
    clock: C,
    floor: CachePadded<Floor>,
}

impl LayeredLimiter<QuantaClock> {
    /// A layered limiter of `layers`, in order, on the TSC clock.
    pub fn new(layers: Vec<Layer>) -> Result<Self, LayersError> {
        Self::with_clock(layers, QuantaClock::new())
    }
}

// The rollback of a rejected request: this or, compiled with `--cfg ratewell_broken="..."`, the
// deliberately broken one of that name (`broken.rs`), for the loom models to catch.
#[cfg(not(ratewell_broken_protocol))]
use self::refund_taken as rollback;
#[cfg(ratewell_broken_protocol)]
use crate::broken::refund_taken as rollback;

/// Take back every admission in `receipts` at `now`, latest first, and forget them.
pub(crate) fn refund_taken(layers: &[LayerState], receipts: &mut [Option<Receipt>], now: u64) {
    for (layer, receipt) in layers.iter().zip(receipts.iter_mut()).rev() {
        if let Some(receipt) = receipt.take() {
            layer.table.refund_at(&receipt, now);
        }
    }
}

impl<C: Clock> LayeredLimiter<C> {
    /// A layered limiter of `layers`, in order, reading time from `clock`; or why not: no layer,
    /// more than [`MAX_LAYERS`], two with one name, a table that cannot be built.
    pub fn with_clock(layers: Vec<Layer>, clock: C) -> Result<Self, LayersError> {
        if layers.is_empty() {
            return Err(LayersError::NoLayers);
        }
        if layers.len() > MAX_LAYERS {
            return Err(LayersError::TooManyLayers { layers: layers.len() });
        }
        for (i, layer) in layers.iter().enumerate() {
            if layers[..i].iter().any(|other| other.name == layer.name) {
                return Err(LayersError::DuplicateName(layer.name.clone()));
            }
        }
        let layers = layers
            .into_iter()
            .map(|Layer { name, policy, capacity, seed }| {
                match KeyedLimiter::try_with_clock(&policy, capacity, ManualClock::new(0)) {
                    Ok(table) => {
                        let table = match seed {
                            Some(seed) => table.seeded(seed),
                            None => table,
                        };
                        Ok(LayerState { name, policy, table })
                    }
                    Err(error) => Err(LayersError::Capacity { layer: name, error }),
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(LayeredLimiter {
            layers: layers.into_boxed_slice(),
            clock,
            floor: CachePadded::new(Floor::default()),
        })
    }

    /// The number of layers.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    /// Always `false`: a layered limiter has at least one layer.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// Layer `i`'s name.
    pub fn name(&self, i: usize) -> Option<&str> {
        self.layers.get(i).map(|l| l.name.as_str())
    }

    /// Layer `i`'s policy.
    pub fn policy(&self, i: usize) -> Option<&Policy> {
        self.layers.get(i).map(|l| &l.policy)
    }

    /// Layer `i`'s metrics (admissions taken back are in [`Metrics::refunds`]).
    pub fn metrics(&self, i: usize) -> Option<Metrics> {
        self.layers.get(i).map(|l| l.table.metrics())
    }

    /// The clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Decide a request of `cost` (0 is taken as 1) with `keys` (one for every layer, or one per
    /// layer in order) and charge every layer if all admit.
    #[inline]
    pub fn check(
        &self,
        keys: &[&dyn LayerKey],
        cost: u32,
    ) -> Result<LayeredDecision, KeyCountError> {
        let mut out = LayeredDecision::default();
        self.check_into(keys, cost, &mut out)?;
        Ok(out)
    }

    /// [`check`](Self::check) into a decision the caller keeps (and may reuse from one request
    /// to the next): a layered decision is 328 bytes, which `check` initializes and returns by
    /// copy (measured: about 100 of a one-layer `check`'s 352 instructions; see
    /// `benches/README.md`). On an error `out` is left as it was.
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{Layer, LayeredDecision, LayeredLimiter, ManualClock, Policy};
    ///
    /// let layers = vec![Layer::new("api", &"fixed-window limit=2 window=1m".parse::<Policy>()?)];
    /// let limiter = LayeredLimiter::with_clock(layers, ManualClock::new(0))?;
    /// let mut decision = LayeredDecision::default();
    /// for expected in [true, true, false] {
    ///     limiter.check_into(&[&"alice"], 1, &mut decision)?;
    ///     assert_eq!(decision.is_admitted(), expected);
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn check_into(
        &self,
        keys: &[&dyn LayerKey],
        cost: u32,
        out: &mut LayeredDecision,
    ) -> Result<(), KeyCountError> {
        let now = self.floor.now(&self.clock);
        self.take(keys, cost, out, &mut Receipts::default(), false, now)
    }

    /// Decide a batch of requests `(keys, cost)` in order, one decision per request into `out`
    /// (cleared first): the same decisions, charges and refunds as [`check`](Self::check) on
    /// each request in slice order, except that the whole batch is decided at one instant (the
    /// clock is read once). Requests are taken in groups of
    /// [`KeyedLimiter::BATCH_GROUP`], every layer's bucket of a group prefetched before its
    /// first request is decided, so that cold keys' memory accesses overlap.
    ///
    /// A request with a wrong number of keys is an error before anything is decided.
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{Layer, LayerKey, LayeredLimiter, ManualClock, Policy};
    ///
    /// let layers = vec![
    ///     Layer::new("route", &"fixed-window limit=100 window=1m".parse::<Policy>()?),
    ///     Layer::new("ip", &"fixed-window limit=2 window=1m".parse::<Policy>()?),
    /// ];
    /// let limiter = LayeredLimiter::with_clock(layers, ManualClock::new(0))?;
    /// let a: [&dyn LayerKey; 2] = [&"/search", &"10.0.0.1"];
    /// let b: [&dyn LayerKey; 2] = [&"/search", &"10.0.0.2"];
    /// let mut out = Vec::new();
    /// limiter.check_batch(&[(&a, 1), (&b, 1), (&a, 1), (&a, 1)], &mut out)?;
    /// let admitted: Vec<bool> = out.iter().map(|d| d.is_admitted()).collect();
    /// assert_eq!(admitted, [true, true, true, false]);
    /// assert_eq!(out[3].decided_by(), Some(1)); // the ip layer rejected the fourth,
    /// assert_eq!(limiter.metrics(0).unwrap().refunds, 1); // so its route charge came back
    /// assert_eq!(out[3].layer(0).unwrap().remaining(), 97);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check_batch(
        &self,
        requests: &[(&[&dyn LayerKey], u32)],
        out: &mut Vec<LayeredDecision>,
    ) -> Result<(), KeyCountError> {
        for &(keys, _) in requests {
            self.keys(keys)?;
        }
        out.clear();
        out.reserve(requests.len());
        let now = self.floor.now(&self.clock);
        for group in requests.chunks(crate::keyed::GROUP) {
            for &(keys, _) in group {
                self.prefetch(keys)?;
            }
            for &(keys, cost) in group {
                let mut decision = LayeredDecision::default();
                self.take(keys, cost, &mut decision, &mut Receipts::default(), false, now)?;
                out.push(decision);
            }
        }
        Ok(())
    }

    /// Start fetching the table buckets a decision with `keys` reads first, one per layer (a
    /// hint: nothing is decided), for a decision a little later: manual pipelining for a caller
    /// that cannot hand its requests over as one batch (see
    /// [`KeyedLimiter::prehash`]).
    pub fn prefetch(&self, keys: &[&dyn LayerKey]) -> Result<(), KeyCountError> {
        let keys = self.keys(keys)?;
        for (i, layer) in self.layers.iter().enumerate() {
            if let Some(hash) = self.hash(i, keys) {
                layer.table.prefetch_hashed(hash);
            }
        }
        Ok(())
    }

    /// Whether a request is admitted, charging every layer if so: [`check`](Self::check)
    /// without the report, which stops at the first enforcing layer that rejects (the layers
    /// after it are not even peeked).
    #[inline]
    pub fn allow(&self, keys: &[&dyn LayerKey], cost: u32) -> Result<bool, KeyCountError> {
        let keys = self.keys(keys)?;
        let now = self.floor.now(&self.clock);
        let cost = cost.max(1);
        if let [layer] = &*self.layers {
            // One layer: its admission is never taken back, so it needs no receipt.
            let Some(hash) = self.hash(0, keys) else { return Ok(true) };
            return Ok(layer.table.allow_hashed(hash, now, cost) || layer.policy.is_dry_run());
        }
        let mut receipts = Receipts::default();
        for (i, layer) in self.layers.iter().enumerate() {
            let Some(hash) = self.hash(i, keys) else { continue };
            match layer.table.charge_hashed(hash, now, cost) {
                // The last layer's admission is never taken back.
                Some(receipt) if i + 1 < self.layers.len() => receipts.0[i] = Some(receipt),
                Some(_) => {}
                None if layer.policy.is_dry_run() => {}
                None => {
                    rollback(&self.layers[..i], &mut receipts.0[..i], now);
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// Decide without taking anything: every layer's peek (its state as it is), combined as a
    /// decision is.
    pub fn peek(
        &self,
        keys: &[&dyn LayerKey],
        cost: u32,
    ) -> Result<LayeredDecision, KeyCountError> {
        let keys = self.keys(keys)?;
        let now = self.floor.now(&self.clock);
        let cost = cost.max(1);
        let mut out = LayeredDecision::default();
        out.start(self.layers.len());
        for (i, layer) in self.layers.iter().enumerate() {
            let Some(hash) = self.hash(i, keys) else {
                out.skipped |= 1 << i;
                continue;
            };
            out.record(i, layer, layer.table.peek_hashed(hash, now, cost));
        }
        Ok(out)
    }

    /// Take now, settle later: the request's charge on every layer, held by a [`Reservation`]
    /// that [`commit`](Reservation::commit)s it, or takes it back on
    /// [`cancel`](Reservation::cancel) or when dropped uncommitted (the work never ran: a
    /// cancelled future, an upstream that failed before sending anything). A rejected request's
    /// reservation holds nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{Layer, LayeredLimiter, ManualClock, Policy};
    ///
    /// let layers = vec![Layer::new("api", &"fixed-window limit=1 window=1m".parse::<Policy>()?)];
    /// let limiter = LayeredLimiter::with_clock(layers, ManualClock::new(0))?;
    /// let reservation = limiter.reserve(&[&"alice"], 1)?;
    /// assert!(reservation.decision().is_admitted());
    /// drop(reservation); // never committed: the charge comes back
    /// let reservation = limiter.reserve(&[&"alice"], 1)?;
    /// assert!(reservation.decision().is_admitted());
    /// reservation.commit();
    /// assert!(!limiter.check(&[&"alice"], 1)?.is_admitted());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reserve(
        &self,
        keys: &[&dyn LayerKey],
        cost: u32,
    ) -> Result<Reservation<'_, C>, KeyCountError> {
        let (mut decision, mut receipts) = (LayeredDecision::default(), Receipts::default());
        let now = self.floor.now(&self.clock);
        self.take(keys, cost, &mut decision, &mut receipts, true, now)?;
        Ok(Reservation { limiter: self, receipts, decision })
    }

    /// [`reserve`](Self::reserve) holding the limiter by an [`Arc`], for a reservation that
    /// outlives the borrow (one kept in a `'static` future).
    pub fn reserve_owned(
        self: &Arc<Self>,
        keys: &[&dyn LayerKey],
        cost: u32,
    ) -> Result<OwnedReservation<C>, KeyCountError> {
        let (mut decision, mut receipts) = (LayeredDecision::default(), Receipts::default());
        let now = self.floor.now(&self.clock);
        self.take(keys, cost, &mut decision, &mut receipts, true, now)?;
        Ok(OwnedReservation { limiter: Arc::clone(self), receipts, decision })
    }

    /// `keys` if there is one for every layer or one per layer.
    #[inline]
    fn keys<'k>(&self, keys: &'k [&'k dyn LayerKey]) -> Result<Keys<'k>, KeyCountError> {
        match keys.len() {
            1 => Ok(Keys { keys, step: 0 }),
            n if n == self.layers.len() => Ok(Keys { keys, step: 1 }),
            n => Err(KeyCountError { keys: n, layers: self.layers.len() }),
        }
    }

    /// The hash of layer `i`'s key, `None` when it is absent.
    #[inline]
    fn hash(&self, i: usize, keys: Keys<'_>) -> Option<u64> {
        keys.keys[i * keys.step].key_hash(&KeyHasher(self.layers[i].table.hasher()))
    }

    /// The protocol of the module documentation, deciding into `out` and keeping the
    /// admissions in `receipts` (with `keep`, all of them: a reservation's). The layers after a
    /// rejecting one are peeked and the layers refunded are peeked again, so that every layer's
    /// decision is its state's.
    #[inline(always)]
    fn take(
        &self,
        keys: &[&dyn LayerKey],
        cost: u32,
        out: &mut LayeredDecision,
        receipts: &mut Receipts,
        keep: bool,
        now: u64,
    ) -> Result<(), KeyCountError> {
        let keys = self.keys(keys)?;
        out.start(self.layers.len());
        let cost = cost.max(1);
        let mut hashes = [0u64; MAX_LAYERS];
        let mut rejected_at = None;
        for (i, layer) in self.layers.iter().enumerate() {
            let Some(hash) = self.hash(i, keys) else {
                out.skipped |= 1 << i;
                continue;
            };
            hashes[i] = hash;
            if rejected_at.is_some() {
                out.record(i, layer, layer.table.peek_hashed(hash, now, cost));
                continue;
            }
            let (decision, receipt) = layer.table.take_hashed(hash, now, cost);
            out.record(i, layer, decision);
            if decision.is_admitted() || layer.policy.is_dry_run() {
                // Without `keep`, the last layer's admission is never taken back.
                if keep || i + 1 < self.layers.len() {
                    receipts.0[i] = receipt;
                }
                continue;
            }
            rollback(&self.layers[..i], &mut receipts.0[..i], now);
            rejected_at = Some(i);
        }
        if let Some(r) = rejected_at {
            // The layers before it were charged and refunded: report their state now.
            for (i, layer) in self.layers[..r].iter().enumerate() {
                if out.skipped & (1 << i) == 0 {
                    out.record(i, layer, layer.table.peek_hashed(hashes[i], now, cost));
                }
            }
        }
        Ok(())
    }

    /// Take back the admissions of a reservation, at the current instant.
    fn refund(&self, receipts: &mut Receipts) {
        if receipts.is_empty() {
            return;
        }
        let now = self.floor.now(&self.clock);
        refund_taken(&self.layers, &mut receipts.0, now);
    }

    /// The `RateLimit-Policy` field: one item per layer, in order, named by the layer
    /// (draft-ietf-httpapi-ratelimit-headers; see [`Policy::ratelimit_policy_field`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{Layer, LayeredLimiter, ManualClock, Policy};
    ///
    /// let layers = vec![
    ///     Layer::new("burst", &"token-bucket capacity=10 rate=10/s".parse::<Policy>()?),
    ///     Layer::new("daily", &"fixed-window limit=10000 window=1d".parse::<Policy>()?),
    /// ];
    /// let limiter = LayeredLimiter::with_clock(layers, ManualClock::new(0))?;
    /// assert_eq!(limiter.ratelimit_policy_field(), r#""burst";q=10;w=1, "daily";q=10000;w=86400"#);
    /// let d = limiter.check(&[&"alice"], 1)?;
    /// assert_eq!(limiter.ratelimit_field(&d), r#""burst";r=9;t=1, "daily";r=9999;t=86400"#);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn ratelimit_policy_field(&self) -> String {
        let items: Vec<String> =
            self.layers.iter().map(|l| l.policy.ratelimit_policy_field(&l.name)).collect();
        items.join(", ")
    }

    /// The `RateLimit` field of a decision of this limiter: one item per layer that decided it
    /// (skipped layers have none), named by the layer.
    pub fn ratelimit_field(&self, decision: &LayeredDecision) -> String {
        let mut field = String::new();
        self.write_ratelimit_field(decision, &mut field);
        field
    }

    /// [`ratelimit_field`](Self::ratelimit_field) appended to `out` (one buffer, no allocation
    /// of its own: for a field written on every response).
    pub fn write_ratelimit_field(&self, decision: &LayeredDecision, out: &mut String) {
        let mut first = true;
        for (i, layer) in self.layers.iter().enumerate() {
            if let Some(d) = decision.layer(i) {
                if !first {
                    out.push_str(", ");
                }
                first = false;
                d.write_ratelimit_field(&layer.name, out);
            }
        }
    }

    /// Write a snapshot of every layer's keys to `w` while decisions go on (each key's state as
    /// it was at some instant of the snapshot; see [`KeyedLimiter::snapshot`]). Read back with
    /// [`restore`](Self::restore).
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{Layer, LayeredLimiter, ManualClock, Policy};
    ///
    /// let layers = || vec![
    ///     Layer::new("ip", &"token-bucket capacity=5 rate=1/s".parse::<Policy>().unwrap()),
    ///     Layer::new("daily", &"fixed-window limit=100 window=1d".parse::<Policy>().unwrap()),
    /// ];
    /// let limiter = LayeredLimiter::with_clock(layers(), ManualClock::new(0))?;
    /// limiter.check(&[&"192.0.2.7", &"alice"], 3)?;
    /// let mut bytes = Vec::new();
    /// limiter.snapshot(&mut bytes)?;
    ///
    /// let mut restarted = LayeredLimiter::with_clock(layers(), ManualClock::new(0))?;
    /// restarted.restore(&bytes[..])?;
    /// let d = restarted.peek(&[&"192.0.2.7", &"alice"], 1)?;
    /// assert_eq!(d.layer(1).unwrap().remaining(), 97);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn snapshot(&self, mut w: impl std::io::Write) -> std::io::Result<SnapshotInfo> {
        let (bytes, info) = self.snapshot_bytes();
        w.write_all(&bytes)?;
        w.flush()?;
        Ok(info)
    }

    /// [`snapshot`](Self::snapshot) into the file at `path`, replacing it only once the new one
    /// is whole (see [`KeyedLimiter::save`]).
    pub fn save(&self, path: impl AsRef<std::path::Path>) -> std::io::Result<SnapshotInfo> {
        let (bytes, info) = self.snapshot_bytes();
        snapshot::write_file(path.as_ref(), &bytes)?;
        Ok(info)
    }

    fn snapshot_bytes(&self) -> (Vec<u8>, SnapshotInfo) {
        let anchor = std::time::SystemTime::now();
        let wall = snapshot::wall_ns(anchor);
        let now = self.floor.now(&self.clock);
        let mut out = snapshot::Out(Vec::new());
        out.header(snapshot::KIND_LAYERED, self.layers.len() as u8, now, wall);
        let mut keys = 0;
        for layer in self.layers.iter() {
            let (bytes, n) = layer.table.snapshot_bytes(now, wall);
            out.text(&layer.name);
            out.u64(bytes.len() as u64);
            out.bytes(&bytes);
            keys += n;
        }
        out.seal();
        let info = SnapshotInfo { keys, bytes: out.0.len() as u64, anchor };
        (out.0, info)
    }

    /// Replace every layer's keys by a snapshot's, counting the system time that passed since
    /// it was taken. See [`restore_with`](Self::restore_with).
    pub fn restore(&mut self, r: impl std::io::Read) -> Result<Restored, SnapshotError> {
        self.restore_with(r, Resume::WallClock)
    }

    /// [`restore`](Self::restore) from the file at `path`.
    pub fn load(&mut self, path: impl AsRef<std::path::Path>) -> Result<Restored, SnapshotError> {
        self.restore(std::fs::File::open(path)?)
    }

    /// Replace every layer's keys by the snapshot read from `r`, with time passed as `resume`
    /// says, as [`KeyedLimiter::restore_with`] does for one table. Layers are matched by name:
    /// a layer the snapshot does not name starts empty, and a layer of the snapshot this
    /// limiter does not have is ignored (named in [`Restored::ignored_layers`]). Each layer
    /// needs the capacity it was snapshotted with. The whole snapshot is checked before
    /// anything changes: on an error the limiter is as it was.
    pub fn restore_with(
        &mut self,
        r: impl std::io::Read,
        resume: Resume,
    ) -> Result<Restored, SnapshotError> {
        let limit = self
            .layers
            .iter()
            .map(|l| l.table.snapshot_limit())
            .fold(1024u64, |a, b| a.saturating_add(b).saturating_add(65_536));
        let bytes = snapshot::read_all(r, limit)?;
        let (header, mut input) = snapshot::open(&bytes)?;
        if header.kind != snapshot::KIND_LAYERED {
            return Err(SnapshotError::Kind {
                found: snapshot::kind_name(header.kind),
                expected: snapshot::kind_name(snapshot::KIND_LAYERED),
            });
        }
        let mut parsed: Vec<Option<_>> = self.layers.iter().map(|_| None).collect();
        let mut ignored = Vec::new();
        for _ in 0..header.count {
            let name = input.text()?;
            let len = input.u64()?;
            let body = input.take(usize::try_from(len).map_err(|_| SnapshotError::Truncated)?)?;
            match self.layers.iter().position(|l| l.name == name) {
                Some(i) if parsed[i].is_none() => {
                    parsed[i] = Some(self.layers[i].table.parse_snapshot(body)?);
                }
                Some(_) => return Err(SnapshotError::Corrupt("a layer named twice")),
                None => ignored.push(name.to_owned()),
            }
        }
        if !input.is_empty() {
            return Err(SnapshotError::Corrupt("bytes after the last layer"));
        }
        let elapsed = snapshot::elapsed(resume, header.anchor);
        let reading = self.floor.reading(&self.clock);
        let offset = snapshot::offset(header.now, elapsed, reading);
        self.floor.set_offset(offset);
        let now = reading.wrapping_add(offset);
        let mut restored = Restored::default();
        for (layer, parsed) in self.layers.iter_mut().zip(parsed) {
            match parsed {
                Some(parsed) => restored.add(&layer.table.apply_snapshot(parsed, now)),
                None => layer.table.forget_all(),
            }
        }
        restored.elapsed = elapsed.unwrap_or_default();
        restored.ignored_layers = ignored;
        Ok(restored)
    }
}

/// The decision on a request of a [`LayeredLimiter`]: the combined verdict, and each layer's own
/// decision.
///
/// Combined (over the enforcing layers that decided; dry-run layers are reported only per layer
/// and in [`would_reject`](Self::would_reject)): impossible if any layer finds the cost
/// impossible, else rejected if any rejects (or finds its table full), else admitted. Its
/// `limit` and `remaining` are the layer's with the least remaining (the first on ties); its
/// `reset_after` the largest; its `retry_after` the largest over the rejecting layers; its
/// `delay` the largest. A request whose every layer was skipped is admitted, with nothing
/// remaining and nothing to wait for.
#[derive(Clone, Copy, Debug)]
pub struct LayeredDecision {
    layers: [Decision; MAX_LAYERS],
    len: u8,
    /// Bit `i`: layer `i` was skipped (its key absent).
    skipped: u8,
    /// Bit `i`: layer `i` is a dry run.
    dry_run: u8,
    /// Bit `i`: layer `i` is a dry run that would have rejected.
    would_reject: u8,
    /// The enforcing layer whose outcome decides a request it did not admit: the first
    /// impossible one, else the first that rejected, else the first whose table was full.
    rejected_by: Option<u8>,
}

const NOTHING: Decision = Decision::admitted(0, 0, 0, 0);

/// How strongly an outcome decides a request: impossible over rejected over table full.
#[inline]
fn rank(outcome: Outcome) -> u8 {
    match outcome {
        Outcome::Impossible => 3,
        Outcome::Rejected => 2,
        Outcome::TableFull => 1,
        _ => 0,
    }
}

impl Default for LayeredDecision {
    /// A decision of no layer (admitted, nothing remaining): a buffer for
    /// [`LayeredLimiter::check_into`].
    fn default() -> Self {
        LayeredDecision {
            layers: [NOTHING; MAX_LAYERS],
            len: 0,
            skipped: 0,
            dry_run: 0,
            would_reject: 0,
            rejected_by: None,
        }
    }
}

impl LayeredDecision {
    /// Start a decision of `len` layers: every layer's decision is then recorded (or the layer
    /// marked skipped) before it is read.
    #[inline]
    fn start(&mut self, len: usize) {
        self.len = len as u8;
        self.skipped = 0;
        self.dry_run = 0;
        self.would_reject = 0;
        self.rejected_by = None;
    }

    /// Record layer `i`'s decision; an enforcing layer's that is not an admission may be the
    /// one that decides the request (the first of the strongest outcome: see [`rank`]).
    #[inline]
    fn record(&mut self, i: usize, layer: &LayerState, decision: Decision) {
        self.record_as(i, layer.policy.is_dry_run(), decision);
    }

    #[inline]
    fn record_as(&mut self, i: usize, dry_run: bool, decision: Decision) {
        self.layers[i] = decision;
        if decision.is_admitted() {
            if dry_run {
                self.dry_run |= 1 << i;
            }
            return;
        }
        if dry_run {
            self.dry_run |= 1 << i;
            self.would_reject |= 1 << i;
            return;
        }
        let stronger = match self.rejected_by {
            None => true,
            Some(by) => rank(decision.outcome()) > rank(self.layers[usize::from(by)].outcome()),
        };
        if stronger {
            self.rejected_by = Some(i as u8);
        }
    }

    /// The enforcing layers that decided.
    #[inline]
    fn enforcing(&self) -> impl Iterator<Item = (usize, &Decision)> {
        let ignored = self.skipped | self.dry_run;
        self.layers[..usize::from(self.len)]
            .iter()
            .enumerate()
            .filter(move |&(i, _)| ignored & (1 << i) == 0)
    }

    /// The layered decision of layers decided elsewhere (another store deciding the same
    /// layers, such as a Redis script), combined exactly as [`LayeredLimiter`] combines its own:
    /// one `(decision, dry_run)` per layer in order, `None` for a skipped layer (its key absent).
    /// `None` for more than [`MAX_LAYERS`] layers.
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{Decision, LayeredDecision, Outcome};
    ///
    /// let ok = Decision::from_parts(Outcome::Admitted, 10, 4, 600, 0, Some(100));
    /// let no = Decision::from_parts(Outcome::Rejected, 5, 0, 900, 300, Some(300));
    /// let d = LayeredDecision::from_layers([(Some(ok), false), (Some(no), false), (None, false)])
    ///     .expect("three layers");
    /// assert!(!d.is_admitted());
    /// assert_eq!(d.decided_by(), Some(1));
    /// assert_eq!(d.decision().retry_after_ns(), Some(300));
    /// assert!(d.is_skipped(2));
    /// ```
    pub fn from_layers<I>(layers: I) -> Option<Self>
    where
        I: IntoIterator<Item = (Option<Decision>, bool)>,
    {
        let mut out = LayeredDecision::default();
        let mut len = 0;
        for (i, (decision, dry_run)) in layers.into_iter().enumerate() {
            if i >= MAX_LAYERS {
                return None;
            }
            len = i + 1;
            match decision {
                Some(decision) => out.record_as(i, dry_run, decision),
                None => out.skipped |= 1 << i,
            }
        }
        out.len = len as u8;
        Some(out)
    }

    /// The combined decision (see the type's documentation): what to answer the request.
    pub fn decision(&self) -> Decision {
        let Some(least) = self.least() else { return NOTHING };
        let (mut reset, mut delay, mut retry) = (0u64, 0u64, 0u64);
        for (_, d) in self.enforcing() {
            reset = reset.max(d.reset_after_ns());
            delay = delay.max(d.delay_ns());
            retry = retry.max(d.retry_after_ns().unwrap_or(0));
        }
        let base = self.layers[least];
        match self.rejected_by {
            None => base.combined(Outcome::Admitted, reset, delay),
            Some(by) => match self.layers[usize::from(by)].outcome() {
                Outcome::Impossible => base.combined(Outcome::Impossible, reset, 0),
                outcome => base.combined(outcome, reset, retry),
            },
        }
    }

    /// `true` if every enforcing layer admitted the request (it was charged to all of them).
    #[inline]
    pub fn is_admitted(&self) -> bool {
        self.rejected_by.is_none()
    }

    /// The combined outcome.
    pub fn outcome(&self) -> Outcome {
        match self.rejected_by {
            None => Outcome::Admitted,
            Some(by) => self.layers[usize::from(by)].outcome(),
        }
    }

    /// The layer that decided: for a rejection, the first enforcing layer that rejected it (or
    /// found it impossible: that layer first); for an admission, the one with the least
    /// remaining. `None` when every layer was skipped or is a dry run.
    pub fn decided_by(&self) -> Option<usize> {
        match self.rejected_by {
            Some(by) => Some(usize::from(by)),
            None => self.least(),
        }
    }

    /// The enforcing layer with the least remaining (the first on ties).
    fn least(&self) -> Option<usize> {
        let mut least: Option<(usize, u64)> = None;
        for (i, d) in self.enforcing() {
            if least.is_none_or(|(_, r)| d.remaining() < r) {
                least = Some((i, d.remaining()));
            }
        }
        least.map(|(i, _)| i)
    }

    /// Layer `i`'s own decision; `None` for a layer skipped (its key absent) or one beyond the
    /// limiter's.
    pub fn layer(&self, i: usize) -> Option<&Decision> {
        (i < usize::from(self.len) && self.skipped & (1 << i) == 0).then(|| &self.layers[i])
    }

    /// The dry-run layers that would have rejected the request (indices, in order).
    pub fn would_reject(&self) -> impl Iterator<Item = usize> + '_ {
        (0..usize::from(self.len)).filter(|i| self.would_reject & (1 << i) != 0)
    }

    /// Whether layer `i` was skipped (its key absent).
    pub fn is_skipped(&self, i: usize) -> bool {
        self.skipped & (1 << i) != 0
    }

    /// The `Retry-After` value of the combined decision (see [`Decision::retry_after_header`]).
    pub fn retry_after_header(&self) -> Option<String> {
        self.decision().retry_after_header()
    }
}

/// A request's charge on every layer of a [`LayeredLimiter`], not yet settled: see
/// [`LayeredLimiter::reserve`]. Dropping it uncommitted takes the charge back.
#[derive(Debug)]
#[must_use = "dropping a reservation takes its charge back; commit it if the work ran"]
pub struct Reservation<'a, C: Clock = QuantaClock> {
    limiter: &'a LayeredLimiter<C>,
    receipts: Receipts,
    decision: LayeredDecision,
}

impl<C: Clock> Reservation<'_, C> {
    /// The decision the reservation was taken with.
    pub fn decision(&self) -> &LayeredDecision {
        &self.decision
    }

    /// Keep the charge: the work ran.
    pub fn commit(mut self) {
        self.receipts = Receipts::default();
    }

    /// Take the charge back now (what dropping does).
    pub fn cancel(self) {}
}

impl<C: Clock> Drop for Reservation<'_, C> {
    fn drop(&mut self) {
        self.limiter.refund(&mut self.receipts);
    }
}

/// [`Reservation`] holding its limiter by an [`Arc`]: see [`LayeredLimiter::reserve_owned`].
#[derive(Debug)]
#[must_use = "dropping a reservation takes its charge back; commit it if the work ran"]
pub struct OwnedReservation<C: Clock = QuantaClock> {
    limiter: Arc<LayeredLimiter<C>>,
    receipts: Receipts,
    decision: LayeredDecision,
}

impl<C: Clock> OwnedReservation<C> {
    /// The decision the reservation was taken with.
    pub fn decision(&self) -> &LayeredDecision {
        &self.decision
    }

    /// Keep the charge: the work ran.
    pub fn commit(mut self) {
        self.receipts = Receipts::default();
    }

    /// Take the charge back now (what dropping does).
    pub fn cancel(self) {}
}

impl<C: Clock> Drop for OwnedReservation<C> {
    fn drop(&mut self) {
        self.limiter.refund(&mut self.receipts);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        // What the documentation of `check_into` and benches/README.md quote.
        assert_eq!(std::mem::size_of::<LayeredDecision>(), 328);
        assert_eq!(std::mem::size_of::<Option<Receipt>>(), 40);
    }
}
