//! A shared table's sliding logs: every key's log in the region, behind the shard's lock word.
//!
//! The heap's log table (`log_table.rs`) grows with use; a region cannot grow, so this one lays
//! out everything it may ever need when the region is made: per shard, `per_shard` nodes, each
//! a key's hash, its place in the shard's list, its policy slot, and a ring of `entries` (the
//! policy's limit) `(time, cost)` entries. The sliding log's decision (`SlidingLog`) is the
//! heap's, on a ring in the region instead of a `VecDeque` ([`Entries`]).
//!
//! # A shard's words
//!
//! | words | what |
//! |---|---|
//! | 0..16 | the undo journal's length, the keys held, the free list, the nodes handed out, the list's ends, the counters |
//! | `index` | an open-addressed index of the shard's keys, a node plus one per word (0: empty), at most half full |
//! | `journal` | the undo journal: `(word, old value)` pairs |
//! | `nodes` | the nodes: hash, links (previous and next plus one), policy slot and a used bit, the ring's word (head, length and total cost), then the ring |
//!
//! Zeros are an empty shard: a region is made of zeros and needs no further writes.
//!
//! # A process that dies holding the lock
//!
//! Every operation under the shard's lock writes through an undo journal: before a word of the
//! shard changes, its index and old value are appended to the journal, and the journal's
//! length word is written (with a flag that an operation is open); the operation ends by
//! zeroing that word. The index is not journaled: it is what the nodes say, and is rebuilt
//! from them. A process that takes the lock over from a dead holder (or from any holder that
//! left the flag set) restores the journaled words newest first and rebuilds the index: the
//! shard is as before the dead process's operation, which loses only that operation's
//! request (its caller never saw the decision). This relies on what a killed process has
//! stored reaching memory in its program order, as the word table's move journal does
//! (`Table::repair`).
//!
//! A region is input from another process: every index read from it is checked before it is
//! used, and every walk is bounded by the shard's size, so hostile bytes give wrong decisions
//! at worst, never a panic or a hang.

use std::sync::atomic::{AtomicU64, Ordering};

use super::LockGuard;
use crate::algorithms::sliding_log::{Entries, EntriesMut, Log, SlidingLog};
use crate::cas::{Report, Taken};
use crate::decision::Decision;
use crate::keyed::log_table::{CANDIDATES, as_log, previous_log, sliding_log};
use crate::keyed::registry::Policies;
use crate::keyed::table::{OnFull, Shard, TableStats};
use crate::keyed::{Receipt, Store};
use crate::mem::Slab;

/// A shard's first words.
mod at {
    pub(super) const JOURNAL: usize = 0;
    pub(super) const LEN: usize = 1;
    /// The first free node, plus one (0: none); free nodes chain through their next link.
    pub(super) const FREE: usize = 2;
    /// Nodes handed out so far: those from here on are zeros, never used.
    pub(super) const NEXT: usize = 3;
    /// The list's ends, plus one: least and most recently admitted.
    pub(super) const FIRST: usize = 4;
    pub(super) const LAST: usize = 5;
    pub(super) const RECLAIMS: usize = 6;
    pub(super) const EVICTIONS: usize = 7;
    pub(super) const REFUSED: usize = 8;
    pub(super) const HEAD: usize = 16;
}

/// A node's words.
mod node {
    pub(super) const HASH: usize = 0;
    /// Previous plus one in the low half, next plus one in the high half.
    pub(super) const LINKS: usize = 1;
    /// The policy slot in the low byte, and [`USED`](super::USED).
    pub(super) const META: usize = 2;
    /// The ring: head, length and total cost, 17 bits each ([`Ring`](super::Ring)).
    pub(super) const RING: usize = 3;
    pub(super) const ENTRIES: usize = 4;
}

/// The journal's length word while an operation is open.
const OPEN: u64 = 1 << 63;
/// A node that holds a key.
const USED: u64 = 1 << 8;
const FIELD: u64 = (1 << 17) - 1;
/// Journal pairs beyond a ring's worth: the most words an operation writes outside the ring
/// (an eviction and an insert, with their links and counters) is under 40.
const SPARE_PAIRS: u64 = 64;

/// The shape of a shared table's logs: shards, keys per shard, entries per key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Geometry {
    pub(crate) shards: u64,
    pub(crate) per_shard: u64,
    pub(crate) entries: u64,
    index_slots: usize,
    journal_at: usize,
    nodes_at: usize,
    node_words: usize,
    shard_words: usize,
}

