//! Batched decisions against single ones: two limiters built alike (the same seed, so the same
//! slots, evictions and relocations), one fed batches, the other the same requests one by one in
//! slice order, must agree on every decision, every later state and every counter. Random batches
//! repeat keys, mix algorithms through per-key overrides, overflow a small table (so that inserts
//! in a batch move and evict keys other requests of the batch were looked up in), and, on the
//! layered limiter, interleave reservations cancelled (refunds).

use proptest::prelude::*;
use ratewell::{KeyedLimiter, Layer, LayerKey, LayeredLimiter, ManualClock, Policy};

const POLICIES: [&str; 7] = [
    "token-bucket capacity=3 rate=2/s",
    "token-bucket capacity=4 refill=2 every=1s",
    "leaky-bucket rate=2/s burst=2",
    "leaky-bucket rate=1/s burst=2 compat=nginx",
    "fixed-window limit=3 window=1s",
    "sliding-window limit=4 window=2s",
    "fixed-window limit=5 window=1s align=first",
];

fn policy(i: usize) -> Policy {
    POLICIES[i % POLICIES.len()].parse().unwrap()
}

#[derive(Clone, Debug)]
enum Op {
    /// A batch of `(key, cost)`; decided through `allow_batch` instead of `check_batch` if set.
    Batch(Vec<(u64, u32)>, bool),
    /// Move the clock on by this many milliseconds.
    Advance(u64),
    /// Give a key its own policy (one of `POLICIES`), or take it away.
    Override(u64, Option<usize>),
}

fn cost() -> impl Strategy<Value = u32> + Clone {
    prop_oneof![6 => Just(1u32), 3 => 1..=4u32, 1 => Just(u32::MAX)]
}

fn ops(keys: u64) -> impl Strategy<Value = Vec<Op>> {
    let request = (0..keys, cost());
    let op = prop_oneof![
        6 => (prop::collection::vec(request, 0..70), any::<bool>()).prop_map(|(r, a)| Op::Batch(r, a)),
        2 => (0..1_500u64).prop_map(Op::Advance),
        1 => (0..keys, prop::option::of(0..POLICIES.len())).prop_map(|(k, p)| Op::Override(k, p)),
    ];
    prop::collection::vec(op, 1..25)
}

/// A limiter and the clock it reads.
fn keyed(base: usize, capacity: usize) -> (KeyedLimiter<u64, ManualClock>, ManualClock) {
    let clock = ManualClock::new(0);
    let limiter = KeyedLimiter::builder(&policy(base), capacity)
        .clock(clock.clone())
        .seed(17)
        .build()
        .expect("a table of this capacity");
    (limiter, clock)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 600, ..ProptestConfig::default() })]

    #[test]
    fn keyed_batches_equal_single_calls(base in 0..POLICIES.len(), capacity in prop_oneof![Just(16usize), Just(64), Just(4096)],
                                        keys in prop_oneof![Just(3u64), Just(40), Just(300)], steps in ops(300)) {
        let (batched, batched_clock) = keyed(base, capacity);
        let (single, single_clock) = keyed(base, capacity);
        let mut out = Vec::new();
        let mut bits = Vec::new();
        for op in &steps {
            match op {
                Op::Batch(requests, lean) => {
                    let requests: Vec<(u64, u32)> = requests.iter().map(|&(k, c)| (k % keys, c)).collect();
                    let refs: Vec<(&u64, u32)> = requests.iter().map(|(k, c)| (k, *c)).collect();
                    if *lean {
                        batched.batch(&refs, &mut out);
                        bits.clear();
                        bits.extend(out.iter().map(|d| d.is_admitted()));
                        let expected: Vec<bool> = refs.iter().map(|&(k, c)| single.request(k).cost(c).allow()).collect();
                        prop_assert_eq!(&bits, &expected);
                    } else {
                        batched.batch(&refs, &mut out);
                        let expected: Vec<_> = refs.iter().map(|&(k, c)| single.request(k).cost(c).check()).collect();
                        prop_assert_eq!(&out, &expected);
                    }
                }
                Op::Advance(ms) => {
                    batched_clock.advance(ms * 1_000_000);
                    single_clock.advance(ms * 1_000_000);
                }
                Op::Override(k, p) => {
                    let k = k % keys;
                    match p {
                        Some(p) => {
                            batched.set_override(&k, Some(&policy(*p))).unwrap();
                            single.set_override(&k, Some(&policy(*p))).unwrap();
                        }
                        None => {
                            batched.set_override(&k, None).expect("clearing an override cannot fail");
                            single.set_override(&k, None).expect("clearing an override cannot fail");
                        }
                    }
                }
            }
            prop_assert_eq!(batched.metrics(), single.metrics());
        }
        // The states left: every key peeked alike.
        for k in 0..keys {
            prop_assert_eq!(batched.request(&k).peek(), single.request(&k).peek(), "key {}", k);
        }
    }
}

