//! The xDS configuration client (`CONFIG_TYPE=GRPC_XDS_SOTW`), as envoyproxy/ratelimit's
//! `src/provider/xds_grpc_sotw_provider.go` and go-control-plane's `pkg/client/sotw/v3` run it:
//! the configuration comes from a control plane (Envoy Gateway's on `envoy-gateway:18001`)
//! instead of a directory.
//!
//! # The stream
//!
//! The client opens `envoy.service.discovery.v3.AggregatedDiscoveryService/
//! StreamAggregatedResources` to [`XdsSettings::server_url`] (with TLS when
//! [`XdsSettings::tls`]; the certificates are read at each connect, so rotated files are
//! picked up) and asks for [`RATE_LIMIT_CONFIG_TYPE_URL`] with its [`Node`] (id and metadata)
//! and the version it last acknowledged (empty at first). Each response holds the whole
//! configuration (state of the world): every resource is a `RateLimitConfig`, turned into a
//! [`ConfigFile`] ([`ConfigFile::from_xds`]), and all of them, in order, go to the `apply`
//! callback, which loads them as the file loader loads a directory.
//!
//! - Accepted (`apply` returns `Ok`): an ACK, a request with the response's `version_info` and
//!   `nonce`.
//! - Refused (a resource of another type, one that does not decode, or `apply` returns
//!   `Err(message)`): a NACK, a request with the last acknowledged `version_info`, the
//!   response's nonce and `error_detail` (code [`NACK_CODE`], the message). Nothing of the
//!   refused response is applied: `apply` sees all of it or none.
//! - The stream ends (the server goes away, an error, EOF): the configuration in force keeps
//!   serving, and the client connects again after a pause ([`XdsBackoff`]), asking with the
//!   last acknowledged version, so an up-to-date control plane has nothing to resend.
//! - A connect fails (refused, TLS, the stream's opening): the client tries again after
//!   [`XdsSettings::connect_retry_interval`], with Go's ±50 % jitter, until it connects.
//!
//! # Differences from the Go service
//!
//! - A stream's first request carries an empty `response_nonce` (the xDS protocol's rule for a
//!   new stream, as Envoy does); Go resends the last nonce of the old stream, which
//!   go-control-plane ignores on a new stream either way.
//! - Go's reconnect acknowledges whatever it last received, even a response it refused; this
//!   client always resends the last version it accepted.
//! - Go dials with gRPC's own connect backoff (1 s growing to 120 s) and never uses
//!   `CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL` (its retry interceptor has no retries
//!   configured); this client waits that interval between connect attempts.
//! - Go's [`XdsBackoff`] attempt count never resets; this client resets it once a stream has
//!   delivered a response (with Go's defaults, the pause is 10 s either way).
//! - TLS trusts [`XdsTls::ca_cert`] only; Go adds it to the system's roots.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prost::Message;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tonic::metadata::{MetadataKey, MetadataValue};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use crate::config::ConfigFile;
use crate::settings::{LogLevel, parse_duration};
use crate::xds_grpc::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use crate::xds_proto::{
    DiscoveryRequest, DiscoveryResponse, Node, RATE_LIMIT_CONFIG_TYPE_URL, RateLimitConfig, Status,
};

/// The `google.rpc.Code` of a NACK's `error_detail`: go-control-plane's ADS client (which the Go
/// service uses) sets only the message, so the code is 0 and the control plane sees what it
/// sees from the Go service. Control planes tell a NACK by `error_detail` being present.
pub const NACK_CODE: i32 = 0;

/// The message name a resource's `type_url` must end with.
const RESOURCE_NAME: &str = "ratelimit.config.ratelimit.v3.RateLimitConfig";

/// The longest a TCP connect and TLS handshake may take: gRPC's minimum connect timeout
/// (grpc-go's `minConnectTimeout`, 20 s).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);

/// The xDS client's settings: envoyproxy/ratelimit's `CONFIG_GRPC_XDS_*` and `XDS_CLIENT_*`
/// variables ([`XdsSettings::from_env`]), their defaults the Go service's.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct XdsSettings {
    /// The control plane, `host:port` (`CONFIG_GRPC_XDS_SERVER_URL`, default
    /// `localhost:18000`); the host may be a name (`envoy-gateway:18001`).
    pub server_url: String,
    /// The node id (`CONFIG_GRPC_XDS_NODE_ID`, default `default`).
    pub node_id: String,
    /// The node's metadata, string values (`CONFIG_GRPC_XDS_NODE_METADATA`: `k1=v1,k2=v2`).
    pub node_metadata: BTreeMap<String, String>,
    /// The pause between connect attempts, before Go's ±50 % jitter
    /// (`CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL`, default 3 s).
    pub connect_retry_interval: Duration,
    /// The pause after a stream ends, before connecting again (`XDS_CLIENT_BACKOFF_*`).
    pub backoff: XdsBackoff,
    /// gRPC metadata sent on the stream, keys lowercase
    /// (`CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS`: `k1:v1,k2:v2`).
    pub headers: BTreeMap<String, String>,
    /// The largest response accepted, in bytes (`XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES`; `None`:
    /// gRPC's default, 4 MiB).
    pub max_message_size: Option<usize>,
    /// TLS to the control plane (`CONFIG_GRPC_XDS_SERVER_USE_TLS`); `None`: plaintext.
    pub tls: Option<XdsTls>,
}

