//! `GRPC_UDS`: the gRPC server listens on a unix socket instead of `GRPC_HOST:GRPC_PORT`, as the
//! Go service does. A client over the socket is decided exactly (5 of 6 at a limit of 5), health
//! answers there, a stale socket file left by a dead process is replaced, a live one or a file
//! that is not a socket stops the start, and the socket's file is removed at stop.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use hyper_util::rt::TokioIo;
use ratewell_rls::grpc::rate_limit_service_client::RateLimitServiceClient;
use ratewell_rls::proto::Code;
use ratewell_rls::server::start;
use tonic::transport::{Channel, Endpoint, Uri};

const CONFIG: &str = "
domain: d
descriptors:
  - key: ip
    rate_limit: {unit: hour, requests_per_unit: 5}
";

async fn channel(path: &Path) -> Channel {
    let path = path.to_path_buf();
    Endpoint::try_from("http://[::1]:1")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }))
        .await
        .expect("a connection over the socket")
}

fn socket_in(dir: &Path) -> PathBuf {
    dir.join("ratelimit.sock")
}

#[tokio::test]
async fn decides_over_a_unix_socket() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), &[("d.yaml", CONFIG)]);
    let socket = socket_in(dir.path());
    let env = [("GRPC_UDS", socket.to_str().unwrap()), ("USE_STATSD", "false")];
    let clock = ratewell::ManualClock::new(600 * S);
    let running = start(settings(dir.path(), &env), clock).await.expect("starts");
    assert_eq!(running.grpc_uds.as_deref(), Some(socket.as_path()));
    assert_eq!(running.grpc.port(), 0, "no TCP listener for gRPC");
    let mut client = RateLimitServiceClient::new(channel(&socket).await);
    let mut codes = Vec::new();
    for _ in 0..6 {
        let r = client.should_rate_limit(request("d", &[&[("ip", "10.0.0.1")]], 1)).await.unwrap();
        codes.push(r.into_inner().overall_code);
    }
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    assert_eq!(codes, [ok, ok, ok, ok, ok, over]);
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel(&socket).await);
    let status = health
        .check(tonic_health::pb::HealthCheckRequest { service: "ratelimit".into() })
        .await
        .unwrap()
        .into_inner()
        .status;
    assert_eq!(status, tonic_health::pb::health_check_response::ServingStatus::Serving as i32);

    // A second service on the same socket: refused while the first listens.
    let e = start(settings(dir.path(), &env), ratewell::ManualClock::new(600 * S))
        .await
        .expect_err("the socket is in use");
    assert!(e.to_string().contains("another process listens on it"), "{e}");

    running.stop().await;
    assert!(!socket.exists(), "the socket's file is removed at stop");
}

#[tokio::test]
async fn a_stale_socket_is_replaced_and_a_plain_file_is_not() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), &[("d.yaml", CONFIG)]);
    let socket = socket_in(dir.path());
    // A socket whose process is gone (bound, then the listener dropped without unlinking).
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    assert!(socket.exists());
    let env = [("GRPC_UDS", socket.to_str().unwrap()), ("USE_STATSD", "false")];
    let running = start(settings(dir.path(), &env), ratewell::ManualClock::new(600 * S))
        .await
        .expect("a stale socket is replaced");
    let mut client = RateLimitServiceClient::new(channel(&socket).await);
    let r = client.should_rate_limit(request("d", &[&[("ip", "a")]], 1)).await.unwrap();
    assert_eq!(r.into_inner().overall_code, Code::Ok as i32);
    running.stop().await;

    let plain = dir.path().join("not-a-socket");
    std::fs::write(&plain, "data").unwrap();
    let env = [("GRPC_UDS", plain.to_str().unwrap()), ("USE_STATSD", "false")];
    let e = start(settings(dir.path(), &env), ratewell::ManualClock::new(600 * S))
        .await
        .expect_err("a plain file is not replaced");
    assert!(e.to_string().contains("a file that is not a socket is there"), "{e}");
    assert_eq!(std::fs::read_to_string(&plain).unwrap(), "data");
}
