//! The keyed limiter and its table: concurrency against the reference model, bounded capacity,
//! lossless reclaim, lossy eviction, fail-closed refusal, overrides and policy changes.

use ratewell_model as common;

use std::sync::{Arc, Barrier};
use std::thread;

use common::{Model, Verdict};
use ratewell::{IpKey, KeyedLimiter, ManualClock, OnFull, Outcome, Policy};

const S: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;

fn policy(text: &str) -> Policy {
    text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
}

/// `threads` threads each make `per_thread` unit requests on every key of `keys`, phase by phase
/// with the clock stepped in between; per key and phase, the admitted count must be the model's
/// (at a fixed instant, unit requests are admitted up to what is available, in any order).
fn stress<M: Model + Send + 'static>(
    text: &str,
    model: M,
    keys: u64,
    threads: usize,
    per_thread: u64,
) {
    let clock = ManualClock::new(0);
    let limiter = Arc::new(KeyedLimiter::<u64, _>::with_clock(&policy(text), 4096, clock.clone()));
    let mut models: Vec<M> = (0..keys).map(|_| model.clone()).collect();
    let phases = [0, 1, 10 * MS, 10 * MS, 250 * MS, 3 * S, 3 * S + 1, 100 * S];
    for (phase, &t) in phases.iter().enumerate() {
        clock.set(t);
        let barrier = Arc::new(Barrier::new(threads));
        let handles: Vec<_> = (0..threads)
            .map(|i| {
                let limiter = Arc::clone(&limiter);
                let barrier = Arc::clone(&barrier);
                thread::spawn(move || {
                    let mut admitted = vec![0u64; keys as usize];
                    barrier.wait();
                    for n in 0..per_thread {
                        // Threads walk the keys in different orders.
                        for k in 0..keys {
                            let key = (k + n + i as u64) % keys;
                            if limiter.check(&key).is_admitted() {
                                admitted[key as usize] += 1;
                            }
                        }
                    }
                    admitted
                })
            })
            .collect();
        let mut got = vec![0u64; keys as usize];
        for h in handles {
            for (g, a) in got.iter_mut().zip(h.join().unwrap()) {
                *g += a;
            }
        }
        for (k, m) in models.iter_mut().enumerate() {
            let requests = threads as u64 * per_thread;
            let want = (0..requests)
                .filter(|_| matches!(m.step(t.into(), 1), Verdict::Admitted { .. }))
                .count() as u64;
            assert_eq!(got[k], want, "{text}: key {k}, phase {phase} (t = {t})");
        }
    }
    let m = limiter.metrics();
    assert_eq!((m.evictions, m.refused), (0, 0), "{text}: no room was needed");
}

#[test]
fn threads_on_one_hot_key_admit_exactly_the_model() {
    let model = common::Gcra { capacity: 50, count: 10, period: S.into(), tat: None };
    stress("token-bucket capacity=50 rate=10/s", model, 1, 4, 200);
    let model = common::Leaky { burst: 20, count: 100, period: S.into(), delay: None, state: None };
    stress("leaky-bucket rate=100r/s burst=20 nodelay", model, 1, 4, 200);
    let model = common::Sliding { limit: 30, window: S.into(), state: (0, 0, 0) };
    stress("sliding-window limit=30 window=1s", model, 1, 4, 200);
}

#[test]
fn threads_on_many_keys_admit_exactly_the_model() {
    let model = common::Fixed { limit: 7, window: S.into(), first: false, state: None };
    stress("fixed-window limit=7 window=1s", model, 300, 4, 5);
    let model = common::Discrete { capacity: 5, refill: 2, every: (100 * MS).into(), state: None };
    stress("token-bucket capacity=5 refill=2 every=100ms", model, 300, 4, 5);
    let model = common::Log { limit: 6, window: S.into(), entries: vec![] };
    stress("sliding-log limit=6 window=1s", model, 100, 4, 5);
    let model = common::Nginx::new(50, S.into(), 4, Some(0));
    stress("leaky-bucket rate=50r/s burst=4 compat=nginx", model, 300, 4, 5);
}

