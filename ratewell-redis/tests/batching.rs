//! Batched decisions equal sequential ones: the same random queues of requests (duplicate keys,
//! every algorithm, layered requests with skipped layers, peeks, costs, refunds in between),
//! submitted all at once to a limiter that batches (what queues while a call is in flight goes as
//! one call) and one by one to a limiter that sends one request per call, must be decided field
//! for field alike. On a cluster, layers whose keys fall in different slots are decided slot by
//! slot, each slot batching on its own.

mod common;

use std::time::Duration;

use common::{Cluster, PATHS, Path, Rng, Server};
use ratewell::{Decision, Nanos, Policy};
use ratewell_redis::{Builder, Receipt, RedisLimiter, Source, Verdict};

/// Every algorithm, a dry-run layer among them; small limits, so that a queue rejects too.
const POLICIES: &[&str] = &[
    "token-bucket capacity=4 rate=3/s",
    "token-bucket capacity=5 refill=2 every=700ms",
    "leaky-bucket rate=4r/s burst=3 delay=1",
    "leaky-bucket rate=2/500ms burst=2 nodelay compat=nginx",
    "fixed-window limit=5 window=1s",
    "fixed-window limit=4 window=2s align=first",
    "sliding-window limit=6 window=1500ms",
    "sliding-log limit=5 window=1s",
    "token-bucket capacity=3 rate=1/s dry-run",
];

fn layered(builder: Builder, rng: &mut Rng, prefix: &str, batch: usize) -> Builder {
    let mut b = builder.prefix(prefix).timeout(Duration::from_secs(5)).batch(batch);
    for i in 0..3 {
        let p: Policy = POLICIES[rng.below(POLICIES.len() as u64) as usize].parse().unwrap();
        b = b.layer(format!("l{i}"), &p);
    }
    b
}

/// Two limiters of the same three random layers: one batching (64), one not (1).
async fn pair(
    seed: u64,
    builder: impl Fn() -> Builder,
    prefix: &str,
) -> (RedisLimiter, RedisLimiter) {
    let mut a = Rng(seed);
    let mut b = Rng(seed);
    let batched = layered(builder(), &mut a, &format!("{prefix}b:"), 64).build().await.unwrap();
    let single = layered(builder(), &mut b, &format!("{prefix}s:"), 1).build().await.unwrap();
    (batched, single)
}

#[derive(Clone, Debug)]
struct Request {
    keys: [Option<String>; 3],
    cost: u32,
    peek: bool,
    at: Nanos,
}

fn queue(rng: &mut Rng, len: usize, start_us: u64, pool: u64, tag: bool) -> Vec<Request> {
    let mut at = start_us;
    (0..len)
        .map(|_| {
            at += [0, 0, 1, 37_000, 250_000][rng.below(5) as usize];
            let key = |rng: &mut Rng| {
                let k = rng.below(pool);
                // A hash tag keeps a request's layers in one slot; without one they spread.
                if tag { format!("{{t{k}}}") } else { format!("k{k}") }
            };
            let keys = [0, 1, 2].map(|_| (rng.below(5) != 0).then(|| key(rng)));
            Request {
                keys,
                cost: 1 + rng.below(3) as u32,
                peek: rng.below(6) == 0,
                at: Nanos::new(at * 1_000),
            }
        })
        .collect()
}

async fn decide(l: &RedisLimiter, r: &Request) -> Verdict {
    let keys: Vec<Option<&str>> = r.keys.iter().map(|k| k.as_deref()).collect();
    let v = if r.peek {
        l.peek_at(&keys, r.cost, r.at).await
    } else {
        l.check_at(&keys, r.cost, r.at).await
    };
    let v = v.expect("a decision");
    assert_eq!(v.source(), Source::Server);
    v
}

/// What a verdict says, field for field.
fn fields(v: &Verdict) -> (bool, Decision, Vec<Option<Decision>>, bool) {
    let layers = (0..3).map(|i| v.layered().layer(i).copied()).collect();
    (v.is_admitted(), v.decision(), layers, v.receipt().is_some())
}

/// `rounds` queues, each submitted at once to `batched` and one by one to `single`, with a
/// random part of each round's charges refunded (at once, and one by one) before the next.
async fn compare(
    batched: &RedisLimiter,
    single: &RedisLimiter,
    seed: u64,
    rounds: usize,
    tag: bool,
) {
    let mut rng = Rng(seed);
    let mut start = 1_000_000u64;
    for round in 0..rounds {
        let len = 1 + rng.below(48) as usize;
        let q = queue(&mut rng, len, start, 6, tag);
        start = q.last().map_or(start, |r| r.at.get() / 1_000) + 1;
        // At once: spawned in order on this (current-thread) runtime, so they reach the queue in
        // order; the first goes alone, the rest queue behind it.
        let handles: Vec<_> = q
            .iter()
            .cloned()
            .map(|r| {
                let l = batched.clone();
                tokio::spawn(async move { decide(&l, &r).await })
            })
            .collect();
        let mut got = Vec::new();
        for h in handles {
            got.push(h.await.unwrap());
        }
        let mut want = Vec::new();
        for r in &q {
            want.push(decide(single, r).await);
        }
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(fields(g), fields(w), "round {round}, request {i}: {:?}", q[i]);
        }
        // Refunds in between, of some admitted charges.
        let refunds: Vec<(Receipt, Receipt)> = got
            .iter()
            .zip(&want)
            .filter(|_| rng.below(3) == 0)
            .filter_map(|(g, w)| Some((g.receipt()?.clone(), w.receipt()?.clone())))
            .collect();
        let at = Nanos::new(start * 1_000);
        let handles: Vec<_> = refunds
            .iter()
            .map(|(g, _)| {
                let (l, g) = (batched.clone(), g.clone());
                tokio::spawn(async move { l.refund_at(&g, at).await })
            })
            .collect();
        for h in handles {
            h.await.unwrap().expect("a refund");
        }
        for (_, w) in &refunds {
            single.refund_at(w, at).await.expect("a refund");
        }
    }
    let (b, s) = (batched.metrics(), single.metrics());
    // A request with every layer skipped makes no call.
    assert!(s.calls <= s.server + s.refunds, "at most one call per request unbatched");
    assert!(b.calls < s.calls, "batching made fewer calls: {} against {}", b.calls, s.calls);
}

