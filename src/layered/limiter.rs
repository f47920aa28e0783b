//! [`LayeredLimiter`]: building it, and its protocol (deciding a request on every layer, and
//! refunding the layers a rejected request was charged).
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

use crossbeam_utils::CachePadded;

use super::{
    KeyCountError, KeyHasher, Layer, LayerKey, LayerState, LayeredDecision, LayersError, MAX_LAYERS,
};
use crate::clock::{Clock, Floor, ManualClock, QuantaClock};
use crate::keyed::{KeyedLimiter, Metrics, Receipt};
use crate::policy::Policy;

/// A request's keys: `keys[i * step]` is layer `i`'s.
#[derive(Clone, Copy)]
struct Keys<'k> {
    keys: &'k [&'k dyn LayerKey],
    step: usize,
}

/// The admissions a request holds, to take back: one receipt per layer at most.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Receipts(pub(super) [Option<Receipt>; MAX_LAYERS]);

impl Receipts {
    pub(super) fn is_empty(&self) -> bool {
        self.0.iter().all(Option::is_none)
    }
}

/// Several limits on one request, all or nothing: per client address, per API key, per route,
/// or several bands on one key (`10/s` and `1000/h`). See the module documentation of
/// `src/layered/limiter.rs` for the protocol and what it guarantees under concurrency.
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
    pub(super) layers: Box<[LayerState]>,
    pub(super) clock: C,
    pub(super) floor: CachePadded<Floor>,
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
                    Ok(mut table) => {
                        if let Some(seed) = seed {
                            table.reseed(seed);
                        }
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
    /// [`Request::prefetch`](crate::Request::prefetch)).
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
    pub(super) fn take(
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
