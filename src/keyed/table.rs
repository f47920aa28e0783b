//! The key table: bounded, sharded, no lock on the hot path, lossless eviction first, no ABA.
//!
//! # Layout
//!
//! The table has `S` shards (a power of two), each [`CachePadded`] with its own insert lock and
//! metrics and owning every `S`-th bucket (bucket `i` belongs to shard `i mod S`) of one array of
//! 128-byte buckets (two adjacent cache lines) of eight 16-byte slots:
//!
//! | word    | bits   | meaning                                                               |
//! |---------|--------|-----------------------------------------------------------------------|
//! | `key`   | 56..64 | index of the key's policy in the limiter's registry (0..=254)         |
//! | `key`   | 0..56  | fingerprint: 54 bits of the key's 64-bit hash, stored odd and below 2^55 |
//! | `key`   | all    | `EMPTY` = 0: a free slot; `TOMBSTONE` = all ones: a slot being changed |
//! | `state` | 0..64  | the algorithm's state word XOR `mask(key)` (see *No ABA*)              |
//!
//! So a slot is 16 bytes and a key's fingerprint and state share a cache line: a hit on a cold key
//! costs one DRAM miss (two for a key in the second line of its bucket, which the adjacent-line
//! prefetcher usually hides). A key may live in one of two buckets of its shard (16 candidate
//! slots, "two-choice" placement): the first is the high bits of the hash multiplied by an odd
//! constant, scaled to the whole array, and its shard is that bucket's (the fast path computes one
//! multiply and no shard); the second is the first's *partner* ([`Table::partner`]): within the
//! shard, `w1 + w2 = h(fp) mod buckets_per_shard` for a mix `h` of the fingerprint and the
//! table's secret, so either bucket and the fingerprint a slot stores give the other one, and a key
//! can be moved between its buckets without its hash. The fingerprint is the hash's high 54 bits,
//! shifted down and made odd: never `EMPTY`, and below 2^55 so never the low bits of `TOMBSTONE`
//! (a scan needs one compare a slot).
//!
//! The table's memory is allocated once, untouched, then advised `MADV_HUGEPAGE` (its whole 2 MiB
//! pages, Linux; `src/mem.rs`) before it is zeroed, so that a large table faults in transparent
//! huge pages where the system allows them (THP `madvise` or `always`): a decision on a cold key
//! then misses the TLB far less often (`benches/README.md`, *Huge pages*).
//!
//! # Relocation (cuckoo moves, under the shard lock)
//!
//! A new key whose sixteen candidate slots are all live does not evict one while a path of moves
//! frees one: a breadth-first search (at most [`RELOCATION_BUCKETS`] buckets) from the key's two
//! buckets through each occupant's partner bucket finds the nearest bucket with a free slot, and
//! the keys along the path move, last first, each into its partner bucket, so that a candidate
//! slot frees up. Both buckets of every key are in its shard, so the whole path is under that
//! shard's lock. A move ([`move_key`]) tombstones the old slot, swaps its state out (any decider
//! that loaded the state before then fails its compare-exchange, and re-validating finds the
//! tombstone), publishes the key with its state in the new slot, and frees the old one. For the
//! instant between the swap and the publication the key is in neither bucket: a lock-free lookup
//! that misses in both therefore takes the shard lock and looks again before it treats the key as
//! absent ([`Table::find_settled`]; a decision of a new key takes that lock anyway). A moved key's
//! stored word moves as it is (its mask is the key word's, which does not change).
//!
//! Random keys, each kept live for an hour by its first request, are first evicted at 90-93% of
//! capacity at 100k slots, 95-96% at 1M and 96-97% at 4M (three seeds each:
//! `cargo run --release --example first_eviction`, `benches/results/first-eviction-2026-12-02.txt`);
//! what stops it is the fullest shard (shards of about 1,000 keys fill unevenly), not the search.
//! A relocation writes only under the lock: the decision hot path is unchanged. A shard whose
//! every slot holds a key is not searched (no path exists), so a flood of new keys into a full
//! table of live keys costs what it did without relocation.
//!
//! Keys are stored only as fingerprints of a per-process-seeded `ahash`: two distinct keys merge
//! only if their 54-bit fingerprints are equal and they share a candidate bucket: at most about
//! 2^-54 per pair of keys sharing a bucket. (With 256 shards, from 256Ki keys up, the shard takes
//! 8 more bits of the hash, and the bucket, a function of all 64, separates most of the rest.)
//!
//! # The hot path (a key already present)
//!
//! Hash once, scan the key's first bucket for its fingerprint, then a CAS loop on the state word:
//! load the state (`Acquire`), check that the key word still holds this key, decide, and
//! compare-exchange. No lock, no allocation, no write on a rejection. Everything else (a key in
//! its second bucket, a new key, a key whose policy was retired, a slot that changed owner under
//! the decision) goes to one out-of-line path that looks the key up again in both buckets.
//!
//! # Batches
//!
//! A batch (`KeyedLimiter::check_batch`) takes its requests in groups of `GROUP`: every key of a
//! group is hashed and the first line of its first bucket prefetched, then every first bucket
//! is scanned (the group's misses overlap instead of each waiting for the one before), then each
//! request is decided in order by the CAS loop above on the slot its scan found, which
//! re-validates the key word: a request earlier in the group that inserted a key (and moved or
//! evicted this one) sends it to the out-of-line path, as a single call would go. So a batch's
//! decisions are those of single calls in slice order.
//!
//! # Insertion and eviction (the slow path, under the shard's lock)
//!
//! A new key is decided against a fresh state first. Under the shard lock, re-scan (another
//! thread may have inserted it, or moved it); a request a fresh state refuses then returns
//! (it changes no state: a flood of new keys that are refused writes no slot). Else take, in
//! order: a free candidate slot; a candidate whose state is indistinguishable from a fresh key's
//! (a *lossless reclaim*: no decision changes); a slot freed by relocation (above); and only when
//! no path was found, either the candidate whose loss grants the least extra capacity (the one
//! closest to full: a *lossy eviction*) or, fail-closed, nothing (the request is refused; its
//! `retry_after` says when a candidate becomes reclaimable). All are counted.
//!
//! Replacing the occupant of a slot is three steps:
//!
//! 1. `key := TOMBSTONE` (no lookup matches it);
//! 2. `state: old -> new ^ mask(new key)` by compare-exchange (`Release`); if a decider changed the
//!    state in between, the key word is restored and the choice is made again;
//! 3. `key := new key` (`Release`).
//!
//! # No ABA
//!
//! A decider for key K that loaded K's state `w` and then stalls must not apply its decision to
//! another key K2 that took the slot meanwhile. Two things prevent it:
//!
//! - *Re-validation.* After each load of the state (`Acquire`), the decider re-reads the key word.
//!   If it read a state that step 2 wrote, it synchronizes with that `Release`, so it sees step 1 or
//!   later: the key word is no longer K and it starts over with a fresh lookup.
//! - *Keyed masks.* A decider that read `w` before step 2 and compare-exchanges after it fails
//!   unless the new occupant's stored word equals `w` bit for bit. Stored words are XORed with
//!   `mask(key word)`, a 64-bit mix of the key word (fingerprint and policy index) and a secret
//!   drawn per table (a 64x64->128-bit multiply folded to 64 bits, as ahash mixes), so equal
//!   *states* of two keys are different *words*: the exchange could only
//!   succeed if K2's state were exactly `K's state ^ mask(K) ^ mask(K2)`, a pseudo-random value
//!   (odds like a fingerprint collision's). The same key re-inserted gets the same mask: its stale
//!   decider may then succeed, which is harmless (its decision is a decision for that key, on that
//!   key's current state).
//!
//! One case is weaker: a decider that read the `0` a reset or a move leaves in a vacated slot,
//! and is then delayed while the same key comes back to that very slot (re-inserted, or moved out
//! and back), re-validates successfully and decides on that `0`. An admission it computes fails
//! its exchange (the slot holds the key's real word) and is decided again; a rejection it computes
//! is returned: a spurious rejection, with report fields from a garbage state. It never admits
//! anything.
//!
//! Unlike a generation tag in the state word, masks cost the algorithms no state bits: the idle
//! horizons of the direct limiter hold in the table too. The loom models in `loom-tests/` force the
//! slot reuse and check both defences, and show that a table without them fails.
//!
//! # Memory ordering
//!
//! The state word publishes nothing but itself, so a decider's successful exchange is `Relaxed`;
//! its failure ordering and the state load are `Acquire` (to pair with step 2). Steps 2 and 3 are
//! `Release`; key-word loads are `Acquire` (a lookup that sees a new key sees its state).