/// The pause after a stream ends, as Go's `jpillora/backoff` computes it for attempt `n`
/// (from 0): `initial × factor^n`, with jitter a uniform pick between `initial` and that, kept
/// within `[initial, max]`. With Go's defaults (factor 0.5 < 1) it is always `initial`, 10 s.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct XdsBackoff {
    /// The first pause (`XDS_CLIENT_BACKOFF_INITIAL_INTERVAL`, default 10 s; 0: 100 ms).
    pub initial: Duration,
    /// The longest pause (`XDS_CLIENT_BACKOFF_MAX_INTERVAL`, default 60 s; 0: 10 s).
    pub max: Duration,
    /// The growth per attempt (`XDS_CLIENT_BACKOFF_RANDOM_FACTOR`, default 0.5; 0 or less: 2).
    pub factor: f64,
    /// Whether the pause is picked at random (`XDS_CLIENT_BACKOFF_JITTER`, default true).
    pub jitter: bool,
}

impl Default for XdsBackoff {
    fn default() -> Self {
        XdsBackoff {
            initial: Duration::from_secs(10),
            max: Duration::from_secs(60),
            factor: 0.5,
            jitter: true,
        }
    }
}

/// TLS to the control plane.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct XdsTls {
    /// The client's certificate chain, PEM, for mutual TLS (`CONFIG_GRPC_XDS_CLIENT_TLS_CERT`).
    pub client_cert: Option<PathBuf>,
    /// The client certificate's key, PEM (`CONFIG_GRPC_XDS_CLIENT_TLS_KEY`).
    pub client_key: Option<PathBuf>,
    /// The certificates the server's chain must lead to, PEM
    /// (`CONFIG_GRPC_XDS_SERVER_TLS_CACERT`).
    pub ca_cert: Option<PathBuf>,
    /// The name checked in the server's certificate, instead of the URL's host
    /// (`CONFIG_GRPC_XDS_SERVER_TLS_SAN`).
    pub server_name: Option<String>,
}

impl XdsTls {
    /// TLS trusting the CA certificates in `ca_cert`, without a client certificate, checking the
    /// URL's host.
    pub fn new(ca_cert: impl Into<PathBuf>) -> XdsTls {
        XdsTls { ca_cert: Some(ca_cert.into()), ..XdsTls::default() }
    }
}

