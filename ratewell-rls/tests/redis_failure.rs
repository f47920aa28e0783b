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
use redis_common::Server;

const CONFIG: &str = "
domain: d
descriptors:
  - key: ip
    rate_limit: {unit: hour, requests_per_unit: 5}
";

/// Time `n` requests, each on its own; the slowest.
async fn slowest(
    grpc: std::net::SocketAddr,
    n: usize,
    check: impl Fn(Result<ratewell_rls::proto::RateLimitResponse, tonic::Status>),
) -> Duration {
    let mut c = ratewell_rls::grpc::rate_limit_service_client::RateLimitServiceClient::connect(
        format!("http://{grpc}"),
    )
    .await
    .unwrap();
    let mut worst = Duration::ZERO;
    for _ in 0..n {
        let start = Instant::now();
        let r = c
            .should_rate_limit(request("d", &[&[("ip", "1.2.3.4")]], 1))
            .await
            .map(|r| r.into_inner());
        worst = worst.max(start.elapsed());
        check(r);
    }
    worst
}

/// A server stopped (SIGSTOP) or killed: every request answered within REDIS_TIMEOUT + 5 ms,
/// in the configured way; once the server is back, decisions go to it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_or_killed_server_is_answered_within_the_timeout() {
    let mut server = Server::start();
    let url = server.url();
    let root = tempfile::tempdir().unwrap();
    write_config(root.path(), &[("d.yaml", CONFIG)]);
    let timeout = Duration::from_millis(20);
    let bound = timeout + Duration::from_millis(5);
    for failover in ["error", "open", "closed"] {
        let env = [
            ("BACKEND_TYPE", "redis"),
            ("REDIS_URL", url.as_str()),
            ("REDIS_TIMEOUT", "20ms"),
            ("REDIS_FAILOVER", failover),
        ];
        let running = start(settings(root.path(), &env), EpochClock::new()).await.unwrap();
        let expect = |r: Result<ratewell_rls::proto::RateLimitResponse, tonic::Status>| match (
            failover, r,
        ) {
            ("error", Err(e)) => assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}"),
            ("open", Ok(r)) => assert_eq!(r.overall_code, Code::Ok as i32),
            ("closed", Ok(r)) => assert_eq!(r.overall_code, Code::OverLimit as i32),
            (f, other) => panic!("{f}: {other:?}"),
        };
        // Up: decided by the server.
        assert!(slowest(running.grpc, 1, |r| assert!(r.is_ok())).await < Duration::from_secs(1));

        server.stop();
        // The signal is delivered asynchronously: let it land before timing anything.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let worst = slowest(running.grpc, 20, &expect).await;
        assert!(worst <= bound, "{failover}, stopped: {worst:?} > {bound:?}");
        server.resume();
        wait_decided(running.grpc).await;

        server.kill();
        let worst = slowest(running.grpc, 20, &expect).await;
        assert!(worst <= bound, "{failover}, killed: {worst:?} > {bound:?}");
        server.restart();
        wait_decided(running.grpc).await;
        let stats = running.service.stats();
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
        assert!(start.elapsed() < Duration::from_secs(10), "the server was not decided on again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
