//! A three-node Redis Cluster (`redis-cli --cluster create`): a layered request whose keys share
//! a hash tag is one script on one node and decides as the engine does; layers whose keys fall
//! in different slots are decided slot by slot, all or nothing.

mod common;

use std::time::Duration;

use common::{Cluster, PATHS, Path, Rng};
use ratewell::{Layer, LayeredLimiter, ManualClock, Nanos, Policy};
use ratewell_redis::{RedisLimiter, Source};

async fn limiter(cluster: &Cluster, prefix: &str, policies: &[Policy]) -> RedisLimiter {
    let mut b = RedisLimiter::cluster_builder(&cluster.urls())
        .prefix(prefix)
        .timeout(Duration::from_secs(5));
    for (i, p) in policies.iter().enumerate() {
        b = b.layer(format!("l{i}"), p);
    }
    b.build().await.expect("a cluster limiter")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_tagged_layers_decide_in_one_script_as_the_engine_does() {
    for path in PATHS {
        hash_tagged_layers_decide_in_one_script_as_the_engine_does_on(path).await;
    }
}

async fn hash_tagged_layers_decide_in_one_script_as_the_engine_does_on(path: Path) {
    let cluster = Cluster::start_on(path);
    let policies: Vec<Policy> = [
        "token-bucket capacity=5 rate=7/s",
        "fixed-window limit=8 window=1s",
        "sliding-log limit=6 window=2s",
    ]
    .iter()
    .map(|s| s.parse().unwrap())
    .collect();
    let redis = limiter(&cluster, "c:", &policies).await;
    let engine = LayeredLimiter::with_clock(
        policies.iter().enumerate().map(|(i, p)| Layer::new(format!("l{i}"), p)).collect(),
        ManualClock::new(0),
    )
    .unwrap();
    let mut rng = Rng(99);
    let mut t_us = 1_000_000u64;
    // Keys spread over the three nodes.
    let users: Vec<String> = (0..12).map(|i| format!("user-{i}")).collect();
    for step in 0..400 {
        t_us += [0, 1, 50_000, 142_857, 1_000_000][rng.below(5) as usize];
        let who = users[rng.below(users.len() as u64) as usize].as_str();
        let c = 1 + rng.below(3) as u32;
        engine.clock().set(t_us * 1_000);
        let want = engine.check(&[&who], c).unwrap();
        let got = redis.check_at(&[Some(who); 3], c, Nanos::new(t_us * 1_000)).await.unwrap();
        assert_eq!(got.source(), Source::Server);
        assert_eq!(got.decision(), want.decision(), "step {step}");
        for i in 0..3 {
            assert_eq!(got.layered().layer(i), want.layer(i), "step {step}, layer {i}");
        }
    }
    // The keys really are spread: every node holds some.
    let mut held = 0;
    for node in &cluster.nodes {
        let n: u64 = node.cli(&["DBSIZE"]).unwrap().trim().parse().unwrap();
        assert!(n > 0, "node {} holds no key", node.port);
        held += n;
    }
    // delete_keys scans every primary: all of them gone, each counted once.
    assert_eq!(redis.delete_keys().await.unwrap(), held);
    for node in &cluster.nodes {
        assert_eq!(node.cli(&["DBSIZE"]).unwrap().trim(), "0", "node {}", node.port);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layers_on_different_slots_are_all_or_nothing() {
    for path in PATHS {
        layers_on_different_slots_are_all_or_nothing_on(path).await;
    }
}

async fn layers_on_different_slots_are_all_or_nothing_on(path: Path) {
    let cluster = Cluster::start_on(path);
    let policies: Vec<Policy> = [
        "fixed-window limit=10 window=1h align=first",
        "fixed-window limit=2 window=1h align=first",
    ]
    .iter()
    .map(|s| s.parse().unwrap())
    .collect();
    let redis = limiter(&cluster, "s:", &policies).await;
    // An IP and an API key: different hash tags, different slots.
    let keys = [Some("198.51.100.7"), Some("key-42")];
    for _ in 0..2 {
        let v = redis.check_layers(&keys, 1).await.unwrap();
        assert_eq!((v.source(), v.is_admitted()), (Source::Server, true));
    }
    // The second layer rejects: the first, on another slot, is charged nothing, and reports its
    // state as it is (as in process: a rejected request's layers are peeks).
    for _ in 0..3 {
        let v = redis.check_layers(&keys, 1).await.unwrap();
        assert!(!v.is_admitted());
        assert_eq!(v.layered().decided_by(), Some(1));
        assert_eq!(v.layered().layer(0).unwrap().remaining(), 8);
    }
    let first = redis.peek_layers(&[Some("198.51.100.7"), None], 1).await.unwrap();
    assert_eq!(first.decision().remaining(), 8, "the rejected requests were refunded");
    assert_eq!(redis.metrics().refunds, 3);
}
