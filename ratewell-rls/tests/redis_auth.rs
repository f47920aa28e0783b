//! `REDIS_AUTH` against live servers on loopback, in the Go service's two forms: a password
//! (`requirepass`) and `user:password` (an ACL user, the default user off). Each decides exactly
//! as the memory store decides the same requests (5 of 6 admitted at a limit of 5); a wrong
//! password stops the start with the server's refusal, never a service that decides without
//! its store.

mod common;
#[path = "../../ratewell-redis/tests/common/mod.rs"]
mod redis_common;

use std::sync::atomic::Ordering;

use common::*;
use ratewell_rls::grpc::rate_limit_service_client::RateLimitServiceClient;
use ratewell_rls::proto::Code;
use ratewell_rls::server::start;
use redis_common::Server;

const CONFIG: &str = "
domain: d
descriptors:
  - key: ip
    rate_limit: {unit: hour, requests_per_unit: 5}
";

/// Six requests on one descriptor, on `REDIS_AUTH=auth`: the overall codes, or why the service
/// did not start.
async fn six(server: &Server, auth: &str) -> Result<Vec<i32>, String> {
    let addr = format!("127.0.0.1:{}", server.port);
    let env = [
        ("BACKEND_TYPE", "redis"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", addr.as_str()),
        ("REDIS_AUTH", auth),
        ("REDIS_TIMEOUT", "1s"),
        ("USE_STATSD", "false"),
    ];
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), &[("d.yaml", CONFIG)]);
    let clock = ratewell::ManualClock::new(600 * S);
    let running = start(settings(dir.path(), &env), clock).await.map_err(|e| e.to_string())?;
    let url = format!("http://{}", running.grpc);
    let mut client = RateLimitServiceClient::connect(url).await.unwrap();
    let mut codes = Vec::new();
    for _ in 0..6 {
        let r = client.should_rate_limit(request("d", &[&[("ip", "10.0.0.1")]], 1)).await;
        codes.push(r.expect("decided on the server").into_inner().overall_code);
    }
    assert_eq!(running.service.stats().redis_error.load(Ordering::Relaxed), 0);
    running.stop().await;
    Ok(codes)
}

/// What the memory store answers: 5 of 6 admitted at a limit of 5.
fn exact() -> Result<Vec<i32>, String> {
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    Ok(vec![ok, ok, ok, ok, ok, over])
}

fn refused(result: Result<Vec<i32>, String>) {
    let e = result.expect_err("a wrong password does not start");
    assert!(e.contains("authentication failed"), "{e}");
}

#[tokio::test]
async fn a_password() {
    // Characters a URL's user information cannot hold as they are.
    let server = Server::start_with(&["--requirepass", "s3cr@t/%#?"]);
    assert_eq!(six(&server, "s3cr@t/%#?").await, exact());
    refused(six(&server, "wrong").await);
}

#[tokio::test]
async fn an_acl_user() {
    let server = Server::start_with(&[
        "--user", "default", "off", "--user", "limiter", "on", ">pw", "~*", "&*", "+@all",
    ]);
    assert_eq!(six(&server, "limiter:pw").await, exact());
    refused(six(&server, "limiter:nope").await);
    // The password alone is the default user's, which is off.
    refused(six(&server, "pw").await);
}
