//! `REDIS_TLS` against live `redis-server`s that listen only over TLS on loopback, with
//! certificates made by rcgen, configured by the Go service's variables (`REDIS_TLS_CACERT`,
//! `REDIS_TLS_CLIENT_CERT`, `REDIS_TLS_CLIENT_KEY`, `REDIS_TLS_SKIP_HOSTNAME_VERIFICATION`):
//! a server verified against the CA, reached by name and by address, decides exactly as the
//! memory store decides the same requests, and so does one that requires a client certificate
//! and one that also asks for a password (`REDIS_AUTH`). The start fails, with `certificate` in
//! its error, for a server certificate of another CA (skipping the hostname check or not: the
//! chain is still verified, as in Go), for a client without the certificate the server
//! requires, and for a certificate whose names do not hold the address reached, unless
//! `REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=true`; a wrong password stops it with the server's
//! refusal.

mod common;
#[path = "common/redis_servers.rs"]
mod redis_servers;

use std::sync::atomic::Ordering;

use common::*;
use ratewell_rls::proto::{Code, RateLimitRequest};
use redis_servers::*;

const CONFIG: &str = "
domain: d
descriptors:
  - key: ip
    rate_limit: {unit: hour, requests_per_unit: 5}
";

/// Six requests on the descriptor `ip=ip`.
fn six(ip: &str) -> Vec<RateLimitRequest> {
    (0..6).map(|_| request("d", &[&[("ip", ip)]], 1)).collect()
}

/// The service over TLS to `url` (`REDIS_TLS=true`, `tls` for the files, `extra` on top):
/// its answers to `requests`, or why it did not start.
async fn over_tls(
    url: &str,
    tls: &[(String, String)],
    extra: &[(&str, &str)],
    requests: &[RateLimitRequest],
) -> Result<Vec<Answer>, String> {
    let mut env: Vec<(&str, &str)> = vec![
        ("BACKEND_TYPE", "redis"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", url),
        ("REDIS_TLS", "true"),
        ("REDIS_TIMEOUT", "2s"),
    ];
    env.extend(tls.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    env.extend_from_slice(extra);
    let mut service = Service::start(CONFIG, &env).await?;
    let mut answers = Vec::new();
    for r in requests {
        answers.push(service.send(r).await);
    }
    let errors = service.running.service.stats().redis_error.load(Ordering::Relaxed);
    assert_eq!(errors, 0, "no Redis errors over TLS: {answers:?}");
    service.running.stop().await;
    Ok(answers)
}

/// `result` holds the memory store's answers to six requests on one descriptor (5 admitted,
/// then over the limit), and the server holds the descriptor's key.
async fn as_memory(result: Result<Vec<Answer>, String>, server: &Process, ip: &str) {
    let got = result.expect("the service starts over TLS");
    let want = on_memory(CONFIG, &six(ip)).await;
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    assert_eq!(codes(&want), [ok, ok, ok, ok, ok, over]);
    assert_eq!(got, want, "over TLS as in memory");
    let keys = server.keys();
    assert!(keys.iter().any(|k| k.starts_with(&format!("d_ip_{ip}_"))), "keys: {keys:?}");
}

/// The start failed with `certificate` (any case) in its error.
fn refused_for_a_certificate(result: Result<Vec<Answer>, String>, what: &str) {
    let e = result.expect_err(what);
    eprintln!("{what}: {e}");
    assert!(e.to_ascii_lowercase().contains("certificate"), "{what}: {e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_verified_against_the_ca() {
    let pki = Pki::new();
    let server = pki.tls_server(&pki.server, false, &[], "");
    let tls = pki.env(false, false);
    clear_of_boundary(3600, 30).await;
    // By name and by address: the certificate holds both.
    let by_name = format!("localhost:{}", server.port);
    as_memory(over_tls(&by_name, &tls, &[], &six("10.0.0.1")).await, &server, "10.0.0.1").await;
    let by_address = format!("127.0.0.1:{}", server.port);
    as_memory(over_tls(&by_address, &tls, &[], &six("10.0.0.2")).await, &server, "10.0.0.2").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_requires_a_client_certificate() {
    let pki = Pki::new();
    let server = pki.tls_server(&pki.server, true, &[], "");
    let url = format!("127.0.0.1:{}", server.port);
    clear_of_boundary(3600, 30).await;
    let with = pki.env(true, false);
    as_memory(over_tls(&url, &with, &[], &six("10.0.1.1")).await, &server, "10.0.1.1").await;
    let without = pki.env(false, false);
    refused_for_a_certificate(
        over_tls(&url, &without, &[], &six("10.0.1.2")).await,
        "a client without the certificate the server requires does not start",
    );
    assert!(!server.keys().iter().any(|k| k.contains("10.0.1.2")), "nothing decided");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_certificate_of_another_ca_is_refused() {
    let pki = Pki::new();
    let server = pki.tls_server(&pki.foreign, false, &[], "");
    let url = format!("localhost:{}", server.port);
    for skip in [false, true] {
        // Skipping the hostname check still verifies the chain, as Go's does.
        refused_for_a_certificate(
            over_tls(&url, &pki.env(true, skip), &[], &six("10.0.2.1")).await,
            &format!("another CA's server certificate (skip hostname: {skip}) does not start"),
        );
    }
    assert_eq!(server.dbsize(), 0, "nothing decided");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_for_another_name_needs_skip_hostname_verification() {
    let pki = Pki::new();
    let server = pki.tls_server(&pki.localhost_only, false, &[], "");
    let by_address = format!("127.0.0.1:{}", server.port);
    refused_for_a_certificate(
        over_tls(&by_address, &pki.env(true, false), &[], &six("10.0.3.1")).await,
        "a certificate for localhost reached as 127.0.0.1 does not start",
    );
    assert_eq!(server.dbsize(), 0, "nothing decided");
    clear_of_boundary(3600, 30).await;
    let skipped = over_tls(&by_address, &pki.env(true, true), &[], &six("10.0.3.2")).await;
    as_memory(skipped, &server, "10.0.3.2").await;
    let by_name = format!("localhost:{}", server.port);
    let named = over_tls(&by_name, &pki.env(true, false), &[], &six("10.0.3.3")).await;
    as_memory(named, &server, "10.0.3.3").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_a_password() {
    let pki = Pki::new();
    let server = pki.tls_server(&pki.server, true, &["--requirepass", "tls-pw"], "tls-pw");
    let url = format!("127.0.0.1:{}", server.port);
    let tls = pki.env(true, false);
    clear_of_boundary(3600, 30).await;
    let with = over_tls(&url, &tls, &[("REDIS_AUTH", "tls-pw")], &six("10.0.4.1")).await;
    as_memory(with, &server, "10.0.4.1").await;
    let wrong = over_tls(&url, &tls, &[("REDIS_AUTH", "wrong")], &six("10.0.4.2")).await;
    let e = wrong.expect_err("a wrong password over TLS does not start");
    assert!(e.contains("authentication failed"), "{e}");
}
