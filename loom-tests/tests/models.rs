//! loom models of every CAS protocol: the one-word loop of each algorithm, and the key table's
//! insert, eviction, reclaim, reuse and relocation races.
//!
//! Each model asserts. Each is also shown to fail on a deliberately broken protocol, compiled only
//! for that purpose with `--cfg ratewell_broken="..."` (the variants of `src/broken/variants.txt`,
//! implemented in `src/broken.rs`): under it, the models that must catch the
//! break are `should_panic` (so the suite passes only if they do fail):
//!
//! | variant         | the break                                         | caught by |
//! |-----------------|---------------------------------------------------|-----------|
//! | `store`         | a plain store instead of the compare-exchange     | `one_word_*` (not the log), `keyed_one_key_concurrent_decisions`, `decision_racing_slot_reuse`, `move_racing_decision`, `reclaim_racing_decision`, `layered_*` |
//! | `reject_writes` | a rejection writes back the state it read         | `one_word_*` (not the log), `rejection_racing_admission`, `layered_cancel_racing_a_request` |
//! | `no_mask`       | stored states not masked per key (the "tag")      | `decision_racing_slot_reuse`, `move_racing_decision` |
//! | `no_revalidate` | the key word not re-checked after loading a state | `decision_racing_slot_reuse`, `reclaim_racing_decision`, `move_racing_decision` |
//! | `no_rescan`     | an insert does not look for the key again under the shard lock | `keyed_one_key_two_threads_inserting`, `move_racing_decision` |
//! | `log_split_lock`| the sliding log checks under one lock and logs under another | `one_word_sliding_log` |
//! | `no_refund`     | a layered rejection keeps the earlier layers' charges | `layered_*` |
//! | `move_unfrozen` | a key moved between its buckets is copied without taking its state out of the old slot | `move_racing_decision` |
//! | `unsettled_miss`| a lookup that finds its key in neither bucket does not wait for the shard lock | `move_racing_lookup` |
//! | `snapshot_unlocked` | a snapshot reads a shard without its insert lock | `snapshot_racing_move` |
#![cfg(ratewell_loom)]

use loom::sync::Arc;
use loom::thread;
use ratewell::{
    Decision, KeyedLimiter, Layer, LayeredLimiter, Limiter, ManualClock, Outcome, Policy,
};
use ratewell_model::{self as common, Expected, Model, expect};

const S: u64 = 1_000_000_000;

fn policy(text: &str) -> Policy {
    text.parse().unwrap()
}

/// Words of stack for a model's body: loom runs the model's first thread on a coroutine of 32 KiB,
/// which the layered limiter's frames outgrow under some variants (a stack overflow, not a
/// finding), so the body runs on a thread of this size that the first one joins.
const STACK_WORDS: usize = 1 << 17;

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(2);
    }
    let f = std::sync::Arc::new(f);
    builder.check(move || {
        let f = std::sync::Arc::clone(&f);
        thread::Builder::new()
            .stack_size(STACK_WORDS)
            .spawn(move || f())
            .expect("the model's thread")
            .join()
            .expect("the model's body");
    });
}

/// One step of a thread's program: a request of some cost, or setting the shared clock.
#[derive(Clone, Copy, Debug)]
enum Step {
    Check(u32),
    Set(u64),
}

/// The verdicts two threads saw, each running its program in order, must be those of some serial
/// interleaving of the two programs run through the model; and the state left must be that
/// interleaving's (compared through a peek at `later`).
///
/// A request reads the clock once, somewhere between its thread's previous step and the point
/// where it takes effect: in the serial order it may use any clock value current in that span.
fn linearizable<M: Model>(
    fresh: &M,
    programs: [&[Step]; 2],
    seen: [Vec<Decision>; 2],
    start: u64,
    later: u64,
    after: Decision,
) {
    let (a, b) = (programs[0].len(), programs[1].len());
    let order = |mask: u32| (0..a + b).map(move |step| usize::from(mask >> step & 1 == 0));
    let found = (0u32..1 << (a + b)).filter(|m| m.count_ones() as usize == a).any(|mask| {
        let order: Vec<usize> = order(mask).collect();
        explain(
            fresh.clone(),
            &order,
            programs,
            &seen,
            [0, 0],
            [0, 0],
            start,
            [vec![start], vec![start]],
            later,
            &after,
        )
    });
    assert!(found, "no serial order explains {seen:?} then {after:?}");
}

