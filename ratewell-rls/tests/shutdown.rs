//! Health as Envoy and Kubernetes ask for it, and the stop on SIGTERM, against the binary: gRPC
//! health answers for `ratelimit` (the Go service's name, which Envoy's `grpc_health_check`
//! asks for) and for the empty name; SIGHUP stops it as SIGTERM does; connections are closed
//! at `GRPC_MAX_CONNECTION_AGE`; on SIGTERM health turns NOT_SERVING and `/healthcheck` answers
//! 500 while a request in flight finishes, then the process exits 0.

mod common;
#[path = "../../ratewell-redis/tests/common/mod.rs"]
mod redis_common;

use std::time::Duration;

use common::*;
use ratewell_rls::proto::Code;
use redis_common::Server;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const CONFIG: &str = "
domain: d
descriptors:
  - key: ip
    rate_limit: {unit: hour, requests_per_unit: 5}
";

fn config_root() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), &[("d.yaml", CONFIG)]);
    dir
}

async fn health(grpc: std::net::SocketAddr) -> HealthClient<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))
        .unwrap()
        .connect()
        .await
        .expect("a connection");
    HealthClient::new(channel)
}

/// A health watch on `ratelimit`, its first status read: SERVING.
async fn serving_watch(
    grpc: std::net::SocketAddr,
) -> tonic::Streaming<tonic_health::pb::HealthCheckResponse> {
    let mut watch = health(grpc)
        .await
        .watch(HealthCheckRequest { service: "ratelimit".into() })
        .await
        .unwrap()
        .into_inner();
    let first = watch.message().await.unwrap().unwrap();
    assert_eq!(first.status, ServingStatus::Serving as i32);
    watch
}

#[tokio::test]
async fn health_answers_for_ratelimit_and_the_empty_name() {
    let root = config_root();
    let root_s = root.path().display().to_string();
    let mut bin = Binary::spawn(&[
        ("RUNTIME_ROOT", &root_s),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_WATCH_ROOT", "false"),
    ]);
    let mut h = health(bin.grpc).await;
    for name in ["ratelimit", "", "envoy.service.ratelimit.v3.RateLimitService"] {
        let r = h.check(HealthCheckRequest { service: name.into() }).await.unwrap().into_inner();
        assert_eq!(r.status, ServingStatus::Serving as i32, "{name:?}");
    }
    let e = h.check(HealthCheckRequest { service: "other".into() }).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    assert!(bin.logged("deciding in process"), "the backend's line");
    // SIGHUP stops it too, as it stops the Go service (its runner's signals).
    let pid = bin.child.id().to_string();
    bin.wait_catches(SIGHUP);
    assert!(std::process::Command::new("kill").args(["-HUP", &pid]).status().unwrap().success());
    assert_eq!(bin.exited_within(Duration::from_secs(10)).await.code(), Some(0));
}

/// A request waits on a stopped Redis server (SIGSTOP) when SIGTERM comes: health turns
/// NOT_SERVING on a watch opened before, `/healthcheck` answers 500, and once the server
/// resumes the request is answered (OK) and the process exits 0. The store is Redis because
/// the environment names one (`REDIS_URL`) and no `BACKEND_TYPE`, as the Go service's default.
#[tokio::test]
async fn sigterm_turns_health_off_finishes_in_flight_requests_and_exits_zero() {
    let redis = Server::start();
    let url = redis.url();
    let addr = url.trim_start_matches("redis://").trim_end_matches('/').to_owned();
    let root = config_root();
    let root_s = root.path().display().to_string();
    let mut bin = Binary::spawn(&[
        ("RUNTIME_ROOT", &root_s),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", &addr),
        ("REDIS_TIMEOUT", "20s"),
    ]);
    assert!(bin.logged("deciding on Redis at redis://"), "{:?}", bin.lines());
    let mut client = bin.client().await;
    let r = client.should_rate_limit(request("d", &[&[("ip", "1")]], 1)).await.unwrap();
    assert_eq!(r.get_ref().overall_code, Code::Ok as i32);
    let (code, _) = http(bin.http, "GET", "/healthcheck", b"").await;
    assert_eq!(code, 200);
    let mut watch = serving_watch(bin.grpc).await;

    redis.stop();
    let in_flight = tokio::spawn(async move {
        client.should_rate_limit(request("d", &[&[("ip", "1")]], 1)).await.map(|r| r.into_inner())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!in_flight.is_finished(), "the request waits on the stopped server");
    let pid = bin.child.id().to_string();
    bin.wait_catches(SIGTERM);
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());

    let next = tokio::time::timeout(Duration::from_secs(5), watch.message()).await;
    let next = next.expect("a status within 5 s").unwrap().unwrap();
    assert_eq!(next.status, ServingStatus::NotServing as i32);
    drop(watch);
    let (code, _) = http(bin.http, "GET", "/healthcheck", b"").await;
    assert_eq!(code, 500, "unhealthy while draining");
    assert!(bin.child.try_wait().unwrap().is_none(), "still finishing the request in flight");

    redis.resume();
    let answered = tokio::time::timeout(Duration::from_secs(10), in_flight).await;
    let answered = answered.expect("answered once the server resumes").unwrap();
    assert_eq!(answered.expect("an answer, not an error").overall_code, Code::Ok as i32);
    assert_eq!(bin.exited_within(Duration::from_secs(10)).await.code(), Some(0));
}

/// A health watch open on one connection for `wait`: whether the server ended it.
async fn watch_ended(env: &[(&str, &str)], wait: Duration) -> bool {
    let h = Harness::start(&[("d.yaml", CONFIG)], env, 600).await;
    let mut watch = serving_watch(h.running.grpc).await;
    let ended = matches!(tokio::time::timeout(wait, watch.message()).await, Ok(Err(_) | Ok(None)));
    drop(watch);
    h.running.stop().await;
    ended
}

/// `GRPC_MAX_CONNECTION_AGE` and `_GRACE`: a connection is sent a GOAWAY at that age and closed
/// after the grace, a stream still open on it then (a health watch) with it; under the Go
/// defaults (24 h and 1 h) it stays.
#[tokio::test]
async fn connections_are_closed_at_their_maximum_age() {
    let short = [("GRPC_MAX_CONNECTION_AGE", "300ms"), ("GRPC_MAX_CONNECTION_AGE_GRACE", "200ms")];
    assert!(watch_ended(&short, Duration::from_secs(5)).await, "closed at 300 ms + 200 ms");
    assert!(!watch_ended(&[], Duration::from_secs(2)).await, "kept under the defaults");
}
