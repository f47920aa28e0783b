//! loom models of the shared table's two one-word protocols (`src/keyed/shared/lock.rs`, exposed
//! under `--cfg ratewell_loom` as `ratewell::shared_protocol`): the shard's insert lock
//! (`acquire`, `release`) and the region's initialisation (`initialise`).
//!
//! Processes are loom threads, each with its own [`Liveness`] ([`Proc`]) whose identity is its
//! number (1, 2, 3) and whose `gone` reads the shared dead flags ([`Dead`]). A process that dies
//! simply stops, holding the word: it sets its flag and returns. The flag is set `Release` and
//! read `Acquire`: whoever learns that a process is gone sees what it wrote before it died, as a
//! death observed through the kernel is in a real system. The protocol cannot carry that itself:
//! its `Acquire` on the takeover pairs with no `Release` of the dead holder's (its last write to
//! the word was its own `0 -> me`). With the flag `Relaxed`, loom finds the taker's repair
//! racing the dead holder's write in `lock_holder_dies_racing_its_waiters`.
//! `pause` yields to loom's scheduler, so that a spin lets the holder run.
//!
//! | model | threads and what they do | what it asserts |
//! |-------|--------------------------|-----------------|
//! | `lock_excludes` | two processes, each taking the lock twice: an increment under it (a loom `UnsafeCell`, and an atomic read and written back in two steps), then the release | loom finds no two accesses to the cell unordered by the lock, no increment is lost, nothing is taken over, the word is free after |
//! | `lock_excludes_three` | the same with three processes, once each (spins cut short: see below) | the same |
//! | `lock_taken_over_from_a_dead_holder` | A takes the lock, does half its work (one of its two increments) and dies holding it; then B and C start and take the lock | exactly one of B and C took it over (`true`), and it saw A's half, alone, and mended it; the other took it cleanly; no two sections unordered; four increments; the word free after |
//! | `lock_holder_dies_racing_its_waiters` | the same three started at once: A takes the lock first, between B and C, or last | whoever comes after A takes it over and mends A's half; nobody takes it over twice; if A came last its lock stays held, its half unmended; no two sections unordered (A's half seen through its death alone: no thread started after A wrote it) |
//! | `initialised_once` | two processes initialise a region concurrently | one `Created`, one `Attached`; `init` ran once; both see the header (written `Relaxed` by `init`, read `Relaxed` after); nothing taken over; the word `READY` |
//! | `initialised_once_three` | the same with three (spins cut short) | one `Created`, two `Attached`, the rest as above |
//! | `initialised_again_after_a_dead_initialiser` | A claims the word (`0 -> A`, as `initialise` does), writes half the header and dies; then B and C initialise concurrently | exactly one of them ran `init` (`Created`, the header written anew over A's half), the other `Attached`; both see the whole header; the word `READY` |
//! | `failed_initialisation_gives_the_word_back` | B's `init` fails, C's succeeds, concurrently | C `Created`; B got its error (the word back at 0, for C) or `Attached` to C's header without running `init` |
//!
//! # Spins
//!
//! loom owes a spinning thread no fairness: with two waiters and a holder, it explores the
//! waiters yielding to each other for ever, without a preemption, and the model never ends. So
//! a waiter on a live holder is cut short after [`PRUNE_AFTER`] tries (`loom::skip_branch`: that
//! execution goes on, but nothing after is explored), in the three-process models. While the
//! holder lives, a failed try changes nothing but the waiter's count of tries: the executions
//! cut repeat a state already explored.
//!
//! A waiter asks whether the holder is gone only every [`CHECK_EVERY`] (256) tries, so in a model
//! with a dead holder each waiter spins 256 times first. The lock's waiters spin on
//! compare-exchanges, each a write to loom, so it places the two preemptions among all of them:
//! `lock_taken_over_from_a_dead_holder` alone takes about 270,000 executions and 100 s. [`Quiet`]
//! stops loom exploring while both waiters wait on the dead holder far from their check
//! ([`NEAR`] tries before it): every try in that stretch fails and changes nothing, and each
//! yield hands the turn to the other waiter, so the schedules skipped differ in nothing but the
//! waiters' counts of tries. `SHARED_LOOM_FULL=1` explores every try on a dead holder (about
//! 100 s for `lock_taken_over_from_a_dead_holder`, over ten minutes for
//! `lock_holder_dies_racing_its_waiters`).
#![cfg(ratewell_loom)]