use std::sync::atomic::AtomicU64 as StdAtomicU64;

use crossbeam_utils::CachePadded;

use crate::algorithms::convert;
use crate::cas::{Applied, Report, apply_algorithm, refund_masked};
use crate::decision::Decision;
use crate::keyed::registry::Policies;
use crate::keyed::{GROUP, Receipt, Store, shard_count};
use crate::sync::{AtomicU64, Mutex, Ordering, lock};

pub(crate) const EMPTY: u64 = 0;
pub(crate) const TOMBSTONE: u64 = u64::MAX;
const FP_BITS: u32 = 56;
const FP_MASK: u64 = (1 << FP_BITS) - 1;
/// Odd constants of the bucket spread and of the state mask (the digits of pi and of e).
const SPREAD: u64 = 0x243f_6a88_85a3_08d3;
const MASK_MUL: u64 = 0xb7e1_5162_8aed_2a6b;
/// Policy indices 0..=254; 255 would make `TOMBSTONE` a valid key word.
pub(crate) const MAX_POLICIES: usize = 255;
const SLOTS_PER_BUCKET: usize = 8;
const _: () = assert!(SLOTS_PER_BUCKET * 16 == 128);
/// The most buckets one relocation search looks at: the two roots, their keys' other buckets
/// (16), and some of the next level.
const RELOCATION_BUCKETS: usize = 64;
const NO_PARENT: u16 = u16::MAX;