/// Go's `strconv.ParseBool`.
fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// `CONFIG_GRPC_XDS_NODE_METADATA` as Go's `getClientNode` reads it: entries split on `,`,
/// each `key=value` split on its first `=`; an entry without `=` is skipped, a later key wins.
fn parse_node_metadata(v: &str) -> BTreeMap<String, String> {
    v.split(',')
        .filter_map(|entry| entry.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// `CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS` as Go's `envconfig` reads a map (pairs split on
/// `,`, each exactly one `key:value`), its keys lowercased as Go's `metadata.New` does; each
/// checked as gRPC metadata.
fn parse_headers(name: &str, v: &str) -> Result<BTreeMap<String, String>, String> {
    let mut headers = BTreeMap::new();
    if v.trim().is_empty() {
        return Ok(headers);
    }
    for pair in v.split(',') {
        let mut parts = pair.split(':');
        let (Some(key), Some(value), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(format!("{name}: invalid map item: {pair:?} (k1:v1,k2:v2)"));
        };
        let key = key.to_ascii_lowercase();
        metadata(&key, value).map_err(|e| format!("{name}: {e}"))?;
        headers.insert(key, value.to_owned());
    }
    Ok(headers)
}

/// `key: value` as ASCII gRPC metadata.
fn metadata(
    key: &str,
    value: &str,
) -> Result<(MetadataKey<tonic::metadata::Ascii>, MetadataValue<tonic::metadata::Ascii>), String> {
    if key.to_ascii_lowercase().ends_with("-bin") {
        return Err(format!("{key:?}: binary metadata (-bin) is not supported"));
    }
    let k = MetadataKey::from_bytes(key.to_ascii_lowercase().as_bytes())
        .map_err(|_| format!("{key:?} is not a gRPC metadata key"))?;
    let v = MetadataValue::try_from(value)
        .map_err(|_| format!("{value:?} is not a gRPC metadata value (visible ASCII)"))?;
    Ok((k, v))
}

/// Whether `url` is `host:port`, as the client dials it.
fn check_server_url(url: &str) -> Result<(), String> {
    if url.contains("://") {
        return Err(format!("{url}: host:port, without a scheme"));
    }
    let uri: tonic::codegen::http::Uri =
        format!("http://{url}").parse().map_err(|_| format!("{url}: not host:port"))?;
    match uri.authority() {
        Some(a) if a.as_str() == url && a.port().is_some() && !a.host().is_empty() => Ok(()),
        _ => Err(format!("{url}: not host:port")),
    }
}

impl XdsSettings {
    /// The Go service's defaults, for the control plane at `server_url` (`host:port`) and the
    /// node `node_id`, plaintext.
    pub fn new(server_url: impl Into<String>, node_id: impl Into<String>) -> XdsSettings {
        XdsSettings {
            server_url: server_url.into(),
            node_id: node_id.into(),
            node_metadata: BTreeMap::new(),
            connect_retry_interval: Duration::from_secs(3),
            backoff: XdsBackoff::default(),
            headers: BTreeMap::new(),
            max_message_size: None,
            tls: None,
        }
    }

    /// The settings in `env`, read as envoyproxy/ratelimit's `settings.go` reads them: `None`
    /// unless `CONFIG_TYPE` is `GRPC_XDS_SOTW` (Go's exact spelling); an empty variable is
    /// unset. An error names the variable and what is wrong with its value.
    ///
    /// Stricter than Go: a client certificate without its key (or a key without its
    /// certificate) is an error (Go silently sends none), and TLS needs
    /// `CONFIG_GRPC_XDS_SERVER_TLS_CACERT` (this client does not read the system's roots).
    ///
    /// ```
    /// use std::collections::HashMap;
    /// use ratewell_rls::xds::XdsSettings;
    ///
    /// let env: HashMap<String, String> = [
    ///     ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
    ///     ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
    ///     ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
    ///     ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "x-tenant:a,x-zone:eu"),
    /// ]
    /// .into_iter()
    /// .map(|(k, v)| (k.to_owned(), v.to_owned()))
    /// .collect();
    /// let settings = XdsSettings::from_env(&env)?.expect("CONFIG_TYPE=GRPC_XDS_SOTW");
    /// assert_eq!(settings.server_url, "envoy-gateway:18001");
    /// assert_eq!(settings.headers["x-zone"], "eu");
    /// assert!(settings.tls.is_none());
    /// # Ok::<(), String>(())
    /// ```
    pub fn from_env(env: &HashMap<String, String>) -> Result<Option<XdsSettings>, String> {
        if env.get("CONFIG_TYPE").map(String::as_str) != Some("GRPC_XDS_SOTW") {
            return Ok(None);
        }
        let get = |name: &str| env.get(name).map(String::as_str).filter(|v| !v.is_empty());
        let duration = |name: &str, default: Duration| match get(name) {
            None => Ok(default),
            Some(v) => parse_duration(v)
                .ok_or_else(|| format!("{name}={v}: not a duration (such as 3s or 500ms)")),
        };
        let flag = |name: &str, default: bool| match get(name) {
            None => Ok(default),
            Some(v) => parse_bool(v).ok_or_else(|| format!("{name}={v}: not a boolean")),
        };
        let mut s = XdsSettings::new(
            get("CONFIG_GRPC_XDS_SERVER_URL").unwrap_or("localhost:18000"),
            get("CONFIG_GRPC_XDS_NODE_ID").unwrap_or("default"),
        );
        check_server_url(&s.server_url).map_err(|e| format!("CONFIG_GRPC_XDS_SERVER_URL={e}"))?;
        s.node_metadata = parse_node_metadata(get("CONFIG_GRPC_XDS_NODE_METADATA").unwrap_or(""));
        s.connect_retry_interval =
            duration("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", s.connect_retry_interval)?;
        s.headers = parse_headers(
            "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
            get("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS").unwrap_or(""),
        )?;
        s.backoff.initial = duration("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", s.backoff.initial)?;
        s.backoff.max = duration("XDS_CLIENT_BACKOFF_MAX_INTERVAL", s.backoff.max)?;
        if let Some(v) = get("XDS_CLIENT_BACKOFF_RANDOM_FACTOR") {
            s.backoff.factor = v
                .parse::<f64>()
                .ok()
                .filter(|f| f.is_finite())
                .ok_or_else(|| format!("XDS_CLIENT_BACKOFF_RANDOM_FACTOR={v}: not a number"))?;
        }
        s.backoff.jitter = flag("XDS_CLIENT_BACKOFF_JITTER", s.backoff.jitter)?;
        if let Some(v) = get("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES") {
            let size: usize = v.parse().map_err(|_| {
                format!("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES={v}: not a number of bytes")
            })?;
            s.max_message_size = (size != 0).then_some(size);
        }
        if flag("CONFIG_GRPC_XDS_SERVER_USE_TLS", false)? {
            let path = |name: &str| get(name).map(PathBuf::from);
            let tls = XdsTls {
                client_cert: path("CONFIG_GRPC_XDS_CLIENT_TLS_CERT"),
                client_key: path("CONFIG_GRPC_XDS_CLIENT_TLS_KEY"),
                ca_cert: path("CONFIG_GRPC_XDS_SERVER_TLS_CACERT"),
                server_name: get("CONFIG_GRPC_XDS_SERVER_TLS_SAN").map(str::to_owned),
            };
            if tls.client_cert.is_some() != tls.client_key.is_some() {
                return Err("CONFIG_GRPC_XDS_CLIENT_TLS_CERT and CONFIG_GRPC_XDS_CLIENT_TLS_KEY \
                            go together: set both, or neither"
                    .to_owned());
            }
            if tls.ca_cert.is_none() {
                return Err("CONFIG_GRPC_XDS_SERVER_USE_TLS=true needs \
                            CONFIG_GRPC_XDS_SERVER_TLS_CACERT: the system's roots are not read"
                    .to_owned());
            }
            if let Some(name) = &tls.server_name {
                tokio_rustls::rustls::pki_types::ServerName::try_from(name.as_str()).map_err(
                    |_| format!("CONFIG_GRPC_XDS_SERVER_TLS_SAN={name}: not a DNS name or an IP"),
                )?;
            }
            s.tls = Some(tls);
        }
        Ok(Some(s))
    }
}

/// What the client does with a response's configuration: load these files (every resource of
/// the response, in order) and put them in force, or return why not.
pub type XdsApply = Arc<dyn Fn(Vec<ConfigFile>) -> Result<(), String> + Send + Sync>;

/// Where the client's log lines go.
pub type XdsLog = Arc<dyn Fn(LogLevel, String) + Send + Sync>;

/// The client's counters, and the version in force. Each counter is its own state and
/// publishes no other memory: `Relaxed` increments and loads.
#[derive(Debug, Default)]
pub struct XdsStats {
    connects: AtomicU64,
    connect_failures: AtomicU64,
    stream_ends: AtomicU64,
    acks: AtomicU64,
    nacks: AtomicU64,
    version: Mutex<String>,
}

impl XdsStats {
    /// Streams opened.
    pub fn connects(&self) -> u64 {
        self.connects.load(Ordering::Relaxed)
    }

    /// Connect attempts that failed (refused, TLS, the stream's opening).
    pub fn connect_failures(&self) -> u64 {
        self.connect_failures.load(Ordering::Relaxed)
    }

    /// Open streams that ended (the server went away, an error, EOF).
    pub fn stream_ends(&self) -> u64 {
        self.stream_ends.load(Ordering::Relaxed)
    }

    /// Responses accepted and acknowledged.
    pub fn acks(&self) -> u64 {
        self.acks.load(Ordering::Relaxed)
    }

    /// Responses refused.
    pub fn nacks(&self) -> u64 {
        self.nacks.load(Ordering::Relaxed)
    }

    /// The version last accepted (empty before the first).
    pub fn version(&self) -> String {
        self.version.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// A running client ([`spawn`]).
#[derive(Debug)]
pub struct XdsClient {
    /// The client's task: it ends when `stopped` turns true.
    pub task: JoinHandle<()>,
    /// Its counters.
    pub stats: Arc<XdsStats>,
}

/// Start the client on the current Tokio runtime: it connects, applies each accepted response
/// with `apply`, logs through `log`, and runs until `stopped` turns true (or its sender is
/// dropped), promptly, whatever it is waiting for. It never ends on its own: a control plane
/// out of reach is retried for as long as it runs.
pub fn spawn(
    settings: XdsSettings,
    apply: XdsApply,
    log: XdsLog,
    stopped: watch::Receiver<bool>,
) -> XdsClient {
    let stats = Arc::new(XdsStats::default());
    let client = Client { node: node(&settings), settings, apply, log, stats: stats.clone() };
    XdsClient { task: tokio::spawn(client.run(stopped)), stats }
}

/// The node the client sends: Go's `getClientNode` (id and string metadata, no cluster; the
/// metadata present, even empty).
fn node(settings: &XdsSettings) -> Node {
    use prost_types::value::Kind;
    let fields = settings
        .node_metadata
        .iter()
        .map(|(k, v)| (k.clone(), prost_types::Value { kind: Some(Kind::StringValue(v.clone())) }))
        .collect();
    Node {
        id: settings.node_id.clone(),
        cluster: String::new(),
        metadata: Some(prost_types::Struct { fields }),
    }
}

struct Client {
    settings: XdsSettings,
    node: Node,
    apply: XdsApply,
    log: XdsLog,
    stats: Arc<XdsStats>,
}

/// How a session ended.
enum Ended {
    /// `stopped` turned true.
    Stopped,
    /// The connect failed.
    Connect(String),
    /// The open stream ended, after delivering `responses` responses.
    Stream { error: String, responses: u64 },
}

async fn wait_stopped(stopped: &mut watch::Receiver<bool>) {
    let _ = stopped.wait_for(|s| *s).await;
}

impl Client {
    fn log(&self, level: LogLevel, message: String) {
        (self.log)(level, message);
    }

    async fn run(self, mut stopped: watch::Receiver<bool>) {
        let url = &self.settings.server_url;
        self.log(
            LogLevel::Info,
            format!("xDS: starting the configuration client to {url}, node {}", self.node.id),
        );
        let mut acked = String::new();
        let mut attempt = 0u64;
        loop {
            if *stopped.borrow() {
                return;
            }
            let pause = match self.session(&mut acked, &mut stopped).await {
                Ended::Stopped => return,
                Ended::Connect(e) => {
                    XdsStats::count(&self.stats.connect_failures);
                    let pause = linear_jitter(self.settings.connect_retry_interval, random_unit());
                    self.log(
                        LogLevel::Error,
                        format!("xDS: cannot connect to {url}: {e}; again in {pause:.1?}"),
                    );
                    pause
                }
                Ended::Stream { error, responses } => {
                    XdsStats::count(&self.stats.stream_ends);
                    if responses > 0 {
                        attempt = 0;
                    }
                    let pause = backoff_delay(&self.settings.backoff, attempt, random_unit());
                    attempt = attempt.saturating_add(1);
                    self.log(
                        LogLevel::Error,
                        format!(
                            "xDS: the stream from {url} ended: {error}; the configuration in \
                             force keeps serving; connecting again in {pause:.1?}"
                        ),
                    );
                    pause
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = wait_stopped(&mut stopped) => return,
            }
        }
    }

    /// One connection: connect, then answer responses until the stream ends.
    async fn session(&self, acked: &mut String, stopped: &mut watch::Receiver<bool>) -> Ended {
        let (tx, rx) = mpsc::channel(4);
        let connect = async {
            let first = self.request(acked, String::new(), None);
            tx.send(first).await.map_err(|_| "the request stream closed".to_owned())?;
            let channel = endpoint(&self.settings)?.connect().await.map_err(|e| chain(&e))?;
            let mut client = AggregatedDiscoveryServiceClient::new(channel);
            if let Some(size) = self.settings.max_message_size {
                client = client.max_decoding_message_size(size);
            }
            let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
            for (key, value) in &self.settings.headers {
                let (key, value) = metadata(key, value)?;
                request.metadata_mut().insert(key, value);
            }
            match client.stream_aggregated_resources(request).await {
                Ok(response) => Ok(response.into_inner()),
                Err(status) => Err(status_text(&status)),
            }
        };
        let mut inbound = tokio::select! {
            result = connect => match result {
                Ok(inbound) => inbound,
                Err(e) => return Ended::Connect(e),
            },
            _ = wait_stopped(stopped) => return Ended::Stopped,
        };
        XdsStats::count(&self.stats.connects);
        self.log(LogLevel::Info, format!("xDS: connected to {}", self.settings.server_url));
        let mut responses = 0;
        loop {
            let message = tokio::select! {
                message = inbound.message() => message,
                _ = wait_stopped(stopped) => return Ended::Stopped,
            };
            let response = match message {
                Ok(Some(response)) => response,
                Ok(None) => {
                    let error = "the server closed the stream".to_owned();
                    return Ended::Stream { error, responses };
                }
                Err(status) => return Ended::Stream { error: status_text(&status), responses },
            };
            responses += 1;
            let answer = self.answer(response, acked).await;
            tokio::select! {
                sent = tx.send(answer) => if sent.is_err() {
                    let error = "the request stream closed".to_owned();
                    return Ended::Stream { error, responses };
                },
                _ = wait_stopped(stopped) => return Ended::Stopped,
            }
        }
    }

    /// Apply `response`, and the ACK or NACK that answers it.
    async fn answer(&self, response: DiscoveryResponse, acked: &mut String) -> DiscoveryRequest {
        let DiscoveryResponse { version_info: version, resources, nonce, .. } = response;
        self.log(
            LogLevel::Debug,
            format!("xDS: version {version:?} received, {} resources", resources.len()),
        );
        let result = match decode(&resources) {
            Ok(files) => {
                let apply = self.apply.clone();
                // The load reads every resource: off the runtime's workers; a panic in it is a
                // refusal, not the client's end.
                match tokio::task::spawn_blocking(move || apply(files)).await {
                    Ok(result) => result,
                    Err(e) => Err(format!("the configuration's load failed: {e}")),
                }
            }
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => {
                XdsStats::count(&self.stats.acks);
                self.log(
                    LogLevel::Info,
                    format!("xDS: version {version:?} applied, {} resources", resources.len()),
                );
                *self.stats.version.lock().unwrap_or_else(|e| e.into_inner()) = version.clone();
                *acked = version;
                self.request(acked, nonce, None)
            }
            Err(message) => {
                XdsStats::count(&self.stats.nacks);
                self.log(
                    LogLevel::Error,
                    format!(
                        "xDS: version {version:?} refused, {acked:?} stays in force: {message}"
                    ),
                );
                let detail = Status { code: NACK_CODE, message, details: Vec::new() };
                self.request(acked, nonce, Some(detail))
            }
        }
    }

    /// A request: go-control-plane's ADS client's, the node on every one.
    fn request(&self, version: &str, nonce: String, error: Option<Status>) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info: version.to_owned(),
            node: Some(self.node.clone()),
            resource_names: Vec::new(),
            type_url: RATE_LIMIT_CONFIG_TYPE_URL.to_owned(),
            response_nonce: nonce,
            error_detail: error,
        }
    }
}

/// Every resource as a configuration file, or why one cannot be: its type is not
/// `RateLimitConfig` (Go's `anypb.UnmarshalTo` check: the URL's last segment names it), or it
/// does not decode.
fn decode(resources: &[prost_types::Any]) -> Result<Vec<ConfigFile>, String> {
    resources
        .iter()
        .enumerate()
        .map(|(i, any)| {
            let url = any.type_url.as_str();
            let named = url == RESOURCE_NAME
                || url.strip_suffix(RESOURCE_NAME).is_some_and(|head| head.ends_with('/'));
            if !named {
                return Err(format!(
                    "resource {i}: mismatched message type: got {url:?}, want {RESOURCE_NAME:?}"
                ));
            }
            let resource = RateLimitConfig::decode(any.value.as_slice())
                .map_err(|e| format!("resource {i}: {e}"))?;
            Ok(ConfigFile::from_xds(&resource))
        })
        .collect()
}

/// The endpoint to dial, its TLS configuration read from the files now.
fn endpoint(settings: &XdsSettings) -> Result<Endpoint, String> {
    let scheme = if settings.tls.is_some() { "https" } else { "http" };
    let url = format!("{scheme}://{}", settings.server_url);
    let endpoint = Endpoint::from_shared(url)
        .map_err(|e| format!("{}: {}", settings.server_url, chain(&e)))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true);
    let Some(tls) = &settings.tls else { return Ok(endpoint) };
    // A few small files, read at each connect: short enough to stay on this task.
    let read = |path: &PathBuf| std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()));
    let mut config = ClientTlsConfig::new();
    if let Some(path) = &tls.ca_cert {
        let pem = read(path)?;
        if !pem.windows(27).any(|w| w == b"-----BEGIN CERTIFICATE-----") {
            return Err(format!("{}: no PEM certificate", path.display()));
        }
        config = config.ca_certificate(Certificate::from_pem(pem));
    }
    if let (Some(cert), Some(key)) = (&tls.client_cert, &tls.client_key) {
        let (cert, key) = (read(cert)?, read(key)?);
        config = config.identity(Identity::from_pem(cert, key));
    }
    if let Some(name) = &tls.server_name {
        config = config.domain_name(name.clone());
    }
    endpoint.tls_config(config).map_err(|e| format!("TLS: {}", chain(&e)))
}

