//! ratewell-rls as Envoy Gateway runs envoyproxy/ratelimit: the container environment of its
//! deployment builder (envoyproxy/gateway
//! `internal/infrastructure/kubernetes/ratelimit/testdata/deployments/default.yaml`), with its
//! paths, ports and host names put on this machine (`envoy-gateway` and `redis.redis.svc` are
//! `localhost`: a host name still, the one a test can resolve), against an xDS control plane run
//! here (tonic, mutual TLS), a statsd listener and a real `redis-server` on loopback.
//!
//! One test walks the deployment's life: the service starts before any configuration arrives,
//! takes it over mutual TLS and ACKs it, NACKs a bad version and keeps the good one, keeps
//! deciding while the control plane is away and resumes at the last version when it returns,
//! answers the rate limit service only over mutual TLS, decides on Redis, answers gRPC health for
//! `ratelimit`, sends statsd under the Go names with the counts it decided, and exits 0 on
//! SIGTERM.

#[path = "common/ads.rs"]
mod ads;
mod common;
#[path = "../../ratewell-redis/tests/common/mod.rs"]
mod redis_common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ads::{AdsServer, WAIT, any, response};
use common::{Binary, request};
use ratewell_rls::grpc::rate_limit_service_client::RateLimitServiceClient;
use ratewell_rls::proto::{Code, RateLimitResponse};
use ratewell_rls::xds_proto::{
    DiscoveryResponse, RATE_LIMIT_CONFIG_TYPE_URL, RateLimitConfig, RateLimitDescriptor,
    RateLimitPolicy, RateLimitUnit,
};
use redis_common::Server;
use tokio::net::{TcpListener, UdpSocket};
use tonic::transport::{
    Certificate, Channel, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig,
};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// The Go default backoff before reconnecting after a stream ends (`XDS_CLIENT_BACKOFF_*`,
/// which Envoy Gateway leaves unset) is 10 s: a reconnect is waited for longer.
const RECONNECT: Duration = Duration::from_secs(25);

// ---- certificates ------------------------------------------------------------------------

struct Pki {
    dir: tempfile::TempDir,
    ca: String,
    /// The control plane's certificate.
    control_plane: Identity,
    /// Envoy's client certificate for the rate limit service.
    envoy: Identity,
    /// A client certificate from another CA.
    stranger: Identity,
}

fn ca(name: &str) -> (rcgen::Issuer<'static, rcgen::KeyPair>, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.distinguished_name.push(rcgen::DnType::CommonName, name);
    let cert = params.self_signed(&key).unwrap();
    (rcgen::Issuer::new(params, key), cert.pem())
}

