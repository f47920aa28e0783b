//! TLS and mutual TLS on a real tonic server fed by `ratewell_rls::tls::incoming`: certificates
//! made by rcgen, clients by tonic and tokio-rustls, every wait bounded.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ratewell_rls::tls::{ReloadingTls, ServerTls, incoming};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

/// The bound on every wait: only a hang reaches it on a busy machine (a wait ends as soon as
/// what it waits for has happened).
const WAIT: Duration = Duration::from_secs(20);

async fn bounded<T>(what: &str, f: impl Future<Output = T>) -> T {
    match tokio::time::timeout(WAIT, f).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: not done within {WAIT:?}"),
    }
}

/// Wait until `check` holds, polling; false if it never did within the bound.
async fn eventually<F: Future<Output = bool>>(mut check: impl FnMut() -> F) -> bool {
    let deadline = tokio::time::Instant::now() + WAIT;
    while tokio::time::Instant::now() < deadline {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

fn ca(name: &str) -> Ca {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.distinguished_name.push(DnType::CommonName, name);
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    Ca { pem: cert.pem(), issuer: Issuer::new(params, key) }
}

/// A leaf certificate (PEM, its DER) and key (PKCS#8 PEM).
struct Leaf {
    pem: String,
    der: Vec<u8>,
    key: String,
}

fn leaf(ca: &Ca, names: &[&str], usage: ExtendedKeyUsagePurpose) -> Leaf {
    let mut params =
        CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>()).unwrap();
    params.extended_key_usages = vec![usage];
    params.distinguished_name.push(DnType::CommonName, names.first().copied().unwrap_or("leaf"));
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    Leaf { pem: cert.pem(), der: cert.der().to_vec(), key: key.serialize_pem() }
}

fn server_leaf(ca: &Ca) -> Leaf {
    leaf(ca, &["localhost", "127.0.0.1"], ExtendedKeyUsagePurpose::ServerAuth)
}

fn client_leaf(ca: &Ca, san: &str) -> Leaf {
    leaf(ca, &[san], ExtendedKeyUsagePurpose::ClientAuth)
}

/// A tonic server (gRPC health) on 127.0.0.1:0, stopped when dropped.
struct Server {
    addr: SocketAddr,
    tls: ReloadingTls,
    _stop: oneshot::Sender<()>,
}

async fn serve(settings: ServerTls) -> Server {
    let tls = settings.load().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = incoming(listener, tls.clone(), |_, _| {});
    let (_reporter, health) = tonic_health::server::health_reporter();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(async move {
        let until = async {
            let _ = stopped.await;
        };
        let _ = tonic::transport::Server::builder()
            .add_service(health)
            .serve_with_incoming_shutdown(connections, until)
            .await;
    });
    Server { addr, tls, _stop: stop }
}

fn write(dir: &Path, name: &str, content: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, content).unwrap();
    path
}

/// A tonic client trusting `ca`, presenting `identity` if any.
async fn connect(
    addr: SocketAddr,
    ca: &str,
    identity: Option<&Leaf>,
) -> Result<HealthClient<Channel>, String> {
    let mut tls =
        ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)).domain_name("localhost");
    if let Some(id) = identity {
        tls = tls.identity(Identity::from_pem(&id.pem, &id.key));
    }
    let endpoint = Endpoint::from_shared(format!("https://{addr}"))
        .map_err(|e| e.to_string())?
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect_timeout(WAIT)
        .timeout(WAIT);
    let channel = bounded("connect", endpoint.connect()).await.map_err(|e| format!("{e:?}"))?;
    Ok(HealthClient::new(channel))
}

async fn check(client: &mut HealthClient<Channel>) -> Result<i32, String> {
    let request = HealthCheckRequest { service: String::new() };
    bounded("check", client.check(request))
        .await
        .map(|r| r.into_inner().status)
        .map_err(|e| format!("{e:?}"))
}

/// Connect and ask once: the health status, or why not.
async fn ask(addr: SocketAddr, ca: &str, identity: Option<&Leaf>) -> Result<i32, String> {
    let mut client = connect(addr, ca, identity).await?;
    check(&mut client).await
}

const SERVING: i32 = tonic_health::pb::health_check_response::ServingStatus::Serving as i32;

