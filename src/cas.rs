//! The one CAS loop that applies a pure decision to an atomic state word.
//!
//! # Memory ordering
//!
//! A state word holds the whole state of its key and publishes no other memory: no reader of the
//! word goes on to read data written before the word was stored. So a successful exchange is
//! `Relaxed`: the atomicity of `compare_exchange` alone gives what the limiter promises. All
//! read-modify-writes of one word are totally ordered (its modification order), each decision is
//! computed from the value it replaces, and none is lost. The loads are `Acquire` only for the key
//! table, whose slots can change owner: a load that sees a word installed for a new owner must also
//! see the owner's key (see `keyed/table.rs`, *No ABA*). The loom models in `loom-tests/` check both.
//!
//! A rejection returns before any write, so a key under attack is only read: its cache line stays
//! shared between cores.

use crate::algorithms::{Algorithm, OneWord, dispatch};
use crate::decision::Decision;
use crate::sync::{AtomicU64, Ordering};

/// The outcome of [`apply_masked`].
pub(crate) enum Applied<R> {
    Done(R),
    /// `still_ours` said the word changed owner: look the key up again.
    Moved,
}

// The CAS loop the limiters run: the one below or, compiled with `--cfg ratewell_broken="..."`, the
// deliberately broken one of that name (`broken.rs`), for the loom models to catch.
#[cfg(not(ratewell_broken_protocol))]
use self::apply_masked as cas;
#[cfg(ratewell_broken_protocol)]
use crate::broken::apply_masked as cas;

/// What a decision reports: the full [`Decision`], or only whether it was admitted (the lean
/// `allow` paths, from which the compiler drops the decision's arithmetic).
pub(crate) trait Report: Sized {
    /// Decide `cost` at `now` on the unmasked state `word`, inlined into the caller's loop.
    fn decide<A: OneWord>(algorithm: &A, word: u64, now: u64, cost: u32) -> (Self, Option<u64>);
    /// The same through the algorithm's dispatch, for the cold paths (a new key).
    fn decide_cold(algorithm: &Algorithm, word: u64, now: u64, cost: u32) -> (Self, Option<u64>);
    /// A new key refused for want of a slot.
    fn refused(limit: u64, retry_after: u64) -> Self;
    /// The report of a decision made in full (the sliding log's).
    fn from_decision(decision: Decision) -> Self;
    /// The report of a decision made in full with what taking it back needs (the keyed sliding
    /// log's).
    #[inline]
    fn from_taken(taken: Taken) -> Self {
        Self::from_decision(taken.decision)
    }
    /// The report of a decision on a key stored under the registry's policy `idx`.
    #[inline(always)]
    fn owned_by(self, _idx: u8) -> Self {
        self
    }
}

/// Only whether a request was admitted, with what taking it back needs: the lean report of the
/// layered limiter's `allow`, from which the compiler drops the decision's arithmetic.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Charged {
    /// `(before, after)`, as in [`Taken`]; `None` when not admitted.
    pub(crate) charge: Option<(u64, u64)>,
    pub(crate) idx: u8,
}

impl Report for Charged {
    #[inline(always)]
    fn decide<A: OneWord>(algorithm: &A, word: u64, now: u64, cost: u32) -> (Self, Option<u64>) {
        let next = algorithm.admit_inline(word, now, cost);
        (Charged { charge: next.map(|next| (word, next)), idx: 0 }, next)
    }
    fn decide_cold(algorithm: &Algorithm, word: u64, now: u64, cost: u32) -> (Self, Option<u64>) {
        let next = algorithm.admit(word, now, cost);
        (Charged { charge: next.map(|next| (word, next)), idx: 0 }, next)
    }
    fn refused(_: u64, _: u64) -> Self {
        Charged { charge: None, idx: 0 }
    }
    fn from_decision(_: Decision) -> Self {
        Charged { charge: None, idx: 0 }
    }
    fn from_taken(taken: Taken) -> Self {
        Charged { charge: taken.charge, idx: taken.idx }
    }
    #[inline(always)]
    fn owned_by(self, idx: u8) -> Self {
        Charged { idx, ..self }
    }
}

/// A decision, with what taking it back needs when it was admitted: the report of the layered
/// limiter, which may have to refund it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Taken {
    pub(crate) decision: Decision,
    /// `(before, after)`: the state the admission replaced and the one it stored (for the
    /// sliding log, `after` is the time of the request's entry).
    pub(crate) charge: Option<(u64, u64)>,
    /// The registry's index of the policy the key was decided under.
    pub(crate) idx: u8,
}

impl Report for Taken {
    #[inline(always)]
    fn decide<A: OneWord>(algorithm: &A, word: u64, now: u64, cost: u32) -> (Self, Option<u64>) {
        let (decision, next) = algorithm.decide_inline(word, now, cost);
        (Taken { decision, charge: next.map(|next| (word, next)), idx: 0 }, next)
    }
    fn decide_cold(algorithm: &Algorithm, word: u64, now: u64, cost: u32) -> (Self, Option<u64>) {
        let (decision, next) = algorithm.decide(word, now, cost);
        (Taken { decision, charge: next.map(|next| (word, next)), idx: 0 }, next)
    }
    fn refused(limit: u64, retry_after: u64) -> Self {
        Taken { decision: Decision::table_full(limit, retry_after), charge: None, idx: 0 }
    }
    fn from_decision(decision: Decision) -> Self {
        Taken { decision, charge: None, idx: 0 }
    }
    fn from_taken(taken: Taken) -> Self {
        taken
    }
    #[inline(always)]
    fn owned_by(self, idx: u8) -> Self {
        Taken { idx, ..self }
    }
}

