//! The sliding log's keyed table: a log per key, behind a lock per shard.
//!
//! The sliding log's state is a list, not a word, so this table trades the lock-free hot path for
//! simplicity: each decision locks the key's shard (one of up to 256, so distinct keys rarely
//! contend). Each log holds at most `limit` entries (at most 65,536), merged per instant.
//!
//! # Bounded, in constant time per new key
//!
//! A shard keeps its keys in a slab (`nodes`, reused through a free list) indexed by a hash map,
//! and threads them on a doubly linked list in the order of their latest admission: the head is
//! the key admitted least recently. Since the limiter's time never goes backwards (its clock
//! floor), a key's newest entry is at least as old as the newest entry of every key behind it, so
//! under one policy the keys whose logs have expired are a prefix of the list. When a new key
//! finds its shard full, it examines at most [`CANDIDATES`] keys from the head: the first whose log
//! has expired (or whose policy was retired) is reclaimed (a *lossless reclaim*: no decision
//! changes); if all are live, the one whose loss grants the least extra capacity (the most
//! remaining, then the soonest back to full) is evicted, or the new key refused
//! ([`OnFull::Refuse`]). Either way a new key costs O(1), however many keys the shard holds.
//! With per-key overrides of different windows, an expired log deeper in the list is not seen:
//! lossless first among the candidates, as in the word table.
//!
//! # Memory
//!
//! Counted as allocated: the slab's and the index's capacity, and every log's entry buffer
//! (16 bytes an entry, room for at least 4; a buffer keeps its capacity as entries expire, and is
//! freed with its key). A key costs a 72-byte node and up to 4.6 index buckets of 13 bytes (the
//! index is a power of two of buckets at most 7/8 full, and doubles once when evictions leave it
//! tombstones): at most 136 bytes a key of capacity, plus its buffer. All of it grows with use up to the capacity in keys and
//! `limit` entries per key, never beyond.

use std::collections::HashMap;

use crossbeam_utils::CachePadded;

use crate::algorithms::{Algorithm, sliding_log::Log, sliding_log::SlidingLog};
use crate::cas::{Report, Taken};
use crate::decision::Decision;
use crate::keyed::registry::Policies;
use crate::keyed::table::{CapacityError, MAX_CAPACITY, OnFull, TableStats};
use crate::keyed::{Receipt, Store, shard_count};
use crate::sync::{Mutex, MutexGuard, lock};

/// Keys examined from the head of a full shard's list for one new key.
pub(crate) const CANDIDATES: usize = 8;
/// The end of a list.
const NIL: u32 = u32::MAX;

pub(crate) struct LogTable {
    shards: Box<[CachePadded<Mutex<LogShard>>]>,
    per_shard: usize,
    on_full: OnFull,
}

struct Node {
    hash: u64,
    /// The key's policy index.
    idx: u8,
    log: Log,
    prev: u32,
    next: u32,
}

struct LogShard {
    index: HashMap<u64, u32, ahash::RandomState>,
    nodes: Vec<Node>,
    /// Free nodes, chained through `next`.
    free: u32,
    /// Least recently admitted.
    head: u32,
    /// Most recently admitted.
    tail: u32,
    /// Bytes of every log's entry buffer.
    entry_bytes: u64,
    /// The most keys the index has had room for (it never shrinks; its `capacity` reads lower
    /// while removed keys' tombstones wait for a rehash).
    index_room: usize,
    reclaims: u64,
    evictions: u64,
    refused: u64,
}

pub(crate) fn sliding_log<P: Policies>(policies: &P, idx: u8) -> Option<&SlidingLog> {
    as_log(policies.algorithm(idx)?)
}

/// The policy of slot `idx` even if retired (what a key stored under it has been decided by).
pub(crate) fn previous_log<P: Policies>(policies: &P, idx: u8) -> Option<&SlidingLog> {
    as_log(policies.previous(idx)?)
}

pub(crate) fn as_log(algorithm: &Algorithm) -> Option<&SlidingLog> {
    match algorithm {
        Algorithm::Log(log) => Some(log),
        _ => None,
    }
}

impl LogShard {
    fn new() -> Self {
        LogShard {
            // Seeded: iteration order plays no part in a decision, and a fixed seed keeps the
            // table's behaviour the same from run to run.
            index: HashMap::with_hasher(ahash::RandomState::with_seeds(7, 11, 13, 17)),
            nodes: Vec::new(),
            free: NIL,
            head: NIL,
            tail: NIL,
            entry_bytes: 0,
            index_room: 0,
            reclaims: 0,
            evictions: 0,
            refused: 0,
        }
    }

