//! The one-word table as a [`Store`]: decisions (the inlined hot path, the out-of-line rest,
//! batch groups), peeks, refunds, resets, reclaims, stats, and moving keys off retired policies.

use super::{
    EMPTY, FP_BITS, FP_MASK, OnFull, Place, SLOTS_PER_BUCKET, Slot, TOMBSTONE, Table, TableStats,
    key_word, mix,
};
use crate::algorithms::convert;
use crate::cas::{Report, refund_masked};
use crate::decision::Decision;
use crate::keyed::registry::Policies;
use crate::keyed::{GROUP, Receipt, Store};
use crate::sync::Ordering;
use std::sync::atomic::AtomicU64 as StdAtomicU64;

impl Table {
    /// Everything but the fast path: a key in its second bucket, a new key, a key on a retired
    /// policy, a slot that changed owner meanwhile.
    #[cold]
    #[inline(never)]
    fn decide_slow<R: Report, P: Policies>(
        &self,
        policies: &P,
        hash: u64,
        now: u64,
        cost: u32,
        mut first_missed: bool,
    ) -> R {
        let place = self.place(hash);
        loop {
            // After a lock-free miss in the first bucket, the second is looked in alone (a key
            // inserted there meanwhile is found by the insert's scan under the shard lock).
            let found = if first_missed { self.find_second(place) } else { self.find(place) };
            first_missed = false;
            let Some((slot, key)) = found else {
                match self.insert_slow(policies, place, now, cost) {
                    Some(decision) => return decision,
                    None => continue,
                }
            };
            let idx = (key >> FP_BITS) as u8;
            let Some(algorithm) = policies.deciding(idx) else {
                self.migrate_at(policies, place, now);
                continue;
            };
            if let Some(report) = self.apply(algorithm, slot, key, now, cost) {
                return report;
            }
        }
    }

    /// Move the key at `place` (if present) to the policy `resolve` now gives it, keeping what
    /// it consumed ([`convert`]).
    #[cold]
    #[inline(never)]
    pub(crate) fn migrate_at<P: Policies>(&self, policies: &P, place: Place, now: u64) {
        loop {
            // Resolved before the shard lock (resolving may take the registry's lock, which a
            // sweep holds while it takes shard locks), and checked under it.
            let (idx, token) = policies.resolve(place.fp);
            let _guard = self.lock_shard(place.shard);
            if !policies.still(idx, token) {
                continue;
            }
            let Some((slot, key)) = self.find(place) else { return };
            self.convert_slot(policies, slot, key, idx, now);
            return;
        }
    }

    /// Under the shard lock: store the key of `slot` (key word `key`) under slot `idx`, its state
    /// converted. Nothing to do if it is there already.
    fn convert_slot<P: Policies>(&self, policies: &P, slot: &Slot, key: u64, idx: u8, now: u64) {
        let from = (key >> FP_BITS) as u8;
        let Some(to) = policies.algorithm(idx) else { return };
        if from == idx {
            return;
        }
        let new_key = key_word(idx, key & FP_MASK);
        loop {
            let stored = slot.state.load(Ordering::Acquire);
            let word = match policies.previous(from) {
                Some(from) => convert(from, to, stored ^ self.mask(key), now),
                None => 0,
            };
            if self.replace(slot, key, stored, new_key, word) {
                return;
            }
        }
    }
}

impl Store for Table {
    fn set_on_full(&mut self, on_full: OnFull) {
        self.on_full = on_full;
    }

    /// Mask states with a new secret; every key is forgotten (its stored state would unmask to
    /// garbage).
    fn reseed(&mut self, secret: u64) {
        self.secret = mix(secret) | 1;
        if self.stats().len == 0 {
            return;
        }
        for slot in self.buckets.iter().flat_map(|b| &b.slots) {
            slot.key.store(EMPTY, Ordering::Relaxed);
            slot.state.store(0, Ordering::Relaxed);
        }
        for shard in self.shards.iter() {
            shard.len.store(0, Ordering::Relaxed);
        }
    }

    /// The fingerprint stored for `hash`.
    fn fingerprint(&self, hash: u64) -> u64 {
        self.place(hash).fp
    }