impl Geometry {
    /// The geometry, if it is one a table can have (`shards` a power of two up to 256, keys per
    /// shard below 2^31, entries from 1 to 65,536) and its words fit the address space.
    pub(crate) fn new(shards: u64, per_shard: u64, entries: u64) -> Option<Self> {
        let sliding = u64::from(crate::algorithms::sliding_log::MAX_LIMIT);
        if !shards.is_power_of_two() || shards > 256 || per_shard == 0 || per_shard >= 1 << 31 {
            return None;
        }
        if entries == 0 || entries > sliding {
            return None;
        }
        let index_slots = (per_shard * 2).next_power_of_two();
        let journal_pairs = 2 * entries + SPARE_PAIRS;
        let node_words = node::ENTRIES as u64 + 2 * entries;
        let journal_at = at::HEAD as u64 + index_slots;
        let nodes_at = journal_at + 2 * journal_pairs;
        let shard_words = per_shard.checked_mul(node_words)?.checked_add(nodes_at)?;
        let total = shard_words.checked_mul(shards)?.checked_mul(8)?;
        usize::try_from(total).ok()?;
        Some(Geometry {
            shards,
            per_shard,
            entries,
            index_slots: index_slots as usize,
            journal_at: journal_at as usize,
            nodes_at: nodes_at as usize,
            node_words: node_words as usize,
            shard_words: shard_words as usize,
        })
    }

    /// Bytes of every shard's words.
    pub(crate) fn bytes(&self) -> usize {
        self.shard_words * self.shards as usize * 8
    }

    fn journal_pairs(&self) -> usize {
        (self.nodes_at - self.journal_at) / 2
    }
}

/// The sliding logs of a shared table.
pub(crate) struct LogRegion {
    /// The table's shards, for their lock words.
    locks: Slab<Shard>,
    words: Slab<AtomicU64>,
    geo: Geometry,
    on_full: OnFull,
}

impl LogRegion {
    /// The logs over `words` (the region's log area, [`Geometry::bytes`] of it) and `locks`
    /// (a lock per shard).
    pub(crate) fn new(
        locks: Slab<Shard>,
        words: Slab<AtomicU64>,
        geo: Geometry,
        on_full: OnFull,
    ) -> Option<Self> {
        (locks.len() as u64 == geo.shards && words.len() * 8 == geo.bytes()).then_some(LogRegion {
            locks,
            words,
            geo,
            on_full,
        })
    }

    fn shard_of(&self, hash: u64) -> usize {
        (hash as usize) & (self.geo.shards as usize - 1)
    }