use std::sync::Arc as PlainArc;
use std::sync::atomic::AtomicBool as PlainBool;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use loom::thread;
use ratewell::shared_protocol::{
    CHECK_EVERY, Init, Liveness, READY, Word, acquire, initialise, release,
};

/// The processes a model may have: identities 1 to `PROCESSES`.
const PROCESSES: usize = 3;

/// Tries after which a three-process model's waiter stops being explored (see the module doc).
const PRUNE_AFTER: u32 = 8;

/// Tries before each check whether the holder is gone that [`Quiet`] explores.
const NEAR: u32 = 8;

/// Branches one execution may take: a waiter on a dead holder goes [`CHECK_EVERY`] times round
/// its loop (a compare-exchange or a load, and a yield) before it asks; loom's default is 1,000.
const MAX_BRANCHES: usize = 16 * CHECK_EVERY as usize;

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(2);
    }
    if std::env::var_os("LOOM_MAX_BRANCHES").is_none() {
        builder.max_branches = MAX_BRANCHES;
    }
    builder.check(f);
}

/// Which processes have died, by identity - 1.
struct Dead([AtomicBool; PROCESSES]);

impl Dead {
    fn new() -> Arc<Self> {
        Arc::new(Self(std::array::from_fn(|_| AtomicBool::new(false))))
    }
}

/// How a process's waits are explored (see the module doc).
enum Spin {
    /// Every try.
    Full,
    /// Not after this many tries.
    Pruned(u32),
    /// As [`Quiet`] says.
    Quiet(PlainArc<Quiet>),
}

/// A simulated process: its identity, the shared dead flags, and how its waits are explored.
struct Proc {
    me: u64,
    dead: Arc<Dead>,
    spin: Spin,
}

impl Proc {
    fn new(me: u64, dead: &Arc<Dead>) -> Self {
        Self::with(me, dead, Spin::Full)
    }

    fn with(me: u64, dead: &Arc<Dead>, spin: Spin) -> Self {
        assert!((1..=PROCESSES as u64).contains(&me));
        Self { me, dead: Arc::clone(dead), spin }
    }

    /// This process dies: it stops here, whatever it holds.
    fn die(self) {
        self.dead.0[self.me as usize - 1].store(true, Release);
    }

    /// Its wait is over (it holds the word, or initialise returned).
    fn waited(&self) {
        if let Spin::Quiet(quiet) = &self.spin {
            quiet.set(self.me, false);
        }
    }
}

impl Liveness for Proc {
    fn me(&self) -> u64 {
        self.me
    }

    fn gone(&self, identity: u64) -> bool {
        assert_ne!(identity, self.me, "asked whether it is gone itself");
        assert!(
            (1..=PROCESSES as u64).contains(&identity),
            "asked about {identity:#x}, which names no process"
        );
        self.dead.0[identity as usize - 1].load(Acquire)
    }

    fn pause(&self, tries: u32) {
        match &self.spin {
            Spin::Full => {}
            Spin::Pruned(after) => {
                if tries > *after {
                    loom::skip_branch();
                }
            }
            Spin::Quiet(quiet) => {
                if !quiet.died.load(Relaxed) && tries > PRUNE_AFTER {
                    // Waiting on a live holder: as `Pruned`.
                    loom::skip_branch();
                }
                quiet.set(self.me, tries % CHECK_EVERY < CHECK_EVERY - NEAR);
            }
        }
        thread::yield_now();
    }
}

/// Whether loom explores, in a model whose waiters spin on a holder that dies: not while every
/// waiter waits on the dead holder far from its next check (a stretch in which nothing changes
/// but their counts of tries), nor after [`PRUNE_AFTER`] tries on the holder while it lives (as
/// [`Spin::Pruned`]). Per execution, and no part of the model: plain atomics, which loom does not
/// see (its threads run one at a time).
struct Quiet {
    /// The identities of the waiters.
    waiters: Vec<u64>,
    /// Per identity - 1: waiting far from its check.
    far: [PlainBool; PROCESSES],
    /// Whether the holder the waiters wait on has died.
    died: PlainBool,
    /// Whether loom is exploring now.
    exploring: PlainBool,
    /// `SHARED_LOOM_FULL`: explore every try on a dead holder.
    full: bool,
}

