//! `BACKEND_TYPE=redis` when the server fails: stopped (SIGSTOP) or killed, every request is
//! answered within `REDIS_TIMEOUT` + 5 ms, in the way `REDIS_FAILOVER` says; once the server is
//! back, decisions go to it again. A test binary of its own, so that no other test of the crate
//! shares the machine while it times answers.

mod common;
#[path = "../../ratewell-redis/tests/common/mod.rs"]
mod redis_common;

use std::time::{Duration, Instant};

use common::*;
use ratewell_rls::clock::EpochClock;
use ratewell_rls::proto::Code;
use ratewell_rls::server::start;
use ratewell_rls::stats::Stats;
use redis_common::Server;

const CONFIG: &str = "
domain: d
descriptors:
  - key: ip
    rate_limit: {unit: hour, requests_per_unit: 5}
";

/// `REDIS_TIMEOUT` here.
const TIMEOUT: Duration = Duration::from_millis(20);
/// The promise: every request answered within `REDIS_TIMEOUT` + 5 ms. The service times each
/// request itself (`ratelimit_service_response_time_seconds`, from the request's arrival to its
/// answer), and that histogram has a bucket at exactly this bound (`le="0.025"`): what is
/// checked is the service's own time, which the test's client (its connection, its scheduling
/// on a busy machine) does not add to.
const BOUND: Duration = Duration::from_millis(25);
/// The bucket of the histogram that is [`BOUND`].
const BOUND_LE: &str = "le=\"0.025\"";
/// Each failure is timed in up to this many tries (each a new failure of the server): on a busy
/// machine one of the service's wake-ups may come late, not in every try. A service that does
/// not honour the timeout is over the bound in every try.
const TRIES: usize = 5;
/// A request not answered within this has hung (waiting on the stopped server, or for the
/// operating system's TCP timeout): far above any busy machine's delays.
const HANG: Duration = Duration::from_secs(10);

/// The answers the service timed over [`BOUND`] so far: the histogram's count less its bucket
/// at the bound.
fn over_bound(stats: &Stats) -> u64 {
    let text = stats.prometheus_text();
    let value = |start: &str, has: &str| -> u64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(start) && l.contains(has))
            .unwrap_or_else(|| panic!("no {start}…{has} in {text}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let count = value("ratelimit_service_response_time_seconds_count{", "ShouldRateLimit");
    count - value("ratelimit_service_response_time_seconds_bucket{", BOUND_LE)
}

/// One try: `n` requests, each on its own, each checked by `check` and bounded by [`HANG`].
struct Try {
    /// Answers the service timed over [`BOUND`].
    over: u64,
    /// The slowest answer as the client saw it (for the message).
    client_worst: Duration,
}

impl std::fmt::Debug for Try {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} over (the client's slowest: {:?})", self.over, self.client_worst)
    }
}

async fn timed(
    grpc: std::net::SocketAddr,
    stats: &Stats,
    n: usize,
    check: impl Fn(Result<ratewell_rls::proto::RateLimitResponse, tonic::Status>),
) -> Try {
    let mut c = ratewell_rls::grpc::rate_limit_service_client::RateLimitServiceClient::connect(
        format!("http://{grpc}"),
    )
    .await
    .unwrap();
    let before = over_bound(stats);
    let mut client_worst = Duration::ZERO;
    for _ in 0..n {
        let start = Instant::now();
        let call = c.should_rate_limit(request("d", &[&[("ip", "1.2.3.4")]], 1));
        let r = tokio::time::timeout(HANG, call)
            .await
            .unwrap_or_else(|_| panic!("a request not answered within {HANG:?}"))
            .map(|r| r.into_inner());
        client_worst = client_worst.max(start.elapsed());
        check(r);
    }
    // Each answer is timed before it is sent: all n are in the histogram by now.
    Try { over: over_bound(stats) - before, client_worst }
}

/// A server stopped (SIGSTOP) or killed: every request answered within REDIS_TIMEOUT + 5 ms,
/// in the configured way; once the server is back, decisions go to it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_or_killed_server_is_answered_within_the_timeout() {
    let mut server = Server::start();
    let url = server.url();
    let root = tempfile::tempdir().unwrap();
    write_config(root.path(), &[("d.yaml", CONFIG)]);
    assert_eq!(TIMEOUT + Duration::from_millis(5), BOUND);
    for failover in ["error", "open", "closed"] {
        let env = [
            ("BACKEND_TYPE", "redis"),
            ("REDIS_URL", url.as_str()),
            ("REDIS_TIMEOUT", "20ms"),
            ("REDIS_FAILOVER", failover),
        ];
        let running = start(settings(root.path(), &env), EpochClock::new()).await.unwrap();
        let stats = running.service.stats().clone();
        let expect = |r: Result<ratewell_rls::proto::RateLimitResponse, tonic::Status>| match (
            failover, r,
        ) {
            ("error", Err(e)) => assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}"),
            ("open", Ok(r)) => assert_eq!(r.overall_code, Code::Ok as i32),
            ("closed", Ok(r)) => assert_eq!(r.overall_code, Code::OverLimit as i32),
            (f, other) => panic!("{f}: {other:?}"),
        };
        // Up: decided by the server.
        timed(running.grpc, &stats, 1, |r| assert!(r.is_ok())).await;

        let mut tries = Vec::new();
        while tries.last().is_none_or(|t: &Try| t.over > 0) && tries.len() < TRIES {
            // `stop` returns once the process is stopped.
            server.stop();
            tries.push(timed(running.grpc, &stats, 20, &expect).await);
            server.resume();
            wait_decided(running.grpc).await;
        }
        assert_eq!(tries.last().unwrap().over, 0, "{failover}, stopped: over {BOUND:?}: {tries:?}");

        let mut tries = Vec::new();
        while tries.last().is_none_or(|t: &Try| t.over > 0) && tries.len() < TRIES {
            server.kill();
            tries.push(timed(running.grpc, &stats, 20, &expect).await);
            server.restart();
            wait_decided(running.grpc).await;
        }
        assert_eq!(tries.last().unwrap().over, 0, "{failover}, killed: over {BOUND:?}: {tries:?}");
        assert!(stats.redis_error.load(std::sync::atomic::Ordering::Relaxed) >= 40);
        running.stop().await;
    }
}

/// Wait until the server decides again (a fresh state: the first request is OK with a limit).
async fn wait_decided(grpc: std::net::SocketAddr) {
    let mut c = ratewell_rls::grpc::rate_limit_service_client::RateLimitServiceClient::connect(
        format!("http://{grpc}"),
    )
    .await
    .unwrap();
    let start = Instant::now();
    loop {
        let r = c
            .should_rate_limit(request("d", &[&[("unknown", "x")], &[("ip", "9.9.9.9")]], 0))
            .await;
        if let Ok(r) = r.map(tonic::Response::into_inner) {
            if r.statuses[1].current_limit.is_some()
                && r.overall_code == Code::Ok as i32
                && r.statuses[1].limit_remaining < 5
            {
                return;
            }
        }
        assert!(start.elapsed() < DEADLINE, "the server was not decided on again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