/// The leaf certificate a new TLS connection is served (its DER), by a tokio-rustls client
/// trusting `cas`.
async fn served(addr: SocketAddr, cas: &[&str]) -> Result<Vec<u8>, String> {
    let mut roots = RootCertStore::empty();
    for ca in cas {
        roots.add(CertificateDer::from_pem_slice(ca.as_bytes()).unwrap()).unwrap();
    }
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = bounded("tcp", TcpStream::connect(addr)).await.map_err(|e| e.to_string())?;
    let name = ServerName::try_from("localhost").unwrap();
    let stream =
        bounded("handshake", connector.connect(name, tcp)).await.map_err(|e| e.to_string())?;
    let (_, session) = stream.get_ref();
    assert_eq!(session.alpn_protocol(), Some(&b"h2"[..]), "ALPN h2 negotiated");
    let certs = session.peer_certificates().ok_or("no certificate served")?;
    Ok(certs[0].to_vec())
}

fn fast(settings: ServerTls) -> ServerTls {
    ServerTls { reload_interval: Duration::from_millis(100), ..settings }
}

#[tokio::test]
async fn tls_serves_and_plaintext_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ca("ca");
    let server_cert = server_leaf(&ca);
    let cert = write(dir.path(), "tls.crt", &server_cert.pem);
    let key = write(dir.path(), "tls.key", &server_cert.key);
    let server = serve(ServerTls::new(cert, key)).await;

    assert_eq!(ask(server.addr, &ca.pem, None).await, Ok(SERVING));
    assert_eq!(served(server.addr, &[&ca.pem]).await, Ok(server_cert.der.clone()));

    // A client without the CA does not trust the server.
    let other = self::ca("other");
    assert!(ask(server.addr, &other.pem, None).await.is_err());

    // Plaintext HTTP/2: the server's handshake fails, the client gets no answer.
    let before = server.tls.handshake_failures();
    let plain = Endpoint::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect_timeout(WAIT)
        .timeout(WAIT);
    let answer = match bounded("plaintext connect", plain.connect()).await {
        Ok(channel) => check(&mut HealthClient::new(channel)).await,
        Err(e) => Err(e.to_string()),
    };
    assert!(answer.is_err(), "plaintext answered: {answer:?}");
    assert!(eventually(|| async { server.tls.handshake_failures() > before }).await);

    // And the server still serves TLS afterwards.
    assert_eq!(ask(server.addr, &ca.pem, None).await, Ok(SERVING));
}

#[tokio::test]
async fn mutual_tls_requires_a_client_certificate_from_the_ca_with_the_san() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ca("ca");
    let server_cert = server_leaf(&ca);
    let cert = write(dir.path(), "tls.crt", &server_cert.pem);
    let key = write(dir.path(), "tls.key", &server_cert.key);
    let client_ca = write(dir.path(), "ca.crt", &ca.pem);
    let good = client_leaf(&ca, "envoy.client");
    let wrong_san = client_leaf(&ca, "someone.else");
    let other_ca = self::ca("other");
    let foreign = client_leaf(&other_ca, "envoy.client");

    let settings = ServerTls {
        client_ca: Some(client_ca),
        client_san: Some("envoy.client".to_owned()),
        ..ServerTls::new(cert, key)
    };
    let server = serve(settings.clone()).await;

    let refused =
        [("no certificate", None), ("another CA", Some(&foreign)), ("no SAN", Some(&wrong_san))];
    for (what, identity) in refused {
        let before = server.tls.handshake_failures();
        let answer = ask(server.addr, &ca.pem, identity).await;
        assert!(answer.is_err(), "{what}: answered {answer:?}");
        assert!(
            eventually(|| async { server.tls.handshake_failures() > before }).await,
            "{what}: the server's handshake did not fail"
        );
    }
    assert_eq!(ask(server.addr, &ca.pem, Some(&good)).await, Ok(SERVING));

    // Without the SAN requirement, any certificate from the CA is served, and only those.
    let server = serve(ServerTls { client_san: None, ..settings }).await;
    assert_eq!(ask(server.addr, &ca.pem, Some(&wrong_san)).await, Ok(SERVING));
    assert!(ask(server.addr, &ca.pem, Some(&foreign)).await.is_err());
    assert!(ask(server.addr, &ca.pem, None).await.is_err());
}