#[derive(Debug, Default)]
pub(crate) struct Slot {
    key: AtomicU64,
    state: AtomicU64,
}

#[derive(Debug, Default)]
#[repr(align(128))]
struct Bucket {
    slots: [Slot; SLOTS_PER_BUCKET],
}

#[derive(Debug)]
struct Shard {
    /// Serializes insertions, evictions and removals; never taken by a decision on a present key.
    lock: Mutex<()>,
    // Written only under `lock` (so never on the hot path): plain std atomics, not modelled.
    len: StdAtomicU64,
    reclaims: StdAtomicU64,
    evictions: StdAtomicU64,
    refused: StdAtomicU64,
    /// Inserts that moved keys to make room, and the keys moved.
    relocations: StdAtomicU64,
    moves: StdAtomicU64,
}

/// The most keys a keyed limiter holds: 2^39 (8 TiB of slots; the sliding log's table indexes
/// its up to 256 shards' keys with 32 bits).
pub(crate) const MAX_CAPACITY: u64 = 1 << 39;

/// Why a keyed limiter of the capacity asked for cannot be built.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CapacityError {
    /// More keys than [`KeyedLimiter::MAX_CAPACITY`](crate::KeyedLimiter::MAX_CAPACITY).
    TooLarge {
        /// The capacity asked for.
        requested: u64,
        /// The largest capacity a keyed limiter accepts.
        max: u64,
    },
    /// The allocator could not provide the table.
    OutOfMemory {
        /// The bytes of the table that could not be allocated.
        bytes: u64,
    },
}

impl std::fmt::Display for CapacityError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CapacityError::TooLarge { requested, max } => {
                write!(f, "a capacity of {requested} keys is above the maximum of {max}")
            }
            CapacityError::OutOfMemory { bytes } => {
                write!(f, "the key table's {bytes} bytes could not be allocated")
            }
        }
    }
}

