//! A new key's slot (the slow path, under the shard lock): a free candidate, else a lossless
//! reclaim, else a slot freed by cuckoo relocation, else a lossy eviction or, fail-closed, none
//! (the module doc's *Relocation* and *Insertion and eviction*).

use super::{
    EMPTY, FP_BITS, FP_MASK, OnFull, Place, Rescan, SLOTS_PER_BUCKET, Slot, TOMBSTONE, Table,
    key_word, move_key, rescan,
};
use crate::cas::Report;
use crate::keyed::registry::Policies;
use crate::sync::Ordering;

/// The most buckets one relocation search looks at: the two roots, their keys' other buckets
/// (16), and some of the next level.
pub(super) const RELOCATION_BUCKETS: usize = 64;
const NO_PARENT: u16 = u16::MAX;

impl Table {
    /// A new key: decide against a fresh state and, if something is taken, find it a slot.
    /// `None`: the key appeared meanwhile; decide again on the fast path.
    #[cold]
    #[inline(never)]
    pub(super) fn insert_slow<R: Report, P: Policies>(
        &self,
        policies: &P,
        place: Place,
        now: u64,
        cost: u32,
    ) -> Option<R> {
        let (idx, token) = policies.resolve(place.fp);
        // Retired since it was resolved: resolve again.
        let algorithm = policies.algorithm(idx)?;
        let (decision, next) = R::decide_cold(algorithm, 0, now, cost);
        let shard = &self.shards[place.shard];
        let _guard = self.lock_shard(place.shard);
        // Under the lock, where no key is half-moved: absent after all? (Another thread may have
        // inserted it, or the lock-free scan may have missed a key in the middle of a move.)
        let Rescan::Absent { mut free } = rescan(self, place) else { return None };
        // A fresh state refuses it (nothing to store): the key is absent, and so is decided.
        let Some(next) = next else { return Some(decision) };
        // A slot retired (and perhaps swept and reassigned) since it was resolved must not be
        // stored: see `registry.rs`, *Reusing slots*.
        if !policies.still(idx, token) {
            return None;
        }
        let new_key = key_word(idx, place.fp);
        loop {
            let choice = match free.take() {
                Some(slot) => Choice::Free { slot, moves: 0 },
                None => self.choose(policies, place, now),
            };
            match choice {
                Choice::Free { slot, moves } => {
                    slot.state.store(next ^ self.mask(new_key), Ordering::Release);
                    slot.key.store(new_key, Ordering::Release);
                    shard.len.fetch_add(1, Ordering::Relaxed);
                    if moves > 0 {
                        shard.relocations.fetch_add(1, Ordering::Relaxed);
                        shard.moves.fetch_add(moves, Ordering::Relaxed);
                    }
                    return Some(decision.owned_by(idx));
                }
                Choice::Occupied { slot, key, stored, lossless } => {
                    if !self.replace(slot, key, stored, new_key, next) {
                        continue;
                    }
                    let counter = if lossless { &shard.reclaims } else { &shard.evictions };
                    counter.fetch_add(1, Ordering::Relaxed);
                    return Some(decision.owned_by(idx));
                }
                Choice::Refuse { retry_after } => {
                    shard.refused.fetch_add(1, Ordering::Relaxed);
                    let limit = algorithm.decide(0, now, 1).0.limit();
                    return Some(R::refused(limit, retry_after));
                }
            }
        }
    }