fn leaf(issuer: &rcgen::Issuer<'static, rcgen::KeyPair>, names: &[&str]) -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let cert = rcgen::CertificateParams::new(names).unwrap().signed_by(&key, issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// Envoy Gateway's `/certs`: one CA, and one certificate (`tls.crt`) that is both the rate limit
/// service's and its xDS client's.
fn pki() -> Pki {
    let (issuer, ca_pem) = ca("envoy-gateway test CA");
    let (cert, key) = leaf(&issuer, &["localhost", "127.0.0.1", "envoy-ratelimit"]);
    let dir = tempfile::tempdir().unwrap();
    for (name, content) in [("ca.crt", &ca_pem), ("tls.crt", &cert), ("tls.key", &key)] {
        std::fs::write(dir.path().join(name), content).unwrap();
    }
    let (cp_cert, cp_key) = leaf(&issuer, &["localhost"]);
    let (envoy_cert, envoy_key) = leaf(&issuer, &["envoy"]);
    let (other, _) = ca("another CA");
    let (stranger_cert, stranger_key) = leaf(&other, &["envoy"]);
    Pki {
        dir,
        ca: ca_pem,
        control_plane: Identity::from_pem(cp_cert, cp_key),
        envoy: Identity::from_pem(envoy_cert, envoy_key),
        stranger: Identity::from_pem(stranger_cert, stranger_key),
    }
}

// ---- the control plane -------------------------------------------------------------------

/// The control plane: an ADS server over TLS that asks for a client certificate from the CA.
async fn control_plane(addr: SocketAddr, pki: &Pki) -> AdsServer {
    let tls = ServerTlsConfig::new()
        .identity(pki.control_plane.clone())
        .client_ca_root(Certificate::from_pem(&pki.ca));
    AdsServer::start(TcpListener::bind(addr).await.unwrap(), Some(tls)).await
}

/// A response of `version` whose resources are `configs`.
fn discovery(version: &str, nonce: &str, configs: Vec<RateLimitConfig>) -> DiscoveryResponse {
    response(version, nonce, configs.iter().map(any).collect())
}

fn config(requests_per_unit: u32, unit: i32) -> RateLimitConfig {
    RateLimitConfig {
        name: "default/eg/http".into(),
        domain: "eg".into(),
        descriptors: vec![RateLimitDescriptor {
            key: "user".into(),
            rate_limit: Some(RateLimitPolicy { unit, requests_per_unit, ..Default::default() }),
            ..Default::default()
        }],
    }
}

fn hour() -> i32 {
    RateLimitUnit::Hour as i32
}

// ---- clients -------------------------------------------------------------------------------

/// A channel to the service's gRPC port over TLS, with `identity` as the client certificate.
async fn channel(grpc: SocketAddr, pki: &Pki, identity: Option<&Identity>) -> Option<Channel> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&pki.ca))
        .domain_name("localhost");
    if let Some(identity) = identity {
        tls = tls.identity(identity.clone());
    }
    let endpoint = Endpoint::from_shared(format!("https://{grpc}")).unwrap().tls_config(tls);
    let endpoint = endpoint.unwrap().connect_timeout(WAIT);
    tokio::time::timeout(WAIT, endpoint.connect()).await.ok()?.ok()
}

/// Whether a rate limit call on `channel` is answered (a refused handshake surfaces on the
/// first call, TLS 1.3 sending the server's verdict on the client's certificate after it).
async fn answered(channel: Option<Channel>) -> bool {
    let Some(channel) = channel else { return false };
    let mut client = RateLimitServiceClient::new(channel);
    let call = client.should_rate_limit(request("elsewhere", &[&[("user", "probe")]], 1));
    matches!(tokio::time::timeout(WAIT, call).await, Ok(Ok(_)))
}

/// What a run of decisions came to, as statsd should report it.
#[derive(Default)]
struct Tally {
    calls: u64,
    ok: u64,
    over: u64,
}

impl Tally {
    fn count(&mut self, r: &RateLimitResponse) {
        self.calls += 1;
        if r.overall_code == Code::Ok as i32 { self.ok += 1 } else { self.over += 1 }
    }
}

async fn decide(
    client: &mut RateLimitServiceClient<Channel>,
    user: &str,
    tally: &mut Tally,
) -> RateLimitResponse {
    let r = client.should_rate_limit(request("eg", &[&[("user", user)]], 1)).await;
    let r = r.expect("an answer").into_inner();
    tally.count(&r);
    r
}

fn remaining(r: &RateLimitResponse) -> (i32, u32, u32) {
    let s = &r.statuses[0];
    (s.code, s.current_limit.as_ref().map_or(0, |l| l.requests_per_unit), s.limit_remaining)
}

/// Every statsd line sent to `sockets` until `quiet` passes without one, counters summed by name.
async fn statsd_counters(sockets: &[UdpSocket], quiet: Duration) -> HashMap<String, u64> {
    let mut sums = HashMap::new();
    let (mut a, mut b) = (vec![0u8; 65_536], vec![0u8; 65_536]);
    loop {
        let second = async {
            match sockets.get(1) {
                Some(s) => s.recv(&mut b).await.map(|n| b[..n].to_vec()),
                None => std::future::pending().await,
            }
        };
        let next = async {
            tokio::select! {
                r = sockets[0].recv(&mut a) => r.map(|n| a[..n].to_vec()),
                r = second => r,
            }
        };
        let Ok(Ok(datagram)) = tokio::time::timeout(quiet, next).await else { return sums };
        for line in String::from_utf8_lossy(&datagram).lines() {
            let Some((name, rest)) = line.split_once(':') else { continue };
            let Some(value) = rest.strip_suffix("|c") else { continue };
            *sums.entry(name.to_owned()).or_default() += value.parse::<u64>().unwrap();
        }
    }
}