impl Quiet {
    fn new(waiters: &[u64]) -> PlainArc<Self> {
        PlainArc::new(Self {
            waiters: waiters.to_vec(),
            far: Default::default(),
            died: PlainBool::new(false),
            exploring: PlainBool::new(true),
            full: std::env::var_os("SHARED_LOOM_FULL").is_some(),
        })
    }

    /// The holder has died (it holds the lock for good).
    fn died(&self) {
        self.died.store(true, Relaxed);
    }

    fn set(&self, me: u64, far: bool) {
        self.far[me as usize - 1].store(far, Relaxed);
        let quiet = !self.full
            && self.died.load(Relaxed)
            && self.waiters.iter().all(|&w| self.far[w as usize - 1].load(Relaxed));
        if quiet == self.exploring.load(Relaxed) {
            self.exploring.store(!quiet, Relaxed);
            if quiet { loom::stop_exploring() } else { loom::explore() }
        }
    }
}

/// Take the lock as `live`, run `section` (given whether it was taken over), release it; whether
/// it was taken over.
fn locked(word: &AtomicU64, live: &Proc, section: impl FnOnce(bool)) -> bool {
    let recovered = acquire(word, live);
    live.waited();
    assert_eq!(Word::load(word, Relaxed), live.me, "the lock is not held by its taker");
    section(recovered);
    release(word);
    recovered
}

/// The shared state of a lock model: the lock word, the dead flags, and what the lock protects.
struct Locked {
    word: AtomicU64,
    dead: Arc<Dead>,
    /// Critical sections run; loom reports any two accesses not ordered by the lock.
    count: UnsafeCell<u64>,
    /// The same count, read and written back in two steps: a lock that let two sections overlap
    /// loses an increment.
    split: AtomicU64,
}

impl Locked {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            word: AtomicU64::new(0),
            dead: Dead::new(),
            count: UnsafeCell::new(0),
            split: AtomicU64::new(0),
        })
    }

    /// One critical section's work, under the lock.
    fn increment(&self) {
        // SAFETY: under the lock (loom checks it).
        self.count.with_mut(|count| unsafe { *count += 1 });
        let seen = self.split.load(Relaxed);
        self.split.store(seen + 1, Relaxed);
    }

    /// The count, under the lock or after every thread is joined.
    fn count(&self) -> u64 {
        // SAFETY: as `increment`.
        let count = self.count.with(|count| unsafe { *count });
        assert_eq!(count, self.split.load(Relaxed), "an increment was lost");
        count
    }
}

/// `processes` processes take the lock `sections` times each, nobody dies: every increment
/// counted, nothing taken over.
fn lock_excludes_model(processes: u64, sections: u64, spin: fn() -> Spin) {
    model(move || {
        let shared = Locked::new();
        let handles: Vec<_> = (1..=processes)
            .map(|me| {
                let shared = Arc::clone(&shared);
                thread::spawn(move || {
                    let live = Proc::with(me, &shared.dead, spin());
                    (0..sections)
                        .map(|_| locked(&shared.word, &live, |_| shared.increment()))
                        .fold(false, |a, b| a | b)
                })
            })
            .collect();
        for handle in handles {
            assert!(!handle.join().unwrap(), "a lock taken over though nobody died");
        }
        assert_eq!(shared.count(), processes * sections);
        assert_eq!(Word::load(&shared.word, Relaxed), 0, "the lock is still held");
    });
}

#[test]
fn lock_excludes() {
    lock_excludes_model(2, 2, || Spin::Full);
}

#[test]
fn lock_excludes_three() {
    lock_excludes_model(3, 1, || Spin::Pruned(PRUNE_AFTER));
}

