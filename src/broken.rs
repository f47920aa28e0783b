//! Deliberately broken protocols, compiled only with `--cfg ratewell_broken="VARIANT"` to show
//! that the loom models in `loom-tests/` catch each break (there, the models that must catch it
//! are `should_panic`).
//!
//! Each step of the protocol that a variant breaks has its real function beside its use, and here
//! a function of the same name and signature: the broken one when its variant is selected, else
//! the real one. The variants are listed once, in `broken/variants.txt`, which the build script
//! (check-cfg), `loom-tests` and `.ci/run` read.

use crate::algorithms::sliding_log::{Log, SlidingLog};
use crate::cas::{self, Applied};
use crate::decision::Decision;
use crate::keyed::table::{self, Place, Slot, Table};
use crate::sync::{AtomicU64, Mutex, Ordering, lock};

/// The CAS loop (`cas.rs`).
///
/// - `store`: a plain store instead of the compare-exchange (lost updates);
/// - `reject_writes`: a rejection writes back the state it read (a lost admission when another
///   thread admitted in between);
/// - `no_revalidate`: the key word is not re-checked after loading a state (a state of the slot's
///   next owner is decided as this key's).
#[inline]
pub(crate) fn apply_masked<R>(
    decide: impl Fn(u64) -> (R, Option<u64>),
    word: &AtomicU64,
    mask: u64,
    still_ours: impl Fn() -> bool,
) -> Applied<R> {
    if cfg!(ratewell_broken = "store") {
        if !still_ours() {
            return Applied::Moved;
        }
        let (report, next) = decide(word.load(Ordering::Acquire) ^ mask);
        if let Some(next) = next {
            word.store(next ^ mask, Ordering::Relaxed);
        }
        Applied::Done(report)
    } else if cfg!(ratewell_broken = "reject_writes") {
        let current = word.load(Ordering::Acquire);
        let rejected = |current| {
            if !still_ours() {
                return None;
            }
            let (report, next) = decide(current ^ mask);
            Some((report, next.is_none()))
        };
        match rejected(current) {
            Some((report, true)) => {
                word.store(current, Ordering::Relaxed);
                Applied::Done(report)
            }
            _ => cas::apply_masked(&decide, word, mask, &still_ours),
        }
    } else if cfg!(ratewell_broken = "no_revalidate") {
        cas::apply_masked(decide, word, mask, || true)
    } else {
        cas::apply_masked(decide, word, mask, still_ours)
    }
}

/// The mask of a key's stored state (`table.rs`). `no_mask`: every key's state is stored as it
/// is, so a decision that loaded the state of the slot's previous owner can succeed on it.
#[inline]
pub(crate) fn mask_of(secret: u64, key: u64) -> u64 {
    if cfg!(ratewell_broken = "no_mask") { 0 } else { table::mask_of(secret, key) }
}

/// The re-scan under the shard lock before an insert (`table.rs`). `no_rescan`: none, so two
/// threads inserting one new key store it twice.
pub(crate) fn present(table: &Table, place: Place) -> table::Rescan<'_> {
    if cfg!(ratewell_broken = "no_rescan") {
        table::Rescan::Absent { free: None }
    } else {
        table::present(table, place)
    }
}

/// The lock taken after a lock-free miss (`table.rs`). `unsettled_miss`: none, so a lookup
/// that runs while its key is moved between buckets takes the key for absent.
pub(crate) fn confirm_miss(table: &Table, place: Place) -> Option<(&Slot, u64)> {
    if cfg!(ratewell_broken = "unsettled_miss") { None } else { table::confirm_miss(table, place) }
}

/// Taking the state out of a slot a key is moved from (`table.rs`). `move_unfrozen`: read, not
/// swapped, so a decider that loaded it before the move still lands its exchange on the vacated
/// slot, and the admission is lost with it.
pub(crate) fn take_state(state: &AtomicU64) -> u64 {
    if cfg!(ratewell_broken = "move_unfrozen") {
        state.load(Ordering::Acquire)
    } else {
        table::take_state(state)
    }
}

/// The lock a snapshot holds while it reads a shard (`table.rs`). `snapshot_unlocked`: none,
/// so a key being moved between its buckets is in neither when the snapshot passes, and is lost.
pub(crate) fn snapshot_guard(t: &Table, shard: usize) -> Option<table::ShardGuard<'_>> {
    if cfg!(ratewell_broken = "snapshot_unlocked") { None } else { table::snapshot_guard(t, shard) }
}

/// A sliding log's decision (`limiter.rs`). `log_split_lock`: checked under one lock and logged
/// under another, so two threads can both pass the check for the last unit.
pub(crate) fn log_under_one_lock(
    a: &SlidingLog,
    log: &Mutex<Log>,
    now: u64,
    cost: u32,
) -> Decision {
    if !cfg!(ratewell_broken = "log_split_lock") {
        return crate::limiter::log_under_one_lock(a, log, now, cost);
    }
    let decision = a.decide(&mut *lock(log), now, cost, false);
    if decision.is_admitted() {
        a.decide(&mut *lock(log), now, cost, true);
    }
    decision
}

/// The rollback of a rejected layered request (`layered/limiter.rs`).
///
/// - `no_refund`: the layers that admitted before the rejecting one keep their charges.
pub(crate) fn refund_taken(
    layers: &[crate::layered::LayerState],
    receipts: &mut [Option<crate::keyed::Receipt>],
    now: u64,
) {
    if cfg!(ratewell_broken = "no_refund") {
        receipts.iter_mut().for_each(|r| *r = None);
    } else {
        crate::layered::limiter::refund_taken(layers, receipts, now)
    }
}