/// The container environment of Envoy Gateway's deployment builder, its paths, ports and
/// host names put on this machine.
fn environment(
    pki: &Pki,
    data: &std::path::Path,
    statsd_port: u16,
    control_port: u16,
    redis_port: &str,
) -> Vec<(&'static str, String)> {
    let certs = |name: &str| pki.dir.path().join(name).display().to_string();
    vec![
        ("RUNTIME_ROOT", data.display().to_string()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".into()),
        ("RUNTIME_IGNOREDOTFILES", "true".into()),
        ("RUNTIME_WATCH_ROOT", "false".into()),
        ("LOG_LEVEL", "info".into()),
        ("USE_STATSD", "true".into()),
        ("STATSD_PORT", statsd_port.to_string()),
        ("CONFIG_TYPE", "GRPC_XDS_SOTW".into()),
        ("CONFIG_GRPC_XDS_SERVER_URL", format!("localhost:{}", control_port)),
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit".into()),
        ("GRPC_SERVER_USE_TLS", "true".into()),
        ("GRPC_SERVER_TLS_CERT", certs("tls.crt")),
        ("GRPC_SERVER_TLS_KEY", certs("tls.key")),
        ("GRPC_SERVER_TLS_CA_CERT", certs("ca.crt")),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true".into()),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", certs("tls.crt")),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", certs("tls.key")),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", certs("ca.crt")),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true".into()),
        ("REDIS_SOCKET_TYPE", "tcp".into()),
        ("REDIS_URL", format!("localhost:{redis_port}")),
    ]
}

// ---- the test ------------------------------------------------------------------------------