#[derive(Clone, Debug)]
enum LayeredOp {
    /// Requests `(key of layer 0, key of layer 1, cost)`.
    Batch(Vec<(u64, u64, u32)>),
    /// A reservation cancelled at once: charged, then refunded.
    Cancelled(u64, u64, u32),
    /// A reservation kept.
    Kept(u64, u64, u32),
    Advance(u64),
}

fn layered_ops() -> impl Strategy<Value = Vec<LayeredOp>> {
    let request = (0..30u64, 0..6u64, cost());
    let op = prop_oneof![
        5 => prop::collection::vec(request.clone(), 0..50).prop_map(LayeredOp::Batch),
        2 => request.clone().prop_map(|(a, b, c)| LayeredOp::Cancelled(a, b, c)),
        1 => request.prop_map(|(a, b, c)| LayeredOp::Kept(a, b, c)),
        2 => (0..1_500u64).prop_map(LayeredOp::Advance),
    ];
    prop::collection::vec(op, 1..25)
}

fn layered(a: usize, b: usize, capacity: usize) -> LayeredLimiter<ManualClock> {
    let layers = vec![
        Layer::new("client", &policy(a)).capacity(capacity).seeded(3),
        Layer::new("route", &policy(b)).capacity(capacity).seeded(4),
    ];
    LayeredLimiter::with_clock(layers, ManualClock::new(0)).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn layered_batches_equal_single_calls(a in 0..POLICIES.len(), b in 0..POLICIES.len(),
                                          capacity in prop_oneof![Just(16usize), Just(1024)], steps in layered_ops()) {
        let batched = layered(a, b, capacity);
        let single = layered(a, b, capacity);
        let mut out = Vec::new();
        for op in &steps {
            match op {
                LayeredOp::Batch(requests) => {
                    let keys: Vec<[&dyn LayerKey; 2]> = requests.iter().map(|(a, b, _)| [a as &dyn LayerKey, b]).collect();
                    let refs: Vec<(&[&dyn LayerKey], u32)> = keys.iter().zip(requests).map(|(k, r)| (&k[..], r.2)).collect();
                    batched.check_batch(&refs, &mut out).unwrap();
                    let expected: Vec<String> = refs.iter().map(|&(k, c)| format!("{:?}", single.check(k, c).unwrap())).collect();
                    let got: Vec<String> = out.iter().map(|d| format!("{d:?}")).collect();
                    prop_assert_eq!(got, expected);
                }
                LayeredOp::Cancelled(x, y, c) | LayeredOp::Kept(x, y, c) => {
                    let keys: [&dyn LayerKey; 2] = [x, y];
                    let keep = matches!(op, LayeredOp::Kept(..));
                    for limiter in [&batched, &single] {
                        let reservation = limiter.reserve(&keys, *c).unwrap();
                        if keep { reservation.commit() } else { reservation.cancel() }
                    }
                }
                LayeredOp::Advance(ms) => {
                    batched.clock().advance(ms * 1_000_000);
                    single.clock().advance(ms * 1_000_000);
                }
            }
            for i in 0..2 {
                prop_assert_eq!(batched.metrics(i), single.metrics(i));
            }
        }
    }
}

#[test]
fn a_wrong_key_count_decides_nothing() {
    let limiter = layered(4, 4, 64);
    let good: [&dyn LayerKey; 1] = [&"k"];
    let bad: [&dyn LayerKey; 3] = [&"a", &"b", &"c"];
    let mut out = Vec::new();
    assert!(limiter.check_batch(&[(&good, 1), (&bad, 1)], &mut out).is_err());
    assert!(out.is_empty());
    assert_eq!(limiter.metrics(0).unwrap().admitted, 0, "nothing decided");
}

#[test]
fn batches_longer_than_a_group_and_empty_ones() {
    // 1,000 requests on 10 keys (limit 3 each): exactly 30 admitted, in the first three rounds.
    let (limiter, _) = keyed(4, 1024);
    let keys: Vec<u64> = (0..1_000).map(|i| i % 10).collect();
    let refs: Vec<(&u64, u32)> = keys.iter().map(|k| (k, 1)).collect();
    let mut out = vec![ratewell::Limiter::new(&policy(0)).check(); 3];
    limiter.batch(&refs, &mut out);
    assert_eq!(out.len(), 1_000);
    let admitted: Vec<usize> = (0..1_000).filter(|&i| out[i].is_admitted()).collect();
    assert_eq!(admitted, (0..30).collect::<Vec<_>>());
    limiter.batch(&[], &mut out);
    assert!(out.is_empty(), "cleared");
}