    fn len(&self) -> usize {
        self.index.len()
    }

    fn unlink(&mut self, i: u32) {
        let (prev, next) = (self.nodes[i as usize].prev, self.nodes[i as usize].next);
        match prev {
            NIL => self.head = next,
            p => self.nodes[p as usize].next = next,
        }
        match next {
            NIL => self.tail = prev,
            n => self.nodes[n as usize].prev = prev,
        }
    }

    fn push_back(&mut self, i: u32) {
        let tail = self.tail;
        let node = &mut self.nodes[i as usize];
        node.prev = tail;
        node.next = NIL;
        match tail {
            NIL => self.head = i,
            t => self.nodes[t as usize].next = i,
        }
        self.tail = i;
    }

    /// Move `i` to the back: it was just admitted.
    fn touch(&mut self, i: u32) {
        if self.tail != i {
            self.unlink(i);
            self.push_back(i);
        }
    }

    /// Insert a key into a shard of at most `room` keys.
    fn insert(&mut self, hash: u64, idx: u8, log: Log, room: usize) {
        self.entry_bytes += log_bytes(&log);
        let node = Node { hash, idx, log, prev: NIL, next: NIL };
        let i = match self.free {
            NIL => {
                if self.nodes.len() == self.nodes.capacity() {
                    // Double, but never past the shard's room.
                    let more = self
                        .nodes
                        .capacity()
                        .max(4)
                        .min(room.saturating_sub(self.nodes.len()))
                        .max(1);
                    self.nodes.reserve_exact(more);
                }
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
            f => {
                self.free = self.nodes[f as usize].next;
                self.nodes[f as usize] = node;
                f
            }
        };
        self.index.insert(hash, i);
        self.index_room = self.index_room.max(self.index.capacity());
        self.push_back(i);
    }

    fn remove(&mut self, i: u32) {
        self.unlink(i);
        let node = &mut self.nodes[i as usize];
        self.index.remove(&node.hash);
        self.entry_bytes -= log_bytes(&node.log);
        node.log = Log::default();
        node.next = self.free;
        self.free = i;
    }

    /// Decide on node `i`'s log, keeping the byte count and the order; with `commit`, the
    /// time of the entry an admission logged.
    fn decide_at(
        &mut self,
        i: u32,
        a: &SlidingLog,
        now: u64,
        cost: u32,
        commit: bool,
    ) -> (Decision, Option<u64>) {
        let node = &mut self.nodes[i as usize];
        let before = log_bytes(&node.log);
        let (decision, at) = if commit {
            a.take(&mut node.log, now, cost)
        } else {
            (a.decide(&mut node.log, now, cost, false), None)
        };
        let after = log_bytes(&node.log);
        self.entry_bytes = self.entry_bytes - before + after;
        if at.is_some() {
            self.touch(i);
        }
        (decision, at)
    }
}

impl LogTable {
    /// Every key's `(hash, policy slot, log)`, shard by shard under its lock, each shard's keys
    /// from the least recently admitted.
    pub(crate) fn snapshot(&self, mut each: impl FnMut(u64, u8, &Log)) {
        for shard in self.shards.iter() {
            let shard = lock(&**shard);
            let mut i = shard.head;
            while i != NIL {
                let node = &shard.nodes[i as usize];
                each(node.hash, node.idx, &node.log);
                i = node.next;
            }
        }
    }

    /// Store the key hashed `hash` with its log under slot `idx`, behind the keys stored before
    /// it (restore them from the least recently admitted): `false` if its shard is full or the
    /// key is there already. With exclusive access: restoring fills a table no decision uses yet.
    pub(crate) fn put(&mut self, hash: u64, idx: u8, log: Log) -> bool {
        let room = self.per_shard;
        let mut shard = lock(&*self.shards[(hash as usize) & (self.shards.len() - 1)]);
        if shard.len() >= room || shard.index.contains_key(&hash) {
            return false;
        }
        shard.insert(hash, idx, log, room);
        true
    }

