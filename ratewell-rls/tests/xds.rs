//! The xDS configuration client against an ADS server run in the test (the generated server
//! trait, on 127.0.0.1): the first request, ACKs and NACKs, the configuration in force across
//! refusals, reconnects, metadata, and mutual TLS. Every wait is bounded.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ratewell_rls::config::RateLimitConfig as Loaded;
use ratewell_rls::proto::{Entry, RateLimitDescriptor as Request};
use ratewell_rls::xds::{self, XdsApply, XdsClient, XdsLog, XdsSettings, XdsTls};
use ratewell_rls::xds_proto::{
    DiscoveryRequest, RATE_LIMIT_CONFIG_TYPE_URL, RateLimitConfig, RateLimitDescriptor,
    RateLimitPolicy, RateLimitUnit,
};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::transport::{Certificate, Identity, ServerTlsConfig};

#[path = "common/ads.rs"]
mod ads;

use ads::{AdsServer, WAIT, any, response};

/// What the test's loader saw and holds: every `apply` call's file names, and the configuration
/// in force (loaded as the service loads it; a refusal keeps the previous one).
#[derive(Default)]
struct Loader {
    calls: Mutex<Vec<Vec<String>>>,
    current: Mutex<Option<Loaded>>,
}

impl Loader {
    fn apply(self: &Arc<Self>) -> XdsApply {
        let this = self.clone();
        Arc::new(move |files| {
            this.calls.lock().unwrap().push(files.iter().map(|f| f.name().to_owned()).collect());
            let config = Loaded::new(&files, false).map_err(|e| e.to_string())?;
            *this.current.lock().unwrap() = Some(config);
            Ok(())
        })
    }

    fn calls(&self) -> Vec<Vec<String>> {
        self.calls.lock().unwrap().clone()
    }

    fn has_domain(&self, domain: &str) -> bool {
        self.current.lock().unwrap().as_ref().is_some_and(|c| c.has_domain(domain))
    }

    fn limit(&self, domain: &str, key: &str) -> Option<u32> {
        let request = Request {
            entries: vec![Entry { key: key.into(), value: "x".into() }],
            ..Default::default()
        };
        let current = self.current.lock().unwrap();
        current.as_ref()?.get_limit(domain, &request).map(|l| l.requests_per_unit)
    }
}

fn log() -> (XdsLog, Arc<Mutex<Vec<String>>>) {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = lines.clone();
    let log: XdsLog = Arc::new(move |level, line| {
        eprintln!("{level:?}: {line}");
        sink.lock().unwrap().push(line);
    });
    (log, lines)
}

fn settings(addr: SocketAddr) -> XdsSettings {
    let mut s = XdsSettings::new(addr.to_string(), "ratewell-test");
    s.connect_retry_interval = Duration::from_millis(50);
    s.backoff.initial = Duration::from_millis(50);
    s.backoff.max = Duration::from_millis(100);
    s
}

fn start(settings: XdsSettings, loader: &Arc<Loader>) -> (XdsClient, watch::Sender<bool>) {
    let (stop, stopped) = watch::channel(false);
    let client = xds::spawn(settings, loader.apply(), log().0, stopped);
    (client, stop)
}

async fn stop(client: XdsClient, stop: watch::Sender<bool>) {
    stop.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(2), client.task)
        .await
        .expect("the client stops promptly")
        .unwrap();
}

/// Wait (bounded) until `condition` holds.
async fn until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !condition() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn limit(key: &str, requests_per_unit: u32, unit: i32) -> RateLimitDescriptor {
    RateLimitDescriptor {
        key: key.into(),
        rate_limit: Some(RateLimitPolicy { unit, requests_per_unit, ..Default::default() }),
        ..Default::default()
    }
}

fn resource(name: &str, domain: &str, descriptors: Vec<RateLimitDescriptor>) -> prost_types::Any {
    any(&RateLimitConfig { name: name.into(), domain: domain.into(), descriptors })
}

fn minute() -> i32 {
    RateLimitUnit::Minute as i32
}

/// An ACK: this version and nonce, no error.
fn assert_ack(request: &DiscoveryRequest, version: &str, nonce: &str) {
    assert_eq!(request.version_info, version);
    assert_eq!(request.response_nonce, nonce);
    assert_eq!(request.type_url, RATE_LIMIT_CONFIG_TYPE_URL);
    assert_eq!(request.error_detail, None, "an ACK");
}

