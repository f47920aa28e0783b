//! Exactness across processes: four independent connections (four limiters, as four processes
//! would hold) hammering one key of a long window admit exactly the policy's number in
//! round-trip mode; with leases, never more, the shortfall within the documented bound, and the
//! server's count equal to what was admitted once the leases are given back.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::Server;
use ratewell_redis::{Leases, RedisLimiter, Source};

const INSTANCES: usize = 4;
const TASKS: usize = 8;

async fn instance(server: &Server, policy: &str, prefix: &str) -> RedisLimiter {
    RedisLimiter::builder(&server.url())
        .layer("l", &policy.parse().unwrap())
        .prefix(prefix)
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .expect("a limiter")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_connections_admit_exactly_the_limit() {
    let server = Server::start();
    for (i, (policy, limit)) in [
        ("fixed-window limit=1000 window=1h align=first", 1000),
        ("token-bucket capacity=1000 rate=1/m", 1000),
        ("leaky-bucket rate=1r/m burst=499 nodelay", 500),
        ("leaky-bucket rate=1r/m burst=299 nodelay compat=nginx", 300),
        ("sliding-log limit=300 window=1h", 300),
    ]
    .into_iter()
    .enumerate()
    {
        let prefix = format!("exact{i}:");
        let admitted = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for _ in 0..INSTANCES {
            // Each instance its own limiter and connection.
            let limiter = instance(&server, policy, &prefix).await;
            for _ in 0..TASKS {
                let (limiter, admitted) = (limiter.clone(), admitted.clone());
                tasks.push(tokio::spawn(async move {
                    for _ in 0..(2 * limit / (INSTANCES * TASKS) as u64 + 10) {
                        let v = limiter.check("hot", 1).await;
                        assert_eq!(v.source(), Source::Server);
                        if v.is_admitted() {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }));
            }
        }
        for t in tasks {
            t.await.expect("no panic");
        }
        assert_eq!(admitted.load(Ordering::Relaxed), limit, "{policy}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leases_never_admit_more_and_fall_short_by_at_most_the_bound() {
    let server = Server::start();
    const LIMIT: u64 = 10_000;
    const MAX_UNITS: u32 = 64;
    let policy = format!("fixed-window limit={LIMIT} window=1h align=first");
    let admitted = Arc::new(AtomicU64::new(0));
    let mut leases = Vec::new();
    let mut tasks = Vec::new();
    for _ in 0..INSTANCES {
        let l = Arc::new(Leases::new(
            instance(&server, &policy, "lease:").await,
            1024,
            MAX_UNITS,
            Duration::from_millis(50),
        ));
        leases.push(l.clone());
        for _ in 0..TASKS {
            let (l, admitted) = (l.clone(), admitted.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..(2 * LIMIT / (INSTANCES * TASKS) as u64) {
                    if l.acquire("hot", 1).await {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
    }
    for t in tasks {
        t.await.expect("no panic");
    }
    let admitted = admitted.load(Ordering::Relaxed);
    assert!(admitted <= LIMIT, "leases admitted {admitted} of {LIMIT}");
    let bound = INSTANCES as u64 * u64::from(MAX_UNITS);
    assert!(LIMIT - admitted <= bound, "short by {} (bound {bound})", LIMIT - admitted);
    let local: u64 = leases.iter().map(|l| l.metrics().local_units).sum();
    assert!(local > admitted / 2, "most units were spent in process: {local} of {admitted}");
    // Give the leases back: the server then counts exactly what was admitted.
    for l in &leases {
        l.close().await;
    }
    let probe = instance(&server, &policy, "lease:").await;
    let v = probe.peek_layers(&[Some("hot")], 1).await.unwrap();
    assert_eq!(v.decision().remaining(), LIMIT - admitted, "the server's count");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_gives_back_only_what_it_did_not_spend() {
    let server = Server::start();
    for (i, policy) in [
        "fixed-window limit=1000 window=1h align=first",
        "token-bucket capacity=1000 rate=1/m",
        "leaky-bucket rate=1r/m burst=999 nodelay",
        "sliding-log limit=1000 window=1h",
    ]
    .into_iter()
    .enumerate()
    {
        let prefix = format!("part{i}:");
        // One instance alone on the key: nothing else touches its state between the lease's
        // charge and its refund.
        let leases =
            Leases::new(instance(&server, policy, &prefix).await, 16, 64, Duration::from_secs(10));
        let mut admitted = 0;
        for _ in 0..37 {
            admitted += u64::from(leases.acquire("k", 1).await);
        }
        assert_eq!(admitted, 37);
        assert!(leases.metrics().leased_units > 37, "{policy}: a lease was larger than its use");
        leases.close().await;
        let probe = instance(&server, policy, &prefix).await;
        let v = probe.peek_layers(&[Some("k")], 1).await.unwrap();
        assert_eq!(
            v.decision().remaining(),
            1000 - 37,
            "{policy}: the server counts what was spent"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_gone_cold_gives_its_slot_to_a_new_one_and_its_units_back() {
    let server = Server::start();
    let policy = "fixed-window limit=1000 window=1h align=first";
    // The lease sizes below (1, 2, then 4) and "a" still in use when "b" asks hold while each
    // step comes within a lease's length, at least an eighth of max_length (and a lease's
    // demand is measured against max_length): 1 s puts that at 125 ms, which a busy machine's
    // delays stay far below. That "a" has gone cold is waited for by time alone (the sleep).
    let max_length = Duration::from_secs(1);
    // One slot: two keys contend for it.
    let leases = Leases::new(instance(&server, policy, "cold:").await, 1, 64, max_length);
    // Leases of 1, 2 and then 4 units: the last holds 3 unspent.
    for _ in 0..4 {
        assert!(leases.acquire("a", 1).await);
    }
    let a_leases = leases.metrics().leases;
    assert!(a_leases >= 1);
    // "a" is in use: "b" is decided by round trip, "a" keeps its slot.
    assert!(leases.acquire("b", 1).await);
    let m = leases.metrics();
    assert_eq!((m.round_trips, m.evictions), (1, 0));
    // Once a's lease has ended and a further max_length has passed, "a" is cold: "b" takes the
    // slot, and what a's lease held goes back to the server.
    tokio::time::sleep(max_length * 3).await;
    for _ in 0..5 {
        assert!(leases.acquire("b", 1).await);
    }
    let m = leases.metrics();
    assert_eq!((m.round_trips, m.evictions), (1, 1), "{m:?}");
    assert!(m.leases > a_leases, "b leased: {m:?}");
    leases.close().await;
    let probe = instance(&server, policy, "cold:").await;
    let remaining = |key: &'static str| {
        let probe = probe.clone();
        async move { probe.peek_layers(&[Some(key)], 1).await.unwrap().decision().remaining() }
    };
    assert_eq!(m.returned_units, 3, "{m:?}");
    assert_eq!(remaining("a").await, 1000 - 4, "a's unspent units were given back");
    assert_eq!(remaining("b").await, 1000 - 6);
}
