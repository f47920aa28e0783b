//! Every key the backend writes expires, no later than its state could still matter: after
//! decisions and refunds on every algorithm and on a layered pair, on the server's clock, on
//! both paths (the function library, and the module's native command), every
//! key under the test's prefix has a `PTTL`, at most the time its policy takes to go from empty
//! back to full (what a fresh key charged to its limit reports as its reset time, which the
//! engine computes here on a manual clock at a window's start).

mod common;

use std::time::Duration;

use common::{PATHS, Path, Server, assert_path};
use ratewell::{Limiter, ManualClock, Policy};
use ratewell_redis::RedisLimiter;

const POLICIES: &[&str] = &[
    "token-bucket capacity=5 rate=7/s",
    "token-bucket capacity=4 refill=2 every=1s",
    "leaky-bucket rate=10r/s burst=5",
    "leaky-bucket rate=3/s burst=4 delay=2",
    "leaky-bucket rate=3/250ms burst=5 delay=2 compat=nginx",
    "fixed-window limit=5 window=1s",
    "fixed-window limit=3 window=1m align=first",
    "sliding-window limit=5 window=1s",
    "sliding-log limit=5 window=1s",
    "sliding-log limit=3 window=2m",
];

/// The longest a key of `policy` can matter, in ms (rounded up): the reset time of a fresh key
/// charged to its limit at the start of a window.
fn longest_ms(policy: &Policy) -> i64 {
    let engine = Limiter::with_clock(policy, ManualClock::new(0));
    let limit = u32::try_from(policy.limit()).unwrap();
    let decision = engine.check_n(limit);
    assert!(decision.is_admitted(), "{policy}: a fresh key admits its limit");
    i64::try_from(decision.reset_after().as_nanos().div_ceil(1_000_000)).unwrap()
}

async fn limiter(server: &Server, prefix: &str, layers: &[(&str, &Policy)]) -> RedisLimiter {
    let mut b = RedisLimiter::builder(&server.url()).prefix(prefix);
    for (name, policy) in layers {
        b = b.layer(*name, policy);
    }
    b.timeout(Duration::from_secs(5)).build().await.expect("a limiter")
}

/// Every key under `prefix`, with its `PTTL`.
fn ttls(server: &Server, prefix: &str) -> Vec<(String, i64)> {
    let keys = server.cli(&["--scan", "--pattern", &format!("{prefix}*")]).expect("SCAN");
    keys.lines()
        .filter(|k| !k.is_empty())
        .map(|k| {
            let ttl = server.cli(&["PTTL", k]).expect("PTTL");
            (k.to_string(), ttl.trim().parse().expect("a PTTL"))
        })
        .collect()
}

fn assert_expire(found: &[(String, i64)], longest: i64, ctx: &str) {
    assert!(!found.is_empty(), "{ctx}: the decisions wrote no key");
    for (key, ttl) in found {
        // -1 is a key without an expiry. 0 (under a millisecond left) and -2 (expired between
        // SCAN and PTTL) are keys that expire: with windows of 250 ms, a slow machine reads them.
        assert!(*ttl != -1, "{ctx}: {key} has PTTL {ttl}: it never expires");
        assert!(
            *ttl <= longest,
            "{ctx}: {key} expires in {ttl} ms, past the {longest} ms it can matter"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_of_every_algorithm_expires() {
    for path in PATHS {
        every_algorithm(path).await;
    }
}

/// Tries of one policy whose keys may all have expired, as they should, before the test could
/// read them: a key of a window aligned to the clock expires at the window's end, which may be
/// a moment after its write, and a loaded machine can take longer than a whole 1 s window
/// between the decisions and the last `PTTL`. A backend that writes no key fails every try.
const TRIES: usize = 5;

async fn every_algorithm(path: Path) {
    let server = Server::start_on(path, &[]);
    for (i, spec) in POLICIES.iter().enumerate() {
        let policy: Policy = spec.parse().unwrap();
        let longest = longest_ms(&policy);
        for attempt in 0.. {
            let prefix = format!("ttl{i}.{attempt}:");
            let redis = limiter(&server, &prefix, &[("l", &policy)]).await;
            // Keys admitted once, to their limit and past it, and one with a charge refunded.
            for key in ["once", "full", "refunded"] {
                let times = if key == "once" { 1 } else { policy.limit() + 2 };
                for _ in 0..times {
                    redis.check(key, 1).await;
                }
            }
            let v = redis.check("given-back", 2).await;
            assert!(v.is_admitted(), "{spec}: a fresh key admits 2");
            redis.refund(v.receipt().expect("a receipt")).await.expect("a refund");
            redis.check("given-back", 1).await;
            let found = ttls(&server, &prefix);
            // No key left: they may have expired as they should before they were read.
            if found.is_empty() && attempt + 1 < TRIES {
                eprintln!("{path:?}: {spec}: every key expired before it was read; again");
                continue;
            }
            assert_expire(&found, longest, &format!("{path:?}: {spec}"));
            assert_path(path, redis.metrics());
            break;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_of_a_layered_pair_expires() {
    for path in PATHS {
        layered_pair(path).await;
    }
}

async fn layered_pair(path: Path) {
    let server = Server::start_on(path, &[]);
    let per_user: Policy = "token-bucket capacity=3 rate=1/s".parse().unwrap();
    let per_tenant: Policy = "sliding-log limit=5 window=10s".parse().unwrap();
    let redis = limiter(&server, "pair:", &[("user", &per_user), ("tenant", &per_tenant)]).await;
    for step in 0..12 {
        let user = format!("u{}", step % 3);
        redis.check_layers(&[Some(&user), Some("t")], 1).await.expect("a decision");
    }
    let found = ttls(&server, "pair:");
    assert!(found.len() >= 4, "three users and a tenant: {found:?}");
    let longest = longest_ms(&per_user).max(longest_ms(&per_tenant));
    assert_expire(&found, longest, &format!("{path:?}: a layered pair"));
    assert_path(path, redis.metrics());
}