/// Depth-first over the clock values each request may have read.
#[allow(clippy::too_many_arguments)]
fn explain<M: Model>(
    mut m: M,
    order: &[usize],
    programs: [&[Step]; 2],
    seen: &[Vec<Decision>; 2],
    mut next: [usize; 2],
    mut decided: [usize; 2],
    mut now: u64,
    mut readable: [Vec<u64>; 2],
    later: u64,
    after: &Decision,
) -> bool {
    let Some((&t, rest)) = order.split_first() else {
        return expect(&mut m, later.into(), 1, false) == Expected::of(after);
    };
    let step = programs[t][next[t]];
    next[t] += 1;
    match step {
        Step::Set(to) => {
            now = to;
            readable.iter_mut().for_each(|r| r.push(to));
            readable[t] = vec![to];
            explain(m, rest, programs, seen, next, decided, now, readable, later, after)
        }
        Step::Check(cost) => {
            let d = &seen[t][decided[t]];
            decided[t] += 1;
            let times = std::mem::replace(&mut readable[t], vec![now]);
            times.iter().any(|&at| {
                let mut m = m.clone();
                expect(&mut m, at.into(), cost.into(), true) == Expected::of(d)
                    && explain(
                        m,
                        rest,
                        programs,
                        seen,
                        next,
                        decided,
                        now,
                        readable.clone(),
                        later,
                        after,
                    )
            })
        }
    }
}

/// Two threads on one direct limiter running `programs` (mixed costs, clock moves), then a peek
/// at `later`.
fn one_word<M: Model + Send + Sync + 'static>(
    text: &'static str,
    fresh: M,
    programs: [&'static [Step]; 2],
    later: u64,
) {
    model(move || {
        let clock = ManualClock::new(S);
        let limiter = Arc::new(Limiter::with_clock(&policy(text), clock.clone()));
        let handles: Vec<_> = programs
            .iter()
            .map(|&program| {
                let (limiter, clock) = (Arc::clone(&limiter), clock.clone());
                thread::spawn(move || {
                    let mut seen = vec![];
                    for &step in program {
                        match step {
                            Step::Check(cost) => seen.push(limiter.check_n(cost)),
                            Step::Set(t) => clock.set(t),
                        }
                    }
                    seen
                })
            })
            .collect();
        let seen: Vec<Vec<Decision>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let costs = programs.iter().map(|p| {
            p.iter().filter_map(|s| match s {
                Step::Check(c) => Some(u64::from(*c)),
                Step::Set(_) => None,
            })
        });
        let admitted: u64 = costs
            .zip(&seen)
            .flat_map(|(cs, ds)| cs.zip(ds).filter(|(_, d)| d.is_admitted()).map(|(c, _)| c))
            .sum();
        // Every policy here holds 3 and refills less than 1 in the quarter second.
        assert!(admitted <= 3, "admitted a cost of {admitted}; at most 3 fit");
        clock.set(later);
        let after = limiter.peek_n(1);
        let [s0, s1]: [Vec<Decision>; 2] = seen.try_into().unwrap();
        linearizable(&fresh, programs, [s0, s1], S, later, after);
    });
}

/// Thread 0 takes 2, moves the clock on a quarter second, takes 1; thread 1 takes 2.
const PROGRAMS: [&[Step]; 2] =
    [&[Step::Check(2), Step::Set(S + S / 4), Step::Check(1)], &[Step::Check(2)]];

#[test]
#[cfg_attr(any(ratewell_broken = "store", ratewell_broken = "reject_writes"), should_panic)]
fn one_word_token_bucket() {
    let m = common::Gcra { capacity: 3, count: 1, period: S.into(), tat: None };
    one_word("token-bucket capacity=3 rate=1/s", m, PROGRAMS, S + S / 2);
}