/// An error and its sources, joined with `: ` (tonic's transport errors say little alone).
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

fn status_text(status: &tonic::Status) -> String {
    let mut text = format!("{:?}: {}", status.code(), status.message());
    if let Some(source) = std::error::Error::source(status) {
        text.push_str(": ");
        text.push_str(&chain(source));
    }
    text
}

/// Go's `grpc_retry.BackoffLinearWithJitter(interval, 0.5)`: `interval × (1 + 0.5 × (2r − 1))`
/// for `r` uniform in `[0, 1)`, so between half and one and a half intervals.
fn linear_jitter(interval: Duration, r: f64) -> Duration {
    let factor = 1.0 + 0.5 * (2.0 * r.clamp(0.0, 1.0) - 1.0);
    Duration::try_from_secs_f64(interval.as_secs_f64() * factor).unwrap_or(interval)
}

/// `jpillora/backoff`'s `ForAttempt(attempt)` (v1.0.0, the Go service's), `r` its
/// `rand.Float64()`.
fn backoff_delay(b: &XdsBackoff, attempt: u64, r: f64) -> Duration {
    let min = if b.initial.is_zero() { Duration::from_millis(100) } else { b.initial };
    let max = if b.max.is_zero() { Duration::from_secs(10) } else { b.max };
    if min >= max {
        return max;
    }
    let factor = if b.factor > 0.0 { b.factor } else { 2.0 };
    let min_nanos = min.as_nanos() as f64;
    let mut nanos = min_nanos * factor.powf(attempt as f64);
    if b.jitter {
        nanos = r.clamp(0.0, 1.0) * (nanos - min_nanos) + min_nanos;
    }
    // Go's `maxInt64` guard; a NaN (from an infinite power) is as long as it gets too.
    if nanos.is_nan() || nanos > (i64::MAX - 512) as f64 {
        return max;
    }
    Duration::from_nanos(nanos.max(0.0) as u64).clamp(min, max)
}

