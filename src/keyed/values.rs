//! The values [`KeyedLimiter`]'s methods take and return: a registered policy's id
//! ([`PolicyId`]), an admission to refund ([`Charge`]), and the counters ([`Metrics`]).

use super::Receipt;
#[cfg(doc)]
use super::{KeyedLimiter, OnFull, Request};
use crate::policy::Policy;

/// A policy registered with a keyed limiter ([`KeyedLimiter::register`]), for decisions that
/// name their policy per call ([`Request::policy`], [`Request::within`]). Not `Clone`: it is
/// handed back once, to [`KeyedLimiter::release`].
#[derive(Debug, PartialEq, Eq)]
pub struct PolicyId {
    pub(super) idx: u8,
    pub(super) word: u32,
    /// Which limiter registered it (the address of its registry's slots, stable for its life).
    pub(super) owner: usize,
    pub(super) policy: Policy,
}

impl PolicyId {
    /// The policy registered.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }
}

/// An admission made by [`Request::take`], which [`KeyedLimiter::refund`] takes
/// back: what several decisions that stand or fall together need when a later one rejects.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "an admission is kept unless refunded; drop the charge to keep it"]
pub struct Charge {
    pub(super) receipt: Receipt,
    pub(super) owner: usize,
}

/// Counters of a keyed limiter. Reading them sums per-shard and per-thread cells; updating them
/// writes no line shared between threads (see [`KeyedLimiter::metrics`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Metrics {
    /// Keys holding state now.
    pub keys: u64,
    /// Keys the table can hold (the configured capacity rounded up to whole buckets).
    pub capacity: u64,
    /// Bytes of per-key storage: for the one-word algorithms, 16 bytes a key, allocated up front
    /// (plus a fixed overhead of a few KiB); for the sliding log, what is allocated now for its
    /// keys (a node and an index entry, about 80 bytes) and their logs (16 bytes an entry), which
    /// grows with use up to the capacity in keys and the limit in entries per key, and never
    /// beyond.
    pub memory_bytes: u64,
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
    /// Admitted decisions (every verb that takes, not `peek`).
    pub admitted: u64,
    /// Rejected and impossible decisions (every verb that takes, not `peek`).
    pub rejected: u64,
    /// Admissions taken back by a [`LayeredLimiter`](crate::LayeredLimiter) (another layer
    /// rejected the request, or a reservation was cancelled) on a key that still held them (not
    /// evicted, reset or moved to another policy since); they stay counted in `admitted`.
    pub refunds: u64,
}