#[test]
#[cfg_attr(any(ratewell_broken = "store", ratewell_broken = "reject_writes"), should_panic)]
fn one_word_discrete_bucket() {
    let m = common::Discrete { capacity: 3, refill: 1, every: S.into(), state: None };
    one_word("token-bucket capacity=3 refill=1 every=1s", m, PROGRAMS, 2 * S);
}

#[test]
#[cfg_attr(any(ratewell_broken = "store", ratewell_broken = "reject_writes"), should_panic)]
fn one_word_leaky_bucket() {
    let m = common::Leaky { burst: 2, count: 1, period: S.into(), delay: Some(1), state: None };
    one_word("leaky-bucket rate=1/s burst=2 delay=1", m, PROGRAMS, S + S / 3);
}

#[test]
#[cfg_attr(any(ratewell_broken = "store", ratewell_broken = "reject_writes"), should_panic)]
fn one_word_leaky_bucket_nginx() {
    let m = common::Nginx::new(2, S.into(), 2, None);
    one_word("leaky-bucket rate=2r/s burst=2 nodelay compat=nginx", m, PROGRAMS, S + S / 3);
}

#[test]
#[cfg_attr(any(ratewell_broken = "store", ratewell_broken = "reject_writes"), should_panic)]
fn one_word_fixed_window() {
    let m = common::Fixed { limit: 3, window: S.into(), first: true, state: None };
    one_word("fixed-window limit=3 window=1s align=first", m, PROGRAMS, S + S / 2);
}

#[test]
#[cfg_attr(any(ratewell_broken = "store", ratewell_broken = "reject_writes"), should_panic)]
fn one_word_sliding_window() {
    let m = common::Sliding { limit: 3, window: S.into(), state: (0, 0, 0) };
    one_word("sliding-window limit=3 window=1s", m, PROGRAMS, S + S / 2);
}

#[test]
#[cfg_attr(ratewell_broken = "log_split_lock", should_panic)]
fn one_word_sliding_log() {
    // The log's mutex is not a CAS protocol, but the model checks it all the same.
    let m = common::Log { limit: 3, window: S.into(), entries: vec![] };
    one_word("sliding-log limit=3 window=1s", m, PROGRAMS, S + S / 2);
}

#[test]
#[cfg_attr(ratewell_broken = "reject_writes", should_panic)]
fn rejection_racing_admission() {
    model(|| {
        let clock = ManualClock::new(0);
        let limiter =
            Arc::new(Limiter::with_clock(&policy("token-bucket capacity=2 rate=1/s"), clock));
        let l = Arc::clone(&limiter);
        let impossible = thread::spawn(move || l.check_n(5));
        let taken = limiter.check_n(2);
        assert!(impossible.join().unwrap().is_impossible());
        assert!(taken.is_admitted());
        // The rejection must not have undone the admission.
        assert_eq!(limiter.check().outcome(), Outcome::Rejected);
    });
}

/// A keyed limiter whose table is one bucket: every key competes for the same eight slots.
fn one_bucket(text: &str, clock: ManualClock) -> Arc<KeyedLimiter<str, ManualClock>> {
    let limiter = KeyedLimiter::with_clock(&policy(text), 8, clock);
    assert_eq!(limiter.metrics().capacity, 8);
    Arc::new(limiter)
}

#[test]
#[cfg_attr(ratewell_broken = "no_rescan", should_panic)]
fn keyed_one_key_two_threads_inserting() {
    // Two threads insert the same new key: one entry, both decisions counted, bound kept.
    model(|| {
        let limiter = one_bucket("token-bucket capacity=3 rate=1/s", ManualClock::new(0));
        let l = Arc::clone(&limiter);
        let other = thread::spawn(move || l.request("k").cost(2).check());
        let mine = limiter.request("k").cost(2).check();
        let other = other.join().unwrap();
        assert_ne!(mine.is_admitted(), other.is_admitted(), "exactly one of two fits");
        assert_eq!(limiter.metrics().keys, 1);
        assert_eq!(limiter.request("k").peek().remaining(), 1, "2 of 3 taken, once");
    });
}