impl std::error::Error for CapacityError {}

/// What to do when every candidate slot of a new key holds a live key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnFull {
    /// Evict the candidate whose loss grants the least extra capacity (the one closest to full);
    /// the default.
    #[default]
    EvictLeastGranting,
    /// Refuse the new key: its request is rejected (fail-closed).
    Refuse,
}

/// Counters of a table, summed over shards.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct TableStats {
    pub(crate) len: u64,
    pub(crate) reclaims: u64,
    pub(crate) evictions: u64,
    pub(crate) refused: u64,
    pub(crate) relocations: u64,
    pub(crate) moves: u64,
    pub(crate) huge_pages: bool,
}

#[derive(Debug)]
pub(crate) struct Table {
    /// `buckets_per_shard * shards` buckets; bucket `i` belongs to shard `i & shard_mask`.
    buckets: Box<[Bucket]>,
    shards: Box<[CachePadded<Shard>]>,
    shard_mask: u64,
    buckets_per_shard: u64,
    secret: u64,
    on_full: OnFull,
    /// Whether the kernel took the advice to back the buckets with transparent huge pages.
    huge_pages: bool,
}

/// Where a key may live: its first candidate bucket (its second is [`Table::partner`] of it).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Place {
    shard: usize,
    /// The first candidate bucket, as an index into the whole array (it belongs to `shard`).
    b1: usize,
    fp: u64,
}

/// A 64-bit mixer (the finalizer of MurmurHash3; constants from Appleby's reference code).
#[inline]
fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// `x` scaled into `0..n` (Lemire's multiply-shift).
#[inline]
fn scale(x: u64, n: u64) -> usize {
    ((u128::from(x) * u128::from(n)) >> 64) as usize
}

/// The mask of a key's stored state (see *No ABA*).
#[inline]
pub(crate) fn mask_of(secret: u64, key: u64) -> u64 {
    let m = u128::from(key ^ secret) * u128::from(MASK_MUL);
    (m as u64) ^ ((m >> 64) as u64)
}

/// Under the shard lock, before inserting: whether the key is present after all (another
/// thread inserted it since the lock-free lookup, or moved it between its buckets).
pub(crate) fn present(table: &Table, place: Place) -> bool {
    table.find(place).is_some()
}

/// After a lock-free miss: the key's slot as the table holds it under the shard lock (no move in
/// progress), if it is present.
pub(crate) fn confirm_miss(table: &Table, place: Place) -> Option<(&Slot, u64)> {
    let _guard = lock(&table.shards[place.shard].lock);
    table.find(place)
}

/// Under the shard lock: move the key in `from` to the free slot `to` (its other bucket's).
///
/// 1. `from.key := TOMBSTONE`: lookups stop matching it (one that misses the key in both buckets
///    waits for the shard lock, [`Table::find_settled`]);
/// 2. `from.state := 0` by swap (`AcqRel`), reading the state to move: a decider that loaded the
///    state before it now fails its compare-exchange, reloads and, re-validating, sees step 1;
/// 3. `to.state := the state`, `to.key := the key` (`Release`): the key's next lookup finds it;
/// 4. `from.key := EMPTY` (`Release`).
///
/// The stored word moves as it is: the mask is the key word's, and the key word is unchanged.
pub(crate) fn move_key(from: &Slot, to: &Slot) {
    let key = from.key.load(Ordering::Relaxed);
    from.key.store(TOMBSTONE, Ordering::Relaxed);
    let stored = freeze(&from.state);
    to.state.store(stored, Ordering::Relaxed);
    to.key.store(key, Ordering::Release);
    from.key.store(EMPTY, Ordering::Release);
}

/// What a snapshot holds while it reads a shard: its insert lock, which every move holds, so no
/// key is caught between its buckets.
pub(crate) fn snapshot_guard(lock: &Mutex<()>) -> Option<crate::sync::MutexGuard<'_, ()>> {
    Some(crate::sync::lock(lock))
}

