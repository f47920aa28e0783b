//! TLS and mutual TLS on the gRPC server, as envoyproxy/ratelimit serves them, with the
//! certificate files re-read when they change.
//!
//! # Settings (the Go service's variables)
//!
//! | variable | Go default | here |
//! |---|---|---|
//! | `GRPC_SERVER_USE_TLS` | `false` | TLS on the gRPC port |
//! | `GRPC_SERVER_TLS_CERT` | `""` | the server's certificate chain, PEM (required with TLS) |
//! | `GRPC_SERVER_TLS_KEY` | `""` | its private key, PEM: PKCS#8, PKCS#1 (RSA) or SEC1 (EC) |
//! | `GRPC_CLIENT_TLS_CACERT` | `""` | mutual TLS: clients must present a certificate chaining to these CAs |
//! | `GRPC_CLIENT_TLS_SAN` | `""` | with a client CA: the client certificate must carry this name |
//!
//! (envoyproxy/ratelimit `src/settings/settings.go`, `src/server/server_impl.go`,
//! `src/server/tls.go`.) The client SAN is checked as Go's `x509.Certificate.Verify` checks its
//! `DNSName`: a DNS name against the certificate's DNS names (wildcards allowed), an IP address
//! against its IP addresses; the common name is not consulted. As in Go, the SAN applies only
//! with a client CA: without one no client certificate is asked for.
//!
//! Envoy Gateway writes the client CA as `GRPC_SERVER_TLS_CA_CERT` (envoyproxy/gateway
//! `internal/infrastructure/kubernetes/ratelimit/resource.go`), a name the Go service does not
//! read: there the Go service serves TLS without asking for client certificates, though Envoy
//! Gateway gives Envoy a client certificate for it. This module reads that name too, as the
//! client CA when `GRPC_CLIENT_TLS_CACERT` is not set: under Envoy Gateway's environment the
//! server asks for a client certificate from that CA and refuses a client without one.
//!
//! # Differences from the Go service
//!
//! - `GRPC_SERVER_TLS_CA_CERT` (Envoy Gateway's name) is read as the client CA, which the Go
//!   service ignores: mutual TLS where Envoy Gateway means it.
//! - Go's client CA pool is the system's roots plus the file (`utils.TlsConfigFromFiles` starts
//!   from `x509.SystemCertPool()`), so there any public CA's client certificate passes. Here only
//!   the file's CAs are trusted.
//! - Go reloads the certificate and key, not the client CA; here the CA is reloaded too.
//! - Go requires the certificate and key in one directory (it watches that directory); here each
//!   file is watched by itself.
//!
//! # Reloading
//!
//! Kubernetes updates a mounted secret by writing a new timestamped directory and swapping the
//! `..data` symlink that `tls.crt` and the others point through; an operator may instead
//! rewrite the files in place. Every [`ServerTls::reload_interval`] (one second by default) a
//! background task of [`incoming`] reads the files through their paths (so links are
//! followed) and compares their *contents* with those of the configuration in force; only a
//! difference builds a new configuration. Comparing contents rather than modification times
//! catches every kind of replacement, including a rewrite of the same length within one
//! timestamp tick, and costs a few kilobytes read per second. A poll rather than a check per
//! accepted connection keeps file reads off the accept path and independent of the connection
//! rate: a flood of connections does not multiply them. A failed build (a half-written file, a
//! key that does not match the certificate yet) keeps the last good configuration, and is
//! reported once: again only when the error differs, or after the files were usable (or back
//! as loaded) in between. Every poll retries.
//!
//! A new configuration applies to connections accepted after it; connections already open keep
//! the session they negotiated.
//!
//! # Accepting
//!
//! [`incoming`] returns a stream of finished TLS connections for
//! `tonic::transport::Server::serve_with_incoming_shutdown` (tonic implements `Connected` for
//! tokio-rustls's server stream). Each accepted socket gets `TCP_NODELAY` and its handshake in
//! its own task, bounded by [`ServerTls::handshake_timeout`], so a client that never finishes
//! its handshake holds only its own task. A failed handshake is counted and logged at debug, and
//! never ends the stream. The configuration offers ALPN `h2` (gRPC is HTTP/2) and is built on
//! rustls's ring provider explicitly; no process-wide provider is installed.
//!
//! # Examples
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::collections::HashMap;
//! use ratewell_rls::tls::{ServerTls, incoming};
//!
//! let env: HashMap<String, String> = std::env::vars().collect();
//! if let Some(settings) = ServerTls::from_env(&env)? {
//!     let tls = settings.load()?;
//!     let listener = tokio::net::TcpListener::bind("0.0.0.0:8081").await?;
//!     let connections = incoming(listener, tls, |level, message| {
//!         eprintln!("{level:?}: {message}");
//!     });
//!     // tonic::transport::Server::builder()...serve_with_incoming_shutdown(connections, until)
//! #   drop(connections);
//! }
//! # Ok(())
//! # }
//! ```

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::client::verify_server_name;
use tokio_rustls::rustls::crypto::{CryptoProvider, ring};
use tokio_rustls::rustls::pki_types::pem::{self, PemObject};
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use tokio_rustls::rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use tokio_rustls::rustls::server::{ParsedCertificate, WebPkiClientVerifier};
use tokio_rustls::rustls::{
    DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig, SignatureScheme,
};
use tokio_stream::Stream;

