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
//! [`RELOCATION_BUCKETS`]: insert::RELOCATION_BUCKETS
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
//! A batch (`KeyedLimiter::batch`) takes its requests in groups of `GROUP`: every key of a
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
//!   drawn per table (the key word times the secret, 64x64->128 bits folded to 64, as ahash
//!   mixes), so equal
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

use crate::cas::{Applied, Report, apply_algorithm};
use crate::keyed::shard_count;
use crate::mem::Slab;
use crate::sync::{AtomicU64, Mutex, MutexGuard, Ordering, lock};

mod insert;
mod snapshot;
mod store;
#[cfg(test)]
mod tests;

pub(crate) const EMPTY: u64 = 0;
pub(crate) const TOMBSTONE: u64 = u64::MAX;
const FP_BITS: u32 = 56;
const FP_MASK: u64 = (1 << FP_BITS) - 1;
/// Odd constant of the bucket spread (the digits of pi).
const SPREAD: u64 = 0x243f_6a88_85a3_08d3;
/// Policy indices 0..=254; 255 would make `TOMBSTONE` a valid key word.
pub(crate) const MAX_POLICIES: usize = 255;
const SLOTS_PER_BUCKET: usize = 8;
const _: () = assert!(SLOTS_PER_BUCKET * 16 == 128);

#[derive(Debug, Default)]
#[repr(C)]
pub(crate) struct Slot {
    key: AtomicU64,
    state: AtomicU64,
}

#[derive(Debug, Default)]
#[repr(C, align(128))]
pub(crate) struct Bucket {
    slots: [Slot; SLOTS_PER_BUCKET],
}

/// A shard's counters, and a shared table's lock word and move journal. Written only under the
/// shard's insert lock (so never on the hot path): plain std atomics, not modelled.
#[derive(Debug, Default)]
#[repr(C, align(128))]
pub(crate) struct Shard {
    /// A shared table's insert lock (`shared/lock.rs`): 0 when free, else its holder's identity.
    /// A heap table's lock is its `Table::locks` entry.
    pub(crate) lock: StdAtomicU64,
    len: StdAtomicU64,
    reclaims: StdAtomicU64,
    evictions: StdAtomicU64,
    refused: StdAtomicU64,
    /// Inserts that moved keys to make room, and the keys moved.
    relocations: StdAtomicU64,
    moves: StdAtomicU64,
    /// A shared table's move in progress ([`Table::move_journaled`]): the slot it moves from
    /// (its index in the table plus one; 0 for none), the slot it moves to (likewise), the key
    /// word, and the stored state it takes.
    journal: [StdAtomicU64; 4],
}