#[tokio::test]
async fn under_envoy_gateways_environment() {
    let pki = pki();
    let redis = Server::start();
    let redis_port = redis.url().trim_end_matches('/').rsplit(':').next().unwrap().to_owned();
    let data = tempfile::tempdir().unwrap();
    let statsd = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let statsd_port = statsd.local_addr().unwrap().port();
    let mut sockets = vec![statsd];
    // `localhost` may resolve to ::1 first elsewhere: listen there too where it can.
    if let Ok(v6) = UdpSocket::bind(("::1", statsd_port)).await {
        sockets.push(v6);
    }
    let control_addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();

    let eg_env = environment(&pki, data.path(), statsd_port, control_addr.port(), &redis_port);
    let env: Vec<(&str, &str)> = eg_env.iter().map(|(k, v)| (*k, v.as_str())).collect();

    // Started before the control plane is up: listening, deciding nothing yet.
    let mut bin = Binary::spawn(&env);
    assert!(bin.logged("deciding on Redis at redis://localhost:"), "{:?}", bin.lines());
    let envoy = channel(bin.grpc, &pki, Some(&pki.envoy)).await.expect("an mTLS connection");
    let mut rls = RateLimitServiceClient::new(envoy.clone());
    let e = rls.should_rate_limit(request("eg", &[&[("user", "a")]], 1)).await.unwrap_err();
    assert_eq!(e.message(), "no rate limit configuration loaded");

    // The configuration over mutual TLS, ACKed.
    let mut control = control_plane(control_addr, &pki).await;
    let mut stream = control.stream_within(RECONNECT).await;
    assert!(stream.peer_certs > 0, "the service presents its client certificate");
    let first = stream.request().await;
    assert_eq!(first.node.as_ref().unwrap().id, "envoy-ratelimit");
    assert_eq!(first.type_url, RATE_LIMIT_CONFIG_TYPE_URL);
    assert_eq!((first.version_info.as_str(), first.response_nonce.as_str()), ("", ""));
    stream.send(discovery("v1", "n1", vec![config(5, hour())]));
    let ack = stream.request().await;
    assert_eq!((ack.version_info.as_str(), ack.response_nonce.as_str()), ("v1", "n1"));
    assert!(ack.error_detail.is_none(), "an ACK");

    let mut tally = Tally::default();
    for n in 0..8u32 {
        let r = decide(&mut rls, "alice", &mut tally).await;
        let want = if n < 5 { (Code::Ok as i32, 5, 4 - n) } else { (Code::OverLimit as i32, 5, 0) };
        assert_eq!(remaining(&r), want, "request {n}");
    }
    assert!(
        redis.cli(&["DBSIZE"]).is_some_and(|n| n.trim().parse::<u64>().unwrap() > 0),
        "the counts are on the Redis server"
    );

    // Only over mutual TLS: no certificate, another CA's, plaintext: refused.
    assert!(answered(Some(envoy.clone())).await);
    assert!(!answered(channel(bin.grpc, &pki, None).await).await, "no client certificate");
    assert!(!answered(channel(bin.grpc, &pki, Some(&pki.stranger)).await).await, "another CA");
    let plain = Endpoint::from_shared(format!("http://{}", bin.grpc)).unwrap().connect().await;
    assert!(!answered(plain.ok()).await, "plaintext");

    // gRPC health for `ratelimit`, as Envoy's grpc_health_check asks.
    let mut health = HealthClient::new(envoy.clone());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let status = health.check(HealthCheckRequest { service: "ratelimit".into() }).await;
        if status.unwrap().into_inner().status == ServingStatus::Serving as i32 {
            break;
        }
        assert!(Instant::now() < deadline, "health for ratelimit is SERVING once configured");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // A bad version: NACKed with the last good one; v1 keeps deciding.
    stream.send(discovery("v2", "n2", vec![config(10, 42)]));
    let nack = stream.request().await;
    assert_eq!((nack.version_info.as_str(), nack.response_nonce.as_str()), ("v1", "n2"));
    let detail = nack.error_detail.as_ref().expect("a NACK");
    assert!(detail.message.contains("invalid rate limit unit '42'"), "{}", detail.message);
    assert_eq!(remaining(&decide(&mut rls, "bob", &mut tally).await), (Code::Ok as i32, 5, 4));

    // The control plane goes away: decisions go on under v1.
    control.shutdown(vec![stream]).await;
    assert_eq!(remaining(&decide(&mut rls, "bob", &mut tally).await), (Code::Ok as i32, 5, 3));
    assert_eq!(remaining(&decide(&mut rls, "alice", &mut tally).await).0, Code::OverLimit as i32);

    // It comes back: the service resumes at v1, and takes v3.
    let mut control = control_plane(control_addr, &pki).await;
    let mut stream = control.stream_within(RECONNECT).await;
    let resumed = stream.request().await;
    assert_eq!(resumed.version_info, "v1", "the first request names the last good version");
    stream.send(discovery("v3", "n3", vec![config(7, hour())]));
    let ack = stream.request().await;
    assert_eq!((ack.version_info.as_str(), ack.response_nonce.as_str()), ("v3", "n3"));
    let deadline = Instant::now() + Duration::from_secs(20);
    let r = loop {
        let r = decide(&mut rls, "carol", &mut tally).await;
        if remaining(&r).1 == 7 || Instant::now() > deadline {
            break r;
        }
    };
    assert_eq!(remaining(&r).1, 7, "v3 decides");

    // SIGTERM: exits 0, the last statsd flush sent on the way out.
    let status = bin.terminate();
    assert_eq!(status.code(), Some(0), "{:?}", bin.lines());
    control.shutdown(vec![stream]).await;
    let sent = statsd_counters(&sockets, Duration::from_millis(500)).await;
    let rule = |stat: &str| sent.get(&format!("ratelimit.service.rate_limit.eg.user.{stat}"));
    assert_eq!(rule("total_hits"), Some(&(tally.ok + tally.over)), "{sent:?}");
    assert_eq!(rule("within_limit"), Some(&tally.ok), "{sent:?}");
    assert_eq!(rule("over_limit"), Some(&tally.over), "{sent:?}");
    // Two more calls: the one before any configuration, and the mTLS probe (another domain).
    let calls = sent.get("ratelimit_server.ShouldRateLimit.total_requests");
    assert_eq!(calls, Some(&(tally.calls + 2)), "{sent:?}");
    assert_eq!(sent.get("ratelimit.service.config_load_success"), Some(&2), "{sent:?}");
    assert_eq!(sent.get("ratelimit.service.config_load_error"), Some(&1), "{sent:?}");
    drop(redis);
}

