//! The sliding log's keyed table: a log per key, behind a lock per shard.
//!
//! The sliding log's state is a list, not a word, so this table trades the lock-free hot path for
//! simplicity: each decision locks the key's shard (one of up to 256, so distinct keys rarely
//! contend). Capacity is bounded like the word table's: when a shard is full, logs whose entries
//! have all expired are reclaimed first (a scan of the shard: O(shard size), paid only when full),
//! then the live log with the most room left is evicted, or the key refused ([`OnFull::Refuse`]).
//! Each log holds at most `limit` entries (at most 65,536), merged per instant.

use std::collections::HashMap;

use crossbeam_utils::CachePadded;

use crate::algorithms::{Algorithm, sliding_log::Log, sliding_log::SlidingLog};
use crate::decision::Decision;
use crate::sync::{Mutex, MutexGuard};
use crate::table::{OnFull, Policies, TableStats};

pub(crate) struct LogTable {
    shards: Box<[CachePadded<Mutex<LogShard>>]>,
    per_shard: usize,
    on_full: OnFull,
}

#[derive(Default)]
struct LogShard {
    logs: HashMap<u64, (u8, Log), ahash::RandomState>,
    reclaims: u64,
    evictions: u64,
    refused: u64,
}

fn sliding_log<P: Policies>(policies: &P, idx: u8) -> Option<&SlidingLog> {
    match policies.algorithm(idx)? {
        Algorithm::Log(log) => Some(log),
        _ => None,
    }
}

impl LogTable {
    pub(crate) fn new(capacity: usize, on_full: OnFull) -> Self {
        let capacity = capacity.max(1);
        let shards = (capacity / 1024).clamp(1, 256).next_power_of_two();
        LogTable {
            shards: (0..shards)
                .map(|_| CachePadded::new(Mutex::new(LogShard::default())))
                .collect(),
            per_shard: capacity.div_ceil(shards),
            on_full,
        }
    }

    pub(crate) fn set_on_full(&mut self, on_full: OnFull) {
        self.on_full = on_full;
    }

    pub(crate) fn capacity(&self) -> u64 {
        (self.per_shard * self.shards.len()) as u64
    }

    fn shard(&self, hash: u64) -> MutexGuard<'_, LogShard> {
        let shard = &self.shards[(hash as usize) & (self.shards.len() - 1)];
        shard.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn decide<P: Policies>(
        &self,
        policies: &P,
        hash: u64,
        now: u64,
        cost: u32,
        commit: bool,
    ) -> Decision {
        let mut shard = self.shard(hash);
        if let Some((idx, log)) = shard.logs.get_mut(&hash) {
            match sliding_log(policies, *idx) {
                Some(algorithm) => return algorithm.decide(log, now, cost, commit),
                // Its policy was replaced: the key starts fresh under the current one.
                None => {
                    shard.logs.remove(&hash);
                }
            }
        }
        let idx = policies.resolve(hash);
        let algorithm = sliding_log(policies, idx).expect("resolve returns a live sliding log");
        let mut log = Log::default();
        let decision = algorithm.decide(&mut log, now, cost, false);
        if !commit || !decision.is_admitted() {
            return decision;
        }
        if shard.logs.len() >= self.per_shard {
            if let Some(refused) = self.make_room(policies, &mut shard, now, decision.limit()) {
                return refused;
            }
        }
        let decision = algorithm.decide(&mut log, now, cost, true);
        shard.logs.insert(hash, (idx, log));
        decision
    }

    /// Free one entry of a full shard: reclaim expired logs, else evict or refuse.
    #[cold]
    fn make_room<P: Policies>(
        &self,
        policies: &P,
        shard: &mut LogShard,
        now: u64,
        limit: u64,
    ) -> Option<Decision> {
        let before = shard.logs.len();
        shard.logs.retain(|_, (idx, log)| {
            sliding_log(policies, *idx).is_some_and(|a| !a.is_fresh(log, now))
        });
        shard.reclaims += (before - shard.logs.len()) as u64;
        if shard.logs.len() < self.per_shard {
            return None;
        }
        // Rank live logs by room left (then by how soon they empty).
        let mut best: Option<(u64, (u64, u64))> = None;
        for (&key, (idx, log)) in shard.logs.iter_mut() {
            let Some(a) = sliding_log(policies, *idx) else { continue };
            let probe = a.decide(log, now, 1, false);
            let remaining = probe.remaining() + u64::from(probe.is_admitted());
            let rank = (probe.limit().saturating_sub(remaining), probe.reset_after_ns());
            if best.is_none_or(|(_, b)| rank < b) {
                best = Some((key, rank));
            }
        }
        match (self.on_full, best) {
            (OnFull::EvictLeastGranting, Some((key, _))) => {
                shard.logs.remove(&key);
                shard.evictions += 1;
                None
            }
            _ => {
                shard.refused += 1;
                let soonest = shard
                    .logs
                    .values_mut()
                    .filter_map(|(idx, log)| {
                        sliding_log(policies, *idx)
                            .map(|a| a.decide(log, now, 1, false).reset_after_ns())
                    })
                    .min()
                    .unwrap_or(0);
                Some(Decision::rejected(limit, 0, soonest, soonest))
            }
        }
    }

    pub(crate) fn remove(&self, hash: u64) -> bool {
        self.shard(hash).logs.remove(&hash).is_some()
    }

    /// Move the key to the policy `resolve` gives it now, fresh.
    pub(crate) fn migrate<P: Policies>(&self, policies: &P, hash: u64) {
        let mut shard = self.shard(hash);
        let idx = policies.resolve(hash);
        if let Some(entry) = shard.logs.get_mut(&hash) {
            if entry.0 != idx {
                *entry = (idx, Log::default());
            }
        }
    }

    pub(crate) fn reclaim_fresh<P: Policies>(&self, policies: &P, now: u64) -> u64 {
        let mut total = 0;
        for shard in self.shards.iter() {
            let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            let before = shard.logs.len();
            shard.logs.retain(|_, (idx, log)| {
                sliding_log(policies, *idx).is_some_and(|a| !a.is_fresh(log, now))
            });
            let n = (before - shard.logs.len()) as u64;
            shard.reclaims += n;
            total += n;
        }
        total
    }

    pub(crate) fn stats(&self) -> TableStats {
        let mut s = TableStats::default();
        for shard in self.shards.iter() {
            let shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            s.len += shard.logs.len() as u64;
            s.reclaims += shard.reclaims;
            s.evictions += shard.evictions;
            s.refused += shard.refused;
        }
        s
    }
}