#[tokio::test]
async fn mutual_tls_san_may_be_an_ip_address() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ca("ca");
    let server_cert = server_leaf(&ca);
    let settings = ServerTls {
        client_ca: Some(write(dir.path(), "ca.crt", &ca.pem)),
        client_san: Some("10.0.0.7".to_owned()),
        ..ServerTls::new(
            write(dir.path(), "tls.crt", &server_cert.pem),
            write(dir.path(), "tls.key", &server_cert.key),
        )
    };
    let server = serve(settings).await;
    let by_ip = client_leaf(&ca, "10.0.0.7");
    let by_other_ip = client_leaf(&ca, "10.0.0.8");
    assert_eq!(ask(server.addr, &ca.pem, Some(&by_ip)).await, Ok(SERVING));
    assert!(ask(server.addr, &ca.pem, Some(&by_other_ip)).await.is_err());
}

#[tokio::test]
async fn files_rewritten_in_place_are_served_to_new_connections() {
    let dir = tempfile::tempdir().unwrap();
    let (old_ca, new_ca) = (ca("old"), ca("new"));
    let (old, new) = (server_leaf(&old_ca), server_leaf(&new_ca));
    let cert = write(dir.path(), "tls.crt", &old.pem);
    let key = write(dir.path(), "tls.key", &old.key);
    let server = serve(fast(ServerTls::new(&cert, &key))).await;

    let mut existing = connect(server.addr, &old_ca.pem, None).await.unwrap();
    assert_eq!(check(&mut existing).await, Ok(SERVING));

    std::fs::write(&cert, &new.pem).unwrap();
    std::fs::write(&key, &new.key).unwrap();
    let both = [old_ca.pem.as_str(), new_ca.pem.as_str()];
    assert!(
        eventually(|| async { served(server.addr, &both).await == Ok(new.der.clone()) }).await,
        "the new certificate was not served"
    );
    assert!(server.tls.reloads() >= 1);

    // A new connection validates against the new CA only; the old CA no longer works.
    assert_eq!(ask(server.addr, &new_ca.pem, None).await, Ok(SERVING));
    assert!(ask(server.addr, &old_ca.pem, None).await.is_err());
    // The connection opened before keeps its session.
    assert_eq!(check(&mut existing).await, Ok(SERVING));
}

#[cfg(unix)]
#[tokio::test]
async fn a_kubernetes_data_symlink_swap_is_followed() {
    use std::os::unix::fs::symlink;

    let root = tempfile::tempdir().unwrap();
    let root = root.path();
    let (old_ca, new_ca) = (ca("old"), ca("new"));
    let (old, new) = (server_leaf(&old_ca), server_leaf(&new_ca));
    let client = client_leaf(&old_ca, "envoy.client");
    let new_client = client_leaf(&new_ca, "envoy.client");

    // As the kubelet lays out a secret: files in a timestamped directory, `..data` linking to
    // it, and each name a link through `..data`.
    let first = root.join("..2026_01_01_00_00_00.1");
    std::fs::create_dir(&first).unwrap();
    write(&first, "tls.crt", &old.pem);
    write(&first, "tls.key", &old.key);
    write(&first, "ca.crt", &old_ca.pem);
    symlink(&first, root.join("..data")).unwrap();
    for name in ["tls.crt", "tls.key", "ca.crt"] {
        symlink(Path::new("..data").join(name), root.join(name)).unwrap();
    }
    let settings = ServerTls {
        client_ca: Some(root.join("ca.crt")),
        ..ServerTls::new(root.join("tls.crt"), root.join("tls.key"))
    };
    let server = serve(fast(settings)).await;
    let mut existing = connect(server.addr, &old_ca.pem, Some(&client)).await.unwrap();
    assert_eq!(check(&mut existing).await, Ok(SERVING));

    // The swap: a new directory, a new link renamed over `..data` (atomic), the old removed.
    let second = root.join("..2026_01_02_00_00_00.2");
    std::fs::create_dir(&second).unwrap();
    write(&second, "tls.crt", &new.pem);
    write(&second, "tls.key", &new.key);
    write(&second, "ca.crt", &new_ca.pem);
    symlink(&second, root.join("..data_tmp")).unwrap();
    std::fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
    std::fs::remove_dir_all(&first).unwrap();

    assert!(
        eventually(|| async { ask(server.addr, &new_ca.pem, Some(&new_client)).await.is_ok() })
            .await,
        "the swapped certificate and CA were not served"
    );
    assert_eq!(served_with_client(server.addr, &new_ca.pem, &new_client).await, Ok(new.der));
    // The client CA was reloaded too: the old CA's client is refused on a new connection.
    assert!(ask(server.addr, &new_ca.pem, Some(&client)).await.is_err());
    assert_eq!(server.tls.reload_failures(), 0, "an atomic swap never shows a half state");
    // The connection opened before keeps working.
    assert_eq!(check(&mut existing).await, Ok(SERVING));
}

