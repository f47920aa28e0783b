//! The xDS client's settings: envoyproxy/ratelimit's `CONFIG_GRPC_XDS_*` and `XDS_CLIENT_*`
//! variables, read as the Go service reads them.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::Duration;

use tonic::metadata::{MetadataKey, MetadataValue};

use crate::env::{parse_bool, parse_duration};

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
pub(super) fn metadata(
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