    /// The table's shape as a snapshot names it: shards and keys per shard.
    pub(crate) fn shape(&self) -> (u64, u64) {
        (self.shards.len() as u64, self.per_shard as u64)
    }
}

fn log_bytes(log: &Log) -> u64 {
    log.allocated_bytes() as u64
}

impl LogTable {
    /// Decide, and log the request if admitted and `commit` (else a peek); with what taking the
    /// admission back needs.
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
        // A key present under a live policy: decided under the shard lock alone.
        {
            let mut shard = self.shard(hash);
            if let Some(&i) = shard.index.get(&hash) {
                let idx = shard.nodes[i as usize].idx;
                if let Some(a) = policies.deciding(idx).and_then(as_log) {
                    return taken(shard.decide_at(i, a, now, cost, commit), idx);
                }
            }
        }
        // A new key, or one whose policy was replaced: resolve its policy before taking the
        // shard lock (resolving may take the registry's lock, which a sweep holds while it takes
        // shard locks), and check under it that the policy is still the one resolved.
        loop {
            let (idx, token) = policies.resolve(hash);
            let Some(algorithm) = sliding_log(policies, idx) else { continue };
            let mut shard = self.shard(hash);
            if !policies.still(idx, token) {
                continue;
            }
            if let Some(&i) = shard.index.get(&hash) {
                // Its log carries over (the entries are the requests the key made), read under
                // the current policy.
                shard.nodes[i as usize].idx = idx;
                return taken(shard.decide_at(i, algorithm, now, cost, commit), idx);
            }
            let decision = algorithm.decide(&mut Log::default(), now, cost, false);
            if !commit || !decision.is_admitted() {
                return taken((decision, None), idx);
            }
            if shard.len() >= self.per_shard {
                if let Some(refused) = self.make_room(policies, &mut shard, now, decision.limit()) {
                    return taken((refused, None), idx);
                }
            }
            let mut log = Log::default();
            let decided = algorithm.take(&mut log, now, cost);
            shard.insert(hash, idx, log, self.per_shard);
            return taken(decided, idx);
        }
    }

    pub(crate) fn new(capacity: usize) -> Result<Self, CapacityError> {
        let capacity = (capacity as u64).max(1);
        if capacity > MAX_CAPACITY {
            return Err(CapacityError::TooLarge { requested: capacity, max: MAX_CAPACITY });
        }
        let shards = shard_count(capacity);
        // At most 2^39 / 256 keys a shard: node indices fit u32, below `NIL`.
        let per_shard = capacity.div_ceil(shards) as usize;
        Ok(LogTable {
            shards: (0..shards).map(|_| CachePadded::new(Mutex::new(LogShard::new()))).collect(),
            per_shard,
            on_full: OnFull::default(),
        })
    }

    fn shard(&self, hash: u64) -> MutexGuard<'_, LogShard> {
        let shard = &self.shards[(hash as usize) & (self.shards.len() - 1)];
        lock(&**shard)
    }

    /// Free one node of a full shard, looking at most [`CANDIDATES`] keys from the head: reclaim
    /// an expired log, else evict the least granting or refuse.
    #[cold]
    fn make_room<P: Policies>(
        &self,
        policies: &P,
        shard: &mut LogShard,
        now: u64,
        limit: u64,
    ) -> Option<Decision> {
        let mut victim: Option<(u32, (u64, u64))> = None;
        let mut soonest = u64::MAX;
        let mut i = shard.head;
        for _ in 0..CANDIDATES {
            if i == NIL {
                break;
            }
            let node = &shard.nodes[i as usize];
            let Some(a) = previous_log(policies, node.idx).filter(|a| !a.is_fresh(&node.log, now))
            else {
                shard.remove(i);
                shard.reclaims += 1;
                return None;
            };
            let probe = a.probe(&node.log, now);
            soonest = soonest.min(probe.reset_after_ns());
            let rank = (probe.limit().saturating_sub(probe.remaining()), probe.reset_after_ns());
            if victim.is_none_or(|(_, best)| rank < best) {
                victim = Some((i, rank));
            }
            i = node.next;
        }
        match (self.on_full, victim) {
            (OnFull::EvictLeastGranting, Some((i, _))) => {
                shard.remove(i);
                shard.evictions += 1;
                None
            }
            _ => {
                shard.refused += 1;
                Some(Decision::table_full(limit, if soonest == u64::MAX { 0 } else { soonest }))
            }
        }
    }
}

impl Store for LogTable {
    fn set_on_full(&mut self, on_full: OnFull) {
        self.on_full = on_full;
    }