    /// Shard `s`, locked; repaired first if a holder left an operation open.
    fn lock(&self, s: usize) -> Locked<'_> {
        let (guard, _) = LockGuard::acquire(&self.locks[s].lock);
        let from = s * self.geo.shard_words;
        let mut locked = Locked {
            w: &self.words[from..from + self.geo.shard_words],
            g: &self.geo,
            journaled: 0,
            open: false,
            guard: Some(guard),
        };
        if locked.w[at::JOURNAL].load(Ordering::Acquire) != 0 {
            locked.roll_back();
        }
        locked
    }

    /// The shards whose lock word is held, and the holder's pid.
    pub(crate) fn lock_holders(&self) -> Vec<(usize, u32)> {
        let held = self.locks.iter().map(|s| s.lock.load(Ordering::Relaxed)).enumerate();
        held.filter(|&(_, w)| w != 0).map(|(s, w)| (s, (w >> 32) as u32)).collect()
    }

    /// Every key's `(hash, policy slot, log)`, shard by shard under its lock, each shard's keys
    /// from the least recently admitted.
    pub(crate) fn snapshot(&self, mut each: impl FnMut(u64, u8, &Log)) {
        for s in 0..self.geo.shards as usize {
            let shard = self.lock(s);
            let mut at = shard.link(shard.get(at::FIRST));
            let mut steps = 0;
            while let Some(n) = at {
                if steps == self.geo.per_shard {
                    break;
                }
                steps += 1;
                let (hash, idx) = (shard.get(shard.node(n) + node::HASH), shard.idx(n));
                let log = Log::copied(&shard.ring(n));
                each(hash, idx, &log);
                at = shard.next(n);
            }
        }
    }

    /// Store the key hashed `hash` with `log` under slot `idx`, behind the keys stored before
    /// it: `false` if its shard is full or the key is there already.
    pub(crate) fn put(&self, hash: u64, idx: u8, log: &Log) -> bool {
        let mut shard = self.lock(self.shard_of(hash));
        if shard.find(hash).is_some() {
            return false;
        }
        let Some(n) = shard.insert(hash, idx) else { return false };
        let mut ring = shard.ring_mut(n);
        for i in 0..log.len().min(self.geo.entries as usize) {
            let (t, c) = log.get(i);
            let total = ring.total.saturating_add(c);
            ring.admit(0, t, c, total);
        }
        true
    }

    /// The table's shape as a snapshot names it: shards and keys per shard.
    pub(crate) fn shape(&self) -> (u64, u64) {
        (self.geo.shards, self.geo.per_shard)
    }

    /// Decide, and log the request if admitted and `commit` (else a peek); with what taking the
    /// admission back needs. As the heap's `LogTable::take`.
    fn take<P: Policies>(
        &self,
        policies: &P,
        hash: u64,
        now: u64,
        cost: u32,
        commit: bool,
    ) -> Taken {
        let taken = |(decision, at): (Decision, Option<u64>), idx: u8| Taken {
            decision,
            charge: at.map(|at| (0, at)),
            idx,
        };
        let s = self.shard_of(hash);
        {
            let mut shard = self.lock(s);
            if let Some(n) = shard.find(hash) {
                let idx = shard.idx(n);
                if let Some(a) = policies.deciding(idx).and_then(as_log) {
                    return taken(shard.decide_at(n, a, now, cost, commit), idx);
                }
            }
        }
        loop {
            let (idx, token) = policies.resolve(hash);
            let Some(algorithm) = sliding_log(policies, idx) else { continue };
            let mut shard = self.lock(s);
            if !policies.still(idx, token) {
                continue;
            }
            if let Some(n) = shard.find(hash) {
                shard.set_idx(n, idx);
                return taken(shard.decide_at(n, algorithm, now, cost, commit), idx);
            }
            let decision = algorithm.peek(&Log::default(), now, cost);
            if !commit || !decision.is_admitted() {
                return taken((decision, None), idx);
            }
            if !shard.has_room() {
                if let Some(refused) = self.make_room(policies, &mut shard, now, decision.limit()) {
                    return taken((refused, None), idx);
                }
            }
            let Some(n) = shard.insert(hash, idx) else {
                // Only a corrupted shard has no node after making room.
                shard.count(at::REFUSED);
                return taken((Decision::table_full(decision.limit(), 0), None), idx);
            };
            return taken(shard.decide_at(n, algorithm, now, cost, true), idx);
        }
    }

    /// Free one node of a full shard, looking at most [`CANDIDATES`] keys from the head: reclaim
    /// an expired log, else evict the least granting or refuse (as the heap's table).
    #[cold]
    fn make_room<P: Policies>(
        &self,
        policies: &P,
        shard: &mut Locked<'_>,
        now: u64,
        limit: u64,
    ) -> Option<Decision> {
        let mut victim: Option<(usize, (u64, u64))> = None;
        let mut soonest = u64::MAX;
        let mut at = shard.link(shard.get(at::FIRST));
        for _ in 0..CANDIDATES {
            let Some(n) = at else { break };
            let ring = shard.ring(n);
            let Some(a) = previous_log(policies, shard.idx(n)).filter(|a| !a.is_fresh(&ring, now))
            else {
                shard.remove(n);
                shard.count(at::RECLAIMS);
                return None;
            };
            let probe = a.probe(&ring, now);
            soonest = soonest.min(probe.reset_after_ns());
            let rank = (probe.limit().saturating_sub(probe.remaining()), probe.reset_after_ns());
            if victim.is_none_or(|(_, best)| rank < best) {
                victim = Some((n, rank));
            }
            at = shard.next(n);
        }
        match (self.on_full, victim) {
            (OnFull::EvictLeastGranting, Some((n, _))) => {
                shard.remove(n);
                shard.count(at::EVICTIONS);
                None
            }
            _ => {
                shard.count(at::REFUSED);
                Some(Decision::table_full(limit, if soonest == u64::MAX { 0 } else { soonest }))
            }
        }
    }
}

impl Store for LogRegion {
    fn set_on_full(&mut self, on_full: OnFull) {
        self.on_full = on_full;
    }

    /// Forget every key (of every process).
    fn reseed(&mut self, _secret: u64) {
        for s in 0..self.geo.shards as usize {
            self.lock(s).clear();
        }
    }

    fn capacity(&self) -> u64 {
        self.geo.shards * self.geo.per_shard
    }

    #[inline]
    fn decide<R: Report, P: Policies>(&self, policies: &P, hash: u64, now: u64, cost: u32) -> R {
        R::from_taken(self.take(policies, hash, now, cost, true))
    }

    fn refund<P: Policies>(&self, policies: &P, receipt: &Receipt, _now: u64) -> bool {
        let mut shard = self.lock(self.shard_of(receipt.hash));
        let Some(n) = shard.find(receipt.hash) else { return false };
        if shard.idx(n) != receipt.idx {
            return false;
        }
        let Some(a) = sliding_log(policies, receipt.idx) else { return false };
        a.give_back(&mut shard.ring_mut(n), receipt.after, u64::from(receipt.cost));
        true
    }

    fn peek<P: Policies>(&self, policies: &P, hash: u64, now: u64, cost: u32) -> Decision {
        self.take(policies, hash, now, cost, false).decision
    }

    fn fingerprint(&self, hash: u64) -> u64 {
        hash
    }

    fn reset(&self, hash: u64) -> bool {
        let mut shard = self.lock(self.shard_of(hash));
        let Some(n) = shard.find(hash) else { return false };
        shard.remove(n);
        true
    }

    fn migrate<P: Policies>(&self, policies: &P, hash: u64, _now: u64) {
        loop {
            let (idx, token) = policies.resolve(hash);
            let mut shard = self.lock(self.shard_of(hash));
            if !policies.still(idx, token) {
                continue;
            }
            if let Some(n) = shard.find(hash) {
                shard.set_idx(n, idx);
            }
            return;
        }
    }