/// A NACK: the last good version, this nonce, an error that says `why`.
fn assert_nack(request: &DiscoveryRequest, good: &str, nonce: &str, why: &str) {
    assert_eq!(request.version_info, good);
    assert_eq!(request.response_nonce, nonce);
    assert_eq!(request.type_url, RATE_LIMIT_CONFIG_TYPE_URL);
    let detail = request.error_detail.as_ref().expect("a NACK has error_detail");
    assert_eq!(detail.code, xds::NACK_CODE);
    assert!(detail.message.contains(why), "{:?} should say {why:?}", detail.message);
}

#[tokio::test]
async fn first_request_ack_nack_and_metadata() {
    let mut server = AdsServer::bind(None).await;
    let loader = Arc::new(Loader::default());
    let mut s = settings(server.addr);
    s.node_metadata.insert("cluster".into(), "eu-1".into());
    s.headers.insert("x-tenant".into(), "t1".into());
    s.headers.insert("authorization".into(), "Bearer abc".into());
    let (client, stopper) = start(s, &loader);

    let mut stream = server.stream().await;
    assert_eq!(stream.metadata.get("x-tenant").unwrap(), "t1");
    assert_eq!(stream.metadata.get("authorization").unwrap(), "Bearer abc");
    let first = stream.request().await;
    let node = first.node.as_ref().expect("the node");
    assert_eq!(node.id, "ratewell-test");
    let cluster = &node.metadata.as_ref().unwrap().fields["cluster"];
    assert_eq!(cluster.kind, Some(prost_types::value::Kind::StringValue("eu-1".into())));
    assert_ack(&first, "", "");
    assert!(first.resource_names.is_empty());

    // A good version: applied whole (both resources, in order), ACKed.
    stream.send(response(
        "v1",
        "n1",
        vec![
            resource("a-config", "a", vec![limit("k", 10, minute())]),
            resource("b-config", "b", vec![limit("k", 20, minute())]),
        ],
    ));
    assert_ack(&stream.request().await, "v1", "n1");
    assert_eq!(loader.calls(), [vec!["a-config", "b-config"]]);
    assert_eq!((loader.limit("a", "k"), loader.limit("b", "k")), (Some(10), Some(20)));
    assert_eq!(client.stats.version(), "v1");

    // Refused by the loader (a domain twice): NACKed with the last good version; v1 stays.
    stream.send(response(
        "v2",
        "n2",
        vec![resource("a-config", "a", vec![]), resource("a-again", "a", vec![])],
    ));
    assert_nack(
        &stream.request().await,
        "v1",
        "n2",
        "a-again: duplicate domain 'a' in config file",
    );
    // Refused by the loader (a unit the enum does not declare).
    stream.send(response("v3", "n3", vec![resource("c-config", "c", vec![limit("k", 1, 42)])]));
    assert_nack(&stream.request().await, "v1", "n3", "c-config: invalid rate limit unit '42'");
    assert_eq!(loader.calls().len(), 3, "the loader saw v2 and v3, and refused them");

    // Refused before the loader (a resource of another type, bytes that do not decode):
    // apply never sees the version.
    let mut wrong = resource("d-config", "d", vec![]);
    wrong.type_url = "type.googleapis.com/envoy.config.cluster.v3.Cluster".into();
    stream.send(response("v4", "n4", vec![resource("d-config", "d", vec![]), wrong]));
    assert_nack(&stream.request().await, "v1", "n4", "resource 1: mismatched message type");
    let garbage = prost_types::Any {
        type_url: RATE_LIMIT_CONFIG_TYPE_URL.into(),
        value: vec![0x1a, 0x7f, 0x0a],
    };
    stream.send(response("v5", "n5", vec![garbage]));
    assert_nack(&stream.request().await, "v1", "n5", "resource 0: failed to decode");
    assert_eq!(loader.calls().len(), 3, "apply never saw v4 or v5");
    assert!(loader.has_domain("a") && loader.has_domain("b") && !loader.has_domain("d"));
    assert_eq!(loader.limit("a", "k"), Some(10), "v1 is in force");
    assert_eq!(client.stats.version(), "v1");

    // A good version again: ACKed; an empty state of the world is a configuration too.
    stream.send(response(
        "v6",
        "n6",
        vec![resource("e-config", "e", vec![limit("k", 6, minute())])],
    ));
    assert_ack(&stream.request().await, "v6", "n6");
    assert!(loader.has_domain("e") && !loader.has_domain("a"));
    stream.send(response("v7", "n7", vec![]));
    assert_ack(&stream.request().await, "v7", "n7");
    assert!(!loader.has_domain("e"));
    assert_eq!(loader.calls().last().unwrap(), &Vec::<String>::new());

    assert_eq!((client.stats.acks(), client.stats.nacks()), (3, 4));
    assert_eq!((client.stats.connects(), client.stats.stream_ends()), (1, 0));
    stop(client, stopper).await;
    server.shutdown(vec![stream]).await;
}