use crate::env::parse_bool;
use crate::telemetry::logging::LogLevel;

/// How long a client has to finish its TLS handshake. A choice, not the Go service's: grpc-go
/// allows 120 s (`grpc.ConnectionTimeout`'s default); Envoy's own connect timeout for a cluster
/// defaults to 5 s, so an honest client finishes well within this.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How often the certificate files are read for a change.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(1);

/// Finished handshakes waiting for the server to take them.
const QUEUE: usize = 64;

/// After a failed `accept` (out of file descriptors, say), wait this long before the next, so
/// the loop does not spin on an error that repeats.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The gRPC server's TLS settings: the `GRPC_SERVER_TLS_*` and `GRPC_CLIENT_TLS_*` variables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerTls {
    /// `GRPC_SERVER_TLS_CERT`: the server's certificate chain, PEM, leaf first.
    pub cert: PathBuf,
    /// `GRPC_SERVER_TLS_KEY`: the server's private key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// `GRPC_CLIENT_TLS_CACERT`: when set, every client must present a certificate chaining to
    /// one of this file's CAs, or its handshake fails.
    pub client_ca: Option<PathBuf>,
    /// `GRPC_CLIENT_TLS_SAN`: when set with [`client_ca`](Self::client_ca), the client
    /// certificate must carry this DNS name or IP address (as Go checks it). Without a client
    /// CA it has no effect, as in Go.
    pub client_san: Option<String>,
    /// The longest a handshake may take ([`HANDSHAKE_TIMEOUT`] from [`from_env`](Self::from_env)).
    pub handshake_timeout: Duration,
    /// How often the files are read for a change ([`RELOAD_INTERVAL`] from
    /// [`from_env`](Self::from_env)).
    pub reload_interval: Duration,
}