    fn sweep<P: Policies>(&self, policies: &P, _now: u64) {
        for s in 0..self.geo.shards as usize {
            let mut shard = self.lock(s);
            for n in 0..shard.handed_out() {
                if shard.used(n) && sliding_log(policies, shard.idx(n)).is_none() {
                    let hash = shard.get(shard.node(n) + node::HASH);
                    let (idx, _) = policies.resolve(hash);
                    shard.set_idx(n, idx);
                    shard.commit();
                }
            }
        }
    }

    fn reclaim_fresh<P: Policies>(&self, policies: &P, now: u64) -> u64 {
        let mut total = 0;
        for s in 0..self.geo.shards as usize {
            let mut shard = self.lock(s);
            let mut at = shard.link(shard.get(at::FIRST));
            let mut steps = 0;
            while let Some(n) = at {
                if steps == self.geo.per_shard {
                    break;
                }
                steps += 1;
                let next = shard.next(n);
                let ring = shard.ring(n);
                if previous_log(policies, shard.idx(n)).is_none_or(|a| a.is_fresh(&ring, now)) {
                    shard.remove(n);
                    shard.count(at::RECLAIMS);
                    // Each removal its own operation: the journal holds one at a time.
                    shard.commit();
                    total += 1;
                }
                at = next;
            }
        }
        total
    }

    /// The region's log area: laid out in full when the table is made.
    fn memory_bytes(&self) -> u64 {
        self.geo.bytes() as u64
    }

    fn stats(&self) -> TableStats {
        let mut s = TableStats::default();
        // Counts from the region are another process's bytes: capped and saturating.
        for shard in 0..self.geo.shards as usize {
            let shard = self.lock(shard);
            s.len += shard.get(at::LEN).min(self.geo.per_shard);
            s.reclaims = s.reclaims.saturating_add(shard.get(at::RECLAIMS));
            s.evictions = s.evictions.saturating_add(shard.get(at::EVICTIONS));
            s.refused = s.refused.saturating_add(shard.get(at::REFUSED));
        }
        s
    }
}

/// A shard, locked: its words, written through the undo journal.
struct Locked<'a> {
    w: &'a [AtomicU64],
    g: &'a Geometry,
    /// Pairs in the journal.
    journaled: usize,
    /// Whether an operation is open (the journal's length word has [`OPEN`]).
    open: bool,
    /// Released after the journal is closed.
    guard: Option<LockGuard<'a>>,
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // An operation cut short: undone, as for a process that died.
            if self.open {
                self.roll_back();
            }
        } else {
            self.commit();
        }
        let guard = self.guard.take();
        if died() {
            // (Tests: a process that died holds its lock for ever.)
            std::mem::forget(guard);
        }
    }
}

