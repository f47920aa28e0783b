//! Shared tables: a keyed limiter's table in memory that several processes map, so that every
//! process on a machine decides on the same states (`docs/SEMANTICS.md`, *Shared tables*).
//!
//! # What the region holds
//!
//! Everything the table's processes must agree on, and nothing else; offsets, never pointers
//! (each process maps the region at its own address):
//!
//! | bytes | what |
//! |---|---|
//! | 0..4096 | the header: the initialisation word (`lock.rs`), a magic number and the layout version, the geometry, the full-table behaviour, the hash seeds and a probe of the hasher, the clock's origin and scale, the boot it was made in, the policy's text, each process's counter block's owner |
//! | `SHARDS` | per shard, 128 bytes: its insert lock word, its counters, its move journal (a sliding log's table uses the lock word alone) |
//! | `COUNTS` | per process (16 blocks), a cell of admitted and rejected counts per thread; 8 striped cells for the rest; the refunds |
//! | `BUCKETS` (4096-aligned) | the buckets, as a heap table's (`table.rs`); for a sliding log, every key's node and ring of entries, shard by shard (`logs.rs`) |
//!
//! The decision hot path is the heap table's, instruction for instruction: the buckets and the
//! shards are [`Slab`]s, one pointer and one length either way. What differs is around it: the
//! insert locks are lock words a waiter can take over from a dead process (`lock.rs`), the
//! table's moves are journaled so that a death loses no key (`Table::repair`), the counters are
//! in the region, and the clock is the region's (`SharedClock`).
//!
//! # Attaching
//!
//! The first process to attach initialises the region (exactly once, even when several race:
//! `lock::initialise`); every process then checks the header against what it was asked for, and
//! is refused with an error naming the field that differs. Attaching starts no thread and
//! allocates only the limiter's own few hundred bytes and its policy.

mod lock;

#[cfg(not(all(target_os = "linux", not(ratewell_loom))))]
use self::lock::Liveness;

use std::sync::atomic::AtomicU64;

/// A shared table's shard insert lock, held (`lock.rs`, *The lock word*).
pub(crate) struct LockGuard<'a> {
    word: &'a AtomicU64,
}

impl<'a> LockGuard<'a> {
    /// Take the lock `word`, and whether it was taken over from a process that died holding it.
    pub(crate) fn acquire(word: &'a AtomicU64) -> (Self, bool) {
        #[cfg(all(target_os = "linux", not(ratewell_loom)))]
        let recovered = lock::acquire(word, &lock::System);
        // No shared table is built there: a lock word nobody dies holding.
        #[cfg(not(all(target_os = "linux", not(ratewell_loom))))]
        let recovered = lock::acquire(word, &Alone);
        (LockGuard { word }, recovered)
    }
}

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        lock::release(self.word);
    }
}

/// One process that never dies: where shared tables are not built (off Linux, loom).
#[cfg(not(all(target_os = "linux", not(ratewell_loom))))]
struct Alone;

#[cfg(not(all(target_os = "linux", not(ratewell_loom))))]
impl Liveness for Alone {
    fn me(&self) -> u64 {
        1
    }
    fn gone(&self, _: u64) -> bool {
        false
    }
    fn pause(&self, _: u32) {
        std::hint::spin_loop();
    }
}

/// The protocols, for the loom models (`loom-tests/`); not part of the API.
#[cfg(ratewell_loom)]
#[doc(hidden)]
pub mod protocol {
    pub use super::lock::{CHECK_EVERY, Init, Liveness, READY, Word, acquire, initialise, release};
}

#[cfg(all(target_os = "linux", not(ratewell_loom)))]
mod logs;
#[cfg(all(target_os = "linux", not(ratewell_loom)))]
mod region;

#[cfg(all(target_os = "linux", not(ratewell_loom)))]
pub(crate) use self::logs::LogRegion;

#[cfg(all(target_os = "linux", not(ratewell_loom)))]
pub use self::region::{SharedError, SharedInfo};