#[tokio::test]
async fn reconnects_with_the_last_acked_version() {
    let mut server = AdsServer::bind(None).await;
    let addr = server.addr;
    let loader = Arc::new(Loader::default());
    let (client, stopper) = start(settings(addr), &loader);

    let mut stream = server.stream().await;
    assert_ack(&stream.request().await, "", "");
    stream.send(response("v1", "n1", vec![resource("a", "a", vec![limit("k", 1, minute())])]));
    assert_ack(&stream.request().await, "v1", "n1");
    stream.send(response("v2", "n2", vec![resource("a", "", vec![])]));
    assert_nack(&stream.request().await, "v1", "n2", "config file cannot have empty domain");

    // The stream fails: the client opens another and asks for the version it last accepted
    // (not the refused one), with no nonce on the new stream.
    stream.responses.send(Err(tonic::Status::unavailable("control plane restarting"))).unwrap();
    let mut again = server.stream().await;
    assert_ack(&again.request().await, "v1", "");
    assert_eq!(client.stats.stream_ends(), 1);

    // The server goes away: the stream ends, connects are refused and retried; the
    // configuration in force keeps serving.
    server.shutdown(vec![stream, again]).await;
    until("refused connects", || client.stats.connect_failures() >= 2).await;
    assert_eq!(loader.limit("a", "k"), Some(1));
    assert_eq!(loader.calls().len(), 2);

    // It comes back on the same port: the client connects again, still at v1.
    let mut back = AdsServer::start(TcpListener::bind(addr).await.unwrap(), None).await;
    let mut stream = back.stream().await;
    let first = stream.request().await;
    assert_ack(&first, "v1", "");
    assert_eq!(first.node.unwrap().id, "ratewell-test");
    stream.send(response("v3", "n3", vec![resource("b", "b", vec![])]));
    assert_ack(&stream.request().await, "v3", "n3");
    assert!(loader.has_domain("b") && !loader.has_domain("a"));
    assert_eq!(client.stats.connects(), 3);
    stop(client, stopper).await;
    back.shutdown(vec![stream]).await;
}

#[tokio::test]
async fn stops_promptly_whatever_it_waits_for() {
    // Waiting between refused connects.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
    let loader = Arc::new(Loader::default());
    let mut s = settings(closed);
    s.connect_retry_interval = Duration::from_secs(3600);
    let (client, stopper) = start(s, &loader);
    until("a refused connect", || client.stats.connect_failures() == 1).await;
    stop(client, stopper).await;

    // Waiting for a response on an open stream.
    let mut server = AdsServer::bind(None).await;
    let (client, stopper) = start(settings(server.addr), &loader);
    let mut stream = server.stream().await;
    stream.request().await;
    stop(client, stopper).await;
    server.shutdown(vec![stream]).await;

    // Waiting for a stream that never opens (a listener that never answers).
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (client, stopper) = start(settings(silent.local_addr().unwrap()), &loader);
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop(client, stopper).await;
    assert!(loader.calls().is_empty());
}

/// A CA, and certificates it signs: the server's for `xds.test`, the client's.
struct Pki {
    dir: tempfile::TempDir,
    ca: String,
    server: Identity,
}

fn ca() -> (rcgen::Issuer<'static, rcgen::KeyPair>, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.distinguished_name.push(rcgen::DnType::CommonName, "ratewell test CA");
    let cert = params.self_signed(&key).unwrap();
    (rcgen::Issuer::new(params, key), cert.pem())
}

fn leaf(issuer: &rcgen::Issuer<'static, rcgen::KeyPair>, name: &str) -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let params = rcgen::CertificateParams::new(vec![name.to_owned()]).unwrap();
    let cert = params.signed_by(&key, issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

fn write(dir: &Path, name: &str, content: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, content).unwrap();
    path
}

fn pki() -> Pki {
    let (issuer, ca) = ca();
    let (server_cert, server_key) = leaf(&issuer, "xds.test");
    let (client_cert, client_key) = leaf(&issuer, "envoy-ratelimit");
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "ca.crt", &ca);
    write(dir.path(), "tls.crt", &client_cert);
    write(dir.path(), "tls.key", &client_key);
    let (_, other_ca) = self::ca();
    write(dir.path(), "other-ca.crt", &other_ca);
    Pki { ca, server: Identity::from_pem(server_cert, server_key), dir }
}