#[test]
#[cfg_attr(ratewell_broken = "store", should_panic)]
fn keyed_one_key_concurrent_decisions() {
    // A key already present, decided by two threads: no lost update.
    model(|| {
        let limiter = one_bucket("fixed-window limit=3 window=1s", ManualClock::new(0));
        assert!(limiter.check("k").is_admitted());
        let l = Arc::clone(&limiter);
        let other = thread::spawn(move || l.check("k").is_admitted());
        let mine = limiter.check("k").is_admitted();
        assert!(mine && other.join().unwrap());
        assert!(!limiter.check("k").is_admitted(), "3 of 3 taken: a lost update would admit a 4th");
    });
}

#[test]
#[cfg_attr(
    any(ratewell_broken = "no_mask", ratewell_broken = "no_revalidate", ratewell_broken = "store"),
    should_panic
)]
fn decision_racing_slot_reuse() {
    // K's slot is evicted and given to K2 while a decision for K is in flight: that decision
    // must never land on K2's state, even though K's and K2's states are equal.
    model(|| {
        let limiter = one_bucket("fixed-window limit=2 window=1s", ManualClock::new(0));
        for full in ["a", "b", "c", "d", "e", "f", "g"] {
            assert!(limiter.request(full).cost(2).check().is_admitted());
        }
        // K has used 1 of 2: the candidate closest to full, so the victim when K2 arrives.
        assert!(limiter.check("K").is_admitted());
        let l = Arc::clone(&limiter);
        let k = thread::spawn(move || l.check("K").is_admitted());
        let k2 = limiter.check("K2");
        assert!(k2.is_admitted());
        let _ = k.join().unwrap();
        // K2 holds exactly its own one request (1 of 2 remains), unless K, back for a slot,
        // evicted K2 in turn (K2 is then fresh). K's decision on K2 would fill it.
        let peek = limiter.request("K2").peek();
        assert!(peek.is_admitted(), "K's decision landed on K2");
        match limiter.metrics().evictions {
            1 => assert_eq!(peek.remaining(), 1, "K2 lost its request"),
            2 => assert_eq!(peek.remaining(), 2, "K2 evicted: fresh"),
            n => panic!("{n} evictions"),
        }
    });
}

#[test]
#[cfg_attr(any(ratewell_broken = "no_revalidate", ratewell_broken = "store"), should_panic)]
fn reclaim_racing_decision() {
    // At 1 s every key's window has expired: all eight are reclaimable. K2's insert reclaims one
    // while K takes a request: K's request must count (on K) and nothing is evicted.
    model(|| {
        let clock = ManualClock::new(0);
        let limiter = one_bucket("fixed-window limit=2 window=1s", clock.clone());
        for key in ["K", "t", "u", "v", "w", "x", "y", "z"] {
            assert!(limiter.check(key).is_admitted());
        }
        clock.set(S);
        let l = Arc::clone(&limiter);
        let k = thread::spawn(move || l.check("K").is_admitted());
        assert!(limiter.check("K2").is_admitted());
        assert!(k.join().unwrap());
        assert_eq!(limiter.request("K").peek().remaining(), 1, "K's request was lost");
        assert_eq!(limiter.request("K2").peek().remaining(), 1);
        assert_eq!(limiter.metrics().evictions, 0, "only lossless reclaims were needed");
    });
}