impl ServerTls {
    /// Settings for a server certificate and key, without client certificates, with the default
    /// timeout and interval.
    pub fn new(cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> ServerTls {
        ServerTls {
            cert: cert.into(),
            key: key.into(),
            client_ca: None,
            client_san: None,
            handshake_timeout: HANDSHAKE_TIMEOUT,
            reload_interval: RELOAD_INTERVAL,
        }
    }

    /// Read the Go service's variables: `None` when `GRPC_SERVER_USE_TLS` is false or unset
    /// (its default), an error naming the variable when a value is not usable. The files are
    /// not read here; [`load`](Self::load) reads them.
    pub fn from_env(env: &HashMap<String, String>) -> Result<Option<ServerTls>, String> {
        let get = |name: &str| env.get(name).map(String::as_str).unwrap_or("");
        let use_tls = match get("GRPC_SERVER_USE_TLS") {
            "" => false,
            v => parse_bool(v)
                .ok_or_else(|| format!("GRPC_SERVER_USE_TLS={v}: not a boolean (true or false)"))?,
        };
        if !use_tls {
            return Ok(None);
        }
        let required = |name: &str, what: &str| match get(name) {
            "" => Err(format!("GRPC_SERVER_USE_TLS is true but {name} ({what}) is not set")),
            v => Ok(PathBuf::from(v)),
        };
        let cert = required("GRPC_SERVER_TLS_CERT", "the server's certificate chain, PEM")?;
        let key = required("GRPC_SERVER_TLS_KEY", "the server's private key, PEM")?;
        // Go's name, else Envoy Gateway's (which the Go service does not read).
        let client_ca = match (get("GRPC_CLIENT_TLS_CACERT"), get("GRPC_SERVER_TLS_CA_CERT")) {
            ("", "") => None,
            ("", v) | (v, _) => Some(PathBuf::from(v)),
        };
        let client_san = match get("GRPC_CLIENT_TLS_SAN") {
            "" => None,
            v => {
                ServerName::try_from(v).map_err(|_| {
                    format!("GRPC_CLIENT_TLS_SAN={v}: neither a DNS name nor an IP address")
                })?;
                Some(v.to_owned())
            }
        };
        Ok(Some(ServerTls { client_ca, client_san, ..ServerTls::new(cert, key) }))
    }

    /// Read the files and build the first configuration. Every error names its file.
    pub fn load(&self) -> Result<ReloadingTls, TlsError> {
        let files = Files::read(self)?;
        let config = build(self, &files)?;
        Ok(ReloadingTls {
            inner: Arc::new(Inner {
                settings: self.clone(),
                current: RwLock::new(config),
                loaded: Mutex::new(files),
                reloads: AtomicU64::new(0),
                reload_failures: AtomicU64::new(0),
                handshake_failures: AtomicU64::new(0),
            }),
        })
    }
}

/// Why a certificate, key or CA file could not be used.
#[derive(Debug)]
#[non_exhaustive]
pub enum TlsError {
    /// The file could not be read (missing, unreadable).
    Read {
        /// The file.
        path: PathBuf,
        /// What reading it said.
        error: io::Error,
    },
    /// The file holds nothing of what it should (`what`: "certificate", "private key").
    Empty {
        /// The file.
        path: PathBuf,
        /// What was looked for.
        what: &'static str,
    },
    /// The file is not well-formed PEM, or its content is not a usable certificate or key.
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// The private key is not the certificate's.
    KeyMismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
    },
}

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TlsError::Read { path, error } => write!(f, "{}: cannot read: {error}", path.display()),
            TlsError::Empty { path, what } => {
                write!(f, "{}: no {what} in the file (expected PEM)", path.display())
            }
            TlsError::Malformed { path, detail } => write!(f, "{}: {detail}", path.display()),
            TlsError::KeyMismatch { cert, key } => write!(
                f,
                "{}: the private key does not match the certificate {}",
                key.display(),
                cert.display()
            ),
        }
    }
}

impl std::error::Error for TlsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TlsError::Read { error, .. } => Some(error),
            _ => None,
        }
    }
}

/// The contents of the files a configuration was built from.
#[derive(PartialEq, Eq)]
struct Files {
    cert: Vec<u8>,
    key: Vec<u8>,
    ca: Option<Vec<u8>>,
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    // `fs::read` opens the path, so a symlink (Kubernetes's `..data`) is followed.
    std::fs::read(path).map_err(|error| TlsError::Read { path: path.to_owned(), error })
}

impl Files {
    fn read(settings: &ServerTls) -> Result<Files, TlsError> {
        Ok(Files {
            cert: read(&settings.cert)?,
            key: read(&settings.key)?,
            ca: settings.client_ca.as_deref().map(read).transpose()?,
        })
    }
}

fn pem_error(path: &Path, what: &'static str, e: pem::Error) -> TlsError {
    match e {
        pem::Error::NoItemsFound => TlsError::Empty { path: path.to_owned(), what },
        e => TlsError::Malformed { path: path.to_owned(), detail: format!("not valid PEM: {e}") },
    }
}

fn certificates(path: &Path, bytes: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(path, "certificate", e))?;
    if certs.is_empty() {
        return Err(TlsError::Empty { path: path.to_owned(), what: "certificate" });
    }
    Ok(certs)
}

/// Build a configuration from the files' contents.
fn build(settings: &ServerTls, files: &Files) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = Arc::new(ring::default_provider());
    let certs = certificates(&settings.cert, &files.cert)?;
    for cert in &certs {
        ParsedCertificate::try_from(cert).map_err(|e| TlsError::Malformed {
            path: settings.cert.clone(),
            detail: format!("not a usable certificate: {e}"),
        })?;
    }
    let key = PrivateKeyDer::from_pem_slice(&files.key)
        .map_err(|e| pem_error(&settings.key, "private key", e))?;
    let key = provider.key_provider.load_private_key(key).map_err(|e| TlsError::Malformed {
        path: settings.key.clone(),
        detail: format!("not a usable private key: {e}"),
    })?;
    let certified = tokio_rustls::rustls::sign::CertifiedKey::new(certs, key);
    certified.keys_match().map_err(|_| TlsError::KeyMismatch {
        cert: settings.cert.clone(),
        key: settings.key.clone(),
    })?;

    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Malformed {
            path: settings.cert.clone(),
            detail: format!("no TLS version available: {e}"),
        })?;
    let builder = match (&settings.client_ca, &files.ca) {
        (Some(path), Some(bytes)) => {
            let verifier = client_verifier(path, bytes, settings.client_san.as_deref(), provider)?;
            builder.with_client_cert_verifier(verifier)
        }
        _ => builder.with_no_client_auth(),
    };
    let resolver = tokio_rustls::rustls::sign::SingleCertAndKey::from(certified);
    let mut config = builder.with_cert_resolver(Arc::new(resolver));
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

