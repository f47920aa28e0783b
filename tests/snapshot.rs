//! Snapshots: a limiter snapshotted at any point of a trace and restored into a new one (a fresh
//! clock, the wall-time shift applied) decides the rest of the trace exactly as the limiter that
//! ran it uninterrupted; bad snapshots are errors that change nothing.

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, SystemTime};

use proptest::prelude::*;
use ratewell::{KeyedLimiter, Layer, LayeredLimiter, ManualClock, Policy, Resume, SnapshotError};

const MS: u64 = 1_000_000;

fn policy(text: &str) -> Policy {
    text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
}

/// One policy per algorithm, with an override of the same kind.
const POLICIES: [(&str, &str); 8] = [
    ("token-bucket capacity=5 rate=10/s", "token-bucket capacity=9 rate=3/s"),
    (
        "token-bucket capacity=4 refill=2 every=300ms",
        "token-bucket capacity=8 refill=1 every=100ms",
    ),
    ("leaky-bucket rate=10r/s burst=3 nodelay", "leaky-bucket rate=20r/s burst=6 nodelay"),
    ("leaky-bucket rate=10r/s burst=5 delay=2", "leaky-bucket rate=5r/s burst=2"),
    ("fixed-window limit=6 window=700ms", "fixed-window limit=11 window=1s"),
    ("fixed-window limit=6 window=1s align=first", "fixed-window limit=3 window=500ms"),
    ("sliding-window limit=7 window=1s", "sliding-window limit=12 window=2s"),
    ("sliding-log limit=5 window=800ms", "sliding-log limit=9 window=1s"),
];

/// A trace: `(gap before it in ns, key, cost)`.
fn trace() -> impl Strategy<Value = Vec<(u64, u32, u32)>> {
    prop::collection::vec((0..120 * MS, 0..24u32, 1..4u32), 2..300)
}

/// The keys with an override.
fn overridden(k: u32) -> bool {
    k.is_multiple_of(5)
}

fn keyed(text: &str, over: &str, clock: &ManualClock) -> KeyedLimiter<u32, ManualClock> {
    let limiter = KeyedLimiter::with_clock(&policy(text), 512, clock.clone());
    set_overrides(&limiter, over);
    limiter
}

fn set_overrides(limiter: &KeyedLimiter<u32, ManualClock>, over: &str) {
    for k in (0..24).filter(|&k| overridden(k)) {
        limiter.set_override(&k, Some(&policy(over))).unwrap();
    }
}

/// The split run: the trace's first `split` requests on one limiter, a snapshot, `pause` of
/// silence, and the rest on a limiter restored from it whose clock started elsewhere.
fn split_run(
    text: &str,
    over: &str,
    trace: &[(u64, u32, u32)],
    split: usize,
    pause: u64,
) -> Vec<ratewell::Decision> {
    let start = 1_000_000 * MS;
    let clock = ManualClock::new(start);
    let first = keyed(text, over, &clock);
    let mut t = start;
    let mut out = Vec::new();
    for &(gap, k, cost) in &trace[..split] {
        t += gap;
        clock.set(t);
        out.push(first.request(&k).cost(cost).check());
    }
    let mut bytes = Vec::new();
    let info = first.snapshot(&mut bytes).unwrap();
    drop(first);

    // A fresh process: its clock's epoch is its own start.
    let origin = 12_345;
    let clock = ManualClock::new(origin);
    let mut second = KeyedLimiter::<u32, _>::with_clock(&policy(text), 512, clock.clone());
    let at = info.anchor + Duration::from_nanos(pause);
    let restored = second.restore(&bytes[..], Resume::At(at)).unwrap();
    assert_eq!(restored.elapsed, Duration::from_nanos(pause));
    set_overrides(&second, over);
    let resumed = t + pause;
    for &(gap, k, cost) in &trace[split..] {
        t += gap;
        // The new clock reads from its origin; the restore's offset maps it onto the trace.
        clock.set(origin + t.saturating_sub(resumed));
        out.push(second.request(&k).cost(cost).check());
    }
    out
}