/// A keyed limiter of two buckets (16 slots) in which inserting `"new"`'s key must move `K` from
/// bucket 0 to bucket 1: bucket 0 holds `K` (first, with one request of two taken) and seven
/// keys that can live only there, and the new key can live only there too. Returns the limiter
/// and the new key.
fn move_needed() -> (Arc<KeyedLimiter<str, ManualClock>>, String) {
    let limiter = KeyedLimiter::with_clock(
        &policy("fixed-window limit=2 window=1s"),
        16,
        ManualClock::new(0),
    );
    assert_eq!(limiter.metrics().capacity, 16);
    let names = (0..).map(|i| format!("k{i}"));
    let only_first: Vec<String> =
        names.clone().filter(|k| limiter.buckets_of(k.as_str()) == Some((0, 0))).take(8).collect();
    let movable = names.clone().find(|k| limiter.buckets_of(k.as_str()) == Some((0, 1))).unwrap();
    assert!(limiter.check(&movable).is_admitted());
    for k in &only_first[..7] {
        assert!(limiter.request(k).cost(2).check().is_admitted());
    }
    let m = limiter.metrics();
    assert_eq!((m.keys, m.moves), (8, 0));
    // `K` is the name the models use for the key that moves.
    let limiter = Arc::new(limiter);
    MOVED.with(|k| *k.borrow_mut() = movable);
    (limiter, only_first[7].clone())
}

thread_local! {
    static MOVED: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

fn moved() -> String {
    MOVED.with(|k| k.borrow().clone())
}

#[test]
#[cfg_attr(
    any(
        ratewell_broken = "move_unfrozen",
        ratewell_broken = "store",
        ratewell_broken = "no_mask",
        ratewell_broken = "no_revalidate",
        ratewell_broken = "no_rescan"
    ),
    should_panic
)]
fn move_racing_decision() {
    // K is moved to its other bucket to make room while a decision for K is in flight: the
    // decision lands on K wherever K is, once.
    model(|| {
        let (limiter, new) = move_needed();
        let k = moved();
        let l = Arc::clone(&limiter);
        let key = k.clone();
        let other = thread::spawn(move || l.check(&key).is_admitted());
        assert!(limiter.check(&new).is_admitted());
        assert!(other.join().unwrap(), "K had one of two left");
        let m = limiter.metrics();
        assert_eq!((m.keys, m.moves, m.evictions), (9, 1, 0));
        assert_eq!(limiter.buckets_of(k.as_str()), Some((0, 1)));
        assert_eq!(limiter.request(&k).peek().remaining(), 0, "K's second request was lost");
    });
}

/// A snapshot's bytes restored into a new limiter of `capacity` keys (the same shape).
fn restored(bytes: &[u8], capacity: usize) -> KeyedLimiter<str, ManualClock> {
    let mut limiter = KeyedLimiter::with_clock(
        &policy("fixed-window limit=2 window=1s"),
        capacity,
        ManualClock::new(0),
    );
    limiter.restore(bytes, ratewell::Resume::SameClock).expect("a whole snapshot");
    limiter
}

#[test]
fn snapshot_racing_decision() {
    // A snapshot reads K while a decision takes K's second unit: the snapshot holds K's state
    // before the decision or after it, never anything else, and the decision is not lost.
    // (The snapshot runs on the spawned thread: loom explores a read racing the main thread's
    // writes from there.)
    model(|| {
        let limiter = one_bucket("fixed-window limit=2 window=1s", ManualClock::new(0));
        assert!(limiter.check("K").is_admitted());
        let l = Arc::clone(&limiter);
        let other = thread::spawn(move || {
            let mut bytes = Vec::new();
            l.snapshot(&mut bytes).unwrap();
            bytes
        });
        assert!(limiter.check("K").is_admitted());
        let bytes = other.join().unwrap();
        assert_eq!(limiter.request("K").peek().remaining(), 0, "the decision was lost");
        let left = restored(&bytes, 8).request("K").peek().remaining();
        assert!(left == 1 || left == 0, "a state K never had: {left} left");
    });
}

