//! Layered limits: one request checked against several limits, admitted by all of them or
//! charged to none.
//!
//! One concern per file:
//!
//! - this file: the layers ([`Layer`], at most [`MAX_LAYERS`]), the errors of building a
//!   limiter ([`LayersError`]) and of a request's keys ([`KeyCountError`]), and the keys of a
//!   request ([`LayerKey`], [`KeyHasher`], [`Absent`]);
//! - `limiter.rs`: [`LayeredLimiter`] and its protocol (taking on every layer, dry runs, the
//!   refund of a rejected request), documented there with what holds under concurrency;
//! - `decision.rs`: [`LayeredDecision`], the combined verdict, and the `RateLimit` and
//!   `RateLimit-Policy` fields of a layered limiter;
//! - `reservation.rs`: the reservation guards ([`Reservation`], [`OwnedReservation`]);
//! - `snapshot.rs`: snapshot and restore of a layered limiter's keys.

use std::fmt;
use std::hash::Hash;

use crate::clock::ManualClock;
use crate::keyed::{CapacityError, KeyedLimiter};
use crate::policy::Policy;

mod decision;
pub(crate) mod limiter;
mod reservation;
mod snapshot;

pub use decision::LayeredDecision;
pub use limiter::LayeredLimiter;
pub use reservation::{OwnedReservation, Reservation};

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
    /// [`Builder::seed`](crate::Builder::seed), and its caveat for keys clients choose).
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