impl Report for Decision {
    #[inline(always)]
    fn decide<A: OneWord>(algorithm: &A, word: u64, now: u64, cost: u32) -> (Self, Option<u64>) {
        algorithm.decide_inline(word, now, cost)
    }
    fn decide_cold(algorithm: &Algorithm, word: u64, now: u64, cost: u32) -> (Self, Option<u64>) {
        algorithm.decide(word, now, cost)
    }
    fn refused(limit: u64, retry_after: u64) -> Self {
        Decision::table_full(limit, retry_after)
    }
    #[inline]
    fn from_decision(decision: Decision) -> Self {
        decision
    }
}

impl Report for bool {
    #[inline(always)]
    fn decide<A: OneWord>(algorithm: &A, word: u64, now: u64, cost: u32) -> (Self, Option<u64>) {
        let next = algorithm.admit_inline(word, now, cost);
        (next.is_some(), next)
    }
    fn decide_cold(algorithm: &Algorithm, word: u64, now: u64, cost: u32) -> (Self, Option<u64>) {
        let next = algorithm.admit(word, now, cost);
        (next.is_some(), next)
    }
    fn refused(_: u64, _: u64) -> Self {
        false
    }
    #[inline]
    fn from_decision(decision: Decision) -> Self {
        decision.is_admitted()
    }
}

/// [`apply_masked`] for a one-word `algorithm`: one match on the algorithm, then a CAS loop
/// compiled for it, with its decision inlined.
///
/// Always inlined: with `#[inline]` alone LLVM keeps the keyed `check`'s instance out of line
/// (the keyed table has several callers), and every hit pays the call and its spills. Inlined,
/// `keyed/ratewell/1000` takes 34.7 ns against 37.1 ns (medians of three alternating runs,
/// `benches/results/keyed-2026-12-05-ab-*.txt`), for 3 more instructions per hit.
#[inline(always)]
pub(crate) fn apply_algorithm<R: Report>(
    algorithm: &Algorithm,
    word: &AtomicU64,
    mask: u64,
    still_ours: impl Fn() -> bool,
    now: u64,
    cost: u32,
) -> Applied<R> {
    dispatch!(algorithm, a => cas(|w| R::decide(a, w, now, cost), word, mask, still_ours))
}

/// Decide a request against the word with `decide` (from the unmasked state to the report and,
/// if admitted, the next state), and store the new state if admitted. The word stores
/// `state ^ mask`; `still_ours` is asked after every load.
#[inline]
pub(crate) fn apply_masked<R>(
    decide: impl Fn(u64) -> (R, Option<u64>),
    word: &AtomicU64,
    mask: u64,
    still_ours: impl Fn() -> bool,
) -> Applied<R> {
    let mut current = word.load(Ordering::Acquire);
    loop {
        if !still_ours() {
            return Applied::Moved;
        }
        let (report, next) = decide(current ^ mask);
        let Some(next) = next else { return Applied::Done(report) };
        // `compare_exchange_weak` may fail spuriously; the loop recomputes from the value it
        // returns, which is the freshest one anyway.
        match word.compare_exchange_weak(current, next ^ mask, Ordering::Relaxed, Ordering::Acquire)
        {
            Ok(_) => return Applied::Done(report),
            Err(actual) => current = actual,
        }
    }
}

/// Take back a charge of `cost` that turned the unmasked state `before` into `after`, on the
/// word storing `state ^ mask` (see [`crate::algorithms::OneWord::refund`]); `false` if
/// `still_ours` said the word changed owner (the key is gone: nothing to give back).
pub(crate) fn refund_masked(
    algorithm: &Algorithm,
    word: &AtomicU64,
    mask: u64,
    still_ours: impl Fn() -> bool,
    now: u64,
    (before, after, cost): (u64, u64, u32),
) -> bool {
    let give_back = |w: u64| {
        let next = algorithm.refund(w, now, before, after, cost);
        ((), (next != w).then_some(next))
    };
    matches!(cas(give_back, word, mask, still_ours), Applied::Done(()))
}

/// The direct limiter's case: an unmasked word that never changes owner, of a one-word
/// algorithm the caller has already matched.
#[inline]
pub(crate) fn apply_one<R: Report, A: OneWord>(
    algorithm: &A,
    word: &AtomicU64,
    now: u64,
    cost: u32,
) -> R {
    match cas(|w| R::decide(algorithm, w, now, cost), word, 0, || true) {
        Applied::Done(report) => report,
        Applied::Moved => unreachable!("a direct limiter's word has one owner"),
    }
}

/// Decide without taking anything, reporting the state as it is.
#[inline]
pub(crate) fn peek(algorithm: &Algorithm, word: &AtomicU64, now: u64, cost: u32) -> Decision {
    algorithm.peek(word.load(Ordering::Relaxed), now, cost)
}