#[cfg(test)]
thread_local! {
    /// Tests: the stores to a shard this thread makes before it "dies" (`None`: it lives), and
    /// whether it has (a store was refused).
    static STORES_LEFT: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
    static DEAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the next store to a shard happens (tests: not once the thread has "died").
#[cfg(test)]
fn alive() -> bool {
    STORES_LEFT.with(|left| match left.get() {
        None => true,
        Some(0) => {
            DEAD.with(|dead| dead.set(true));
            false
        }
        Some(n) => {
            left.set(Some(n - 1));
            true
        }
    })
}

#[cfg(test)]
fn died() -> bool {
    DEAD.with(|dead| dead.get())
}

#[cfg(not(test))]
#[inline(always)]
fn alive() -> bool {
    true
}

#[cfg(not(test))]
#[inline(always)]
fn died() -> bool {
    false
}

impl<'a> Locked<'a> {
    fn get(&self, i: usize) -> u64 {
        self.w[i].load(Ordering::Relaxed)
    }

    /// Store `value` in word `i` (every store to the shard is one of these).
    fn store(&self, i: usize, value: u64, order: Ordering) {
        if alive() {
            self.w[i].store(value, order);
        }
    }

    /// Open an operation (before its first write, the index's included).
    fn begin(&mut self) {
        if !self.open {
            self.open = true;
            self.journaled = 0;
            self.store(at::JOURNAL, OPEN, Ordering::Release);
        }
    }

    /// Write word `i`, its old value journaled first.
    fn set(&mut self, i: usize, value: u64) {
        let old = self.get(i);
        if old == value {
            return;
        }
        self.begin();
        let k = self.journaled;
        if k < self.g.journal_pairs() {
            let pair = self.g.journal_at + 2 * k;
            self.store(pair, i as u64, Ordering::Relaxed);
            self.store(pair + 1, old, Ordering::Relaxed);
            self.journaled = k + 1;
            self.store(at::JOURNAL, OPEN | (k as u64 + 1), Ordering::Release);
        }
        // (No operation writes more words than the journal holds: `SPARE_PAIRS`.)
        self.store(i, value, Ordering::Relaxed);
    }

    /// Write an index word (not journaled: rebuilt from the nodes).
    fn set_index(&mut self, slot: usize, value: u64) {
        self.begin();
        self.store(at::HEAD + slot, value, Ordering::Relaxed);
    }

    /// End the open operation: what it wrote stands.
    fn commit(&mut self) {
        if self.open {
            self.store(at::JOURNAL, 0, Ordering::Release);
            self.open = false;
            self.journaled = 0;
        }
    }

    /// Undo the journaled words, newest first, rebuild the index, and close the journal.
    fn roll_back(&mut self) {
        let pairs = (self.w[at::JOURNAL].load(Ordering::Acquire) & !OPEN) as usize;
        for k in (0..pairs.min(self.g.journal_pairs())).rev() {
            let pair = self.g.journal_at + 2 * k;
            let (i, old) = (self.get(pair) as usize, self.get(pair + 1));
            // Only the shard's own header and nodes are ever journaled.
            if i < at::HEAD || (self.g.nodes_at..self.g.shard_words).contains(&i) {
                self.store(i, old, Ordering::Relaxed);
            }
        }
        self.rebuild_index();
        self.store(at::JOURNAL, 0, Ordering::Release);
        self.open = false;
        self.journaled = 0;
    }

    /// The index from the nodes: every used node handed out, by its hash.
    fn rebuild_index(&mut self) {
        for slot in 0..self.g.index_slots {
            self.store(at::HEAD + slot, 0, Ordering::Relaxed);
        }
        for n in 0..self.handed_out() {
            if self.used(n) {
                let hash = self.get(self.node(n) + node::HASH);
                if self.find(hash).is_none() {
                    self.index_insert(hash, n);
                }
            }
        }
    }

    /// Forget every key: the shard as zeros say.
    fn clear(&mut self) {
        for w in [at::LEN, at::FREE, at::NEXT, at::FIRST, at::LAST] {
            self.set(w, 0);
        }
        for slot in 0..self.g.index_slots {
            if self.get(at::HEAD + slot) != 0 {
                self.set_index(slot, 0);
            }
        }
    }

    fn node(&self, n: usize) -> usize {
        self.g.nodes_at + n * self.g.node_words
    }

    /// Nodes handed out (checked against the shard's size).
    fn handed_out(&self) -> usize {
        self.get(at::NEXT).min(self.g.per_shard) as usize
    }

    /// The node a link or list end names (a node plus one), if it names one handed out.
    fn link(&self, value: u64) -> Option<usize> {
        let n = value.checked_sub(1)? as usize;
        (n < self.handed_out()).then_some(n)
    }

    fn used(&self, n: usize) -> bool {
        self.get(self.node(n) + node::META) & USED != 0
    }

    fn idx(&self, n: usize) -> u8 {
        self.get(self.node(n) + node::META) as u8
    }

    fn set_idx(&mut self, n: usize, idx: u8) {
        self.set(self.node(n) + node::META, USED | u64::from(idx));
    }

    fn prev(&self, n: usize) -> Option<usize> {
        self.link(self.get(self.node(n) + node::LINKS) & 0xffff_ffff)
    }

    fn next(&self, n: usize) -> Option<usize> {
        self.link(self.get(self.node(n) + node::LINKS) >> 32)
    }

    fn set_links(&mut self, n: usize, prev: Option<usize>, next: Option<usize>) {
        let plus = |l: Option<usize>| l.map_or(0, |l| l as u64 + 1);
        self.set(self.node(n) + node::LINKS, plus(prev) | plus(next) << 32);
    }

    fn count(&mut self, counter: usize) {
        self.set(counter, self.get(counter).wrapping_add(1));
    }

    fn has_room(&self) -> bool {
        self.get(at::FREE) != 0 || self.get(at::NEXT) < self.g.per_shard
    }

    fn home(&self, hash: u64) -> usize {
        (hash >> 8) as usize & (self.g.index_slots - 1)
    }

    /// The node holding the key hashed `hash`.
    fn find(&self, hash: u64) -> Option<usize> {
        let mask = self.g.index_slots - 1;
        let mut slot = self.home(hash);
        for _ in 0..self.g.index_slots {
            let n = self.get(at::HEAD + slot).checked_sub(1)? as usize;
            if n < self.handed_out() && self.get(self.node(n) + node::HASH) == hash && self.used(n)
            {
                return Some(n);
            }
            slot = (slot + 1) & mask;
        }
        None
    }

    fn index_insert(&mut self, hash: u64, n: usize) {
        let mask = self.g.index_slots - 1;
        let mut slot = self.home(hash);
        for _ in 0..self.g.index_slots {
            if self.get(at::HEAD + slot) == 0 {
                self.set_index(slot, n as u64 + 1);
                return;
            }
            slot = (slot + 1) & mask;
        }
        // A full index: only corrupted bytes hold more keys than half its slots. The key is
        // stored without an entry in it (so not found again), never lost from another's.
    }

    /// Remove node `n` from the index: backward-shift deletion, so that no tombstone is left.
    fn index_remove(&mut self, hash: u64, n: usize) {
        let mask = self.g.index_slots - 1;
        let mut slot = self.home(hash);
        let mut found = None;
        for _ in 0..self.g.index_slots {
            match self.get(at::HEAD + slot) {
                0 => break,
                v if v == n as u64 + 1 => {
                    found = Some(slot);
                    break;
                }
                _ => slot = (slot + 1) & mask,
            }
        }
        let Some(mut hole) = found else { return };
        let mut k = hole;
        for _ in 0..self.g.index_slots {
            k = (k + 1) & mask;
            let v = self.get(at::HEAD + k);
            let Some(m) = v.checked_sub(1).map(|m| m as usize) else { break };
            let home = if m < self.g.per_shard as usize {
                self.home(self.get(self.node(m) + node::HASH))
            } else {
                k
            };
            // The entry at `k` may fill the hole unless its home lies cyclically in (hole, k].
            if k.wrapping_sub(home) & mask >= k.wrapping_sub(hole) & mask {
                self.set_index(hole, v);
                hole = k;
            }
        }
        self.set_index(hole, 0);
    }

    fn unlink(&mut self, n: usize) {
        let (prev, next) = (self.prev(n), self.next(n));
        match prev {
            None => self.set(at::FIRST, next.map_or(0, |n| n as u64 + 1)),
            Some(p) => {
                let pp = self.prev(p);
                self.set_links(p, pp, next);
            }
        }
        match next {
            None => self.set(at::LAST, prev.map_or(0, |n| n as u64 + 1)),
            Some(q) => {
                let qn = self.next(q);
                self.set_links(q, prev, qn);
            }
        }
    }

    fn push_back(&mut self, n: usize) {
        let last = self.link(self.get(at::LAST));
        self.set_links(n, last, None);
        match last {
            None => self.set(at::FIRST, n as u64 + 1),
            Some(l) => {
                let lp = self.prev(l);
                self.set_links(l, lp, Some(n));
            }
        }
        self.set(at::LAST, n as u64 + 1);
    }

    /// Move `n` to the back: it was just admitted.
    fn touch(&mut self, n: usize) {
        if self.link(self.get(at::LAST)) != Some(n) {
            self.unlink(n);
            self.push_back(n);
        }
    }

    /// A free node holding the key hashed `hash` with an empty log, at the back of the list.
    fn insert(&mut self, hash: u64, idx: u8) -> Option<usize> {
        let n = match self.link(self.get(at::FREE)) {
            Some(n) => {
                let next = self.next(n).map_or(0, |n| n as u64 + 1);
                self.set(at::FREE, next);
                n
            }
            None => {
                let next = self.get(at::NEXT);
                if next >= self.g.per_shard {
                    return None;
                }
                self.set(at::NEXT, next + 1);
                next as usize
            }
        };
        let base = self.node(n);
        self.set(base + node::HASH, hash);
        self.set(base + node::RING, 0);
        self.set_idx(n, idx);
        self.push_back(n);
        self.set(at::LEN, self.get(at::LEN) + 1);
        self.index_insert(hash, n);
        Some(n)
    }

    fn remove(&mut self, n: usize) {
        let hash = self.get(self.node(n) + node::HASH);
        self.index_remove(hash, n);
        self.unlink(n);
        let base = self.node(n);
        self.set(base + node::META, 0);
        self.set(base + node::RING, 0);
        let free = self.link(self.get(at::FREE));
        self.set_links(n, None, free);
        self.set(at::FREE, n as u64 + 1);
        self.set(at::LEN, self.get(at::LEN).saturating_sub(1));
    }

    fn ring(&self, n: usize) -> Ring<&Self> {
        Ring::of(self, self.node(n))
    }

    fn ring_mut(&mut self, n: usize) -> Ring<&mut Locked<'a>> {
        let base = self.node(n);
        Ring::of(self, base)
    }

    /// Decide on node `n`'s log; with `commit`, the time of the entry an admission logged.
    fn decide_at(
        &mut self,
        n: usize,
        a: &SlidingLog,
        now: u64,
        cost: u32,
        commit: bool,
    ) -> (Decision, Option<u64>) {
        let (decision, at) = if commit {
            a.take(&mut self.ring_mut(n), now, cost)
        } else {
            (a.peek(&self.ring(n), now, cost), None)
        };
        if at.is_some() {
            self.touch(n);
        }
        (decision, at)
    }
}

