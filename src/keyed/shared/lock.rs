//! The two protocols a shared table's processes coordinate by, each on one 64-bit word of the
//! region: a shard's insert lock, and the region's initialisation. Both name a process by its
//! *identity*, and both let a waiter take over from a holder that died.
//!
//! # Identities
//!
//! A process's identity is `pid << 32 | nonce`, where `nonce` is drawn at random once per
//! process (again after `fork`): never 0 (a pid is at least 1), and a process that the kernel
//! gives a dead holder's pid has another identity, so it never takes the holder's lock for its
//! own. A holder is *gone* when no process has its pid (`kill(pid, 0)` fails with `ESRCH`) or
//! that process is a zombie (killed, not yet reaped: `/proc/PID/stat`). Only those two answers,
//! which cannot be wrong about a live holder, count: a waiter never takes over a lock whose
//! holder lives, since two holders would corrupt the shard. (A start time in the identity would
//! also tell a reused pid from its first owner, but a process's view of its own `/proc` entry
//! is not always the others' view of it: qemu-user emulates `/proc/self/stat`. So a dead
//! holder whose pid the kernel has given to another process is waited for until that process
//! ends, which takes the kernel cycling through every pid while the holder's lock is held.)
//!
//! # The lock word
//!
//! 0 when free, else the holder's identity. Taking it: compare-exchange `0 -> me` (`Acquire`).
//! Releasing it: store 0 (`Release`): what the holder wrote under the lock is seen by the next
//! holder. A waiter spins briefly, then yields, and every [`CHECK_EVERY`] tries asks whether the
//! holder is gone; if so it takes the word over by compare-exchange `holder -> me` (one waiter
//! wins), and the caller mends what the dead holder left half done (`Table::repair`) before it
//! goes on. Threads of one process share its identity: a holder that is this process is never
//! taken over (it is alive), so the lock excludes threads as well as processes.
//!
//! # The initialisation word
//!
//! 0 for a region no process has initialised, [`READY`] once one has, else the identity of the
//! process initialising it. The first to exchange `0 -> me` initialises the region and stores
//! `READY` (`Release`); the others wait for `READY` (`Acquire`: they see the whole header). If
//! the initialiser is gone, a waiter takes the word over (`initialiser -> me`) and initialises
//! the region from the start. So exactly one process's initialisation is the one every process
//! attaches to.
//!
//! The loom models in `loom-tests/` check both protocols with processes simulated as threads, a
//! death as a thread that stops holding the word.

// The protocols are public to the loom models (`protocol` in `mod.rs`) and to the crate alone
// otherwise.
#![cfg_attr(not(ratewell_loom), allow(unreachable_pub))]

use std::sync::atomic::Ordering;

/// A 64-bit word the protocols run on: std's atomic in a region, loom's in the models.
pub trait Word {
    /// The atomic's `load`.
    fn load(&self, order: Ordering) -> u64;
    /// The atomic's `store`.
    fn store(&self, value: u64, order: Ordering);
    /// The atomic's `compare_exchange`.
    fn compare_exchange(
        &self,
        current: u64,
        new: u64,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u64, u64>;
}

macro_rules! word {
    ($atomic:ty) => {
        impl Word for $atomic {
            #[inline]
            fn load(&self, order: Ordering) -> u64 {
                <$atomic>::load(self, order)
            }
            #[inline]
            fn store(&self, value: u64, order: Ordering) {
                <$atomic>::store(self, value, order)
            }
            #[inline]
            fn compare_exchange(
                &self,
                current: u64,
                new: u64,
                success: Ordering,
                failure: Ordering,
            ) -> Result<u64, u64> {
                <$atomic>::compare_exchange(self, current, new, success, failure)
            }
        }
    };
}
word!(std::sync::atomic::AtomicU64);
#[cfg(ratewell_loom)]
word!(loom::sync::atomic::AtomicU64);

/// The initialisation word of a region whose header is complete. Not an identity: no pid is
/// `2^32 - 1` (Linux's `pid_max` is at most 2^22).
pub const READY: u64 = u64::MAX;

/// Tries between two questions whether the holder is gone.
pub const CHECK_EVERY: u32 = 256;

/// How a process learns whether another is gone (the system's answer, or a model's).
pub trait Liveness {
    /// This process's identity.
    fn me(&self) -> u64;
    /// Whether the process of `identity` is gone (never true for [`me`](Self::me)).
    fn gone(&self, identity: u64) -> bool;
    /// Let the holder run, after `tries` tries: a spin, a yield, then short sleeps.
    fn pause(&self, tries: u32);
}

/// Take the lock `word`: `true` if it was taken over from a holder that is gone (the caller
/// mends what it left).
pub fn acquire(word: &impl Word, live: &impl Liveness) -> bool {
    let me = live.me();
    let mut tries = 0u32;
    loop {
        // A held word is only read (no exchange) until it looks free: waiters do not pass its
        // cache line back and forth.
        let holder = match word.load(Ordering::Relaxed) {
            0 => match word.compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return false,
                Err(holder) => holder,
            },
            holder => holder,
        };
        tries = tries.wrapping_add(1);
        if tries.is_multiple_of(CHECK_EVERY) && holder != me && live.gone(holder) {
            // The dead holder released nothing: what it wrote before it died is seen because
            // its death is (the kernel has ended it before `gone` can say so), not through
            // this exchange's ordering.
            let taken = word.compare_exchange(holder, me, Ordering::Acquire, Ordering::Relaxed);
            if taken.is_ok() {
                return true;
            }
        }
        live.pause(tries);
    }
}