fn client_verifier(
    path: &Path,
    bytes: &[u8],
    san: Option<&str>,
    provider: Arc<CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(path, bytes)? {
        roots.add(cert).map_err(|e| TlsError::Malformed {
            path: path.to_owned(),
            detail: format!("not a usable CA certificate: {e}"),
        })?;
    }
    let inner = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| TlsError::Malformed {
            path: path.to_owned(),
            detail: format!("not usable as client CAs: {e}"),
        })?;
    match san {
        None => Ok(inner),
        Some(san) => {
            let san = ServerName::try_from(san.to_owned()).map_err(|_| TlsError::Malformed {
                path: path.to_owned(),
                detail: format!("GRPC_CLIENT_TLS_SAN={san}: neither a DNS name nor an IP address"),
            })?;
            Ok(Arc::new(RequireSan { inner, san }))
        }
    }
}

/// The CA's verdict, then the client SAN (Go's `verifyClient`, `src/server/tls.go`).
#[derive(Debug)]
struct RequireSan {
    inner: Arc<dyn ClientCertVerifier>,
    san: ServerName<'static>,
}

impl ClientCertVerifier for RequireSan {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, tokio_rustls::rustls::Error> {
        let verified = self.inner.verify_client_cert(end_entity, intermediates, now)?;
        verify_server_name(&ParsedCertificate::try_from(end_entity)?, &self.san)?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<
        tokio_rustls::rustls::client::danger::HandshakeSignatureValid,
        tokio_rustls::rustls::Error,
    > {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<
        tokio_rustls::rustls::client::danger::HandshakeSignatureValid,
        tokio_rustls::rustls::Error,
    > {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }

    fn requires_raw_public_keys(&self) -> bool {
        self.inner.requires_raw_public_keys()
    }
}

/// The configuration in force and the files it came from; cloned handles share them.
///
/// Made by [`ServerTls::load`]; [`incoming`] polls it for changes.
#[derive(Clone)]
pub struct ReloadingTls {
    inner: Arc<Inner>,
}

struct Inner {
    settings: ServerTls,
    current: RwLock<Arc<ServerConfig>>,
    /// Held across a whole reload, so two reloads do not interleave.
    loaded: Mutex<Files>,
    // Counters alone: each is its whole state and publishes no other memory, so `Relaxed`.
    reloads: AtomicU64,
    reload_failures: AtomicU64,
    handshake_failures: AtomicU64,
}

impl fmt::Debug for ReloadingTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadingTls")
            .field("settings", &self.inner.settings)
            .field("reloads", &self.reloads())
            .field("reload_failures", &self.reload_failures())
            .field("handshake_failures", &self.handshake_failures())
            .finish()
    }
}

impl ReloadingTls {
    /// The settings it was loaded from.
    pub fn settings(&self) -> &ServerTls {
        &self.inner.settings
    }

    /// Read the files now: `Ok(true)` when their contents changed and the new configuration is
    /// in force, `Ok(false)` when they are as loaded, an error (the last good configuration
    /// kept) when the new contents are not usable. Blocking file I/O: from async code, call it
    /// in `spawn_blocking`.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let mut loaded = self.inner.loaded.lock().unwrap_or_else(PoisonError::into_inner);
        let files = Files::read(&self.inner.settings)?;
        if files == *loaded {
            return Ok(false);
        }
        let config = build(&self.inner.settings, &files)?;
        *self.inner.current.write().unwrap_or_else(PoisonError::into_inner) = config;
        *loaded = files;
        self.inner.reloads.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    /// How many times a change of the files was loaded.
    pub fn reloads(&self) -> u64 {
        self.inner.reloads.load(Ordering::Relaxed)
    }

    /// How many polls found changed files that could not be used (each distinct failure once).
    pub fn reload_failures(&self) -> u64 {
        self.inner.reload_failures.load(Ordering::Relaxed)
    }

