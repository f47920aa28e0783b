//! Snapshots of the one-word table: its shape, its keys read shard by shard, and restoring them
//! (`keyed/snapshot.rs` writes and reads the file).

use super::{EMPTY, FP_BITS, FP_MASK, MAX_POLICIES, TOMBSTONE, Table, key_word, read_guard};
use crate::sync::Ordering;

impl Table {
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
        for s in 0..self.shards.len() {
            let _guard = read_guard(self, s);
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
}