/// Step 2 of [`move_key`]: take the state out of a slot being vacated.
pub(crate) fn take_state(state: &AtomicU64) -> u64 {
    state.swap(0, Ordering::AcqRel)
}

// The protocol's steps: these or, compiled with `--cfg ratewell_broken="..."`, the deliberately broken
// ones of those names (`broken.rs`), for the loom models to catch.
#[cfg(not(ratewell_broken_protocol))]
use self::{
    confirm_miss as settle_miss, mask_of as key_mask, present as rescan,
    snapshot_guard as read_guard, take_state as freeze,
};
#[cfg(ratewell_broken_protocol)]
use crate::broken::{
    confirm_miss as settle_miss, mask_of as key_mask, present as rescan,
    snapshot_guard as read_guard, take_state as freeze,
};

fn key_word(idx: u8, fp: u64) -> u64 {
    (u64::from(idx) << FP_BITS) | fp
}

impl Table {
    /// A table of at least `capacity` slots (rounded up to whole buckets in every shard), or
    /// why not: more than [`MAX_CAPACITY`] keys, or an allocation the allocator refused.
    pub(crate) fn new(capacity: usize, secret: u64) -> Result<Self, CapacityError> {
        let capacity = (capacity as u64).max(1);
        if capacity > MAX_CAPACITY {
            return Err(CapacityError::TooLarge { requested: capacity, max: MAX_CAPACITY });
        }
        let shards = shard_count(capacity);
        let buckets_per_shard = capacity.div_ceil(shards * SLOTS_PER_BUCKET as u64);
        let len = (shards * buckets_per_shard) as usize;
        let mut buckets = Vec::new();
        buckets.try_reserve_exact(len).map_err(|_| CapacityError::OutOfMemory {
            bytes: len as u64 * std::mem::size_of::<Bucket>() as u64,
        })?;
        // Before the first write, so that the writes fault huge pages in.
        let huge_pages = crate::mem::advise_huge_pages(&mut buckets.spare_capacity_mut()[..len]);
        buckets.extend((0..len).map(|_| Bucket::default()));
        let shards: Box<[_]> = (0..shards)
            .map(|_| {
                CachePadded::new(Shard {
                    lock: Mutex::new(()),
                    len: StdAtomicU64::new(0),
                    reclaims: StdAtomicU64::new(0),
                    evictions: StdAtomicU64::new(0),
                    refused: StdAtomicU64::new(0),
                    relocations: StdAtomicU64::new(0),
                    moves: StdAtomicU64::new(0),
                })
            })
            .collect();
        Ok(Table {
            buckets: buckets.into_boxed_slice(),
            shard_mask: shards.len() as u64 - 1,
            shards,
            buckets_per_shard,
            secret: mix(secret) | 1,
            on_full: OnFull::default(),
            huge_pages,
        })
    }

    #[inline]
    pub(crate) fn place(&self, hash: u64) -> Place {
        // Bits 10..64 of the hash, odd: never EMPTY, and below 2^55, so never all ones (a slot's
        // key word masked to its fingerprint bits only equals `fp` for this fingerprint).
        let fp = (hash >> (64 - FP_BITS + 1)) | 1;
        let b1 = scale(hash.wrapping_mul(SPREAD), self.buckets.len() as u64);
        let shard = b1 & self.shard_mask as usize;
        Place { shard, b1, fp }
    }

    /// The other candidate bucket of a key with fingerprint `fp` stored in bucket `b`: an
    /// involution (`partner(partner(b)) == b`) within `b`'s shard, computed from what a slot
    /// stores, so a key can be moved between its two buckets without knowing its hash. Within
    /// the shard, the pair of a key's buckets `w1`, `w2` satisfy `w1 + w2 = h(fp) (mod
    /// buckets_per_shard)`.
    #[inline]
    pub(crate) fn partner(&self, b: usize, fp: u64) -> usize {
        let bits = self.shard_mask.count_ones();
        let per_shard = self.buckets_per_shard as usize;
        let (shard, w) = (b & self.shard_mask as usize, b >> bits);
        let h = scale(mix(fp ^ self.secret), self.buckets_per_shard);
        let other = if h >= w { h - w } else { h + per_shard - w };
        other << bits | shard
    }