    /// Slots in the table: the capacity, rounded up to whole buckets.
    fn capacity(&self) -> u64 {
        self.shards.len() as u64 * self.buckets_per_shard * SLOTS_PER_BUCKET as u64
    }

    /// Bytes of slot storage (the buckets; the fixed per-table overhead is not counted).
    fn memory_bytes(&self) -> u64 {
        self.capacity() * 16
    }

    /// Decide a request for the key with hash `hash`; take it if admitted.
    ///
    /// Inlined: a key in its first bucket, on a live policy, whose slot keeps its owner. The rest
    /// is [`decide_slow`](Self::decide_slow).
    #[inline]
    fn decide<R: Report, P: Policies>(&self, policies: &P, hash: u64, now: u64, cost: u32) -> R {
        let place = self.place(hash);
        let Some((slot, key)) = self.find_in(place, place.b1) else {
            return self.decide_slow(policies, hash, now, cost, true);
        };
        let idx = (key >> FP_BITS) as u8;
        if let Some(algorithm) = policies.deciding(idx) {
            if let Some(report) = self.apply(algorithm, slot, key, now, cost) {
                return report;
            }
        }
        self.decide_slow(policies, hash, now, cost, false)
    }

    /// The first cache line of the key's first bucket: slots 0-3, which a bucket fills first
    /// (the second line comes with it when the adjacent-line prefetcher fetches the pair).
    /// Prefetching both lines measured slower (`benches/README.md`, *Batches*): twice the
    /// misses in flight for a group, more than the core keeps.
    #[inline(always)]
    fn prefetch(&self, hash: u64) {
        crate::mem::prefetch(&self.buckets[self.place(hash).b1].slots[0]);
    }

    /// The group's first buckets are scanned (their lines prefetched by the caller, so the
    /// scans' misses overlap), then each request decided in order: on the slot the scan found
    /// if it still holds the key (a request before it may have inserted a key and moved this
    /// one), else on the out-of-line path, as a single decision would.
    #[inline]
    fn decide_group<R: Report, P: Policies>(
        &self,
        policies: &P,
        group: &[(u64, u32)],
        now: u64,
        mut each: impl FnMut(R),
    ) {
        let mut found = [None; GROUP];
        for (found, &(hash, _)) in found.iter_mut().zip(group) {
            let place = self.place(hash);
            *found = self.find_in(place, place.b1);
        }
        for (found, &(hash, cost)) in found.iter().zip(group) {
            let report = found.and_then(|(slot, key)| {
                let idx = (key >> FP_BITS) as u8;
                let algorithm = policies.deciding(idx)?;
                self.apply(algorithm, slot, key, now, cost)
            });
            each(report.unwrap_or_else(|| self.decide_slow(policies, hash, now, cost, false)));
        }
    }

    /// Decide a request for the key with hash `hash` without taking anything, reporting the
    /// key's state as it is (a new key's: fresh).
    fn peek<P: Policies>(&self, policies: &P, hash: u64, now: u64, cost: u32) -> Decision {
        let place = self.place(hash);
        loop {
            let Some((slot, key)) = self.find_settled(place) else {
                let (idx, _) = policies.resolve(place.fp);
                let Some(algorithm) = policies.algorithm(idx) else { continue };
                return algorithm.peek(0, now, cost);
            };
            let idx = (key >> FP_BITS) as u8;
            let Some(algorithm) = policies.deciding(idx) else {
                self.migrate_at(policies, place, now);
                continue;
            };
            let stored = slot.state.load(Ordering::Acquire);
            // Re-validated as a decision is: a state read after the slot changed owner is not ours.
            if slot.key.load(Ordering::Acquire) == key {
                return algorithm.peek(stored ^ self.mask(key), now, cost);
            }
        }
    }

    fn refund<P: Policies>(&self, policies: &P, receipt: &Receipt, now: u64) -> bool {
        let place = self.place(receipt.hash);
        // A key gone (evicted, reset) or moved to another policy since has nothing to take back.
        let Some((slot, key)) = self.find_settled(place) else { return false };
        if (key >> FP_BITS) as u8 != receipt.idx {
            return false;
        }
        let Some(algorithm) = policies.algorithm(receipt.idx) else { return false };
        let still_ours = || slot.key.load(Ordering::Acquire) == key;
        let charge = (receipt.before, receipt.after, receipt.cost);
        refund_masked(algorithm, &slot.state, self.mask(key), still_ours, now, charge)
    }