    /// How many handshakes failed or timed out.
    pub fn handshake_failures(&self) -> u64 {
        self.inner.handshake_failures.load(Ordering::Relaxed)
    }

    fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.inner.current.read().unwrap_or_else(PoisonError::into_inner).clone())
    }
}

/// Aborts its task when dropped.
#[derive(Debug)]
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The stream [`incoming`] returns: TLS connections whose handshake finished. It never ends and
/// never yields an error; dropping it stops accepting, pending handshakes and the reload poll.
#[derive(Debug)]
pub struct TlsIncoming {
    connections: mpsc::Receiver<tokio_rustls::server::TlsStream<TcpStream>>,
    _accept: AbortOnDrop,
    _reload: AbortOnDrop,
}

impl Stream for TlsIncoming {
    type Item = Result<tokio_rustls::server::TlsStream<TcpStream>, io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.connections.poll_recv(cx).map(|c| c.map(Ok))
    }
}

/// Accept TLS connections on `listener` with `tls`'s configuration in force, and poll its files
/// every [`ServerTls::reload_interval`]. `log` receives what the server should log, with its
/// level: handshake failures at debug, reloads at info, refused files (once per change) at
/// error, failed accepts at warn. Must be called within a Tokio runtime.
pub fn incoming(
    listener: TcpListener,
    tls: ReloadingTls,
    log: impl Fn(LogLevel, &str) + Send + Sync + 'static,
) -> TlsIncoming {
    let log = Arc::new(log);
    let (sender, connections) = mpsc::channel(QUEUE);
    let accept = tokio::spawn(accept_loop(listener, tls.clone(), sender, log.clone()));
    let reload = tokio::spawn(reload_loop(tls, log));
    TlsIncoming { connections, _accept: AbortOnDrop(accept), _reload: AbortOnDrop(reload) }
}

async fn accept_loop(
    listener: TcpListener,
    tls: ReloadingTls,
    sender: mpsc::Sender<tokio_rustls::server::TlsStream<TcpStream>>,
    log: Arc<impl Fn(LogLevel, &str) + Send + Sync + 'static>,
) {
    // Dropped with this task, which aborts the handshakes still running.
    let mut handshakes = JoinSet::new();
    let timeout = tls.inner.settings.handshake_timeout;
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => {
                    // As tonic's `TcpIncoming::with_nodelay(Some(true))` does; a failure here
                    // costs latency, not correctness.
                    let _ = tcp.set_nodelay(true);
                    let acceptor = tls.acceptor();
                    let (sender, log, tls) = (sender.clone(), log.clone(), tls.clone());
                    handshakes.spawn(async move {
                        let error = match tokio::time::timeout(timeout, acceptor.accept(tcp)).await {
                            Ok(Ok(stream)) => {
                                // Fails only when the stream was dropped: nothing to serve.
                                let _ = sender.send(stream).await;
                                return;
                            }
                            Ok(Err(e)) => e.to_string(),
                            Err(_) => format!("not finished within {timeout:?}"),
                        };
                        tls.inner.handshake_failures.fetch_add(1, Ordering::Relaxed);
                        log(LogLevel::Debug, &format!("TLS handshake with {peer} failed: {error}"));
                    });
                }
                Err(e) => {
                    log(LogLevel::Warn, &format!("accepting a gRPC connection failed: {e}"));
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
            // Reap finished handshakes so the set holds only running ones.
            Some(_) = handshakes.join_next(), if !handshakes.is_empty() => {}
        }
    }
}

async fn reload_loop(tls: ReloadingTls, log: Arc<impl Fn(LogLevel, &str) + Send + Sync + 'static>) {
    let mut tick = tokio::time::interval(tls.inner.settings.reload_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // the first tick is immediate: the files were just loaded
    // The last failure reported, so each is said once until the files change.
    let mut reported: Option<String> = None;
    loop {
        tick.tick().await;
        let handle = tls.clone();
        let Ok(result) = tokio::task::spawn_blocking(move || handle.reload()).await else {
            continue;
        };
        match result {
            Ok(false) => reported = None,
            Ok(true) => {
                reported = None;
                log(LogLevel::Info, "gRPC TLS certificates reloaded");
            }
            Err(e) => {
                let message = e.to_string();
                if reported.as_deref() != Some(message.as_str()) {
                    tls.inner.reload_failures.fetch_add(1, Ordering::Relaxed);
                    log(
                        LogLevel::Error,
                        &format!(
                            "gRPC TLS certificates not reloaded, the last good ones kept: {message}"
                        ),
                    );
                    reported = Some(message);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