    /// Slots in one shard.
    #[inline]
    fn shard_slots(&self) -> u64 {
        self.buckets_per_shard * SLOTS_PER_BUCKET as u64
    }

    /// The candidate buckets of the key hashed `hash` (for the loom models, which pick keys by
    /// where they live).
    #[cfg(ratewell_loom)]
    pub(crate) fn buckets_of(&self, hash: u64) -> (usize, usize) {
        let place = self.place(hash);
        (place.b1, self.partner(place.b1, place.fp))
    }

    /// The key's candidate buckets: one if its two coincide.
    #[inline]
    fn candidates(&self, place: Place) -> ([usize; 2], usize) {
        let b2 = self.partner(place.b1, place.fp);
        ([place.b1, b2], if b2 == place.b1 { 1 } else { 2 })
    }

    #[inline]
    fn mask(&self, key: u64) -> u64 {
        key_mask(self.secret, key)
    }

    /// The slot of bucket `b` of the key's shard holding its fingerprint, with its key word.
    #[inline(always)]
    fn find_in(&self, place: Place, b: usize) -> Option<(&Slot, u64)> {
        self.buckets[b].slots.iter().find_map(|slot| {
            let key = slot.key.load(Ordering::Acquire);
            (key & FP_MASK == place.fp).then_some((slot, key))
        })
    }

    /// The slot holding the key, with its key word, as a lock-free scan sees it: a key being
    /// moved between its buckets (under the shard lock) is in neither for a moment, so a miss
    /// here is not yet an absence ([`find_settled`](Self::find_settled) is).
    #[inline]
    fn find(&self, place: Place) -> Option<(&Slot, u64)> {
        self.find_in(place, place.b1).or_else(|| {
            let b2 = self.partner(place.b1, place.fp);
            if b2 == place.b1 { None } else { self.find_in(place, b2) }
        })
    }

    /// The slot holding the key; a miss is confirmed under the shard lock, which every move
    /// holds, so `None` means the key was absent at some moment during the call.
    #[inline]
    fn find_settled(&self, place: Place) -> Option<(&Slot, u64)> {
        self.find(place).or_else(|| settle_miss(self, place))
    }

