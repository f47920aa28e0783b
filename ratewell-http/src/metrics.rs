//! Counters of what the layer decided, per layer, readable at any time.
//!
//! Every request adds to a few counters. One counter shared by every thread would be a cache line
//! they pass back and forth on every request; so each thread adds to one of [`STRIPES`]
//! cache-padded blocks of counters (picked once per thread), and a read sums the blocks. Each
//! total is exact; a read may miss the requests being decided meanwhile.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use ratewell::MAX_LAYERS;

/// Blocks of counters; threads beyond this many share blocks (still exact: `fetch_add`).
const STRIPES: usize = 16;

/// Counters of one layer, in a block (its admissions are the engine's own count, which a
/// decision keeps without a read-modify-write).
const REJECTED: usize = 0;
const WOULD_REJECT: usize = 1;
const SKIPPED: usize = 2;
const ABSENT_REJECTED: usize = 3;
const PER_LAYER: usize = 4;
/// Counters of the whole layer, after the layers'.
const GLOBAL: usize = MAX_LAYERS * PER_LAYER;
pub(crate) const FORWARDED_UNTRUSTED: usize = GLOBAL;
pub(crate) const FORWARDED_MALFORMED: usize = GLOBAL + 1;
pub(crate) const MISSING_PEER: usize = GLOBAL + 2;
pub(crate) const DELAYED: usize = GLOBAL + 3;
pub(crate) const DELAY_REFUNDS: usize = GLOBAL + 4;
const COUNTERS: usize = GLOBAL + 5;

#[repr(align(128))]
struct Block([AtomicU64; COUNTERS]);

pub(crate) struct Counters {
    blocks: Box<[Block]>,
}

static NEXT_STRIPE: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static STRIPE: Cell<usize> = const { Cell::new(usize::MAX) };
}

fn stripe() -> usize {
    STRIPE.with(|s| {
        let mut i = s.get();
        if i == usize::MAX {
            i = NEXT_STRIPE.fetch_add(1, Ordering::Relaxed) % STRIPES;
            s.set(i);
        }
        i
    })
}

impl Counters {
    pub(crate) fn new() -> Self {
        Counters {
            blocks: (0..STRIPES)
                .map(|_| Block(std::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
        }
    }

    #[inline]
    pub(crate) fn add(&self, counter: usize) {
        self.blocks[stripe()].0[counter].fetch_add(1, Ordering::Relaxed);
    }

    #[inline]
    pub(crate) fn layer(&self, layer: usize, counter: LayerCounter) {
        self.add(layer * PER_LAYER + counter as usize);
    }

    fn sum(&self, counter: usize) -> u64 {
        self.blocks.iter().map(|b| b.0[counter].load(Ordering::Relaxed)).sum()
    }

    pub(crate) fn read(&self, names: impl Iterator<Item = (String, ratewell::Metrics)>) -> Metrics {
        let layers = names
            .enumerate()
            .map(|(i, (name, table))| LayerMetrics {
                name,
                admitted: table.admitted,
                refunded: table.refunds,
                rejected: self.sum(i * PER_LAYER + REJECTED),
                would_reject: self.sum(i * PER_LAYER + WOULD_REJECT),
                skipped: self.sum(i * PER_LAYER + SKIPPED),
                absent_rejected: self.sum(i * PER_LAYER + ABSENT_REJECTED),
                keys: table.keys,
                capacity: table.capacity,
                evictions: table.evictions,
            })
            .collect();
        Metrics {
            layers,
            forwarded_untrusted: self.sum(FORWARDED_UNTRUSTED),
            forwarded_malformed: self.sum(FORWARDED_MALFORMED),
            missing_peer: self.sum(MISSING_PEER),
            delayed: self.sum(DELAYED),
            delay_refunds: self.sum(DELAY_REFUNDS),
        }
    }
}

#[derive(Clone, Copy)]
pub(crate) enum LayerCounter {
    Rejected = REJECTED as isize,
    WouldReject = WOULD_REJECT as isize,
    Skipped = SKIPPED as isize,
    AbsentRejected = ABSENT_REJECTED as isize,
}

/// What a [`HttpLimiter`](crate::HttpLimiter) has decided since it was built (every clone
/// counts into the same totals).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Metrics {
    /// Per layer, in order.
    pub layers: Vec<LayerMetrics>,
    /// Requests whose peer is not a trusted proxy but sent a forwarding header (ignored: the
    /// peer is the key; a spoofing attempt, or a proxy missing from the trusted set).
    pub forwarded_untrusted: u64,
    /// Requests from a trusted proxy whose forwarding header was malformed or too long (the
    /// peer is the key).
    pub forwarded_malformed: u64,
    /// Requests with no peer address in their extensions (client-address keys absent).
    pub missing_peer: u64,
    /// Requests that waited a delaying leaky bucket's delay before the inner service.
    pub delayed: u64,
    /// Delayed requests dropped before reaching the inner service (their charge refunded).
    pub delay_refunds: u64,
}

/// What one layer decided.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LayerMetrics {
    /// The layer's name.
    pub name: String,
    /// Requests this layer admitted (and charged), including those taken back in `refunded`.
    pub admitted: u64,
    /// Admissions taken back: another layer rejected the request, or it was dropped while it
    /// waited its delay.
    pub refunded: u64,
    /// Requests this layer rejected (with all-or-nothing layers, a request rejected by an earlier
    /// layer is counted here too if this layer would have rejected it).
    pub rejected: u64,
    /// Requests this layer would have rejected, let through because it (or the whole layer) is a
    /// dry run.
    pub would_reject: u64,
    /// Requests without this layer's key that it skipped.
    pub skipped: u64,
    /// Requests without this layer's key that it rejected (with [`Absent::Reject`](crate::Absent)).
    pub absent_rejected: u64,
    /// Keys holding state in the layer's table now.
    pub keys: u64,
    /// Keys the layer's table can hold: its memory bound.
    pub capacity: u64,
    /// Live keys evicted to make room.
    pub evictions: u64,
}