/// A number uniform in `[0, 1)`, for jitter: std's per-process random hash keys over the time.
fn random_unit() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    hasher.write_u128(now.map(|d| d.as_nanos()).unwrap_or_default());
    (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RateLimitConfig as Loaded;
    use crate::proto::{Entry, RateLimitDescriptor as Request, Unit};
    use crate::xds_proto::{RateLimitDescriptor, RateLimitPolicy, RateLimitReplace, RateLimitUnit};

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn xds(pairs: &[(&str, &str)]) -> Result<XdsSettings, String> {
        let mut all = vec![("CONFIG_TYPE", "GRPC_XDS_SOTW")];
        all.extend_from_slice(pairs);
        XdsSettings::from_env(&env(&all)).map(|s| s.expect("GRPC_XDS_SOTW"))
    }

    #[test]
    fn settings_are_none_without_the_xds_config_type() {
        assert_eq!(XdsSettings::from_env(&env(&[])), Ok(None));
        assert_eq!(XdsSettings::from_env(&env(&[("CONFIG_TYPE", "FILE")])), Ok(None));
        assert_eq!(XdsSettings::from_env(&env(&[("CONFIG_TYPE", "grpc_xds_sotw")])), Ok(None));
    }

    #[test]
    fn settings_defaults_are_the_go_services() {
        let s = xds(&[]).unwrap();
        assert_eq!(s, XdsSettings::new("localhost:18000", "default"));
        assert_eq!(s.connect_retry_interval, Duration::from_secs(3));
        assert_eq!(
            s.backoff,
            XdsBackoff {
                initial: Duration::from_secs(10),
                max: Duration::from_secs(60),
                factor: 0.5,
                jitter: true
            }
        );
        assert_eq!((s.max_message_size, s.tls), (None, None));
        assert!(s.headers.is_empty() && s.node_metadata.is_empty());
    }

    #[test]
    fn settings_envoy_gateway() {
        let s = xds(&[
            ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
            ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
        ])
        .unwrap();
        assert_eq!(
            (s.server_url.as_str(), s.node_id.as_str()),
            ("envoy-gateway:18001", "envoy-ratelimit")
        );
        let tls = s.tls.unwrap();
        assert_eq!(tls.client_cert, Some(PathBuf::from("/certs/tls.crt")));
        assert_eq!(tls.client_key, Some(PathBuf::from("/certs/tls.key")));
        assert_eq!(tls.ca_cert, Some(PathBuf::from("/certs/ca.crt")));
        assert_eq!(tls.server_name, None);
    }

    #[test]
    fn settings_formats() {
        let s = xds(&[
            ("CONFIG_GRPC_XDS_NODE_METADATA", "a=1,b=x=y,c:3,,a=2"),
            ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "X-Tenant:t1,x-zone:eu"),
            ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "250ms"),
            ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "1s"),
            ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "1m30s"),
            ("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "2"),
            ("XDS_CLIENT_BACKOFF_JITTER", "F"),
            ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "8388608"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "false"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/ignored/without/tls"),
        ])
        .unwrap();
        // Go: split on `,`, then on the first `=`; `c:3` and the empty entry are skipped.
        let metadata: Vec<_> =
            s.node_metadata.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(metadata, [("a", "2"), ("b", "x=y")]);
        let headers: Vec<_> = s.headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(headers, [("x-tenant", "t1"), ("x-zone", "eu")]);
        assert_eq!(s.connect_retry_interval, Duration::from_millis(250));
        assert_eq!(
            s.backoff,
            XdsBackoff {
                initial: Duration::from_secs(1),
                max: Duration::from_secs(90),
                factor: 2.0,
                jitter: false
            }
        );
        assert_eq!(s.max_message_size, Some(8 << 20));
        assert_eq!(s.tls, None);
        assert_eq!(
            xds(&[("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "0")]).unwrap().max_message_size,
            None
        );
        let san = xds(&[
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "1"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/ca.pem"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "xds.internal"),
        ])
        .unwrap();
        let tls = san.tls.unwrap();
        assert_eq!((tls.server_name.as_deref(), tls.client_cert), (Some("xds.internal"), None));
    }

    #[test]
    fn settings_errors_name_the_variable() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[("CONFIG_GRPC_XDS_SERVER_URL", "http://cp:18000")], "without a scheme"),
            (&[("CONFIG_GRPC_XDS_SERVER_URL", "cp")], "not host:port"),
            (&[("CONFIG_GRPC_XDS_SERVER_URL", "cp:18000/x")], "not host:port"),
            (&[("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "3")], "not a duration"),
            (
                &[("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "soon")],
                "XDS_CLIENT_BACKOFF_MAX_INTERVAL=soon",
            ),
            (&[("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "NaN")], "not a number"),
            (&[("XDS_CLIENT_BACKOFF_JITTER", "yes")], "not a boolean"),
            (&[("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "-1")], "not a number of bytes"),
            (&[("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "a:b,")], "invalid map item: \"\""),
            (&[("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "a:b:c")], "invalid map item"),
            (&[("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "a b:c")], "not a gRPC metadata key"),
            (&[("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "k-bin:c")], "binary metadata"),
            (
                &[("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "k:\u{7f}")],
                "not a gRPC metadata value",
            ),
            (&[("CONFIG_GRPC_XDS_SERVER_USE_TLS", "on")], "CONFIG_GRPC_XDS_SERVER_USE_TLS=on"),
            (
                &[("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true")],
                "needs CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
            ),
            (
                &[
                    ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
                    ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/ca"),
                    ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/c"),
                ],
                "go together",
            ),
            (
                &[
                    ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
                    ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/ca"),
                    ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "a b"),
                ],
                "CONFIG_GRPC_XDS_SERVER_TLS_SAN=a b",
            ),
        ];
        for (pairs, expected) in cases {
            let e = xds(pairs).unwrap_err();
            assert!(e.contains(expected), "{pairs:?}: {e}");
        }
    }

    #[test]
    fn backoff_is_jpillora_backoff() {
        let go = XdsBackoff::default();
        // Factor 0.5 < 1: always the initial interval, whatever the attempt or the draw.
        for attempt in [0, 1, 5, 1000, u64::MAX] {
            for r in [0.0, 0.5, 0.999] {
                assert_eq!(backoff_delay(&go, attempt, r), Duration::from_secs(10));
            }
        }
        let grow = XdsBackoff { factor: 2.0, jitter: false, ..go };
        let secs: Vec<u64> = (0..5).map(|n| backoff_delay(&grow, n, 0.0).as_secs()).collect();
        assert_eq!(secs, [10, 20, 40, 60, 60]);
        let jitter = XdsBackoff { factor: 2.0, ..go };
        assert_eq!(backoff_delay(&jitter, 2, 0.0), Duration::from_secs(10));
        assert_eq!(backoff_delay(&jitter, 2, 0.5), Duration::from_secs(25));
        assert_eq!(backoff_delay(&jitter, 100_000, 0.5), Duration::from_secs(60));
        let zero =
            XdsBackoff { initial: Duration::ZERO, max: Duration::ZERO, factor: 0.0, jitter: false };
        assert_eq!(backoff_delay(&zero, 1, 0.0), Duration::from_millis(200));
        let inverted =
            XdsBackoff { initial: Duration::from_secs(5), max: Duration::from_secs(1), ..go };
        assert_eq!(backoff_delay(&inverted, 0, 0.0), Duration::from_secs(1));
    }

    #[test]
    fn connect_retry_is_linear_with_half_jitter() {
        let d = Duration::from_secs(3);
        assert_eq!(linear_jitter(d, 0.0), Duration::from_millis(1500));
        assert_eq!(linear_jitter(d, 0.5), d);
        assert!(linear_jitter(d, 0.999_999) < Duration::from_millis(4500));
        assert_eq!(linear_jitter(Duration::MAX, 0.9), Duration::MAX);
        for _ in 0..100 {
            let r = random_unit();
            assert!((0.0..1.0).contains(&r), "{r}");
        }
    }

    fn any(value: Vec<u8>, type_url: &str) -> prost_types::Any {
        prost_types::Any { type_url: type_url.into(), value }
    }

    #[test]
    fn decode_checks_each_resource_type_and_bytes() {
        let config = RateLimitConfig { name: "n".into(), domain: "d".into(), descriptors: vec![] };
        let ok = decode(&[
            any(config.encode_to_vec(), RATE_LIMIT_CONFIG_TYPE_URL),
            any(config.encode_to_vec(), RESOURCE_NAME),
            any(config.encode_to_vec(), &format!("example.com/x/{RESOURCE_NAME}")),
        ])
        .unwrap();
        assert_eq!(ok.iter().map(|f| (f.name(), f.domain())).collect::<Vec<_>>(), [("n", "d"); 3]);
        let wrong = format!("type.googleapis.com/x{RESOURCE_NAME}");
        for bad in [
            any(config.encode_to_vec(), "type.googleapis.com/envoy.config.cluster.v3.Cluster"),
            any(config.encode_to_vec(), &wrong),
            any(config.encode_to_vec(), ""),
        ] {
            let e = decode(&[any(config.encode_to_vec(), RATE_LIMIT_CONFIG_TYPE_URL), bad])
                .unwrap_err();
            assert!(e.starts_with("resource 1: mismatched message type"), "{e}");
        }
        for garbage in [vec![0xff], vec![0x0a, 5, b'x'], vec![0x1a, 0x80]] {
            let e = decode(&[any(garbage, RATE_LIMIT_CONFIG_TYPE_URL)]).unwrap_err();
            assert!(e.starts_with("resource 0: failed to decode"), "{e}");
        }
        // Nested past prost's recursion limit: an error, not a stack overflow.
        let mut deep = RateLimitDescriptor { key: "k".into(), ..Default::default() };
        for _ in 0..200 {
            deep = RateLimitDescriptor {
                key: "k".into(),
                descriptors: vec![deep],
                ..Default::default()
            };
        }
        let config =
            RateLimitConfig { domain: "d".into(), descriptors: vec![deep], ..Default::default() };
        assert!(decode(&[any(config.encode_to_vec(), RATE_LIMIT_CONFIG_TYPE_URL)]).is_err());
    }

    fn policy(unit: RateLimitUnit, requests_per_unit: u32) -> Option<RateLimitPolicy> {
        Some(RateLimitPolicy { unit: unit as i32, requests_per_unit, ..Default::default() })
    }

    /// A resource loads as the YAML file of the same content does (Go's `ConfigXdsProtoToYaml`).
    #[test]
    fn a_resource_loads_as_its_yaml_file() {
        let number =
            |n: f64| prost_types::Value { kind: Some(prost_types::value::Kind::NumberValue(n)) };
        let resource = RateLimitConfig {
            name: "edge-config".into(),
            domain: "edge".into(),
            descriptors: vec![
                RateLimitDescriptor {
                    key: "k1".into(),
                    value: "v1".into(),
                    rate_limit: policy(RateLimitUnit::Minute, 5),
                    descriptors: vec![RateLimitDescriptor {
                        key: "k2".into(),
                        rate_limit: Some(RateLimitPolicy {
                            unit: RateLimitUnit::Week as i32,
                            requests_per_unit: 7,
                            name: "weekly".into(),
                            replaces: vec![RateLimitReplace { name: "daily".into() }],
                            ..Default::default()
                        }),
                        shadow_mode: true,
                        detailed_metric: true,
                        ..Default::default()
                    }],
                    quota_mode: true,
                    metadata: Some(prost_types::Struct {
                        fields: [("n".to_owned(), number(1.5))].into(),
                    }),
                    ..Default::default()
                },
                RateLimitDescriptor {
                    key: "open".into(),
                    rate_limit: Some(RateLimitPolicy { unlimited: true, ..Default::default() }),
                    ..Default::default()
                },
            ],
        };
        let yaml = "
domain: edge
descriptors:
  - key: k1
    value: v1
    rate_limit: {unit: minute, requests_per_unit: 5}
    quota_mode: true
    metadata: {n: 1.5}
    descriptors:
      - key: k2
        rate_limit: {unit: week, requests_per_unit: 7, name: weekly, replaces: [{name: daily}]}
        shadow_mode: true
        detailed_metric: true
  - key: open
    rate_limit: {unlimited: true}
";
        let from_xds = ConfigFile::from_xds(&resource);
        assert_eq!((from_xds.name(), from_xds.domain()), ("edge-config", "edge"));
        let from_xds = Loaded::new(&[from_xds], false).unwrap();
        let from_yaml =
            Loaded::new(&[ConfigFile::parse("edge.yaml", yaml).unwrap()], false).unwrap();
        assert_eq!(from_xds.dump(), from_yaml.dump());
        let request = |entries: &[(&str, &str)]| Request {
            entries: entries
                .iter()
                .map(|(k, v)| Entry { key: k.to_string(), value: v.to_string() })
                .collect(),
            ..Default::default()
        };
        for entries in [&[("k1", "v1")][..], &[("k1", "v1"), ("k2", "x")], &[("open", "y")]] {
            let (a, b) = (
                from_xds.get_limit("edge", &request(entries)),
                from_yaml.get_limit("edge", &request(entries)),
            );
            assert_eq!(format!("{a:?}"), format!("{b:?}"), "{entries:?}");
            assert!(a.is_some());
        }
        let weekly = from_xds.get_limit("edge", &request(&[("k1", "v1"), ("k2", "x")])).unwrap();
        assert_eq!(
            (weekly.unit, weekly.name.as_str(), &weekly.replaces[..]),
            (Unit::Week, "weekly", &["daily".to_owned()][..])
        );
        assert!(weekly.shadow_mode && weekly.detailed_metric);
        let k1 = from_xds.get_limit("edge", &request(&[("k1", "v1")])).unwrap();
        assert!(k1.quota_mode);
        assert_eq!(k1.metadata.unwrap().fields["n"], number(1.5));
    }

    /// What Go's loader refuses in a resource, ours refuses with the same words, the file named
    /// by the resource's `name`.
    #[test]
    fn a_bad_resource_is_refused_with_gos_words() {
        let load = |descriptors: Vec<RateLimitDescriptor>| {
            let resource = RateLimitConfig { name: "cfg".into(), domain: "d".into(), descriptors };
            Loaded::new(&[ConfigFile::from_xds(&resource)], false).unwrap_err().to_string()
        };
        let limited = |unit: i32| RateLimitDescriptor {
            key: "k".into(),
            rate_limit: Some(RateLimitPolicy { unit, requests_per_unit: 1, ..Default::default() }),
            ..Default::default()
        };
        assert_eq!(load(vec![limited(0)]), "cfg: invalid rate limit unit 'UNKNOWN'");
        assert_eq!(load(vec![limited(42)]), "cfg: invalid rate limit unit '42'");
        let unlimited_with_unit = RateLimitDescriptor {
            key: "k".into(),
            rate_limit: Some(RateLimitPolicy { unit: 1, unlimited: true, ..Default::default() }),
            ..Default::default()
        };
        assert_eq!(
            load(vec![unlimited_with_unit]),
            "cfg: should not specify rate limit unit when unlimited"
        );
        assert_eq!(
            load(vec![limited(1), limited(2)]),
            "cfg: duplicate descriptor composite key 'd.k'"
        );
        let resource = RateLimitConfig { name: "nameless".into(), ..Default::default() };
        let e = Loaded::new(&[ConfigFile::from_xds(&resource)], false).unwrap_err();
        assert_eq!(e.to_string(), "nameless: config file cannot have empty domain");
        let twice = RateLimitConfig { name: "b".into(), domain: "d".into(), descriptors: vec![] };
        let first = RateLimitConfig { name: "a".into(), ..twice.clone() };
        let files = [ConfigFile::from_xds(&first), ConfigFile::from_xds(&twice)];
        assert_eq!(
            Loaded::new(&files, false).unwrap_err().to_string(),
            "b: duplicate domain 'd' in config file"
        );
        assert!(Loaded::new(&files, true).is_ok());
    }

    #[test]
    fn the_node_is_gos() {
        let mut s = XdsSettings::new("cp:1", "n1");
        assert_eq!(node(&s).encode_to_vec(), [0x0a, 2, b'n', b'1', 0x1a, 0]);
        s.node_metadata.insert("k".into(), "v".into());
        let n = node(&s);
        assert_eq!(
            n.metadata.unwrap().fields["k"].kind,
            Some(prost_types::value::Kind::StringValue("v".into()))
        );
    }
}