/// Release the lock `word`, held by this process.
pub fn release(word: &impl Word) {
    word.store(0, Ordering::Release);
}

/// What [`initialise`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Init {
    /// This process initialised the region.
    Created,
    /// Another had: the header is complete.
    Attached,
}

/// Run the initialisation word's protocol: `init` runs in exactly one process (again in another
/// if that one is gone before it finished), the others wait until it has finished. `may_take`
/// says whether a region whose word names a process that is gone may be initialised anew (the
/// caller checks that the region is a table's, not foreign bytes). An error from `init` gives
/// the word back (0) and is returned.
pub fn initialise<E>(
    word: &impl Word,
    live: &impl Liveness,
    may_take: impl Fn() -> Result<(), E>,
    mut init: impl FnMut() -> Result<(), E>,
) -> Result<Init, E> {
    let me = live.me();
    let mut tries = 0u32;
    loop {
        let seen = word.load(Ordering::Acquire);
        let claimed = match seen {
            READY => return Ok(Init::Attached),
            0 => word.compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed).is_ok(),
            _ => {
                tries = tries.wrapping_add(1);
                // A process initialising it: wait, unless it is gone.
                let gone = seen != me && tries.is_multiple_of(CHECK_EVERY) && live.gone(seen);
                if gone {
                    may_take()?;
                    word.compare_exchange(seen, me, Ordering::Acquire, Ordering::Relaxed).is_ok()
                } else {
                    live.pause(tries);
                    false
                }
            }
        };
        if claimed {
            return match init() {
                Ok(()) => {
                    word.store(READY, Ordering::Release);
                    Ok(Init::Created)
                }
                Err(e) => {
                    word.store(0, Ordering::Release);
                    Err(e)
                }
            };
        }
    }
}

/// The system's answer: identities from `/proc`, `kill(pid, 0)`.
#[cfg(all(target_os = "linux", not(ratewell_loom)))]
pub(crate) struct System;

#[cfg(all(target_os = "linux", not(ratewell_loom)))]
impl System {
    /// The state of process `pid` (`R`, `S`, `Z`...), from `/proc/PID/stat`.
    fn state(pid: u32) -> Option<u8> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // `pid (comm) state ...`: the command may hold spaces and parentheses; it ends at the
        // last ')'.
        let rest = &text[text.rfind(')')? + 1..];
        Some(*rest.split_ascii_whitespace().next()?.as_bytes().first()?)
    }
}

#[cfg(all(target_os = "linux", not(ratewell_loom)))]
impl Liveness for System {
    fn me(&self) -> u64 {
        use std::sync::atomic::AtomicU64 as Std;
        // Cached with the pid it was read for: a child of `fork` reads its own.
        static CACHED: Std = Std::new(0);
        let pid = std::process::id();
        let cached = CACHED.load(Ordering::Relaxed);
        if cached >> 32 == u64::from(pid) {
            return cached;
        }
        let nonce = ahash::RandomState::new().hash_one(pid) as u32;
        let me = u64::from(pid) << 32 | u64::from(nonce);
        // One identity per process, whichever thread asks first.
        match CACHED.compare_exchange(cached, me, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => me,
            Err(other) if other >> 32 == u64::from(pid) => other,
            Err(_) => self.me(),
        }
    }

    fn gone(&self, identity: u64) -> bool {
        let pid = (identity >> 32) as u32;
        let me = self.me();
        if identity == me {
            return false;
        }
        // A holder with this process's pid and another identity had the pid before it.
        if u64::from(pid) == me >> 32 {
            return true;
        }
        if !crate::mem::process_exists(pid) {
            return true;
        }
        // A zombie is gone, unless it is a thread-group leader that ended with `pthread_exit`
        // while its other threads run on (its `task` directory lists them). No `/proc` to ask:
        // the pid alone said it exists.
        match Self::state(pid) {
            Some(b'Z' | b'X') => {
                let tasks = std::fs::read_dir(format!("/proc/{pid}/task"));
                tasks.map_or(true, |tasks| tasks.count() <= 1)
            }
            _ => false,
        }
    }

    fn pause(&self, tries: u32) {
        match tries {
            0..64 => std::hint::spin_loop(),
            64..1024 => std::thread::yield_now(),
            _ => std::thread::sleep(std::time::Duration::from_micros(50)),
        }
    }
}