/// A node's ring of entries, over a locked shard (`S` is `&Locked` to read, `&mut Locked` to
/// write): the [`Entries`] the sliding log decides on. Its word, as read, is checked (a head
/// and a length inside the ring): a corrupted one reads as an empty ring.
struct Ring<S> {
    shard: S,
    base: usize,
    head: usize,
    len: usize,
    total: u64,
}

impl<'a, S: std::ops::Deref<Target = Locked<'a>>> Ring<S> {
    fn of(shard: S, base: usize) -> Self {
        let word = shard.get(base + node::RING);
        let cap = shard.g.entries as usize;
        let (head, len, total) =
            ((word & FIELD) as usize, (word >> 17 & FIELD) as usize, word >> 34 & FIELD);
        let (head, len, total) =
            if head < cap && len <= cap { (head, len, total) } else { (0, 0, 0) };
        Ring { shard, base, head, len, total }
    }

    /// The word of entry `i`'s time (its cost is the next).
    fn at(&self, i: usize) -> usize {
        let cap = self.shard.g.entries as usize;
        self.base + node::ENTRIES + 2 * ((self.head + i) % cap)
    }
}

impl<'a, S: std::ops::Deref<Target = Locked<'a>>> Entries for Ring<S> {
    fn len(&self) -> usize {
        self.len
    }
    fn get(&self, i: usize) -> (u64, u64) {
        let w = self.at(i);
        (self.shard.get(w), self.shard.get(w + 1))
    }
    fn total(&self) -> u64 {
        self.total
    }
}