fn whole_run(text: &str, over: &str, trace: &[(u64, u32, u32)]) -> Vec<ratewell::Decision> {
    let start = 1_000_000 * MS;
    let clock = ManualClock::new(start);
    let limiter = keyed(text, over, &clock);
    let mut t = start;
    let mut out = Vec::new();
    for &(gap, k, cost) in trace {
        t += gap;
        clock.set(t);
        out.push(limiter.request(&k).cost(cost).check());
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Every algorithm, with overrides: the split run's decisions are the uninterrupted run's,
    /// field for field.
    #[test]
    fn a_restored_limiter_decides_as_an_uninterrupted_one(
        which in 0..POLICIES.len(),
        trace in trace(),
        split_at in 0.0..1.0f64,
        pause_at in 0.0..1.0f64,
    ) {
        let (text, over) = POLICIES[which];
        let split = ((trace.len() as f64) * split_at) as usize;
        // The pause is taken out of the gap before the next request, so both runs see that
        // request at the same trace time.
        let gap = trace.get(split).map_or(0, |r| r.0);
        let pause = (gap as f64 * pause_at) as u64;
        let whole = whole_run(text, over, &trace);
        let split = split_run(text, over, &trace, split, pause);
        prop_assert_eq!(whole, split);
    }
}

/// Registered policies (decisions that name their policy) restore exactly whether they are
/// registered before the restore or after it, and a changed one converts as `set_policy` does.
#[test]
fn registered_policies_restore_before_or_after() {
    let clock = ManualClock::new(5 * MS);
    let limiter = KeyedLimiter::<str, _>::with_clock(
        &policy("fixed-window limit=1 window=1s"),
        64,
        clock.clone(),
    );
    let day = limiter.register(&policy("fixed-window limit=10 window=1d")).unwrap();
    assert_eq!(limiter.request("a").policy(&day).cost(4).check().remaining(), 6);
    let mut bytes = Vec::new();
    limiter.snapshot(&mut bytes).unwrap();

    for before in [true, false] {
        let mut restarted = KeyedLimiter::<str, _>::with_clock(
            &policy("fixed-window limit=1 window=1s"),
            64,
            ManualClock::new(0),
        );
        let early =
            before.then(|| restarted.register(&policy("fixed-window limit=10 window=1d")).unwrap());
        restarted.restore(&bytes[..], Resume::SameClock).unwrap();
        let id = early.unwrap_or_else(|| {
            restarted.register(&policy("fixed-window limit=10 window=1d")).unwrap()
        });
        assert_eq!(
            restarted.request("a").policy(&id).check().remaining(),
            5,
            "registered before: {before}"
        );
        restarted.release(id);
    }
    // A rule whose limit changed keeps what the key consumed.
    let mut restarted = KeyedLimiter::<str, _>::with_clock(
        &policy("fixed-window limit=1 window=1s"),
        64,
        ManualClock::new(0),
    );
    restarted.restore(&bytes[..], Resume::SameClock).unwrap();
    let wider = restarted.register(&policy("fixed-window limit=20 window=1d")).unwrap();
    assert_eq!(restarted.request("a").policy(&wider).check().remaining(), 15);
    restarted.release(wider);
    limiter.release(day);
}

/// A layered limiter split the same way: all or nothing across layers, refunds included.
#[test]
fn a_restored_layered_limiter_decides_as_an_uninterrupted_one() {
    let layers = || {
        vec![
            Layer::new("ip", &policy("token-bucket capacity=4 rate=5/s")),
            Layer::new("key", &policy("sliding-window limit=9 window=2s")),
            Layer::new("route", &policy("fixed-window limit=5 window=1s")),
        ]
    };
    let mut rng = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let requests: Vec<(u64, [u64; 3], u32)> = (0..3_000)
        .map(|_| {
            (next() % (30 * MS), [next() % 7, next() % 5, next() % 3], 1 + (next() % 3) as u32)
        })
        .collect();
    for split in [0, 1, 777, 1_500, 2_999, 3_000] {
        let start = 77 * MS;
        let clock = ManualClock::new(start);
        let whole = LayeredLimiter::with_clock(layers(), clock.clone()).unwrap();
        let first = LayeredLimiter::with_clock(layers(), clock.clone()).unwrap();
        let mut t = start;
        let mut second = None;
        let restarted_clock = ManualClock::new(0);
        for (i, (gap, keys, cost)) in requests.iter().enumerate() {
            t += gap;
            clock.set(t);
            let k: [&dyn ratewell::LayerKey; 3] = [&keys[0], &keys[1], &keys[2]];
            if i == split {
                let mut bytes = Vec::new();
                let info = first.snapshot(&mut bytes).unwrap();
                let mut restarted =
                    LayeredLimiter::with_clock(layers(), restarted_clock.clone()).unwrap();
                // Restored at the moment of request `i`: the wall clock moved by its gap.
                restarted
                    .restore_with(&bytes[..], Resume::At(info.anchor + Duration::from_nanos(0)))
                    .unwrap();
                second = Some((restarted, t));
            }
            let want = whole.check(&k, *cost).unwrap();
            let got = match &second {
                Some((limiter, at)) => {
                    restarted_clock.set(t - at);
                    limiter.check(&k, *cost).unwrap()
                }
                None => first.check(&k, *cost).unwrap(),
            };
            assert_eq!(format!("{want:?}"), format!("{got:?}"), "request {i}, split at {split}");
        }
    }
}

/// Time that passed while the process was down counts; a wall clock that went back counts as
/// none (nothing is minted).
#[test]
fn the_pause_counts_and_a_clock_set_back_mints_nothing() {
    let p = policy("token-bucket capacity=10 rate=1/s");
    let limiter = KeyedLimiter::<str, _>::with_clock(&p, 64, ManualClock::new(0));
    assert_eq!(limiter.request("k").cost(10).check().remaining(), 0);
    let mut bytes = Vec::new();
    let info = limiter.snapshot(&mut bytes).unwrap();
    let restore = |at: SystemTime| {
        let mut l = KeyedLimiter::<str, _>::with_clock(&p, 64, ManualClock::new(999 * MS));
        l.restore(&bytes[..], Resume::At(at)).unwrap();
        l.request("k").peek().remaining()
    };
    assert_eq!(restore(info.anchor + Duration::from_secs(3)), 3);
    assert_eq!(restore(info.anchor), 0);
    assert_eq!(restore(info.anchor - Duration::from_secs(3600)), 0);
    // Ten seconds later the key is full again: not stored at all.
    let mut l = KeyedLimiter::<str, _>::with_clock(&p, 64, ManualClock::new(0));
    let r = l.restore(&bytes[..], Resume::At(info.anchor + Duration::from_secs(10))).unwrap();
    assert_eq!((r.keys, r.expired), (0, 1));
}

fn small_snapshot() -> (Vec<u8>, Policy) {
    let p = policy("sliding-window limit=5 window=1m");
    let limiter = KeyedLimiter::<str, _>::with_clock(&p, 64, ManualClock::new(0));
    for k in ["a", "b", "c", "d"] {
        limiter.request(k).cost(2).check();
    }
    let mut bytes = Vec::new();
    limiter.snapshot(&mut bytes).unwrap();
    (bytes, p)
}

/// A limiter's state, as its keys' peeks show it.
fn state_of(limiter: &KeyedLimiter<str, ManualClock>) -> Vec<u64> {
    ["a", "b", "c", "d", "e", "x"].iter().map(|k| limiter.request(k).peek().remaining()).collect()
}

fn victim(p: &Policy) -> KeyedLimiter<str, ManualClock> {
    let limiter = KeyedLimiter::<str, _>::with_clock(p, 64, ManualClock::new(0));
    limiter.request("x").cost(3).check();
    limiter.request("e").check();
    limiter
}

/// Truncated at every offset, every bit flipped, an empty file: each an error, the limiter as
/// it was.
#[test]
fn bad_snapshots_are_errors_that_change_nothing() {
    let (bytes, p) = small_snapshot();
    let mut limiter = victim(&p);
    let before = state_of(&limiter);
    for len in 0..bytes.len() {
        let err = limiter.restore(&bytes[..len], Resume::WallClock).unwrap_err();
        let expected = match len {
            0 => matches!(err, SnapshotError::Empty),
            _ => matches!(err, SnapshotError::Truncated | SnapshotError::Checksum),
        };
        assert!(expected, "cut at {len}: {err}");
        assert_eq!(state_of(&limiter), before);
    }
    for i in 0..bytes.len() {
        for bit in 0..8 {
            let mut flipped = bytes.clone();
            flipped[i] ^= 1 << bit;
            let err = limiter.restore(&flipped[..], Resume::WallClock).unwrap_err();
            assert!(!err.to_string().is_empty());
            assert_eq!(state_of(&limiter), before, "byte {i} bit {bit}: {err}");
        }
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(limiter.restore(&longer[..], Resume::WallClock).is_err());
    assert!(matches!(
        limiter.restore(&b"hello world, not a snapshot"[..], Resume::WallClock),
        Err(SnapshotError::NotASnapshot)
    ));
    assert_eq!(state_of(&limiter), before);
    // The untouched snapshot restores.
    limiter.restore(&bytes[..], Resume::WallClock).unwrap();
    assert_eq!(limiter.request("a").peek().remaining(), 3);
}

/// Resealed with a correct checksum: a wrong version, kind and shape are named.
#[test]
fn foreign_snapshots_are_named() {
    let (bytes, p) = small_snapshot();
    let reseal = |mut b: Vec<u8>| {
        let n = b.len() - 8;
        b.truncate(n);
        let sum = checksum(&b);
        b.extend_from_slice(&sum.to_le_bytes());
        b
    };
    let mut limiter = victim(&p);
    let before = state_of(&limiter);
    let mut v2 = bytes.clone();
    v2[8] = 2;
    assert!(matches!(
        limiter.restore(&reseal(v2)[..], Resume::WallClock),
        Err(SnapshotError::Version { found: 2, supported: 1 })
    ));
    // A table of another capacity.
    let mut wider = KeyedLimiter::<str, _>::with_clock(&p, 100_000, ManualClock::new(0));
    assert!(matches!(
        wider.restore(&bytes[..], Resume::WallClock),
        Err(SnapshotError::Shape { .. })
    ));
    // A sliding log's table.
    let mut logs = KeyedLimiter::<str, _>::with_clock(
        &policy("sliding-log limit=5 window=1m"),
        64,
        ManualClock::new(0),
    );
    assert!(matches!(logs.restore(&bytes[..], Resume::WallClock), Err(SnapshotError::Kind { .. })));
    // A layered limiter's snapshot into a keyed one, and the reverse.
    let layered =
        LayeredLimiter::with_clock(vec![Layer::new("a", &p)], ManualClock::new(0)).unwrap();
    let mut lbytes = Vec::new();
    layered.snapshot(&mut lbytes).unwrap();
    assert!(matches!(
        limiter.restore(&lbytes[..], Resume::WallClock),
        Err(SnapshotError::Kind { .. })
    ));
    let mut layered = layered;
    assert!(matches!(layered.restore(&bytes[..]), Err(SnapshotError::Kind { .. })));
    // Overrides name keys by the hash a restore replaces.
    limiter.set_override("x", Some(&policy("sliding-window limit=50 window=1m"))).unwrap();
    assert!(matches!(
        limiter.restore(&bytes[..], Resume::WallClock),
        Err(SnapshotError::Overrides)
    ));
    limiter.set_override("x", None).expect("clearing an override cannot fail");
    assert_eq!(state_of(&limiter), before);
}

/// The format's checksum, as the crate computes it (`src/snapshot.rs`).
fn checksum(bytes: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut h = (bytes.len() as u64).wrapping_mul(K) ^ 0x5241_5445_5745_4c4c;
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        h = (h ^ u64::from_le_bytes(w.try_into().unwrap())).wrapping_mul(K).rotate_left(29);
    }
    let mut tail = [0u8; 8];
    tail[..words.remainder().len()].copy_from_slice(words.remainder());
    h = (h ^ u64::from_le_bytes(tail)).wrapping_mul(K).rotate_left(29);
    h ^ (h >> 32)
}

/// A snapshot taken while two threads decide is consistent per key: each key's restored state
/// is one the key held at some instant. Each thread charges its own keys one unit at a time,
/// so a key's states are its counts; a torn or invented state shows as a count no instant had.
#[test]
fn a_snapshot_taken_under_decisions_is_consistent_per_key() {
    let p = policy("fixed-window limit=1000000 window=1d");
    let limiter = Arc::new(KeyedLimiter::<u64, _>::with_clock(&p, 4096, ManualClock::new(0)));
    let go = Arc::new(Barrier::new(3));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let handles: Vec<_> = (0..2u64)
        .map(|t| {
            let (limiter, go, stop) = (limiter.clone(), go.clone(), stop.clone());
            thread::spawn(move || {
                go.wait();
                let mut charged = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for k in 0..500 {
                        assert!(limiter.check(&(t * 1000 + k)).is_admitted());
                    }
                    charged += 1;
                }
                charged
            })
        })
        .collect();
    go.wait();
    let mut snapshots = Vec::new();
    for _ in 0..20 {
        let mut bytes = Vec::new();
        limiter.snapshot(&mut bytes).unwrap();
        snapshots.push(bytes);
        thread::sleep(Duration::from_millis(2));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let rounds: Vec<u64> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let mut last = vec![0u64; 2000];
    for bytes in snapshots {
        let mut restored = KeyedLimiter::<u64, _>::with_clock(&p, 4096, ManualClock::new(0));
        restored.restore(&bytes[..], Resume::SameClock).unwrap();
        for t in 0..2u64 {
            for k in 0..500 {
                let key = t * 1000 + k;
                let d = restored.request(&key).peek();
                let used = 1_000_000 - d.remaining();
                // A count the key held: never above what its thread charged, never below what
                // an earlier snapshot saw, in the window the whole run is in.
                assert!(used <= rounds[t as usize] + 1, "key {key}: {used}");
                assert!(
                    used >= last[key as usize],
                    "key {key}: {used} after {}",
                    last[key as usize]
                );
                if used > 0 {
                    assert_eq!(d.reset_after_ns(), 86_400_000_000_000, "key {key}");
                }
                last[key as usize] = used;
            }
        }
    }
    // The threads ran during the snapshots: the last one saw both threads' keys charged.
    assert!(last.iter().filter(|&&u| u > 0).count() >= 900, "the threads ran");
}

/// Snapshots of a sliding log's table restore at another capacity: keys re-inserted by their
/// hash, the ones that do not fit counted.
#[test]
fn sliding_logs_restore_at_another_capacity() {
    let p = policy("sliding-log limit=3 window=1m");
    let limiter = KeyedLimiter::<u32, _>::with_clock(&p, 4096, ManualClock::new(0));
    for k in 0..3000u32 {
        limiter.request(&k).cost(1 + k % 3).check();
    }
    let mut bytes = Vec::new();
    limiter.snapshot(&mut bytes).unwrap();
    let mut same = KeyedLimiter::<u32, _>::with_clock(&p, 4096, ManualClock::new(0));
    let r = same.restore(&bytes[..], Resume::SameClock).unwrap();
    assert_eq!((r.keys, r.dropped), (3000, 0));
    for k in 0..3000u32 {
        assert_eq!(same.request(&k).peek().remaining(), u64::from(2 - k % 3));
    }
    let mut small = KeyedLimiter::<u32, _>::with_clock(&p, 1000, ManualClock::new(0));
    let r = small.restore(&bytes[..], Resume::SameClock).unwrap();
    assert_eq!(r.keys + r.dropped, 3000);
    assert!(r.keys <= small.metrics().capacity && r.keys >= 900, "{r:?}");
}
