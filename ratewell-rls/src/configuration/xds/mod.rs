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

pub mod grpc;
pub mod proto;
mod settings;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prost::Message;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use crate::configuration::config::ConfigFile;
use crate::configuration::xds::grpc::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use crate::configuration::xds::proto::{
    DiscoveryRequest, DiscoveryResponse, Node, RATE_LIMIT_CONFIG_TYPE_URL, RateLimitConfig, Status,
};
use crate::configuration::xds::settings::metadata;
pub use crate::configuration::xds::settings::{XdsBackoff, XdsSettings, XdsTls};
use crate::telemetry::logging::LogLevel;

/// The `google.rpc.Code` of a NACK's `error_detail`: go-control-plane's ADS client (which the Go
/// service uses) sets only the message, so the code is 0 and the control plane sees what it
/// sees from the Go service. Control planes tell a NACK by `error_detail` being present.
pub const NACK_CODE: i32 = 0;

/// The message name a resource's `type_url` must end with.
const RESOURCE_NAME: &str = "ratelimit.config.ratelimit.v3.RateLimitConfig";

/// The longest a TCP connect and TLS handshake may take: gRPC's minimum connect timeout
/// (grpc-go's `minConnectTimeout`, 20 s).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);

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
mod tests;