    /// Forget the key at `place`: its next request is decided as a fresh key's.
    fn reset(&self, hash: u64) -> bool {
        let place = self.place(hash);
        let shard = &self.shards[place.shard];
        let _guard = self.lock_shard(place.shard);
        let Some((slot, _)) = self.find(place) else { return false };
        slot.key.store(TOMBSTONE, Ordering::Relaxed);
        // Any value a stale decider of this key could expect is replaced: its exchange fails.
        slot.state.swap(0, Ordering::Release);
        slot.key.store(EMPTY, Ordering::Release);
        shard.len.fetch_sub(1, Ordering::Relaxed);
        true
    }

    /// Convert every key stored under a retired policy slot to its current policy: before the
    /// registry frees those slots (`registry.rs`, *Reusing slots*).
    fn migrate<P: Policies>(&self, policies: &P, hash: u64, now: u64) {
        self.migrate_at(policies, self.place(hash), now);
    }

    fn sweep<P: Policies>(&self, policies: &P, now: u64) {
        for i in 0..self.shards.len() {
            let _guard = self.lock_shard(i);
            let own = self.buckets.iter().skip(i).step_by(self.shards.len());
            for slot in own.flat_map(|b| &b.slots) {
                let key = slot.key.load(Ordering::Acquire);
                if key == EMPTY || key == TOMBSTONE {
                    continue;
                }
                if policies.algorithm((key >> FP_BITS) as u8).is_none() {
                    let (idx, _) = policies.resolve(key & FP_MASK);
                    self.convert_slot(policies, slot, key, idx, now);
                }
            }
        }
    }

    /// Reclaim every key indistinguishable from a fresh one at `now`; returns how many.
    fn reclaim_fresh<P: Policies>(&self, policies: &P, now: u64) -> u64 {
        let mut reclaimed = 0;
        for (i, shard) in self.shards.iter().enumerate() {
            let _guard = self.lock_shard(i);
            let own = self.buckets.iter().skip(i).step_by(self.shards.len());
            for slot in own.flat_map(|b| &b.slots) {
                let key = slot.key.load(Ordering::Acquire);
                if key == EMPTY {
                    continue;
                }
                let stored = slot.state.load(Ordering::Acquire);
                let fresh = policies
                    .previous((key >> FP_BITS) as u8)
                    .is_none_or(|a| a.reset_after(stored ^ self.mask(key), now) == 0);
                if !fresh {
                    continue;
                }
                slot.key.store(TOMBSTONE, Ordering::Relaxed);
                match slot.state.compare_exchange(stored, 0, Ordering::Release, Ordering::Relaxed) {
                    Ok(_) => {
                        slot.key.store(EMPTY, Ordering::Release);
                        shard.len.fetch_sub(1, Ordering::Relaxed);
                        shard.reclaims.fetch_add(1, Ordering::Relaxed);
                        reclaimed += 1;
                    }
                    // A decision took something meanwhile: the key is live; give it back.
                    Err(_) => slot.key.store(key, Ordering::Release),
                }
            }
        }
        reclaimed
    }

    fn stats(&self) -> TableStats {
        let mut s = TableStats { huge_pages: self.huge_pages, ..TableStats::default() };
        // Saturating: a shared table's counters are another process's bytes.
        for shard in self.shards.iter() {
            let add = |sum: &mut u64, counter: &StdAtomicU64| {
                *sum = sum.saturating_add(counter.load(Ordering::Relaxed));
            };
            add(&mut s.len, &shard.len);
            add(&mut s.reclaims, &shard.reclaims);
            add(&mut s.evictions, &shard.evictions);
            add(&mut s.refused, &shard.refused);
            add(&mut s.relocations, &shard.relocations);
            add(&mut s.moves, &shard.moves);
        }
        s.len = s.len.min(self.capacity());
        s
    }
}