#[test]
fn racing_inserts_of_one_new_key_make_one_entry() {
    for round in 0..200u64 {
        let limiter = Arc::new(KeyedLimiter::<u64, _>::with_clock(
            &policy("token-bucket capacity=3 rate=1/s"),
            64,
            ManualClock::new(0),
        ));
        let barrier = Arc::new(Barrier::new(4));
        let admitted: u64 = (0..4)
            .map(|_| {
                let (limiter, barrier) = (Arc::clone(&limiter), Arc::clone(&barrier));
                thread::spawn(move || {
                    barrier.wait();
                    u64::from(limiter.check(&round).is_admitted())
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .sum();
        assert_eq!(
            admitted, 3,
            "round {round}: both decisions counted, never more than the bucket"
        );
        assert_eq!(limiter.metrics().keys, 1, "round {round}: one entry");
    }
}

#[test]
fn rejected_new_keys_take_no_slot() {
    let limiter = KeyedLimiter::<u64, _>::with_clock(
        &policy("fixed-window limit=5 window=1s"),
        64,
        ManualClock::new(0),
    );
    for k in 0..1000 {
        assert!(limiter.request(&k).cost(6).check().is_impossible());
        assert!(limiter.request(&k).peek().is_admitted());
    }
    let m = limiter.metrics();
    assert_eq!((m.keys, m.admitted, m.rejected), (0, 0, 1000));
}

/// A table of exactly one bucket: every key has the same eight candidate slots.
fn one_bucket(text: &str, on_full: OnFull, clock: &ManualClock) -> KeyedLimiter<str, ManualClock> {
    let limiter = KeyedLimiter::builder(&policy(text), 8)
        .clock(clock.clone())
        .on_full(on_full)
        .build()
        .expect("a table of this capacity");
    assert_eq!(limiter.metrics().capacity, 8);
    limiter
}

/// Eight keys with different amounts used of a 10-token bucket: "b" used least.
const USED: [(&str, u32); 8] =
    [("a", 5), ("b", 1), ("c", 7), ("d", 3), ("f", 4), ("g", 6), ("h", 2), ("i", 9)];

#[test]
fn lossless_reclaim_changes_no_decision() {
    let clock = ManualClock::new(0);
    let limiter = one_bucket("fixed-window limit=1 window=1s", OnFull::Refuse, &clock);
    let reference = KeyedLimiter::<str, _>::with_clock(
        &policy("fixed-window limit=1 window=1s"),
        1 << 12,
        clock.clone(),
    );
    for round in 0..50u64 {
        clock.set(round * S);
        for k in 0..8 {
            let key = format!("r{round}k{k}");
            assert_eq!(limiter.check(&key), reference.check(&key), "{key}");
            assert_eq!(limiter.check(&key), reference.check(&key), "{key}, again");
        }
    }
    let m = limiter.metrics();
    assert_eq!((m.keys, m.evictions, m.refused), (8, 0, 0));
    assert_eq!(m.reclaims, 49 * 8);
}

#[test]
fn lossy_eviction_takes_the_key_closest_to_full() {
    let limiter = one_bucket(
        "token-bucket capacity=10 rate=1/s",
        OnFull::EvictLeastGranting,
        &ManualClock::new(0),
    );
    for (key, cost) in USED {
        assert!(limiter.request(key).cost(cost).check().is_admitted());
    }
    // Every candidate is live: the one that used least (b) goes.
    assert_eq!(limiter.request("e").cost(2).check().remaining(), 8);
    let m = limiter.metrics();
    assert_eq!((m.keys, m.evictions, m.reclaims), (8, 1, 0));
    assert_eq!(limiter.request("b").peek().remaining(), 10, "b starts fresh");
    assert_eq!(limiter.request("c").peek().remaining(), 3, "c kept its state");
}

#[test]
fn fail_closed_refuses_new_keys_and_says_when_to_retry() {
    let clock = ManualClock::new(0);
    let limiter = one_bucket("token-bucket capacity=10 rate=1/s", OnFull::Refuse, &clock);
    for (key, cost) in USED {
        assert!(limiter.request(key).cost(cost).check().is_admitted());
    }
    let d = limiter.check("e");
    assert!(!d.is_admitted());
    // Told apart from an over-limit rejection, so that a proxy can fail open on a full table.
    assert_eq!(d.outcome(), Outcome::TableFull);
    assert!(d.is_table_full());
    // b is back to full after 1 s: then its slot can be reclaimed for e.
    assert_eq!(d.retry_after_ns(), Some(S));
    let m = limiter.metrics();
    assert_eq!((m.keys, m.refused, m.evictions), (8, 1, 0));
    clock.set(S);
    assert!(limiter.check("e").is_admitted());
    assert_eq!(limiter.metrics().reclaims, 1);
    assert_eq!(limiter.request("c").peek().remaining(), 4, "c kept its state");
}

#[test]
fn capacity_is_never_exceeded() {
    for capacity in [1, 4, 5, 100, 4096, 10_000] {
        let limiter = KeyedLimiter::<u64, _>::with_clock(
            &policy("token-bucket capacity=5 rate=1/s"),
            capacity,
            ManualClock::new(0),
        );
        assert!(limiter.metrics().capacity >= capacity as u64);
        assert!(limiter.metrics().capacity < capacity as u64 + 8 * 256);
        for k in 0..(3 * capacity as u64 + 100) {
            assert!(limiter.check(&k).is_admitted());
            assert!(limiter.metrics().keys <= limiter.metrics().capacity);
        }
        assert_eq!(limiter.metrics().memory_bytes, 16 * limiter.metrics().capacity);
    }
}

#[test]
fn overrides_and_policy_changes() {
    let limiter = KeyedLimiter::<str, _>::with_clock(
        &policy("fixed-window limit=2 window=1s"),
        1000,
        ManualClock::new(0),
    );
    assert!(limiter.check("free").is_admitted());
    limiter.set_override("premium", Some(&policy("fixed-window limit=100 window=1s"))).unwrap();
    assert_eq!(limiter.check("premium").remaining(), 99);
    // An override set on a present key moves it, keeping what it consumed (1).
    assert!(limiter.check("later").is_admitted());
    limiter.set_override("later", Some(&policy("fixed-window limit=50 window=1s"))).unwrap();
    assert_eq!(limiter.check("later").remaining(), 48);
    assert_eq!(limiter.policy_of("later"), policy("fixed-window limit=50 window=1s"));
    // The default changes for every key without an override; present keys keep what they
    // consumed under it (free: 1).
    limiter.set_policy(&policy("token-bucket capacity=3 rate=1/s")).unwrap();
    assert_eq!(limiter.check("free").remaining(), 1);
    assert_eq!(limiter.check("premium").remaining(), 98);
    assert_eq!(limiter.policy().to_string(), "token-bucket capacity=3 rate=1/s");
    assert_eq!(limiter.policy_of("free"), limiter.policy());
    // Back to the default: 2 consumed of a capacity of 3.
    limiter.set_override("premium", None).expect("clearing an override cannot fail");
    assert_eq!(limiter.policy_of("premium"), limiter.policy());
    assert_eq!(limiter.check("premium").remaining(), 0);
    assert!(!limiter.check("premium").is_admitted());
    // A sliding log cannot share a one-word table.
    let err = limiter.set_policy(&policy("sliding-log limit=3 window=1s")).unwrap_err();
    assert!(err.expected().contains("same kind"), "{err}");
    // Policies no longer in use free their slots: any number of changes over a limiter's life.
    for n in 1..=1000u64 {
        limiter.set_policy(&policy(&format!("fixed-window limit={n} window=1s"))).unwrap();
        assert_eq!(limiter.check("free").limit(), n);
    }
    assert_eq!(limiter.check("premium").limit(), 1000);
    assert_eq!(limiter.check("later").limit(), 50, "the override survived every sweep");
}

#[test]
fn reset_forgets_one_key() {
    let limiter = KeyedLimiter::<str, _>::with_clock(
        &policy("fixed-window limit=1 window=1h"),
        100,
        ManualClock::new(0),
    );
    assert!(limiter.check("a").is_admitted());
    assert!(limiter.check("b").is_admitted());
    assert!(limiter.reset("a"));
    assert!(!limiter.reset("a"));
    assert!(limiter.check("a").is_admitted());
    assert!(!limiter.check("b").is_admitted());
    assert_eq!(limiter.metrics().keys, 2);
}

#[test]
fn reclaim_fresh_drops_only_fresh_keys() {
    let clock = ManualClock::new(0);
    let limiter = KeyedLimiter::<u64, _>::with_clock(
        &policy("token-bucket capacity=2 rate=1/s"),
        100,
        clock.clone(),
    );
    for k in 0..10 {
        limiter.request(&k).cost(if k < 5 { 1 } else { 2 }).check();
    }
    clock.set(S);
    assert_eq!(limiter.reclaim_fresh(), 5, "one token back: the keys that took one are full");
    assert_eq!(limiter.metrics().keys, 5);
    assert_eq!(limiter.request(&7).cost(2).peek().retry_after_ns(), Some(S));
}

#[test]
fn ip_keys_aggregate_ipv6_clients() {
    let limiter = KeyedLimiter::<IpKey, _>::with_clock(
        &policy("token-bucket capacity=5 rate=1/s"),
        1000,
        ManualClock::new(0),
    );
    // One client rotating through its /64 is one key.
    for i in 0..5u16 {
        let ip = format!("2001:db8:aa:bb:{i:x}::1").parse().unwrap();
        assert!(limiter.check(&IpKey::new(ip)).is_admitted());
    }
    assert!(!limiter.check(&IpKey::new("2001:db8:aa:bb:ffff::".parse().unwrap())).is_admitted());
    assert!(limiter.check(&IpKey::new("2001:db8:aa:bc::1".parse().unwrap())).is_admitted());
    assert_eq!(limiter.metrics().keys, 2);
}

#[test]
fn sliding_log_table_is_bounded_too() {
    let clock = ManualClock::new(0);
    let limiter = KeyedLimiter::<u64, _>::with_clock(
        &policy("sliding-log limit=3 window=1s"),
        8,
        clock.clone(),
    );
    for k in 0..100 {
        assert!(limiter.check(&k).is_admitted());
        assert!(limiter.metrics().keys <= limiter.metrics().capacity);
    }
    assert_eq!(limiter.metrics().evictions, 100 - limiter.metrics().capacity);
    clock.set(2 * S);
    assert_eq!(limiter.reclaim_fresh(), limiter.metrics().capacity);
}

#[test]
fn allow_admits_exactly_what_check_admits() {
    for text in [
        "token-bucket capacity=3 rate=10/s",
        "sliding-log limit=3 window=1s",
        "leaky-bucket rate=5r/s burst=2",
    ] {
        let clock = ManualClock::new(0);
        let a = KeyedLimiter::<u64, _>::with_clock(&policy(text), 64, clock.clone());
        let b = KeyedLimiter::<u64, _>::with_clock(&policy(text), 64, clock.clone());
        for step in 0..2000u64 {
            clock.set(step * 7 * MS);
            let (key, cost) = (step % 5, 1 + (step % 3) as u32);
            assert_eq!(
                a.request(&key).cost(cost).allow(),
                b.request(&key).cost(cost).check().is_admitted(),
                "{text}: step {step}"
            );
        }
        assert_eq!(a.metrics().admitted, b.metrics().admitted);
    }
}

/// Distinct pseudo-random keys (xorshift64 from `seed`).
fn random_keys(seed: u64, n: usize) -> Vec<u64> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut keys: Vec<u64> = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        })
        .collect();
    keys.sort_unstable();
    keys.dedup();
    keys
}

#[test]
fn nine_tenths_full_forgets_no_live_key() {
    // 900,000 keys, each kept live for an hour by its first request, into 1,000,000 slots: a
    // key forgotten (evicted) would be admitted again by its second request.
    let keys = random_keys(11, 900_000);
    assert_eq!(keys.len(), 900_000);
    for seed in [None, Some(5)] {
        let mut builder =
            KeyedLimiter::<u64>::builder(&policy("token-bucket capacity=1 rate=1/h"), 1_000_000)
                .clock(ManualClock::new(0));
        if let Some(seed) = seed {
            builder = builder.seed(seed);
        }
        let limiter = builder.build().expect("a table of this capacity");
        assert!(keys.iter().all(|k| limiter.allow(k)));
        let again = keys.iter().filter(|k| limiter.allow(k)).count();
        let m = limiter.metrics();
        assert_eq!((again, m.evictions, m.keys), (0, 0, 900_000), "seed {seed:?}: {m:?}");
        assert!(m.relocations > 0 && m.moves >= m.relocations, "{m:?}");
    }
}

#[test]
fn relocations_racing_decisions_lose_nothing() {
    // Threads take every unit of keys already present while another thread inserts new keys
    // into the nearly full table, moving keys between their buckets under them: each present key
    // admits exactly its limit, and no key is lost.
    for round in 0..10u64 {
        let limiter = Arc::new(KeyedLimiter::<u64, _>::with_clock(
            &policy("fixed-window limit=3 window=1h"),
            4096,
            ManualClock::new(0),
        ));
        // 3,200 keys present (78% of the slots) and 400 new ones (to 88%).
        let keys = random_keys(round + 100, 3600);
        let (present, new) = keys.split_at(3200);
        for k in present {
            assert!(limiter.request(k).check().is_admitted());
        }
        let moved_before = limiter.metrics().moves;
        let present: Arc<Vec<u64>> = Arc::new(present.to_vec());
        let barrier = Arc::new(Barrier::new(3));
        let deciders: Vec<_> = (0..2)
            .map(|t| {
                let (limiter, present, barrier) =
                    (Arc::clone(&limiter), Arc::clone(&present), Arc::clone(&barrier));
                thread::spawn(move || {
                    barrier.wait();
                    let mut admitted = vec![0u64; present.len()];
                    for _ in 0..3 {
                        for i in 0..present.len() {
                            // The two threads walk the keys in opposite orders.
                            let i = if t == 0 { i } else { present.len() - 1 - i };
                            admitted[i] += u64::from(limiter.allow(&present[i]));
                        }
                    }
                    admitted
                })
            })
            .collect();
        barrier.wait();
        for k in new {
            limiter.check(k);
        }
        let counts: Vec<Vec<u64>> = deciders.into_iter().map(|h| h.join().unwrap()).collect();
        let m = limiter.metrics();
        assert_eq!((m.evictions, m.keys), (0, 3600), "round {round}: {m:?}");
        assert!(
            m.moves > moved_before,
            "round {round}: no key was moved under the deciders: {m:?}"
        );
        for (i, k) in present.iter().enumerate() {
            assert_eq!(counts[0][i] + counts[1][i], 2, "round {round}: key {k}");
            assert_eq!(limiter.request(k).peek().remaining(), 0, "round {round}: key {k}");
        }
    }
}