/// A shard's insert lock, held: a heap table's mutex, or a shared table's lock word.
pub(crate) enum ShardGuard<'a> {
    #[allow(dead_code)] // held for its drop
    Local(MutexGuard<'a, ()>),
    #[allow(dead_code)] // held for its drop
    Shared(crate::keyed::shared::LockGuard<'a>),
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
    /// `buckets_per_shard * shards` buckets; bucket `i` belongs to shard `i & shard_mask`. On
    /// the heap, or in a shared region (`shared/`).
    buckets: Slab<Bucket>,
    shards: Slab<Shard>,
    /// A heap table's insert locks, one per shard; none for a shared table, whose locks are its
    /// shards' lock words.
    locks: Box<[CachePadded<Mutex<()>>]>,
    shard_mask: u64,
    /// `shard_mask`'s bits (the shards are a power of two): kept, so that a bucket's partner
    /// costs no bit count (`count_ones` is a dozen instructions without `popcnt`).
    shard_bits: u32,
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

/// The mask of a key's stored state (see *No ABA*): the key word times the table's secret (odd,
/// drawn per table), 64x64->128 bits, folded to 64 (ahash's `folded_multiply` with the secret as
/// its key). One multiply by a loaded operand: no constant to materialize, no `xor` before it.
#[inline]
pub(crate) fn mask_of(secret: u64, key: u64) -> u64 {
    let m = u128::from(key) * u128::from(secret);
    (m as u64) ^ ((m >> 64) as u64)
}

/// What the scan under the shard lock before an insert found.
pub(crate) enum Rescan<'a> {
    /// The key is present after all (another thread inserted it since the lock-free lookup, or
    /// moved it between its buckets).
    Present,
    /// It is absent; `free` is the first empty slot of its candidate buckets (the one
    /// `choose` would pick), found in the same pass.
    Absent { free: Option<&'a Slot> },
}

/// Under the shard lock, before inserting: whether the key is present after all and, if not,
/// its first free candidate slot, found here rather than by `choose`'s full ranking pass.
pub(crate) fn present(table: &Table, place: Place) -> Rescan<'_> {
    let (candidates, n) = table.candidates(place);
    let slots = || candidates[..n].iter().flat_map(|&b| &table.buckets[b].slots);
    if slots().any(|slot| slot.key.load(Ordering::Acquire) & FP_MASK == place.fp) {
        return Rescan::Present;
    }
    // Under the lock no slot becomes empty or taken meanwhile; in a table with room, the first
    // slot looked at is usually free.
    Rescan::Absent { free: slots().find(|slot| slot.key.load(Ordering::Acquire) == EMPTY) }
}

/// After a lock-free miss: the key's slot as the table holds it under the shard lock (no move in
/// progress), if it is present. Out of line: a miss in both buckets is the slow path, and the
/// lock's code (a heap mutex or a shared lock word) stays out of the paths that may take it
/// (a refund, a peek).
#[cold]
#[inline(never)]
pub(crate) fn confirm_miss(table: &Table, place: Place) -> Option<(&Slot, u64)> {
    let _guard = table.lock_shard(place.shard);
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
pub(crate) fn snapshot_guard(table: &Table, shard: usize) -> Option<ShardGuard<'_>> {
    Some(table.lock_shard(shard))
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
        let (shards, buckets_per_shard) = Self::geometry(capacity)?;
        let len = (shards * buckets_per_shard) as usize;
        let mut buckets = Vec::new();
        buckets.try_reserve_exact(len).map_err(|_| CapacityError::OutOfMemory {
            bytes: len as u64 * std::mem::size_of::<Bucket>() as u64,
        })?;
        // Before the first write, so that the writes fault huge pages in.
        let huge_pages = crate::mem::advise_huge_pages(&mut buckets.spare_capacity_mut()[..len]);
        buckets.extend((0..len).map(|_| Bucket::default()));
        let locks = (0..shards).map(|_| CachePadded::new(Mutex::new(()))).collect();
        let shards: Box<[_]> = (0..shards).map(|_| Shard::default()).collect();
        Ok(Table {
            buckets: Slab::from_box(buckets.into_boxed_slice()),
            shard_mask: shards.len() as u64 - 1,
            shard_bits: shards.len().trailing_zeros(),
            shards: Slab::from_box(shards),
            locks,
            buckets_per_shard,
            secret: mix(secret) | 1,
            on_full: OnFull::default(),
            huge_pages,
        })
    }

    /// The shards and buckets per shard of a table of at least `capacity` slots, or
    /// [`CapacityError::TooLarge`].
    pub(crate) fn geometry(capacity: usize) -> Result<(u64, u64), CapacityError> {
        Self::geometry_with(capacity, shard_count)
    }

    /// [`geometry`](Self::geometry) with `shards(capacity)` shards (a power of two, at most
    /// 256).
    pub(crate) fn geometry_with(
        capacity: usize,
        shards: impl Fn(u64) -> u64,
    ) -> Result<(u64, u64), CapacityError> {
        let capacity = (capacity as u64).max(1);
        if capacity > MAX_CAPACITY {
            return Err(CapacityError::TooLarge { requested: capacity, max: MAX_CAPACITY });
        }
        let shards = shards(capacity);
        Ok((shards, capacity.div_ceil(shards * SLOTS_PER_BUCKET as u64)))
    }

    /// A table over a shared region's `buckets` (`shards.len() * buckets_per_shard` of them)
    /// and `shards`, which the region's first process zeroed: its locks are the shards' lock
    /// words.
    #[cfg(all(target_os = "linux", not(ratewell_loom)))]
    pub(crate) fn in_region(
        buckets: Slab<Bucket>,
        shards: Slab<Shard>,
        buckets_per_shard: u64,
        secret: u64,
        on_full: OnFull,
    ) -> Self {
        debug_assert_eq!(buckets.len() as u64, shards.len() as u64 * buckets_per_shard);
        Table {
            buckets,
            shard_mask: shards.len() as u64 - 1,
            shard_bits: shards.len().trailing_zeros(),
            shards,
            locks: Box::new([]),
            buckets_per_shard,
            secret: mix(secret) | 1,
            on_full,
            huge_pages: false,
        }
    }

    /// Take shard `s`'s insert lock: a heap table's mutex, or a shared table's lock word (taken
    /// over from a holder that died, after mending what it left half done: [`repair`]).
    ///
    /// [`repair`]: Self::repair
    #[inline]
    pub(crate) fn lock_shard(&self, s: usize) -> ShardGuard<'_> {
        match self.locks.get(s) {
            Some(mutex) => ShardGuard::Local(lock(&**mutex)),
            None => self.lock_shared(s),
        }
    }

    #[cold]
    #[inline(never)]
    fn lock_shared(&self, s: usize) -> ShardGuard<'_> {
        let (guard, recovered) = crate::keyed::shared::LockGuard::acquire(&self.shards[s].lock);
        if recovered {
            self.repair(s);
        }
        ShardGuard::Shared(guard)
    }

    /// A shared table's shards whose lock word is held, and the holder's pid.
    #[cfg(all(target_os = "linux", not(ratewell_loom)))]
    pub(crate) fn lock_holders(&self) -> Vec<(usize, u32)> {
        let held = self.shards.iter().map(|s| s.lock.load(Ordering::Relaxed)).enumerate();
        held.filter(|&(_, w)| w != 0).map(|(s, w)| (s, (w >> 32) as u32)).collect()
    }

    /// Whether the table is in a shared region.
    pub(crate) fn is_shared(&self) -> bool {
        self.locks.is_empty()
    }

    /// The slot at `index` (bucket times 8 plus slot) of the whole array.
    fn slot_at(&self, index: usize) -> Option<&Slot> {
        self.buckets.get(index / SLOTS_PER_BUCKET)?.slots.get(index % SLOTS_PER_BUCKET)
    }

    /// Under shard `s`'s lock, taken over from a process that died holding it: finish or undo
    /// what it left half done, so that the shard is as after a whole step of the protocol.
    ///
    /// - A journaled move ([`move_journaled`](Self::move_journaled)) is finished: the key is
    ///   published in the slot it moved to, with the state it had (still in the slot it left if
    ///   the dead process had not taken it out yet, else the journal's copy), and the slot it
    ///   left is freed. No key is lost by a move.
    /// - Any other tombstone is a slot whose key was being replaced, reset or reclaimed: it is
    ///   freed (the key leaving it is gone, and the key arriving, the one being inserted, was
    ///   never published).
    /// - The shard's key count is counted again.
    fn repair(&self, s: usize) {
        let shard = &self.shards[s];
        let from = shard.journal[0].load(Ordering::Acquire) as usize;
        if from != 0 {
            let to = shard.journal[1].load(Ordering::Relaxed) as usize;
            let key = shard.journal[2].load(Ordering::Relaxed);
            let taken = shard.journal[3].load(Ordering::Relaxed);
            // Indices plus one, read from the region: anything out of range is no move.
            let at = |i: usize| i.checked_sub(1).and_then(|i| self.slot_at(i));
            if let (Some(a), Some(b)) = (at(from), at(to)) {
                let moved_off = a.key.load(Ordering::Relaxed) != key;
                if moved_off && b.key.load(Ordering::Relaxed) != key {
                    // The state is still in `a` unless the exchange that took it out ran.
                    let left = a.state.swap(0, Ordering::AcqRel);
                    let stored = if left != 0 { left } else { taken };
                    b.state.store(stored, Ordering::Relaxed);
                    b.key.store(key, Ordering::Release);
                }
                if moved_off {
                    a.state.store(0, Ordering::Relaxed);
                    a.key.store(EMPTY, Ordering::Release);
                }
            }
            shard.journal[0].store(0, Ordering::Release);
        }
        let bits = self.shard_bits;
        let mut len = 0;
        for w in 0..self.buckets_per_shard as usize {
            for slot in &self.buckets[w << bits | s].slots {
                match slot.key.load(Ordering::Relaxed) {
                    EMPTY => {}
                    TOMBSTONE => {
                        slot.state.store(0, Ordering::Relaxed);
                        slot.key.store(EMPTY, Ordering::Release);
                    }
                    _ => len += 1,
                }
            }
        }
        shard.len.store(len, Ordering::Relaxed);
    }

    /// [`move_key`] in a shared table, journaled in the shard so that a process that dies in the
    /// middle loses no key ([`repair`](Self::repair)): the journal names both slots and the key
    /// before the key leaves `from`, and holds the state taken out of `from` before it is taken
    /// (a compare-exchange from the value journaled, retried if a decision changed it).
    fn move_journaled(&self, shard: &Shard, from: usize, to: usize) {
        let (Some(a), Some(b)) = (self.slot_at(from), self.slot_at(to)) else { return };
        let key = a.key.load(Ordering::Relaxed);
        shard.journal[1].store(to as u64 + 1, Ordering::Relaxed);
        shard.journal[2].store(key, Ordering::Relaxed);
        shard.journal[0].store(from as u64 + 1, Ordering::Release);
        a.key.store(TOMBSTONE, Ordering::Relaxed);
        let mut stored = a.state.load(Ordering::Acquire);
        loop {
            shard.journal[3].store(stored, Ordering::Release);
            match a.state.compare_exchange(stored, 0, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(now) => stored = now,
            }
        }
        b.state.store(stored, Ordering::Relaxed);
        b.key.store(key, Ordering::Release);
        a.key.store(EMPTY, Ordering::Release);
        shard.journal[0].store(0, Ordering::Release);
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
        let bits = self.shard_bits;
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

    /// [`find`](Self::find) in the key's second bucket alone (its first just missed).
    #[inline]
    fn find_second(&self, place: Place) -> Option<(&Slot, u64)> {
        let b2 = self.partner(place.b1, place.fp);
        if b2 == place.b1 { None } else { self.find_in(place, b2) }
    }

    /// The slot holding the key, with its key word, as a lock-free scan sees it: a key being
    /// moved between its buckets (under the shard lock) is in neither for a moment, so a miss
    /// here is not yet an absence ([`find_settled`](Self::find_settled) is).
    #[inline]
    fn find(&self, place: Place) -> Option<(&Slot, u64)> {
        self.find_in(place, place.b1).or_else(|| self.find_second(place))
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
}