    /// The CAS loop on `slot`, holding `key` when it was found; `None` if the slot changed owner.
    #[inline(always)]
    fn apply<R: Report>(
        &self,
        algorithm: &crate::algorithms::Algorithm,
        slot: &Slot,
        key: u64,
        now: u64,
        cost: u32,
    ) -> Option<R> {
        let still_ours = || slot.key.load(Ordering::Acquire) == key;
        match apply_algorithm(algorithm, &slot.state, self.mask(key), still_ours, now, cost) {
            Applied::Done(report) => Some(R::owned_by(report, (key >> FP_BITS) as u8)),
            Applied::Moved => None,
        }
    }

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
    ) -> R {
        let place = self.place(hash);
        loop {
            let Some((slot, key)) = self.find(place) else {
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

    /// A new key: decide against a fresh state and, if something is taken, find it a slot.
    /// `None`: the key appeared meanwhile; decide again on the fast path.
    #[cold]
    #[inline(never)]
    fn insert_slow<R: Report, P: Policies>(
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
        let _guard = lock(&shard.lock);
        // Under the lock, where no key is half-moved: absent after all? (Another thread may have
        // inserted it, or the lock-free scan may have missed a key in the middle of a move.)
        if rescan(self, place) {
            return None;
        }
        // A fresh state refuses it (nothing to store): the key is absent, and so is decided.
        let Some(next) = next else { return Some(decision) };
        // A slot retired (and perhaps swept and reassigned) since it was resolved must not be
        // stored: see `registry.rs`, *Reusing slots*.
        if !policies.still(idx, token) {
            return None;
        }
        let new_key = key_word(idx, place.fp);
        loop {
            match self.choose(policies, place, now) {
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
                    .find(|s| s.key.load(Ordering::Relaxed) == EMPTY);
                if let Some(free) = free {
                    return Some(self.shift(&nodes, at, i, free));
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

    /// Move the key in slot `i` of node `at`'s bucket into `free`, then each ancestor's key into
    /// the slot its child vacated, up to a root: the root slot freed, and the moves made.
    fn shift(
        &self,
        nodes: &[(usize, u16, u8)],
        mut at: usize,
        mut i: usize,
        free: &Slot,
    ) -> (&Slot, u64) {
        let mut to = free;
        let mut moves = 0;
        loop {
            let (b, parent, via) = nodes[at];
            let from = &self.buckets[b].slots[i];
            move_key(from, to);
            moves += 1;
            if parent == NO_PARENT {
                return (from, moves);
            }
            (to, at, i) = (from, usize::from(parent), usize::from(via));
        }
    }

    /// Steps 1-3 of the module doc: give `slot` (holding `old_key`, state `stored`) to `new_key`
    /// with the unmasked state `word`. `false` if a decision changed the state meanwhile.
    fn replace(&self, slot: &Slot, old_key: u64, stored: u64, new_key: u64, word: u64) -> bool {
        slot.key.store(TOMBSTONE, Ordering::Relaxed);
        let installed = slot.state.compare_exchange(
            stored,
            word ^ self.mask(new_key),
            Ordering::Release,
            Ordering::Relaxed,
        );
        let key = if installed.is_ok() { new_key } else { old_key };
        slot.key.store(key, Ordering::Release);
        installed.is_ok()
    }

    /// The table's shape as a snapshot names it: shards and buckets per shard.
    pub(crate) fn shape(&self) -> (u64, u64) {
        (self.shards.len() as u64, self.buckets_per_shard)
    }

    /// Every key's `(position, key word, unmasked state)`, shard by shard, each shard under its
    /// lock (so no key is caught between its buckets), in ascending position: `shard *
    /// buckets_per_shard + bucket within the shard`. Decisions on present keys go on meanwhile
    /// (they take no lock); each state is one atomic load, so it is the key's state at some
    /// instant of the snapshot.
    pub(crate) fn snapshot(&self, mut each: impl FnMut(u64, u64, u64)) {
        let bits = self.shard_mask.count_ones();
        for (s, shard) in self.shards.iter().enumerate() {
            let _guard = read_guard(&shard.lock);
            for w in 0..self.buckets_per_shard as usize {
                let position = s as u64 * self.buckets_per_shard + w as u64;
                for slot in &self.buckets[w << bits | s].slots {
                    // Key words change only under the shard lock: no tombstone is seen here
                    // (unless the lock was not taken: the broken variant `snapshot_unlocked`).
                    let key = slot.key.load(Ordering::Acquire);
                    if key == EMPTY || key == TOMBSTONE {
                        continue;
                    }
                    let stored = slot.state.load(Ordering::Acquire);
                    each(position, key, stored ^ self.mask(key));
                }
            }
        }
    }

    /// Whether `key` is a key word a slot can hold: an odd fingerprint below 2^55, a policy
    /// index below [`MAX_POLICIES`].
    pub(crate) fn valid_key(key: u64) -> bool {
        let fp = key & FP_MASK;
        fp & 1 == 1 && fp >> (FP_BITS - 1) == 0 && ((key >> FP_BITS) as usize) < MAX_POLICIES
    }

    /// Store `key` (a key word, [`valid_key`](Self::valid_key)) with the unmasked state `word`
    /// in a free slot of the bucket at `position` (as [`snapshot`](Self::snapshot) numbers
    /// them, below `shards * buckets_per_shard`): `false` if the bucket is full. With
    /// exclusive access: restoring fills a table no decision uses yet.
    pub(crate) fn put(&mut self, position: u64, key: u64, word: u64) -> bool {
        let s = (position / self.buckets_per_shard) as usize;
        let w = (position % self.buckets_per_shard) as usize;
        let b = w << self.shard_mask.count_ones() | s;
        let mask = self.mask(key);
        let Some(slot) =
            self.buckets[b].slots.iter().find(|slot| slot.key.load(Ordering::Relaxed) == EMPTY)
        else {
            return false;
        };
        slot.state.store(word ^ mask, Ordering::Relaxed);
        slot.key.store(key, Ordering::Relaxed);
        self.shards[s].len.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// The key word of policy slot `idx` and the key word `key`'s fingerprint.
    pub(crate) fn with_policy(key: u64, idx: u8) -> u64 {
        key_word(idx, key & FP_MASK)
    }

    /// The policy slot a key word names.
    pub(crate) fn policy_of(key: u64) -> u8 {
        (key >> FP_BITS) as u8
    }

    /// Move the key at `place` (if present) to the policy `resolve` now gives it, keeping what
    /// it consumed ([`convert`]).
    #[cold]
    #[inline(never)]
    pub(crate) fn migrate_at<P: Policies>(&self, policies: &P, place: Place, now: u64) {
        let shard = &self.shards[place.shard];
        loop {
            // Resolved before the shard lock (resolving may take the registry's lock, which a
            // sweep holds while it takes shard locks), and checked under it.
            let (idx, token) = policies.resolve(place.fp);
            let _guard = lock(&shard.lock);
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
        if let Some((slot, key)) = self.find_in(place, place.b1) {
            let idx = (key >> FP_BITS) as u8;
            if let Some(algorithm) = policies.deciding(idx) {
                if let Some(report) = self.apply(algorithm, slot, key, now, cost) {
                    return report;
                }
            }
        }
        self.decide_slow(policies, hash, now, cost)
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
            each(report.unwrap_or_else(|| self.decide_slow(policies, hash, now, cost)));
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
        let _guard = lock(&shard.lock);
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
        for (i, shard) in self.shards.iter().enumerate() {
            let _guard = lock(&shard.lock);
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
            let _guard = lock(&shard.lock);
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
        for shard in self.shards.iter() {
            s.len += shard.len.load(Ordering::Relaxed);
            s.reclaims += shard.reclaims.load(Ordering::Relaxed);
            s.evictions += shard.evictions.load(Ordering::Relaxed);
            s.refused += shard.refused.load(Ordering::Relaxed);
            s.relocations += shard.relocations.load(Ordering::Relaxed);
            s.moves += shard.moves.load(Ordering::Relaxed);
        }
        s
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_spreads_keys() {
        let t = Table::new(1_000_000, 7).unwrap();
        let hasher = ahash::RandomState::with_seeds(1, 2, 3, 4);
        let mut counts = std::collections::HashMap::new();
        let mut seconds = std::collections::HashMap::new();
        let mut shards = std::collections::HashSet::new();
        for k in 0..50_000u64 {
            let p = t.place(hasher.hash_one(k));
            let b2 = t.partner(p.b1, p.fp);
            // Both candidates in the array and in the key's shard, whose lock covers them, and
            // each the other's partner.
            assert!(p.b1 < t.buckets.len() && b2 < t.buckets.len(), "{p:?}");
            assert_eq!(
                (p.b1 & t.shard_mask as usize, b2 & t.shard_mask as usize),
                (p.shard, p.shard)
            );
            assert_eq!(t.partner(b2, p.fp), p.b1);
            *counts.entry(p.b1).or_insert(0) += 1;
            *seconds.entry(b2).or_insert(0) += 1;
            shards.insert(p.shard);
        }
        // 50,000 keys into 125,184 buckets: Poisson(0.4) per bucket, so about 0.5 buckets are
        // expected to get 6 keys and 0.03 to get 7; a skewed placement gets many more.
        let max = counts.values().max().unwrap();
        assert!(*max <= 7, "max keys in one first-choice bucket: {max}");
        let max = seconds.values().max().unwrap();
        assert!(*max <= 7, "max keys in one second-choice bucket: {max}");
        assert_eq!(shards.len(), t.shards.len());
    }
}