impl<'a> Ring<&mut Locked<'a>> {
    fn write_word(&mut self) {
        let word = self.head as u64 | (self.len as u64) << 17 | (self.total & FIELD) << 34;
        self.shard.set(self.base + node::RING, word);
    }
}

impl<'a> EntriesMut for Ring<&mut Locked<'a>> {
    fn admit(&mut self, expired: usize, at: u64, cost: u64, total: u64) {
        let cap = self.shard.g.entries as usize;
        let expired = expired.min(self.len);
        self.head = (self.head + expired) % cap;
        self.len -= expired;
        self.total = total;
        match self.newest() {
            Some((t, c)) if t == at => {
                let w = self.at(self.len - 1) + 1;
                self.shard.set(w, c.saturating_add(cost));
            }
            _ if self.len < cap => {
                let w = self.at(self.len);
                self.shard.set(w, at);
                self.shard.set(w + 1, cost);
                self.len += 1;
            }
            // A full ring holds `limit` entries of cost at least 1 each, so no admission
            // reaches it unless the region's bytes were corrupted: nothing is logged then.
            _ => {}
        }
        self.write_word();
    }
    fn take_off(&mut self, i: usize, back: u64) {
        let (_, c) = self.get(i);
        let back = back.min(c);
        self.total = self.total.saturating_sub(back);
        if c > back {
            let w = self.at(i) + 1;
            self.shard.set(w, c - back);
        } else {
            // The newer entries move down one place.
            for k in i..self.len - 1 {
                let (t, c) = self.get(k + 1);
                let w = self.at(k);
                self.shard.set(w, t);
                self.shard.set(w + 1, c);
            }
            self.len -= 1;
        }
        self.write_word();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyed::log_table::LogTable;
    use crate::keyed::registry::Registry;
    use crate::policy::Policy;

    const SEC: u64 = 1_000_000_000;

    fn logs(policy: &Policy, per_shard: u64) -> (LogRegion, Registry) {
        let Algorithm::Log(log) = &policy.algorithm else { panic!("a sliding log") };
        let geo = Geometry::new(1, per_shard, log.max_entries()).unwrap();
        let words: Box<[AtomicU64]> = (0..geo.bytes() / 8).map(|_| AtomicU64::new(0)).collect();
        let locks: Box<[Shard]> = vec![Shard::default()].into_boxed_slice();
        let region = LogRegion::new(
            Slab::from_box(locks),
            Slab::from_box(words),
            geo,
            OnFull::EvictLeastGranting,
        )
        .unwrap();
        let mut registry = Registry::new(policy);
        registry.freeze();
        (region, registry)
    }

    use crate::algorithms::Algorithm;

    /// A small deterministic generator.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    /// The shared logs decide exactly as the heap's log table (itself checked against the
    /// model): every decision, peek and refund, and the keys kept through evictions and
    /// reclaims, at the same instants.
    #[test]
    fn decides_as_the_heap_table() {
        let policy: Policy = "sliding-log limit=5 window=1s".parse().unwrap();
        // 16 keys of room (the heap table at capacity 16: one shard of 16), 40 keys asked.
        let (shared, registry) = logs(&policy, 16);
        let heap = LogTable::new(16).unwrap();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut now = SEC;
        let mut receipts: Vec<Receipt> = Vec::new();
        for step in 0..20_000 {
            now += rng.next(SEC / 20);
            let hash = rng.next(40) * 0x1_0000_0001 + 7;
            match rng.next(10) {
                0..=5 => {
                    let cost = 1 + rng.next(3) as u32;
                    let a: Taken = heap.decide(&registry, hash, now, cost);
                    let b: Taken = shared.decide(&registry, hash, now, cost);
                    assert_eq!(a.decision, b.decision, "step {step}: decide");
                    assert_eq!(a.charge, b.charge, "step {step}");
                    if let Some(receipt) = Receipt::of(hash, a.idx, a.charge, cost) {
                        receipts.push(receipt);
                    }
                }
                6 => {
                    let cost = 1 + rng.next(6) as u32;
                    let (a, b) = (
                        heap.peek(&registry, hash, now, cost),
                        shared.peek(&registry, hash, now, cost),
                    );
                    assert_eq!(a, b, "step {step}: peek");
                }
                7 if !receipts.is_empty() => {
                    let r = receipts.swap_remove(rng.next(receipts.len() as u64) as usize);
                    assert_eq!(
                        heap.refund(&registry, &r, now),
                        shared.refund(&registry, &r, now),
                        "step {step}: refund"
                    );
                }
                8 => assert_eq!(heap.reset(hash), shared.reset(hash), "step {step}: reset"),
                _ if rng.next(20) == 0 => assert_eq!(
                    heap.reclaim_fresh(&registry, now),
                    shared.reclaim_fresh(&registry, now),
                    "step {step}: reclaim"
                ),
                _ => {}
            }
            let (a, b) = (heap.stats(), shared.stats());
            assert_eq!(
                (a.len, a.reclaims, a.evictions, a.refused),
                (b.len, b.reclaims, b.evictions, b.refused),
                "step {step}: the tables' counts"
            );
        }
        let (mut a, mut b) = (Vec::new(), Vec::new());
        heap.snapshot(|h, i, log| a.push((h, i, log.entries().collect::<Vec<_>>())));
        shared.snapshot(|h, i, log| b.push((h, i, log.entries().collect::<Vec<_>>())));
        assert_eq!(a, b, "the same keys, in the same order, with the same logs");
        assert!(shared.stats().evictions > 0 && shared.stats().reclaims > 0);
    }

    /// The shard's words a key's decisions read: everything but the lock, the index (rebuilt)
    /// and the journal (spent).
    fn state(region: &LogRegion) -> Vec<u64> {
        let g = region.geo;
        let w = &region.words;
        let mut out: Vec<u64> = (1..at::HEAD).map(|i| w[i].load(Ordering::Relaxed)).collect();
        out.extend(w[g.nodes_at..g.shard_words].iter().map(|w| w.load(Ordering::Relaxed)));
        out
    }

    /// A process that dies after any number of its stores to a shard (simulated: its later
    /// stores never happen, and it never releases the lock) leaves a shard that the next
    /// holder takes over and restores to what it was before the operation, every key found.
    #[test]
    fn a_death_at_any_store_is_undone() {
        let policy: Policy = "sliding-log limit=4 window=1s".parse().unwrap();
        let (region, registry) = logs(&policy, 6);
        let mut now = SEC;
        // Keys 1..=6 fill the shard; key 1 holds three entries, key 2 two.
        let mut receipts = Vec::new();
        for (key, times) in [(1u64, 3), (2, 2), (3, 1), (4, 1), (5, 1), (6, 1)] {
            for _ in 0..times {
                now += 1000;
                let t: Taken = region.decide(&registry, key << 8, now, 1);
                receipts.push(Receipt::of(key << 8, t.idx, t.charge, 1).unwrap());
            }
        }
        type Op<'a> = Box<dyn Fn(&LogRegion, u64) + 'a>;
        let ops: Vec<(&str, Op)> = vec![
            (
                "an admission",
                Box::new(|r, now| {
                    let _ = r.decide::<Taken, _>(&registry, 2 << 8, now, 1);
                }),
            ),
            (
                "an eviction and an insert",
                Box::new(|r, now| {
                    let _ = r.decide::<Taken, _>(&registry, 9 << 8, now, 2);
                }),
            ),
            (
                "a refund from the middle of a log",
                Box::new(|r, now| {
                    let _ = r.refund(&registry, &receipts[1], now);
                }),
            ),
            (
                "a reset",
                Box::new(|r, _| {
                    let _ = r.reset(4 << 8);
                }),
            ),
        ];
        for (name, op) in &ops {
            let mut stores = 0;
            loop {
                let before = state(&region);
                let mut keys = Vec::new();
                region.snapshot(|hash, _, _| keys.push(hash));
                STORES_LEFT.with(|left| left.set(Some(stores)));
                op(&region, now + 5000);
                let dead = died();
                STORES_LEFT.with(|left| left.set(None));
                DEAD.with(|d| d.set(false));
                if !dead {
                    break;
                }
                // The lock word names this process, which "died": name a gone one (pid 0).
                region.locks[0].lock.store(1, Ordering::Relaxed);
                drop(region.lock(0));
                assert_eq!(state(&region), before, "{name}, dead after {stores} stores");
                let shard = region.lock(0);
                for &key in &keys {
                    let n = shard.find(key).expect("every key found after the repair");
                    assert!(shard.used(n));
                }
                drop(shard);
                stores += 1;
            }
            // The operation, done whole, wrote at least its journal's opening and one word.
            assert!(stores > 3, "{name}: {stores} stores");
        }
        assert_eq!(region.stats().len, 5, "6 keys, one evicted for key 9, one reset");
    }
}