/// A takes the lock, does half its work (the first of its two increments) and dies holding it.
/// B and C then take it: exactly one takes it over from A and mends A's work (the second
/// increment), seeing the half A did; the other gets it cleanly once the first has released it.
#[test]
fn lock_taken_over_from_a_dead_holder() {
    model(|| {
        let shared = Locked::new();
        let a = Proc::new(1, &shared.dead);
        assert!(!acquire(&shared.word, &a));
        shared.increment();
        a.die();
        let quiet = Quiet::new(&[2, 3]);
        quiet.died();

        let handles: Vec<_> = [2, 3]
            .map(|me| {
                let shared = Arc::clone(&shared);
                let spin = Spin::Quiet(PlainArc::clone(&quiet));
                thread::spawn(move || {
                    let live = Proc::with(me, &shared.dead, spin);
                    locked(&shared.word, &live, |recovered| {
                        if recovered {
                            // A's half, and nothing else, is there to mend.
                            assert_eq!(shared.count(), 1, "not the dead holder's work alone");
                            shared.increment();
                        }
                        shared.increment();
                    })
                })
            })
            .into_iter()
            .collect();
        let recovered: Vec<bool> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(
            recovered.iter().filter(|&&r| r).count(),
            1,
            "not exactly one takeover: {recovered:?}"
        );
        // A's two increments (one by A, one mended) and one each for B and C.
        assert_eq!(shared.count(), 4);
        assert_eq!(Word::load(&shared.word, Relaxed), 0, "the lock is still held");
    });
}

/// The same three processes, all started at once: A takes the lock before B and C, between them
/// or after them, does half its work and dies holding it. Whoever comes after A takes it over
/// and mends A's half (which it sees through A's death alone: no thread was started after A
/// wrote it); nobody takes it over twice; if A came last, its lock stays held and its half
/// unmended.
#[test]
fn lock_holder_dies_racing_its_waiters() {
    model(|| {
        let shared = Locked::new();
        let quiet = Quiet::new(&[2, 3]);
        let a = {
            let (shared, quiet) = (Arc::clone(&shared), PlainArc::clone(&quiet));
            thread::spawn(move || {
                let a = Proc::with(1, &shared.dead, Spin::Pruned(PRUNE_AFTER));
                assert!(!acquire(&shared.word, &a), "taken over though nobody had died");
                shared.increment();
                a.die();
                quiet.died();
            })
        };
        let handles: Vec<_> = [2, 3]
            .map(|me| {
                let shared = Arc::clone(&shared);
                let spin = Spin::Quiet(PlainArc::clone(&quiet));
                thread::spawn(move || {
                    let live = Proc::with(me, &shared.dead, spin);
                    locked(&shared.word, &live, |recovered| {
                        if recovered {
                            shared.increment();
                        }
                        shared.increment();
                    })
                })
            })
            .into_iter()
            .collect();
        a.join().unwrap();
        let recovered: Vec<bool> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        match recovered.iter().filter(|&&r| r).count() {
            1 => {
                assert_eq!(shared.count(), 4);
                assert_eq!(Word::load(&shared.word, Relaxed), 0, "the lock is still held");
            }
            0 => {
                assert_eq!(shared.count(), 3);
                assert_eq!(Word::load(&shared.word, Relaxed), 1, "not A's to the end");
            }
            _ => panic!("taken over twice: {recovered:?}"),
        }
    });
}

/// The value `init` writes into each word of the header.
const HEADER: [u64; 2] = [0x5eed, 0xca11];

/// The shared state of an initialisation model: the word, the dead flags, the header it
/// initialises, and how many times `init` ran to its end.
struct Region {
    word: AtomicU64,
    dead: Arc<Dead>,
    header: [AtomicU64; 2],
    inits: AtomicUsize,
}

/// An `init` that fails ([`failed_initialisation_gives_the_word_back`]).
#[derive(Debug, PartialEq, Eq)]
struct Failed;