    /// Forget every key.
    fn reseed(&mut self, _secret: u64) {
        for shard in self.shards.iter() {
            let mut shard = lock(&**shard);
            let (reclaims, evictions, refused) = (shard.reclaims, shard.evictions, shard.refused);
            *shard = LogShard { reclaims, evictions, refused, ..LogShard::new() };
        }
    }

    fn capacity(&self) -> u64 {
        (self.per_shard * self.shards.len()) as u64
    }

    #[inline]
    fn decide<R: Report, P: Policies>(&self, policies: &P, hash: u64, now: u64, cost: u32) -> R {
        let taken = self.take(policies, hash, now, cost, true);
        R::from_taken(taken)
    }

    fn refund<P: Policies>(&self, policies: &P, receipt: &Receipt, _now: u64) -> bool {
        let mut shard = self.shard(receipt.hash);
        let Some(&i) = shard.index.get(&receipt.hash) else { return false };
        let node = &mut shard.nodes[i as usize];
        if node.idx != receipt.idx {
            return false;
        }
        let Some(a) = sliding_log(policies, node.idx) else { return false };
        a.give_back(&mut node.log, receipt.after, u64::from(receipt.cost));
        true
    }

    fn peek<P: Policies>(&self, policies: &P, hash: u64, now: u64, cost: u32) -> Decision {
        self.take(policies, hash, now, cost, false).decision
    }

    fn fingerprint(&self, hash: u64) -> u64 {
        // The index holds whole hashes.
        hash
    }

    fn reset(&self, hash: u64) -> bool {
        let mut shard = self.shard(hash);
        let Some(&i) = shard.index.get(&hash) else { return false };
        shard.remove(i);
        true
    }

    /// Move the key to the policy `resolve` gives it now; its log carries over.
    fn migrate<P: Policies>(&self, policies: &P, hash: u64, _now: u64) {
        loop {
            let (idx, token) = policies.resolve(hash);
            let mut shard = self.shard(hash);
            if !policies.still(idx, token) {
                continue;
            }
            if let Some(&i) = shard.index.get(&hash) {
                shard.nodes[i as usize].idx = idx;
            }
            return;
        }
    }

    /// Move every key stored under a retired policy slot to its current policy (under the
    /// registry's lock, before it frees those slots).
    fn sweep<P: Policies>(&self, policies: &P, _now: u64) {
        for shard in self.shards.iter() {
            let mut shard = lock(&**shard);
            for i in 0..shard.nodes.len() {
                let node = &shard.nodes[i];
                if shard.index.get(&node.hash) == Some(&(i as u32))
                    && sliding_log(policies, node.idx).is_none()
                {
                    let (idx, _) = policies.resolve(node.hash);
                    shard.nodes[i].idx = idx;
                }
            }
        }
    }

    /// Reclaim every expired log (a scan of every shard); returns how many.
    fn reclaim_fresh<P: Policies>(&self, policies: &P, now: u64) -> u64 {
        let mut total = 0;
        for shard in self.shards.iter() {
            let mut shard = lock(&**shard);
            let mut i = shard.head;
            while i != NIL {
                let node = &shard.nodes[i as usize];
                let next = node.next;
                let fresh =
                    previous_log(policies, node.idx).is_none_or(|a| a.is_fresh(&node.log, now));
                if fresh {
                    shard.remove(i);
                    shard.reclaims += 1;
                    total += 1;
                }
                i = next;
            }
        }
        total
    }

    /// Bytes allocated for keys and logs now: bounded by the capacity in keys and each policy's
    /// limit in entries.
    fn memory_bytes(&self) -> u64 {
        let node = std::mem::size_of::<Node>() as u64;
        // hashbrown: a key, a value and a control byte per bucket, with buckets a power of two
        // at most 7/8 full.
        let index = std::mem::size_of::<(u64, u32)>() as u64 + 1;
        let buckets =
            |room: usize| if room == 0 { 0 } else { (room * 8).div_ceil(7).next_power_of_two() };
        self.shards
            .iter()
            .map(|shard| {
                let shard = lock(&**shard);
                shard.nodes.capacity() as u64 * node
                    + buckets(shard.index_room) as u64 * index
                    + shard.entry_bytes
            })
            .sum()
    }

    fn stats(&self) -> TableStats {
        let mut s = TableStats::default();
        for shard in self.shards.iter() {
            let shard = lock(&**shard);
            s.len += shard.len() as u64;
            s.reclaims += shard.reclaims;
            s.evictions += shard.evictions;
            s.refused += shard.refused;
        }
        s
    }
}
