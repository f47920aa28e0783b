//! `BACKEND_TYPE=redis`, against a `redis-server` of the test's own on a free loopback port, with
//! the function library deciding and with ratewell-redis-module loaded (its command deciding):
//! the same answers as the memory store over random requests (the model the ported suites hold
//! the memory store to), exactly the limit under 8 concurrent clients, a cluster. Failures are
//! `tests/redis_failure.rs` (a binary of their own: they time answers).

mod common;
#[path = "../../ratewell-redis/tests/common/mod.rs"]
mod redis_common;

use common::*;
use ratewell_rls::clock::EpochClock;
use ratewell_rls::proto::{Code, RateLimitOverride, RateLimitRequest, Unit};
use ratewell_rls::server::start;
use redis_common::{Cluster, PATHS, Path, Rng, Server};

const CONFIG: &str = "
domain: d
descriptors:
  - key: ip
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: route
    value: search
    rate_limit: {unit: hour, requests_per_unit: 3}
    descriptors:
      - key: user
        rate_limit: {unit: day, requests_per_unit: 4}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: quota
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: quota2
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: blocked
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: free
    rate_limit: {unlimited: true}
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 4}
  - key: bucket
    rate_limit: {unit: day, requests_per_unit: 1, policy: \"token-bucket capacity=3 rate=1/d\"}
  - key: log
    rate_limit: {unit: day, requests_per_unit: 3, policy: \"sliding-log limit=3 window=1d\"}
  - key: six_hours
    rate_limit: {unit: hour, requests_per_unit: 4, unit_multiplier: 6}
  - key: bands
    rate_limits:
      - {unit: hour, requests_per_unit: 3}
      - {unit: day, requests_per_unit: 5, name: daily}
";

fn root_with(config: &str) -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    write_config(root.path(), &[("d.yaml", config)]);
    root
}

fn redis_env<'a>(url: &'a str, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut env = vec![("BACKEND_TYPE", "redis"), ("REDIS_URL", url)];
    env.extend_from_slice(extra);
    env
}

/// A random request over the configuration's rules.
fn random_request(rng: &mut Rng, run: u64) -> RateLimitRequest {
    let ip = format!("10.0.{run}.{}", rng.below(3));
    let _ = run;
    let user = format!("u{}", rng.below(2));
    let file = format!("files/{}", rng.below(5));
    let pool: Vec<Vec<(&str, String)>> = vec![
        vec![("ip", ip)],
        vec![("route", "search".into()), ("user", user)],
        vec![("route", "search".into())],
        vec![("shadow", "x".into())],
        vec![("quota", "x".into())],
        vec![("quota2", "x".into())],
        vec![("blocked", "x".into())],
        vec![("free", "x".into())],
        vec![("files", file)],
        vec![("unknown", "x".into())],
        vec![("bucket", format!("b{}", rng.below(2)))],
        vec![("log", format!("l{}", rng.below(2)))],
        vec![("six_hours", "x".into())],
        vec![("bands", format!("c{}", rng.below(2)))],
    ];
    let n = 1 + rng.below(3) as usize;
    let picked: Vec<Vec<(&str, String)>> =
        (0..n).map(|_| pool[rng.below(pool.len() as u64) as usize].clone()).collect();
    let refs: Vec<Vec<(&str, &str)>> =
        picked.iter().map(|d| d.iter().map(|(k, v)| (*k, v.as_str())).collect()).collect();
    let slices: Vec<&[(&str, &str)]> = refs.iter().map(Vec::as_slice).collect();
    let mut request = request("d", &slices, 1 + rng.below(2) as u32);
    for d in &mut request.descriptors {
        match rng.below(10) {
            0 => d.hits_addend = Some(0),
            1 => d.hits_addend = Some(2),
            2 => {
                d.limit = Some(RateLimitOverride {
                    requests_per_unit: 2 + rng.below(2) as u32,
                    unit: Unit::Hour as i32,
                })
            }
            _ => {}
        }
    }
    request
}

/// The same random requests answered by the memory store and by Redis: the same codes, limits
/// and remaining; resets within a second of each other (two clocks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_answers_as_the_memory_store() {
    for path in PATHS {
        redis_answers_as_the_memory_store_on(path).await;
    }
}