impl Region {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            word: AtomicU64::new(0),
            dead: Dead::new(),
            header: [AtomicU64::new(0), AtomicU64::new(0)],
            inits: AtomicUsize::new(0),
        })
    }

    /// Initialise as `live` (`may_take`: whether anybody may have died); then the header must be
    /// complete.
    fn initialise(&self, live: &Proc, may_take: bool) -> Init {
        let init = || {
            // `Relaxed`: the protocol's `READY` publishes it.
            for (word, value) in self.header.iter().zip(HEADER) {
                word.store(value, Relaxed);
            }
            self.inits.fetch_add(1, Relaxed);
            Ok::<(), Failed>(())
        };
        let may = || {
            assert!(may_take, "took the word over though nobody died");
            Ok(())
        };
        let outcome = initialise(&self.word, live, may, init).unwrap();
        live.waited();
        self.assert_complete();
        outcome
    }

    fn assert_complete(&self) {
        let header = self.header.each_ref().map(|word| word.load(Relaxed));
        assert_eq!(header, HEADER, "a caller returned before the header was complete");
    }
}

/// `processes` processes initialise one region: one creates it, the others attach, `init` runs
/// once.
fn initialised_once_model(processes: u64, spin: fn() -> Spin) {
    model(move || {
        let region = Region::new();
        let handles: Vec<_> = (1..=processes)
            .map(|me| {
                let region = Arc::clone(&region);
                thread::spawn(move || {
                    region.initialise(&Proc::with(me, &region.dead, spin()), false)
                })
            })
            .collect();
        let outcomes: Vec<Init> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let created = outcomes.iter().filter(|&&o| o == Init::Created).count();
        assert_eq!(created, 1, "not exactly one creator: {outcomes:?}");
        assert_eq!(region.inits.load(Relaxed), 1, "init ran more than once");
        assert_eq!(Word::load(&region.word, Relaxed), READY);
    });
}

#[test]
fn initialised_once() {
    initialised_once_model(2, || Spin::Full);
}

#[test]
fn initialised_once_three() {
    initialised_once_model(3, || Spin::Pruned(PRUNE_AFTER));
}

/// A claims the word and dies halfway through the header; B and C then initialise: one of them
/// runs `init` anew (`Created`), the other attaches, and both see the whole header.
#[test]
fn initialised_again_after_a_dead_initialiser() {
    model(|| {
        let region = Region::new();
        let a = Proc::new(1, &region.dead);
        // What `initialise` does up to `init`, then the first half of `init`.
        assert_eq!(region.word.compare_exchange(0, a.me(), Acquire, Relaxed), Ok(0));
        region.header[0].store(0xdead, Relaxed);
        a.die();

        let handles: Vec<_> = [2, 3]
            .map(|me| {
                let region = Arc::clone(&region);
                thread::spawn(move || region.initialise(&Proc::new(me, &region.dead), true))
            })
            .into_iter()
            .collect();
        let outcomes: Vec<Init> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let created = outcomes.iter().filter(|&&o| o == Init::Created).count();
        assert_eq!(created, 1, "not exactly one creator: {outcomes:?}");
        assert_eq!(region.inits.load(Relaxed), 1, "init ran to its end other than once");
        assert_eq!(Word::load(&region.word, Relaxed), READY);
    });
}

/// B's `init` fails, C's succeeds: the failure puts the word back (C initialises after it), or B
/// attaches to C's region without running `init`.
#[test]
fn failed_initialisation_gives_the_word_back() {
    model(|| {
        let region = Region::new();
        let b = {
            let region = Arc::clone(&region);
            thread::spawn(move || {
                let live = Proc::new(2, &region.dead);
                let may_take = || -> Result<(), Failed> { unreachable!("nobody died") };
                let init = || {
                    region.header[0].store(0xbad, Relaxed);
                    Err(Failed)
                };
                let outcome = initialise(&region.word, &live, may_take, init);
                if outcome.is_ok() {
                    region.assert_complete();
                }
                outcome
            })
        };
        let c = {
            let region = Arc::clone(&region);
            thread::spawn(move || region.initialise(&Proc::new(3, &region.dead), false))
        };
        let b = b.join().unwrap();
        assert_eq!(c.join().unwrap(), Init::Created);
        assert!(matches!(b, Err(Failed) | Ok(Init::Attached)), "B: {b:?}");
        assert_eq!(region.inits.load(Relaxed), 1);
        region.assert_complete();
        assert_eq!(Word::load(&region.word, Relaxed), READY);
    });
}