/// Health before the control plane sends anything, under Envoy Gateway's environment
/// (`FORCE_START_WITHOUT_INITIAL_CONFIG=true`, no `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`):
/// the Go service is healthy from its start, which the Deployment's readiness probe
/// (`failureThreshold: 1`) and startup probe (30 × 10 s) on `/healthcheck` need. With
/// `needs_domain` (`HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=true`), unhealthy until a
/// configuration with a domain arrives.
async fn before_the_first_configuration(needs_domain: bool) {
    let pki = pki();
    let redis = Server::start();
    let redis_port = redis.url().trim_end_matches('/').rsplit(':').next().unwrap().to_owned();
    let data = tempfile::tempdir().unwrap();
    let statsd = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let statsd_port = statsd.local_addr().unwrap().port();
    let control_addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let mut eg_env = environment(&pki, data.path(), statsd_port, control_addr.port(), &redis_port);
    if needs_domain {
        eg_env.push(("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true".into()));
    }
    let env: Vec<(&str, &str)> = eg_env.iter().map(|(k, v)| (*k, v.as_str())).collect();

    // A control plane that takes the stream and sends nothing.
    let mut control = control_plane(control_addr, &pki).await;
    let mut bin = Binary::spawn(&env);
    let mut stream = control.stream_within(RECONNECT).await;
    assert_eq!(stream.request().await.version_info, "");
    let envoy = channel(bin.grpc, &pki, Some(&pki.envoy)).await.expect("an mTLS connection");
    let mut health = HealthClient::new(envoy);
    let want = if needs_domain {
        (500, ServingStatus::NotServing as i32)
    } else {
        (200, ServingStatus::Serving as i32)
    };
    // From the first probe after the ports open, and for 20 s with nothing sent.
    let quiet = Instant::now();
    loop {
        let (code, _) = common::http(bin.http, "GET", "/healthcheck", b"").await;
        let status = health.check(HealthCheckRequest { service: "ratelimit".into() }).await;
        let seen = (code, status.unwrap().into_inner().status);
        assert_eq!(seen, want, "after {:?} without a configuration", quiet.elapsed());
        if quiet.elapsed() >= Duration::from_secs(20) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if needs_domain {
        stream.send(discovery("v1", "n1", vec![config(5, hour())]));
        assert!(stream.request().await.error_detail.is_none(), "an ACK");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (code, _) = common::http(bin.http, "GET", "/healthcheck", b"").await;
            let status = health.check(HealthCheckRequest { service: "ratelimit".into() }).await;
            if (code, status.unwrap().into_inner().status) == (200, ServingStatus::Serving as i32) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "healthy once a configuration with a domain is in force"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    assert_eq!(bin.terminate().code(), Some(0));
    control.shutdown(vec![stream]).await;
    drop(redis);
}

#[tokio::test]
async fn healthy_before_the_first_configuration() {
    before_the_first_configuration(false).await;
}

#[tokio::test]
async fn with_healthy_with_config_unhealthy_until_a_domain() {
    before_the_first_configuration(true).await;
}