    /// Pick the slot for a new key among its candidates (under the shard lock): a free one, else
    /// a reclaimable one, else one freed by moving keys to their other buckets
    /// ([`relocate`](Self::relocate)), else a victim (or none, fail-closed).
    fn choose<'a, P: Policies>(&'a self, policies: &P, place: Place, now: u64) -> Choice<'a> {
        let mut reclaimable = None;
        let mut victim: Option<(&Slot, u64, u64, (u64, u64))> = None;
        let mut soonest = u64::MAX;
        let (candidates, n) = self.candidates(place);
        let buckets = &candidates[..n];
        for &b in buckets {
            for slot in &self.buckets[b].slots {
                let key = slot.key.load(Ordering::Acquire);
                if key == EMPTY {
                    return Choice::Free { slot, moves: 0 };
                }
                if reclaimable.is_some() {
                    continue;
                }
                let stored = slot.state.load(Ordering::Acquire);
                // A key on a retired policy is ranked by it: its next decision converts it.
                let Some(algorithm) = policies.previous((key >> FP_BITS) as u8) else {
                    reclaimable = Some(Choice::Occupied { slot, key, stored, lossless: true });
                    continue;
                };
                let word = stored ^ self.mask(key);
                let reset = algorithm.reset_after(word, now);
                if reset == 0 {
                    reclaimable = Some(Choice::Occupied { slot, key, stored, lossless: true });
                    continue;
                }
                soonest = soonest.min(reset);
                // The least extra capacity granted: the most remaining, then the soonest full.
                let probe = algorithm.decide(word, now, 1).0;
                let remaining = probe.remaining() + u64::from(probe.is_admitted());
                let used = probe.limit().saturating_sub(remaining);
                let rank = (used, reset);
                if victim.is_none_or(|(_, _, _, best)| rank < best) {
                    victim = Some((slot, key, stored, rank));
                }
            }
        }
        if let Some(choice) = reclaimable {
            return choice;
        }
        // A shard with no free slot has no path to one: a full table of live keys (a flood of
        // new keys, each evicting one) pays no search.
        let free = self.shards[place.shard].len.load(Ordering::Relaxed) < self.shard_slots();
        if let Some((slot, moves)) = free.then(|| self.relocate(buckets)).flatten() {
            return Choice::Free { slot, moves };
        }
        match (self.on_full, victim) {
            (OnFull::EvictLeastGranting, Some((slot, key, stored, _))) => {
                Choice::Occupied { slot, key, stored, lossless: false }
            }
            _ => Choice::Refuse { retry_after: soonest },
        }
    }

    /// Under the shard lock, with every slot of the candidate buckets `roots` live: free one of
    /// them by moving keys to their other buckets, along the shortest path found (breadth
    /// first, at most [`RELOCATION_BUCKETS`] buckets looked at) from a root to a bucket with a
    /// free slot. The freed slot and the keys moved; `None` if no path was found.
    fn relocate(&self, roots: &[usize]) -> Option<(&Slot, u64)> {
        // The search tree: a bucket, its parent node, and the slot of the parent's bucket whose
        // key's other bucket it is.
        let mut nodes = [(0usize, NO_PARENT, 0u8); RELOCATION_BUCKETS];
        let mut len = 0;
        for &b in roots {
            nodes[len] = (b, NO_PARENT, 0);
            len += 1;
        }
        let mut at = 0;
        while at < len {
            let b = nodes[at].0;
            for (i, slot) in self.buckets[b].slots.iter().enumerate() {
                let key = slot.key.load(Ordering::Relaxed);
                if key == EMPTY || key == TOMBSTONE {
                    continue;
                }
                let other = self.partner(b, key & FP_MASK);
                if nodes[..len].iter().any(|&(seen, _, _)| seen == other) {
                    continue;
                }
                let free = self.buckets[other]
                    .slots
                    .iter()
                    .position(|s| s.key.load(Ordering::Relaxed) == EMPTY);
                if let Some(free) = free {
                    return Some(self.shift(&nodes, at, i, other * SLOTS_PER_BUCKET + free));
                }
                if len < RELOCATION_BUCKETS {
                    nodes[len] = (other, at as u16, i as u8);
                    len += 1;
                }
            }
            at += 1;
        }
        None
    }

    /// Move the key in slot `i` of node `at`'s bucket into the free slot at index `free` (of
    /// the whole array: bucket times 8 plus slot), then each ancestor's key into the slot its
    /// child vacated, up to a root: the root slot freed, and the moves made. A shared table
    /// journals each move ([`Table::move_journaled`]).
    fn shift(
        &self,
        nodes: &[(usize, u16, u8)],
        mut at: usize,
        mut i: usize,
        free: usize,
    ) -> (&Slot, u64) {
        let mut to = free;
        let mut moves = 0;
        loop {
            let (b, parent, via) = nodes[at];
            let from = b * SLOTS_PER_BUCKET + i;
            if self.is_shared() {
                self.move_journaled(&self.shards[b & self.shard_mask as usize], from, to);
            } else {
                move_key(
                    &self.buckets[b].slots[i],
                    &self.buckets[to / SLOTS_PER_BUCKET].slots[to % SLOTS_PER_BUCKET],
                );
            }
            moves += 1;
            if parent == NO_PARENT {
                return (&self.buckets[b].slots[i], moves);
            }
            (to, at, i) = (from, usize::from(parent), usize::from(via));
        }
    }
}

enum Choice<'a> {
    /// A free slot, freed by `moves` moves if not 0.
    Free {
        slot: &'a Slot,
        moves: u64,
    },
    Occupied {
        slot: &'a Slot,
        key: u64,
        stored: u64,
        lossless: bool,
    },
    Refuse {
        retry_after: u64,
    },
}