#[test]
#[cfg_attr(ratewell_broken = "snapshot_unlocked", should_panic)]
fn snapshot_racing_move() {
    // A snapshot reads the table while K is moved to its other bucket: K is in the snapshot
    // once, with its state (one of two left), never missing (fresh) or twice.
    model(|| {
        let (limiter, new) = move_needed();
        let k = moved();
        let l = Arc::clone(&limiter);
        let other = thread::spawn(move || {
            let mut bytes = Vec::new();
            let info = l.snapshot(&mut bytes).unwrap();
            (bytes, info.keys)
        });
        assert!(limiter.check(&new).is_admitted());
        let (bytes, keys) = other.join().unwrap();
        assert!(keys == 8 || keys == 9, "{keys} keys");
        let copy = restored(&bytes, 16);
        assert_eq!(copy.metrics().keys, keys);
        assert_eq!(copy.request(&k).peek().remaining(), 1, "K was lost");
    });
}

#[test]
#[cfg_attr(ratewell_broken = "unsettled_miss", should_panic)]
fn move_racing_lookup() {
    // K is moved while a peek looks it up: the peek sees K's state (one of two left), never a
    // fresh key's.
    model(|| {
        let (limiter, new) = move_needed();
        let l = Arc::clone(&limiter);
        let key = moved();
        let other = thread::spawn(move || l.request(&key).peek().remaining());
        assert!(limiter.check(&new).is_admitted());
        assert_eq!(other.join().unwrap(), 1, "the lookup took K for absent");
        assert_eq!(limiter.metrics().moves, 1);
    });
}

/// Two bands on one key, 3 a second and 2 a second, with one request already admitted (so the
/// key is present: the models race decisions and refunds, not inserts): the narrow band has room
/// for one more, the wide band for two.
fn two_bands() -> Arc<LayeredLimiter<ManualClock>> {
    let layers = vec![
        Layer::new("wide", &policy("fixed-window limit=3 window=1s")).capacity(8),
        Layer::new("narrow", &policy("fixed-window limit=2 window=1s")).capacity(8),
    ];
    let limiter = LayeredLimiter::with_clock(layers, ManualClock::new(0)).unwrap();
    assert!(limiter.check(&[&"k"], 1).unwrap().is_admitted());
    Arc::new(limiter)
}

/// What remains on each band for key `k`.
fn bands_left(limiter: &LayeredLimiter<ManualClock>) -> (u64, u64) {
    let d = limiter.peek(&[&"k"], 1).unwrap();
    (d.layer(0).unwrap().remaining(), d.layer(1).unwrap().remaining())
}

#[test]
#[cfg_attr(any(ratewell_broken = "no_refund", ratewell_broken = "store"), should_panic)]
fn layered_refunds_are_never_lost() {
    // Two requests on two layers sharing a key: the narrow band admits one; the other request's
    // charge on the wide band, taken before the narrow band rejected it, comes back, whichever
    // thread's exchange lands first.
    model(|| {
        let limiter = two_bands();
        let l = Arc::clone(&limiter);
        let other = thread::spawn(move || l.check(&[&"k"], 1).unwrap().is_admitted());
        let mine = limiter.check(&[&"k"], 1).unwrap().is_admitted();
        let other = other.join().unwrap();
        assert!(mine != other, "the narrow band admits exactly one more");
        assert_eq!(bands_left(&limiter), (1, 0), "the rejected request keeps no charge");
    });
}

#[test]
#[cfg_attr(
    any(
        ratewell_broken = "store",
        ratewell_broken = "reject_writes",
        ratewell_broken = "no_refund"
    ),
    should_panic
)]
fn layered_cancel_racing_a_request() {
    // A reservation cancelled while another request decides: the other may be rejected while the
    // charge is out (allowed), but the take-back is never lost and nothing is admitted twice.
    model(|| {
        let limiter = two_bands();
        let l = Arc::clone(&limiter);
        let other = thread::spawn(move || l.check(&[&"k"], 1).unwrap().is_admitted());
        let reservation = limiter.reserve(&[&"k"], 1).unwrap();
        let reserved = reservation.decision().is_admitted();
        drop(reservation);
        let other = other.join().unwrap();
        assert!(reserved || other, "one of the two found the narrow band free");
        let taken = u64::from(other);
        assert_eq!(
            bands_left(&limiter),
            (2 - taken, 1 - taken),
            "only the kept request is charged"
        );
    });
}