#[tokio::test]
async fn batched_decisions_equal_sequential_ones() {
    for path in PATHS {
        batched_decisions_equal_sequential_ones_on(path).await;
    }
}

async fn batched_decisions_equal_sequential_ones_on(path: Path) {
    let server = Server::start_on(path, &[]);
    for seed in 1..=8u64 {
        let (batched, single) =
            pair(seed, || RedisLimiter::builder(&server.url()), &format!("p{seed}")).await;
        compare(&batched, &single, seed * 7919, 25, true).await;
    }
}

#[tokio::test]
async fn batched_scripts_equal_sequential_ones_where_function_is_missing() {
    // EVALSHA, not FCALL: the same code, the same decisions.
    let server = Server::start_with(&["--rename-command", "FUNCTION", ""]);
    for seed in 11..=13u64 {
        let (batched, single) =
            pair(seed, || RedisLimiter::builder(&server.url()), &format!("e{seed}")).await;
        compare(&batched, &single, seed * 7919, 15, true).await;
    }
    let calls = server.cli(&["INFO", "commandstats"]).unwrap_or_default();
    assert!(calls.contains("cmdstat_evalsha:") && !calls.contains("cmdstat_fcall:"), "{calls}");
}

#[tokio::test]
async fn on_a_cluster_batched_cross_slot_decisions_equal_sequential_ones() {
    for path in PATHS {
        on_a_cluster_batched_cross_slot_decisions_equal_sequential_ones_on(path).await;
    }
}

async fn on_a_cluster_batched_cross_slot_decisions_equal_sequential_ones_on(path: Path) {
    let cluster = Cluster::start_on(path);
    for seed in 1..=3u64 {
        let urls = cluster.urls();
        let (batched, single) =
            pair(seed, || RedisLimiter::cluster_builder(&urls), &format!("c{seed}")).await;
        // One request at a time per key set: keys without a hash tag spread over slots, and a
        // request's slots are decided one after another, so requests of one round use keys of
        // their own (a pool as large as the queue makes few repeats; those repeat in order
        // only within a slot).
        compare_cross_slot(&batched, &single, seed * 104_729).await;
    }
}

/// Requests whose layers fall in different slots, at once against one by one, each round's
/// requests on keys of their own: batching per slot must not change a decision, and a slot that
/// rejects takes the other slots' charges back in both.
async fn compare_cross_slot(batched: &RedisLimiter, single: &RedisLimiter, seed: u64) {
    let mut rng = Rng(seed);
    let mut start = 1_000_000u64;
    for round in 0..10 {
        let len = 1 + rng.below(16) as usize;
        let mut q = queue(&mut rng, len, start, 1_000, false);
        for (i, r) in q.iter_mut().enumerate() {
            for (l, k) in r.keys.iter_mut().enumerate() {
                if k.is_some() {
                    *k = Some(format!("r{round}-q{i}-l{l}-{}", rng.below(2)));
                }
            }
        }
        start = q.last().map_or(start, |r| r.at.get() / 1_000) + 1;
        let handles: Vec<_> = q
            .iter()
            .cloned()
            .map(|r| {
                let l = batched.clone();
                tokio::spawn(async move { decide(&l, &r).await })
            })
            .collect();
        for (i, h) in handles.into_iter().enumerate() {
            let g = h.await.unwrap();
            let w = decide(single, &q[i]).await;
            assert_eq!(fields(&g), fields(&w), "round {round}, request {i}: {:?}", q[i]);
        }
    }
}

/// Tasks that each decide again as soon as they are answered fill the next call together: the
/// callers a call answered run before the next call goes. Were the next call sent at once, it
/// would carry only the one request queued meanwhile, and calls would alternate between one
/// request and all the others (a mean batch near half the tasks).
#[test]
fn tasks_deciding_in_a_loop_fill_each_call() {
    const TASKS: u64 = 32;
    let server = Server::start_on(Path::Library, &[]);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let l = RedisLimiter::builder(&server.url())
            .layer("loop", &"token-bucket capacity=1000000 rate=1000/s".parse::<Policy>().unwrap())
            .prefix("fill:")
            .timeout(Duration::from_secs(5))
            .batch(TASKS as usize)
            .build()
            .await
            .unwrap();
        let round = |rounds: u64| {
            let tasks: Vec<_> = (0..TASKS)
                .map(|t| {
                    let l = l.clone();
                    tokio::spawn(async move {
                        for i in 0..rounds {
                            let v = l.check(&format!("k{t}-{i}"), 1).await;
                            assert_eq!(v.source(), Source::Server);
                        }
                    })
                })
                .collect();
            async move {
                for t in tasks {
                    t.await.unwrap();
                }
            }
        };
        round(2).await;
        let before = l.metrics();
        round(40).await;
        let after = l.metrics();
        let mean = (after.server - before.server) as f64 / (after.calls - before.calls) as f64;
        assert!(mean > 0.8 * TASKS as f64, "mean batch {mean:.1} of {TASKS} tasks");
    });
}