/// As [`served`], presenting a client certificate (TLS 1.3 and mutual TLS: the server checks it
/// after the client's handshake ends, so finish with a read).
async fn served_with_client(addr: SocketAddr, ca: &str, id: &Leaf) -> Result<Vec<u8>, String> {
    let mut roots = RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(ca.as_bytes()).unwrap()).unwrap();
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let chain = vec![CertificateDer::from_pem_slice(id.pem.as_bytes()).unwrap()];
    let key =
        tokio_rustls::rustls::pki_types::PrivateKeyDer::from_pem_slice(id.key.as_bytes()).unwrap();
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = bounded("tcp", TcpStream::connect(addr)).await.map_err(|e| e.to_string())?;
    let name = ServerName::try_from("localhost").unwrap();
    let stream =
        bounded("handshake", connector.connect(name, tcp)).await.map_err(|e| e.to_string())?;
    Ok(stream.get_ref().1.peer_certificates().ok_or("no certificate")?[0].to_vec())
}

#[tokio::test]
async fn a_bad_replacement_keeps_the_last_good_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ca("ca");
    let (old, new) = (server_leaf(&ca), server_leaf(&ca));
    let cert = write(dir.path(), "tls.crt", &old.pem);
    let key = write(dir.path(), "tls.key", &old.key);
    let server = serve(fast(ServerTls::new(&cert, &key))).await;

    // Not PEM at all.
    std::fs::write(&cert, "garbage").unwrap();
    assert!(eventually(|| async { server.tls.reload_failures() == 1 }).await);
    assert_eq!(served(server.addr, &[&ca.pem]).await, Ok(old.der.clone()));
    assert_eq!(ask(server.addr, &ca.pem, None).await, Ok(SERVING));
    // Reported once: more polls of the same bad file add nothing.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(server.tls.reload_failures(), 1);

    // A new certificate with the old key: refused, the old pair still served.
    std::fs::write(&cert, &new.pem).unwrap();
    assert!(eventually(|| async { server.tls.reload_failures() == 2 }).await);
    assert_eq!(served(server.addr, &[&ca.pem]).await, Ok(old.der.clone()));

    // Its key arrives: loaded.
    std::fs::write(&key, &new.key).unwrap();
    assert!(
        eventually(|| async { served(server.addr, &[&ca.pem]).await == Ok(new.der.clone()) }).await
    );
    assert_eq!(server.tls.reloads(), 1);

    // A file removed: refused, kept.
    std::fs::remove_file(&key).unwrap();
    assert!(eventually(|| async { server.tls.reload_failures() == 3 }).await);
    assert_eq!(served(server.addr, &[&ca.pem]).await, Ok(new.der.clone()));
}

#[tokio::test]
async fn a_client_that_never_handshakes_does_not_stop_others() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ca("ca");
    let server_cert = server_leaf(&ca);
    let settings = ServerTls {
        handshake_timeout: Duration::from_millis(1500),
        ..ServerTls::new(
            write(dir.path(), "tls.crt", &server_cert.pem),
            write(dir.path(), "tls.key", &server_cert.key),
        )
    };
    let server = serve(settings).await;

    // Several connections that open TCP and send nothing, and one that sends half a record.
    let mut stalled = Vec::new();
    for _ in 0..8 {
        stalled.push(bounded("tcp", TcpStream::connect(server.addr)).await.unwrap());
    }
    let mut partial = bounded("tcp", TcpStream::connect(server.addr)).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut partial, &[0x16, 0x03, 0x01, 0x01, 0x00])
        .await
        .unwrap();
    stalled.push(partial);

    // Others are served meanwhile, well before the stalled handshakes time out.
    let start = tokio::time::Instant::now();
    assert_eq!(ask(server.addr, &ca.pem, None).await, Ok(SERVING));
    assert_eq!(ask(server.addr, &ca.pem, None).await, Ok(SERVING));
    assert!(start.elapsed() < Duration::from_millis(1500), "served only after the timeout");

    // Then the stalled ones are closed by the handshake timeout, and counted.
    for mut tcp in stalled {
        let mut buf = [0u8; 64];
        let read = bounded("stalled close", tcp.read(&mut buf)).await;
        assert!(matches!(read, Ok(0) | Err(_)), "a stalled connection got {read:?}");
    }
    assert!(eventually(|| async { server.tls.handshake_failures() >= 9 }).await);
    assert_eq!(ask(server.addr, &ca.pem, None).await, Ok(SERVING));
}