impl Pki {
    /// The server's TLS: its certificate, and a client certificate from the CA required.
    fn server_tls(&self) -> ServerTlsConfig {
        ServerTlsConfig::new()
            .identity(self.server.clone())
            .client_ca_root(Certificate::from_pem(&self.ca))
    }

    fn client_tls(&self, ca: &str, identity: bool, san: Option<&str>) -> XdsTls {
        let mut tls = XdsTls::new(self.dir.path().join(ca));
        if identity {
            tls.client_cert = Some(self.dir.path().join("tls.crt"));
            tls.client_key = Some(self.dir.path().join("tls.key"));
        }
        tls.server_name = san.map(str::to_owned);
        tls
    }
}

#[tokio::test]
async fn mutual_tls() {
    let pki = pki();
    let mut server = AdsServer::bind(Some(pki.server_tls())).await;
    let loader = Arc::new(Loader::default());

    // The certificate names xds.test, not 127.0.0.1: the SAN override is what matches.
    let mut s = settings(server.addr);
    s.tls = Some(pki.client_tls("ca.crt", true, Some("xds.test")));
    let (client, stopper) = start(s, &loader);
    let mut stream = server.stream().await;
    assert_eq!(stream.peer_certs, 1, "the server saw the client's certificate");
    assert_ack(&stream.request().await, "", "");
    stream.send(response("v1", "n1", vec![resource("a", "a", vec![limit("k", 3, minute())])]));
    assert_ack(&stream.request().await, "v1", "n1");
    assert_eq!(loader.limit("a", "k"), Some(3));
    stop(client, stopper).await;
    drop(stream);

    // Each of these fails the handshake, and keeps retrying; no stream opens.
    let refused = [
        (
            "no SAN override: 127.0.0.1 is not in the certificate",
            pki.client_tls("ca.crt", true, None),
        ),
        ("another CA", pki.client_tls("other-ca.crt", true, Some("xds.test"))),
        ("the wrong SAN", pki.client_tls("ca.crt", true, Some("other.test"))),
        ("no client certificate", pki.client_tls("ca.crt", false, Some("xds.test"))),
        ("a CA file that is not there", pki.client_tls("missing.crt", true, Some("xds.test"))),
    ];
    for (why, tls) in refused {
        let mut s = settings(server.addr);
        s.tls = Some(tls);
        let (log, lines) = log();
        let (stop_tx, stopped) = watch::channel(false);
        let client = xds::spawn(s, loader.apply(), log, stopped);
        until(why, || client.stats.connect_failures() >= 3).await;
        // No client certificate: the handshake completes on the client's side (TLS 1.3) and
        // the server refuses it after, so the stream cannot open either way.
        assert!(server.no_stream_for(Duration::from_millis(100)).await, "{why}: no stream");
        assert_eq!(client.stats.connects(), 0, "{why}");
        assert!(lines.lock().unwrap().iter().any(|l| l.contains("cannot connect")), "{why}");
        stop(client, stop_tx).await;
    }
    assert_eq!(loader.calls().len(), 1);
    server.shutdown(vec![]).await;
}

#[tokio::test]
async fn certificates_are_read_at_each_connect() {
    let pki = pki();
    let mut server = AdsServer::bind(Some(pki.server_tls())).await;
    let loader = Arc::new(Loader::default());
    // The client starts with the wrong CA in its CA file: refused.
    let ca_path = pki.dir.path().join("rotating-ca.crt");
    std::fs::copy(pki.dir.path().join("other-ca.crt"), &ca_path).unwrap();
    let mut s = settings(server.addr);
    let mut tls = pki.client_tls("rotating-ca.crt", true, Some("xds.test"));
    tls.ca_cert = Some(ca_path.clone());
    s.tls = Some(tls);
    let (client, stopper) = start(s, &loader);
    until("a refused handshake", || client.stats.connect_failures() >= 1).await;
    // The file is replaced with the right CA: the next connect reads it and succeeds.
    std::fs::write(&ca_path, &pki.ca).unwrap();
    let mut stream = server.stream().await;
    assert_ack(&stream.request().await, "", "");
    until("the stream counted", || client.stats.connects() == 1).await;
    stop(client, stopper).await;
    server.shutdown(vec![stream]).await;
}

#[tokio::test]
async fn a_host_name_resolves() {
    let mut server = AdsServer::bind(None).await;
    let loader = Arc::new(Loader::default());
    let mut s = settings(server.addr);
    s.server_url = format!("localhost:{}", server.addr.port());
    let (client, stopper) = start(s, &loader);
    let mut stream = server.stream().await;
    assert_ack(&stream.request().await, "", "");
    stop(client, stopper).await;
    server.shutdown(vec![stream]).await;
}