async fn redis_answers_as_the_memory_store_on(path: Path) {
    let server = Server::start_on(path, &[]);
    let url = server.url();
    let root = root_with(CONFIG);
    let root_s = root.path().display().to_string();
    let memory = start(settings(root.path(), &[]), EpochClock::new()).await.unwrap();
    let env = redis_env(&url, &[("CACHE_KEY_PREFIX", "parity:")]);
    let redis = start(settings(root.path(), &env), EpochClock::new()).await.unwrap();
    let _ = root_s;
    clear_of_boundary(86_400, 60).await;
    clear_of_boundary(6 * 3_600, 60).await;
    clear_of_boundary(3_600, 60).await;
    let mut m = ratewell_rls::grpc::rate_limit_service_client::RateLimitServiceClient::connect(
        format!("http://{}", memory.grpc),
    )
    .await
    .unwrap();
    let mut r = ratewell_rls::grpc::rate_limit_service_client::RateLimitServiceClient::connect(
        format!("http://{}", redis.grpc),
    )
    .await
    .unwrap();
    let mut rng = Rng(11);
    let mut over = 0;
    for i in 0..600 {
        let req = random_request(&mut rng, std::process::id() as u64 % 200);
        let a = m.should_rate_limit(req.clone()).await.unwrap().into_inner();
        let mut b = r.should_rate_limit(req.clone()).await.unwrap().into_inner();
        for (x, y) in a.statuses.iter().zip(&mut b.statuses) {
            if let (Some(dx), Some(dy)) = (&x.duration_until_reset, &mut y.duration_until_reset) {
                assert!((dx.seconds - dy.seconds).abs() <= 1, "request {i}: resets {dx:?} {dy:?}");
                dy.seconds = dx.seconds;
            }
        }
        assert_eq!(a, b, "request {i}: {req:?}");
        over += usize::from(a.overall_code == Code::OverLimit as i32);
    }
    assert!((100..500).contains(&over), "a mix of answers: {over} of 600 over the limit");
    let keys = server.cli(&["KEYS", "parity:*"]).unwrap_or_default();
    assert!(
        keys.lines().any(|k| k.starts_with("parity:d_ip_10.0.")),
        "keys under the prefix: {keys:?}"
    );
}

const EXACT: &str = "
domain: exact
descriptors:
  - key: route
    rate_limit: {unit: hour, requests_per_unit: 1000}
  - key: wide
    rate_limit: {unit: hour, requests_per_unit: 1000}
  - key: tight
    rate_limit: {unit: hour, requests_per_unit: 300}
";

/// 8 clients on their own connections, 4,000 requests at a limit of 1,000, against the binary
/// on Redis: exactly 1,000 OK; pairs charged all or nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_clients_get_exactly_the_limit_on_redis() {
    for path in PATHS {
        eight_clients_get_exactly_the_limit_on_redis_on(path).await;
    }
}

async fn eight_clients_get_exactly_the_limit_on_redis_on(path: Path) {
    let server = Server::start_on(path, &[]);
    let url = server.url();
    let root = root_with(EXACT);
    let root_s = root.path().display().to_string();
    let env = redis_env(
        &url,
        &[
            ("RUNTIME_ROOT", &root_s),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("REDIS_TIMEOUT", "1s"),
        ],
    );
    let b = Binary::spawn(&env);
    clear_of_boundary(3600, 60).await;
    assert_eq!(flood(b.grpc, 8, 500, request("exact", &[&[("route", "x")]], 1)).await, 1000);
    assert_eq!(
        flood(b.grpc, 8, 100, request("exact", &[&[("wide", "x")], &[("tight", "x")]], 1)).await,
        300
    );
    let mut peek = request("exact", &[&[("wide", "x")], &[("tight", "x")]], 1);
    for d in &mut peek.descriptors {
        d.hits_addend = Some(0);
    }
    let r = b.client().await.should_rate_limit(peek).await.unwrap().into_inner();
    let remaining: Vec<u32> = r.statuses.iter().map(|s| s.limit_remaining).collect();
    assert_eq!(remaining, [700, 0], "only admitted pairs charged the wider limit");
}

/// On a Redis Cluster, a request's descriptors sit in one hash slot (their domain's) and are
/// decided in one call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_decides_a_domain_in_one_slot() {
    for path in PATHS {
        a_cluster_decides_a_domain_in_one_slot_on(path).await;
    }
}

async fn a_cluster_decides_a_domain_in_one_slot_on(path: Path) {
    let cluster = Cluster::start_on(path);
    let urls = cluster.urls().join(",");
    let root = root_with(CONFIG);
    let env = redis_env(&urls, &[("REDIS_TYPE", "CLUSTER"), ("REDIS_TIMEOUT", "1s")]);
    let running = start(settings(root.path(), &env), EpochClock::new()).await.unwrap();
    let mut c = ratewell_rls::grpc::rate_limit_service_client::RateLimitServiceClient::connect(
        format!("http://{}", running.grpc),
    )
    .await
    .unwrap();
    clear_of_boundary(3600, 30).await;
    for i in 0..5 {
        let r = c
            .should_rate_limit(request("d", &[&[("ip", "1.1.1.1")], &[("route", "search")]], 1))
            .await
            .unwrap()
            .into_inner();
        let want = if i < 3 { Code::Ok } else { Code::OverLimit };
        assert_eq!(r.overall_code, want as i32, "request {i}");
    }
    let r =
        c.should_rate_limit(request("d", &[&[("ip", "1.1.1.1")]], 1)).await.unwrap().into_inner();
    assert_eq!(
        r.statuses[0].limit_remaining, 1,
        "3 pairs admitted, 2 denied pairs charged nothing"
    );
}
