//! The service's settings: envoyproxy/ratelimit's environment variables, read as it reads them
//! (its `src/settings/settings.go`), and the ones this service adds. Every variable the Go
//! service reads is either supported, ignored with a startup message that names it, or refused
//! at startup: never silently ignored ([`Settings::from_env`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::redis_store::RedisSettings;
use crate::service::{Failover, ServiceSettings, default_header_names};

/// What is done with a variable the Go service reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Support {
    /// Read, with the Go service's meaning.
    Supported,
    /// Accepted and ignored, with a startup message saying why.
    Ignored(&'static str),
    /// Refused at startup when set to anything but its default (the message says why).
    Refused(&'static str),
}

/// Every variable of envoyproxy/ratelimit's settings, and what this service does with it.
pub const GO_VARIABLES: &[(&str, Support)] = &[
    ("HOST", Support::Supported),
    ("PORT", Support::Supported),
    ("DEBUG_HOST", Support::Supported),
    ("DEBUG_PORT", Support::Supported),
    ("GRPC_HOST", Support::Supported),
    ("GRPC_PORT", Support::Supported),
    ("GRPC_UDS", Support::Supported),
    ("GRPC_MAX_CONNECTION_AGE", Support::Supported),
    ("GRPC_MAX_CONNECTION_AGE_GRACE", Support::Supported),
    ("GRPC_SERVER_USE_TLS", Support::Supported),
    ("GRPC_SERVER_TLS_CERT", Support::Supported),
    ("GRPC_SERVER_TLS_KEY", Support::Supported),
    ("GRPC_CLIENT_TLS_CACERT", Support::Supported),
    ("GRPC_CLIENT_TLS_SAN", Support::Supported),
    ("LOG_LEVEL", Support::Supported),
    ("LOG_FORMAT", Support::Supported),
    ("CONFIG_TYPE", Support::Supported),
    ("FORCE_START_WITHOUT_INITIAL_CONFIG", Support::Supported),
    ("CONFIG_GRPC_XDS_NODE_ID", Support::Supported),
    ("CONFIG_GRPC_XDS_NODE_METADATA", Support::Supported),
    ("CONFIG_GRPC_XDS_SERVER_URL", Support::Supported),
    ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", Support::Supported),
    ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", Support::Supported),
    ("CONFIG_GRPC_XDS_SERVER_USE_TLS", Support::Supported),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", Support::Supported),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", Support::Supported),
    ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", Support::Supported),
    ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", Support::Supported),
    ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", Support::Supported),
    ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", Support::Supported),
    ("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", Support::Supported),
    ("XDS_CLIENT_BACKOFF_JITTER", Support::Supported),
    ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", Support::Supported),
    ("USE_DOG_STATSD", Support::Supported),
    ("USE_DOG_STATSD_MOGRIFIERS", Support::Supported),
    ("USE_STATSD", Support::Supported),
    ("STATSD_HOST", Support::Supported),
    ("STATSD_PORT", Support::Supported),
    ("EXTRA_TAGS", Support::Supported),
    ("STATS_FLUSH_INTERVAL", Support::Supported),
    ("DISABLE_STATS", Support::Supported),
    ("USE_PROMETHEUS", Support::Supported),
    ("PROMETHEUS_ADDR", Support::Supported),
    ("PROMETHEUS_PATH", Support::Supported),
    ("PROMETHEUS_MAPPER_YAML", Support::Supported),
    (
        "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
        Support::Ignored("the response time is in seconds"),
    ),
    ("RUNTIME_ROOT", Support::Supported),
    ("RUNTIME_SUBDIRECTORY", Support::Supported),
    ("RUNTIME_APPDIRECTORY", Support::Supported),
    ("RUNTIME_IGNOREDOTFILES", Support::Supported),
    ("RUNTIME_WATCH_ROOT", Support::Supported),
    (
        "EXPIRATION_JITTER_MAX_SECONDS",
        Support::Ignored("keys expire at their window's end, set by the script"),
    ),
    (
        "LOCAL_CACHE_SIZE_IN_BYTES",
        Support::Ignored(
            "every decision is made by the store: in process, or one script call on Redis",
        ),
    ),
    ("NEAR_LIMIT_RATIO", Support::Supported),
    ("CACHE_KEY_PREFIX", Support::Supported),
    ("BACKEND_TYPE", Support::Supported),
    (
        "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
        Support::Ignored("a denied request charges no descriptor, always"),
    ),
    ("LIMIT_RESPONSE_HEADERS_ENABLED", Support::Supported),
    ("LIMIT_LIMIT_HEADER", Support::Supported),
    ("LIMIT_REMAINING_HEADER", Support::Supported),
    ("LIMIT_RESET_HEADER", Support::Supported),
    ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", Support::Supported),
    ("REDIS_SOCKET_TYPE", Support::Supported),
    ("REDIS_TYPE", Support::Supported),
    ("REDIS_URL", Support::Supported),
    ("REDIS_POOL_SIZE", Support::Ignored("one multiplexed connection carries every call")),
    ("REDIS_AUTH", Support::Supported),
    ("REDIS_TLS", Support::Supported),
    ("REDIS_TLS_CLIENT_CERT", Support::Supported),
    ("REDIS_TLS_CLIENT_KEY", Support::Supported),
    ("REDIS_TLS_CACERT", Support::Supported),
    ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", Support::Supported),
    (
        "REDIS_PIPELINE_WINDOW",
        Support::Ignored("the multiplexed connection pipelines every call as it is made"),
    ),
    (
        "REDIS_PIPELINE_LIMIT",
        Support::Ignored("no effect in the Go service either since its radix v4"),
    ),
    ("REDIS_CLUSTER_PIPELINE_PARALLELISM", Support::Ignored("one script call per request")),
    ("REDIS_PERSECOND", Support::Supported),
    ("REDIS_PERSECOND_SOCKET_TYPE", Support::Supported),
    ("REDIS_PERSECOND_TYPE", Support::Supported),
    ("REDIS_PERSECOND_URL", Support::Supported),
    (
        "REDIS_PERSECOND_POOL_SIZE",
        Support::Ignored("one multiplexed connection carries every call"),
    ),
    ("REDIS_PERSECOND_AUTH", Support::Supported),
    ("REDIS_PERSECOND_TLS", Support::Supported),
    ("REDIS_SENTINEL_AUTH", Support::Supported),
    ("REDIS_PERSECOND_SENTINEL_AUTH", Support::Supported),
    (
        "REDIS_PERSECOND_PIPELINE_WINDOW",
        Support::Ignored("the multiplexed connection pipelines every call as it is made"),
    ),
    (
        "REDIS_PERSECOND_PIPELINE_LIMIT",
        Support::Ignored("no effect in the Go service either since its radix v4"),
    ),
    (
        "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM",
        Support::Ignored("one script call per request"),
    ),
    (
        "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
        Support::Ignored(
            "a store that does not answer is failed over (REDIS_FAILOVER), not reported unhealthy",
        ),
    ),
    ("REDIS_TIMEOUT", Support::Supported),
    ("REDIS_PERSECOND_TIMEOUT", Support::Supported),
    (
        "REDIS_POOL_ON_EMPTY_BEHAVIOR",
        Support::Ignored("one multiplexed connection: no pool to run empty"),
    ),
    (
        "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
        Support::Ignored("one multiplexed connection: no pool to run empty"),
    ),
    (
        "REDIS_STARTUP_INITIAL_INTERVAL",
        Support::Ignored("the service starts with the store down and reconnects in the background"),
    ),
    (
        "REDIS_STARTUP_MAX_INTERVAL",
        Support::Ignored("the service starts with the store down and reconnects in the background"),
    ),
    (
        "REDIS_STARTUP_MAX_ELAPSED_TIME",
        Support::Ignored("the service starts with the store down and reconnects in the background"),
    ),
    ("MEMCACHE_HOST_PORT", Support::Ignored("no memcache backend")),
    ("MEMCACHE_MAX_IDLE_CONNS", Support::Ignored("no memcache backend")),
    ("MEMCACHE_SRV", Support::Ignored("no memcache backend")),
    ("MEMCACHE_SRV_REFRESH", Support::Ignored("no memcache backend")),
    ("MEMCACHE_TLS", Support::Ignored("no memcache backend")),
    ("MEMCACHE_TLS_CLIENT_CERT", Support::Ignored("no memcache backend")),
    ("MEMCACHE_TLS_CLIENT_KEY", Support::Ignored("no memcache backend")),
    ("MEMCACHE_TLS_CACERT", Support::Ignored("no memcache backend")),
    ("MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", Support::Ignored("no memcache backend")),
    ("SHADOW_MODE", Support::Supported),
    ("QUOTA_MODE", Support::Supported),
    ("RESPONSE_DYNAMIC_METADATA", Support::Supported),
    ("MERGE_DOMAIN_CONFIG", Support::Supported),
    ("TRACING_ENABLED", Support::Supported),
    ("TRACING_SERVICE_NAME", Support::Supported),
    ("TRACING_SERVICE_NAMESPACE", Support::Supported),
    ("TRACING_SERVICE_INSTANCE_ID", Support::Supported),
    ("TRACING_EXPORTER_PROTOCOL", Support::Supported),
    ("TRACING_SAMPLING_RATE", Support::Supported),
];

/// The variables this service adds.
pub const OWN_VARIABLES: &[(&str, &str)] = &[
    (
        "GRPC_SERVER_TLS_CA_CERT",
        "Envoy Gateway's name for the client CA (the Go service reads none by it): read as GRPC_CLIENT_TLS_CACERT when that is not set, so a client without a certificate from it is refused",
    ),
    (
        "MEMORY_CAPACITY",
        "keys the memory store holds (16 bytes each, allocated at start; default 1000000)",
    ),
    (
        "MAX_STATS_KEYS",
        "distinct per-rule statistics keys kept (default 10000; the rest are counted under key1=\"_overflow\")",
    ),
    (
        "RELOAD_INTERVAL",
        "how often the configuration directory is checked for changes (default 200ms)",
    ),
    (
        "REDIS_FAILOVER",
        "with BACKEND_TYPE=redis, the answer when the server cannot decide within REDIS_TIMEOUT: error (default: gRPC UNAVAILABLE, as the Go service), open (OK) or closed (OVER_LIMIT)",
    ),
    (
        "STATE_FILE",
        "with BACKEND_TYPE=memory, a file that keeps the counts across restarts: read at start (if it exists), written every STATE_INTERVAL and at shutdown (default: none)",
    ),
    ("STATE_INTERVAL", "how often STATE_FILE is written (default 10s)"),
];

/// The variables only the Redis store reads: named as ignored with the memory store.
const REDIS_ONLY: &[&str] = &[
    "REDIS_SOCKET_TYPE",
    "REDIS_TYPE",
    "REDIS_URL",
    "REDIS_AUTH",
    "REDIS_TIMEOUT",
    "CACHE_KEY_PREFIX",
    "REDIS_FAILOVER",
    "REDIS_SENTINEL_AUTH",
    "REDIS_TLS",
    "REDIS_TLS_CLIENT_CERT",
    "REDIS_TLS_CLIENT_KEY",
    "REDIS_TLS_CACERT",
    "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
    "REDIS_PERSECOND",
    "REDIS_PERSECOND_SOCKET_TYPE",
    "REDIS_PERSECOND_TYPE",
    "REDIS_PERSECOND_URL",
    "REDIS_PERSECOND_AUTH",
    "REDIS_PERSECOND_TLS",
    "REDIS_PERSECOND_SENTINEL_AUTH",
    "REDIS_PERSECOND_TIMEOUT",
];

/// The values that a refused variable may still take (its default, or what means "off").
fn harmless(value: &str) -> bool {
    let v = value.trim();
    v.is_empty() || parse_bool(v) == Some(false)
}

/// A setting's value that does not parse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SettingsError(pub String);

impl std::fmt::Display for SettingsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SettingsError {}

/// The service's settings.
#[derive(Clone, Debug)]
pub struct Settings {
    /// `HOST:PORT`: `/healthcheck` and `POST /json`.
    pub http: SocketAddr,
    /// `GRPC_HOST:GRPC_PORT`: the rate limit and health services.
    pub grpc: SocketAddr,
    /// `GRPC_UDS`: the gRPC server listens on this unix socket instead of `grpc` (as in Go).
    pub grpc_uds: Option<PathBuf>,
    /// `DEBUG_HOST:DEBUG_PORT`: `/rlconfig`.
    pub debug: SocketAddr,
    /// `GRPC_MAX_CONNECTION_AGE` and `GRPC_MAX_CONNECTION_AGE_GRACE` (Go defaults 24h and 1h):
    /// a gRPC connection is sent a GOAWAY at that age, and closed after the grace, so that
    /// Envoy's long-lived connections spread again over the replicas.
    pub grpc_max_connection_age: (Duration, Duration),
    /// `GRPC_SERVER_USE_TLS`: TLS on the gRPC server, mutual with a client CA.
    pub tls: Option<crate::tls::ServerTls>,
    /// Which store decides, and why, for the startup log line.
    pub backend: String,
    /// `CONFIG_TYPE=GRPC_XDS_SOTW`: the configuration comes from an xDS control plane, not from
    /// the directory.
    pub xds: Option<crate::xds::XdsSettings>,
    /// `USE_STATSD` (the Go default) or `USE_DOG_STATSD`: where statistics are sent.
    pub statsd: Option<crate::statsd::StatsdSettings>,
    /// `PROMETHEUS_ADDR` and `PROMETHEUS_PATH` when `USE_PROMETHEUS`.
    pub prometheus: Option<(SocketAddr, String)>,
    /// The configuration directory: `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY`.
    pub runtime_root: PathBuf,
    /// `RUNTIME_SUBDIRECTORY` and `RUNTIME_APPDIRECTORY` joined.
    pub runtime_dir: PathBuf,
    /// `RUNTIME_WATCH_ROOT`: watch the root (a symlink swapped to a new directory) rather than
    /// the files of the directory.
    pub watch_root: bool,
    /// `RUNTIME_IGNOREDOTFILES`.
    pub ignore_dotfiles: bool,
    /// `MERGE_DOMAIN_CONFIG`.
    pub merge_domains: bool,
    /// `FORCE_START_WITHOUT_INITIAL_CONFIG`.
    pub force_start: bool,
    /// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`.
    pub healthy_with_config: bool,
    /// `MEMORY_CAPACITY`.
    pub memory_capacity: usize,
    /// `BACKEND_TYPE=redis`: where the server is (`None`: decide in process).
    pub redis: Option<crate::redis_store::RedisSettings>,
    /// `RELOAD_INTERVAL`.
    pub reload_interval: Duration,
    /// `STATE_FILE` (memory store only).
    pub state_file: Option<PathBuf>,
    /// `STATE_INTERVAL`.
    pub state_interval: Duration,
    /// `LOG_LEVEL`: `debug`, `info`, `warn` (default) or `error`.
    pub log_level: LogLevel,
    /// `LOG_FORMAT=json`: log lines as JSON objects with the Go service's field names
    /// ([`crate::logging`]); anything else is plain text, as in Go.
    pub log_json: bool,
    /// What the service itself reads.
    pub service: ServiceSettings,
    /// `TRACING_ENABLED`: spans sent over OTLP ([`crate::otel`]).
    pub tracing: Option<crate::otel::TracingSettings>,
    /// Startup messages: the variables set that are ignored, and why.
    pub notices: Vec<String>,
}

/// How much the service logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    /// Every configuration load and request error.
    Debug,
    /// Configuration loads.
    Info,
    /// Refused configurations and startup notices.
    Warn,
    /// Errors only.
    Error,
}

/// Go's `strconv.ParseBool`.
fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// A Go duration (`10s`, `250ms`, `1h30m`), the subset of units a setting uses.
pub fn parse_duration(v: &str) -> Option<Duration> {
    let mut total = Duration::ZERO;
    let mut rest = v.trim();
    if rest == "0" {
        return Some(Duration::ZERO);
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(rest.len());
        let (number, tail) = rest.split_at(digits);
        let number: f64 = number.parse().ok()?;
        let unit_len = tail.find(|c: char| c.is_ascii_digit()).unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += Duration::try_from_secs_f64(number * scale).ok()?;
        rest = tail;
    }
    Some(total)
}

struct Env<'a>(&'a HashMap<String, String>);

impl Env<'_> {
    fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    fn string(&self, name: &str, default: &str) -> String {
        self.get(name).unwrap_or(default).to_owned()
    }

    fn flag(&self, name: &str, default: bool) -> Result<bool, SettingsError> {
        match self.get(name) {
            None | Some("") => Ok(default),
            Some(v) => parse_bool(v)
                .ok_or_else(|| SettingsError(format!("{name}={v}: not a boolean (true or false)"))),
        }
    }

    fn number<T: std::str::FromStr>(&self, name: &str, default: T) -> Result<T, SettingsError> {
        match self.get(name) {
            None | Some("") => Ok(default),
            Some(v) => {
                v.trim().parse().map_err(|_| SettingsError(format!("{name}={v}: not a number")))
            }
        }
    }

    fn addr(
        &self,
        host: &str,
        port: &str,
        defaults: (&str, u16),
    ) -> Result<SocketAddr, SettingsError> {
        let h = self.string(host, defaults.0);
        let p: u16 = self.number(port, defaults.1)?;
        if let Ok(ip) = h.parse::<std::net::IpAddr>() {
            return Ok(SocketAddr::new(ip, p));
        }
        // A host name, as the Go service takes one: its first address.
        let mut resolved = std::net::ToSocketAddrs::to_socket_addrs(&(h.as_str(), p))
            .map_err(|e| SettingsError(format!("{host}={h}: not an address: {e}")))?;
        resolved.next().ok_or_else(|| SettingsError(format!("{host}={h}: resolves to no address")))
    }
}

/// The Redis store's settings, read as the Go service reads them: `REDIS_SOCKET_TYPE` (`tcp`
/// or `unix`) and `REDIS_URL` (`host:port`, a socket's path, a comma-separated list of
/// `host:port` for `REDIS_TYPE=CLUSTER`, or `name,host:port,...` for `REDIS_TYPE=SENTINEL`), or
/// a `redis://` URL; `REDIS_AUTH` (`password` or `user:password`); `REDIS_SENTINEL_AUTH`;
/// `REDIS_TLS` with `REDIS_TLS_*`; `REDIS_TIMEOUT` (default 50ms here: see the README). With
/// `REDIS_PERSECOND`, the same under `REDIS_PERSECOND_` for the per-second server (TLS with the
/// same `REDIS_TLS_*` files, as in Go).
fn redis_settings(e: &Env<'_>) -> Result<RedisSettings, SettingsError> {
    let mut main = redis_server(e, "REDIS_", "/var/run/nutcracker/ratelimit.sock")?;
    if e.flag("REDIS_PERSECOND", false)? {
        let per_second =
            redis_server(e, "REDIS_PERSECOND_", "/var/run/nutcracker/ratelimitpersecond.sock")?;
        main.per_second = Some(Box::new(per_second));
    }
    Ok(main)
}

/// Go's `REDIS_TLS_*` files, read now: a file that cannot be read stops the start (as in Go).
fn redis_tls(e: &Env<'_>) -> Result<ratewell_redis::Tls, SettingsError> {
    let read = |name: &str| -> Result<Option<Vec<u8>>, SettingsError> {
        match e.get(name).filter(|p| !p.is_empty()) {
            None => Ok(None),
            Some(path) => std::fs::read(path)
                .map(Some)
                .map_err(|err| SettingsError(format!("{name}={path}: cannot be read: {err}"))),
        }
    };
    let client = match (read("REDIS_TLS_CLIENT_CERT")?, read("REDIS_TLS_CLIENT_KEY")?) {
        (Some(cert), Some(key)) => Some((cert, key)),
        // As Go's TlsConfigFromFiles: a pair is loaded only when both are given.
        _ => None,
    };
    Ok(ratewell_redis::Tls {
        ca: read("REDIS_TLS_CACERT")?,
        client,
        skip_hostname_verification: e.flag("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", false)?,
    })
}

/// `user:password` (split at the first `:`, as Go's `strings.Cut`) or a password alone.
fn credentials(auth: &str) -> (Option<String>, Option<String>) {
    match auth.split_once(':') {
        _ if auth.is_empty() => (None, None),
        Some((user, password)) => (Some(user.to_owned()), Some(password.to_owned())),
        None => (None, Some(auth.to_owned())),
    }
}

/// One server's settings under `p` (`REDIS_` or `REDIS_PERSECOND_`).
fn redis_server(e: &Env<'_>, p: &str, default_url: &str) -> Result<RedisSettings, SettingsError> {
    let var = |name: &str| format!("{p}{name}");
    let kind = e.string(&var("TYPE"), "SINGLE").to_ascii_uppercase();
    let (cluster, sentinel) = match kind.as_str() {
        "SINGLE" => (false, false),
        "CLUSTER" => (true, false),
        "SENTINEL" => (false, true),
        other => {
            return Err(SettingsError(format!(
                "{}={other} is not supported: SINGLE, CLUSTER or SENTINEL",
                var("TYPE")
            )));
        }
    };
    let tls = if e.flag(&var("TLS"), false)? { Some(redis_tls(e)?) } else { None };
    let socket = e.string(&var("SOCKET_TYPE"), "unix").to_ascii_lowercase();
    let auth = e.string(&var("AUTH"), "");
    let raw = e.string(&var("URL"), default_url);
    let userinfo = |auth: &str| match credentials(auth) {
        (Some(user), Some(password)) => format!("{}:{}@", url_escape(&user), url_escape(&password)),
        (None, Some(password)) => format!(":{}@", url_escape(&password)),
        _ => String::new(),
    };
    let url_of = |one: &str| -> Result<String, SettingsError> {
        let one = one.trim();
        if one.contains("://") {
            return Ok(one.to_owned());
        }
        match socket.as_str() {
            "tcp" => Ok(format!("redis://{}{one}", userinfo(&auth))),
            "unix" if cluster => Err(SettingsError(format!(
                "{}=CLUSTER needs {}=tcp",
                var("TYPE"),
                var("SOCKET_TYPE")
            ))),
            "unix" if tls.is_some() => Err(SettingsError(format!(
                "{}: TLS to Redis needs {}=tcp",
                var("TLS"),
                var("SOCKET_TYPE")
            ))),
            "unix" if auth.is_empty() => Ok(format!("unix://{one}")),
            "unix" => Ok(format!(
                "unix://{one}?pass={}",
                url_escape(auth.rsplit(':').next().unwrap_or(""))
            )),
            other => Err(SettingsError(format!("{}={other}: tcp or unix", var("SOCKET_TYPE")))),
        }
    };
    let (urls, sentinel) = if sentinel {
        // Go's form: the primary's name, then the sentinels (always TCP), each reached with
        // REDIS_SENTINEL_AUTH; REDIS_AUTH is the primary's.
        let parts: Vec<&str> = raw.split(',').map(str::trim).collect();
        if parts.len() < 2 || parts[0].is_empty() {
            return Err(SettingsError(
                "Expected master name and a list of urls for the sentinels, in the format: <redis master name>,<sentinel1>,...,<sentineln>"
                    .into(),
            ));
        }
        let sentinel_auth = e.string(&var("SENTINEL_AUTH"), "");
        let urls: Vec<String> = parts[1..]
            .iter()
            .map(|a| {
                if a.contains("://") {
                    a.to_string()
                } else {
                    format!("redis://{}{a}", userinfo(&sentinel_auth))
                }
            })
            .collect();
        let (username, password) = credentials(&auth);
        let target = ratewell_redis::Sentinel {
            name: parts[0].to_owned(),
            sentinels: urls.clone(),
            username,
            password,
        };
        (urls, Some(target))
    } else if cluster {
        (raw.split(',').map(url_of).collect::<Result<Vec<_>, _>>()?, None)
    } else {
        (vec![url_of(&raw)?], None)
    };
    let timeout_text = e.string(&var("TIMEOUT"), "50ms");
    let timeout = parse_duration(&timeout_text).filter(|d| !d.is_zero()).ok_or_else(|| {
        SettingsError(format!("{}={timeout_text}: not a duration", var("TIMEOUT")))
    })?;
    Ok(RedisSettings {
        urls,
        cluster,
        sentinel,
        tls,
        timeout,
        prefix: e.string("CACHE_KEY_PREFIX", ""),
        per_second: None,
    })
}

/// `url` without its password, for a log line.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

/// Percent-encode what a URL's user information cannot hold as is.
fn url_escape(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl Settings {
    /// Read the settings from `env` (the process's environment, or a test's).
    pub fn from_env(env: &HashMap<String, String>) -> Result<Settings, SettingsError> {
        let e = Env(env);
        let mut notices = Vec::new();
        // The Go service's default is redis; here a bare start decides in process, and an
        // environment that names a Redis server (REDIS_URL) without BACKEND_TYPE decides there.
        let (backend, why) = match e.get("BACKEND_TYPE").filter(|b| !b.is_empty()) {
            Some(b) => (b.to_ascii_lowercase(), "BACKEND_TYPE"),
            None if e.get("REDIS_URL").is_some_and(|u| !u.is_empty()) => {
                ("redis".to_owned(), "REDIS_URL is set and BACKEND_TYPE is not")
            }
            None => ("memory".to_owned(), "the default: BACKEND_TYPE and REDIS_URL are not set"),
        };
        let redis = match backend.as_str() {
            "memory" => {
                for &name in REDIS_ONLY {
                    if e.get(name).is_some() {
                        notices.push(format!("{name} is ignored: BACKEND_TYPE is memory"));
                    }
                }
                None
            }
            "redis" => Some(redis_settings(&e)?),
            _ => {
                return Err(SettingsError(format!(
                    "BACKEND_TYPE={backend}: memory or redis (memcache is not supported)"
                )));
            }
        };
        let failover = match e.string("REDIS_FAILOVER", "error").to_ascii_lowercase().as_str() {
            "error" => Failover::Error,
            "open" => Failover::Open,
            "closed" => Failover::Closed,
            other => {
                return Err(SettingsError(format!(
                    "REDIS_FAILOVER={other}: error, open or closed"
                )));
            }
        };
        for &(name, support) in GO_VARIABLES {
            let Some(value) = e.get(name) else { continue };
            match support {
                Support::Supported => {}
                Support::Ignored(why) => notices.push(format!("{name} is ignored: {why}")),
                Support::Refused(why) if !harmless(value) => {
                    return Err(SettingsError(format!("{name}={value} is not supported: {why}")));
                }
                Support::Refused(why) => notices.push(format!("{name} is ignored: {why}")),
            }
        }
        let headers = if e.flag("LIMIT_RESPONSE_HEADERS_ENABLED", false)? {
            let [l, r, t] = default_header_names();
            Some([
                e.string("LIMIT_LIMIT_HEADER", &l),
                e.string("LIMIT_REMAINING_HEADER", &r),
                e.string("LIMIT_RESET_HEADER", &t),
            ])
        } else {
            None
        };
        let ratio: f32 = e.number("NEAR_LIMIT_RATIO", 0.8)?;
        if !(0.0..=1.0).contains(&ratio) {
            return Err(SettingsError(format!("NEAR_LIMIT_RATIO={ratio}: not between 0 and 1")));
        }
        let prometheus = if e.flag("USE_PROMETHEUS", false)? {
            let addr = e.string("PROMETHEUS_ADDR", ":9090");
            let addr = if addr.starts_with(':') { format!("0.0.0.0{addr}") } else { addr };
            let addr: SocketAddr = addr
                .parse()
                .map_err(|_| SettingsError(format!("PROMETHEUS_ADDR={addr}: not an address")))?;
            if let Some(path) = e.get("PROMETHEUS_MAPPER_YAML").filter(|p| !p.is_empty()) {
                let text = std::fs::read_to_string(path).map_err(|err| {
                    SettingsError(format!("PROMETHEUS_MAPPER_YAML={path}: cannot be read: {err}"))
                })?;
                let n = crate::mapper::check(path, &text).map_err(SettingsError)?;
                notices.push(format!(
                    "PROMETHEUS_MAPPER_YAML={path}: its {n} mappings name the series served \
                     already, under the same names and labels"
                ));
            }
            Some((addr, e.string("PROMETHEUS_PATH", "/metrics")))
        } else {
            if e.get("PROMETHEUS_MAPPER_YAML").is_some_and(|p| !p.is_empty()) {
                notices.push("PROMETHEUS_MAPPER_YAML is ignored: USE_PROMETHEUS is off".into());
            }
            None
        };
        let log_level = match e.string("LOG_LEVEL", "WARN").to_ascii_uppercase().as_str() {
            "DEBUG" | "TRACE" => LogLevel::Debug,
            "INFO" => LogLevel::Info,
            "WARN" | "WARNING" => LogLevel::Warn,
            "ERROR" | "FATAL" | "PANIC" => LogLevel::Error,
            other => return Err(SettingsError(format!("LOG_LEVEL={other}: not a level"))),
        };
        let reload = e.string("RELOAD_INTERVAL", "200ms");
        let reload_interval = parse_duration(&reload)
            .filter(|d| !d.is_zero())
            .ok_or_else(|| SettingsError(format!("RELOAD_INTERVAL={reload}: not a duration")))?;
        let state = e.string("STATE_INTERVAL", "10s");
        let state_interval = parse_duration(&state)
            .filter(|d| !d.is_zero())
            .ok_or_else(|| SettingsError(format!("STATE_INTERVAL={state}: not a duration")))?;
        let state_file = e.get("STATE_FILE").filter(|f| !f.is_empty()).map(PathBuf::from);
        if state_file.is_some() && redis.is_some() {
            notices.push(
                "STATE_FILE is ignored: BACKEND_TYPE is redis (the server keeps the counts)".into(),
            );
        }
        let state_file = state_file.filter(|_| redis.is_none());
        let backend = match &redis {
            None => format!("deciding in process (BACKEND_TYPE=memory: {why})"),
            Some(r) => format!("deciding on Redis at {} (BACKEND_TYPE=redis: {why})", r.describe()),
        };
        let tls = crate::tls::ServerTls::from_env(env).map_err(SettingsError)?;
        if tls.is_some() && e.get("GRPC_UDS").is_some_and(|p| !p.is_empty()) {
            return Err(SettingsError(
                "GRPC_UDS with GRPC_SERVER_USE_TLS is not supported: TLS is served on GRPC_PORT only"
                    .into(),
            ));
        }
        let age = |name: &str, default: &str| {
            let text = e.string(name, default);
            parse_duration(&text)
                .filter(|d| !d.is_zero())
                .ok_or_else(|| SettingsError(format!("{name}={text}: not a duration")))
        };
        let grpc_max_connection_age =
            (age("GRPC_MAX_CONNECTION_AGE", "24h")?, age("GRPC_MAX_CONNECTION_AGE_GRACE", "1h")?);
        let statsd = crate::statsd::StatsdSettings::from_env(env).map_err(SettingsError)?;
        match e.string("CONFIG_TYPE", "FILE").as_str() {
            "FILE" | "GRPC_XDS_SOTW" => {}
            other => {
                return Err(SettingsError(format!(
                    "CONFIG_TYPE={other}: FILE (the default) or GRPC_XDS_SOTW"
                )));
            }
        }
        let xds = crate::xds::XdsSettings::from_env(env).map_err(SettingsError)?;
        let runtime_dir = PathBuf::from(e.string("RUNTIME_SUBDIRECTORY", ""))
            .join(e.string("RUNTIME_APPDIRECTORY", "config"));
        Ok(Settings {
            http: e.addr("HOST", "PORT", ("0.0.0.0", 8080))?,
            grpc: e.addr("GRPC_HOST", "GRPC_PORT", ("0.0.0.0", 8081))?,
            grpc_uds: e.get("GRPC_UDS").filter(|p| !p.is_empty()).map(PathBuf::from),
            debug: e.addr("DEBUG_HOST", "DEBUG_PORT", ("0.0.0.0", 6070))?,
            grpc_max_connection_age,
            tls,
            backend,
            statsd,
            xds,
            prometheus,
            runtime_root: PathBuf::from(e.string("RUNTIME_ROOT", "/srv/runtime_data/current")),
            runtime_dir,
            watch_root: e.flag("RUNTIME_WATCH_ROOT", true)?,
            ignore_dotfiles: e.flag("RUNTIME_IGNOREDOTFILES", false)?,
            merge_domains: e.flag("MERGE_DOMAIN_CONFIG", false)?,
            force_start: e.flag("FORCE_START_WITHOUT_INITIAL_CONFIG", false)?,
            healthy_with_config: e.flag("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", false)?,
            memory_capacity: e.number("MEMORY_CAPACITY", 1_000_000)?,
            redis,
            reload_interval,
            state_file,
            state_interval,
            log_level,
            log_json: e.string("LOG_FORMAT", "text").eq_ignore_ascii_case("json"),
            service: ServiceSettings {
                shadow_mode: e.flag("SHADOW_MODE", false)?,
                quota_mode: e.flag("QUOTA_MODE", false)?,
                near_limit_ratio: ratio,
                headers,
                dynamic_metadata: e.flag("RESPONSE_DYNAMIC_METADATA", false)?,
                max_stats_keys: e.number("MAX_STATS_KEYS", crate::stats::DEFAULT_MAX_STATS_KEYS)?,
                failover,
            },
            tracing: crate::otel::TracingSettings::from_env(env).map_err(SettingsError)?,
            notices,
        })
    }

    /// The configuration directory (`RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY`).
    pub fn config_dir(&self) -> PathBuf {
        self.runtime_root.join(&self.runtime_dir)
    }
}

/// What `--help` prints: every variable read, and what is done with the Go service's others.
pub fn help() -> String {
    let mut out = String::from(
        "ratewell-rls: an Envoy rate limit service (envoy.service.ratelimit.v3) that reads\n\
         envoyproxy/ratelimit's configuration, decided exactly by the ratewell engine.\n\n\
         Usage: ratewell-rls [--help]\n       ratewell-rls check -config_dir DIR [-merge_domain_configs]\n         (envoyproxy/ratelimit's config_check: exit 0 if the configuration loads, else 1)\n\n\
         Configured by environment variables, as envoyproxy/ratelimit is.\n\nSupported:\n",
    );
    for (name, support) in GO_VARIABLES {
        if *support == Support::Supported {
            out.push_str(&format!("  {name}\n"));
        }
    }
    out.push_str("\nAdded by this service:\n");
    for (name, what) in OWN_VARIABLES {
        out.push_str(&format!("  {name}: {what}\n"));
    }
    out.push_str("\nRead by envoyproxy/ratelimit and ignored here (named at startup when set):\n");
    for (name, support) in GO_VARIABLES {
        if let Support::Ignored(why) = support {
            out.push_str(&format!("  {name}: {why}\n"));
        }
    }
    let refused: Vec<_> = GO_VARIABLES
        .iter()
        .filter_map(|(name, support)| match support {
            Support::Refused(why) => Some(format!("  {name}: {why}\n")),
            _ => None,
        })
        .collect();
    if !refused.is_empty() {
        out.push_str("\nRefused at startup unless off:\n");
        out.extend(refused);
    }
    out.push_str(
        "\nBACKEND_TYPE: memory or redis (envoyproxy/ratelimit's default); unset, redis when\n\
         REDIS_URL is set, else memory.\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn defaults_are_the_go_services() {
        let s = Settings::from_env(&env(&[])).unwrap();
        assert_eq!(s.grpc.port(), 8081);
        assert_eq!(s.http.port(), 8080);
        assert_eq!(s.debug.port(), 6070);
        assert_eq!(s.config_dir(), PathBuf::from("/srv/runtime_data/current/config"));
        assert!(s.watch_root && s.prometheus.is_none() && s.notices.is_empty());
    }

    #[test]
    fn unsupported_variables_are_named() {
        let s = Settings::from_env(&env(&[
            ("REDIS_POOL_SIZE", "10"),
            ("LOCAL_CACHE_SIZE_IN_BYTES", "100"),
        ]))
        .unwrap();
        assert_eq!(s.notices.len(), 2);
        assert!(
            s.notices[0].starts_with("LOCAL_CACHE_SIZE_IN_BYTES is ignored")
                || s.notices[1].starts_with("LOCAL_CACHE_SIZE_IN_BYTES is ignored")
        );
        let s = Settings::from_env(&env(&[("CONFIG_TYPE", "GRPC_XDS_SOTW")])).unwrap();
        assert_eq!(s.xds.unwrap().server_url, "localhost:18000", "the Go default");
        let e = Settings::from_env(&env(&[("CONFIG_TYPE", "GRPC_XDS_DELTA")])).unwrap_err();
        assert_eq!(e.0, "CONFIG_TYPE=GRPC_XDS_DELTA: FILE (the default) or GRPC_XDS_SOTW");
        assert!(Settings::from_env(&env(&[("CONFIG_TYPE", "FILE")])).unwrap().xds.is_none());
        assert!(Settings::from_env(&env(&[("TRACING_ENABLED", "false")])).is_ok());
        let e = Settings::from_env(&env(&[("BACKEND_TYPE", "memcache")])).unwrap_err();
        assert!(e.0.contains("BACKEND_TYPE=memcache"), "{e}");
        let e = Settings::from_env(&env(&[("BACKEND_TYPE", "redis"), ("REDIS_TYPE", "SENTINEL")]))
            .unwrap_err();
        assert!(e.0.starts_with("Expected master name and a list of urls"), "{e}");
        let e = Settings::from_env(&env(&[("BACKEND_TYPE", "redis"), ("REDIS_TYPE", "ring")]))
            .unwrap_err();
        assert_eq!(e.0, "REDIS_TYPE=RING is not supported: SINGLE, CLUSTER or SENTINEL");
        let e = Settings::from_env(&env(&[("SHADOW_MODE", "yes")])).unwrap_err();
        assert_eq!(e.0, "SHADOW_MODE=yes: not a boolean (true or false)");
    }

    #[test]
    fn redis_urls_are_read_as_the_go_service_reads_them() {
        let redis = |pairs: &[(&str, &str)]| {
            let mut all = vec![("BACKEND_TYPE", "redis")];
            all.extend_from_slice(pairs);
            Settings::from_env(&env(&all)).unwrap().redis.unwrap()
        };
        let r = redis(&[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "localhost:6379"),
            ("REDIS_AUTH", "p@ss"),
        ]);
        assert_eq!(r.urls, ["redis://:p%40ss@localhost:6379"]);
        assert_eq!(r.timeout, Duration::from_millis(50));
        let r = redis(&[("REDIS_SOCKET_TYPE", "tcp"), ("REDIS_AUTH", "user:pw")]);
        assert_eq!(r.urls, ["redis://user:pw@/var/run/nutcracker/ratelimit.sock"]);
        let r = redis(&[]);
        assert_eq!(r.urls, ["unix:///var/run/nutcracker/ratelimit.sock"]);
        let r = redis(&[
            ("REDIS_TYPE", "cluster"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "a:1, b:2"),
            ("REDIS_TIMEOUT", "20ms"),
        ]);
        assert_eq!(
            (r.urls.clone(), r.cluster, r.timeout),
            (
                vec!["redis://a:1".to_string(), "redis://b:2".to_string()],
                true,
                Duration::from_millis(20)
            )
        );
        let r = redis(&[("REDIS_URL", "redis://127.0.0.1:7000/2"), ("CACHE_KEY_PREFIX", "rl:")]);
        assert_eq!((r.urls[0].as_str(), r.prefix.as_str()), ("redis://127.0.0.1:7000/2", "rl:"));
        let e =
            Settings::from_env(&env(&[("BACKEND_TYPE", "memory"), ("REDIS_URL", "x")])).unwrap();
        assert_eq!(e.notices, ["REDIS_URL is ignored: BACKEND_TYPE is memory"]);
    }

    #[test]
    fn the_backend_follows_the_go_default_where_a_redis_is_named() {
        let s = Settings::from_env(&env(&[])).unwrap();
        assert!(s.redis.is_none());
        assert!(s.backend.starts_with("deciding in process"), "{}", s.backend);
        let s = Settings::from_env(&env(&[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "redis.redis.svc:6379"),
            ("REDIS_AUTH", "secret"),
        ]))
        .unwrap();
        assert_eq!(s.redis.unwrap().urls, ["redis://:secret@redis.redis.svc:6379"]);
        assert_eq!(
            s.backend,
            "deciding on Redis at redis://***@redis.redis.svc:6379 (BACKEND_TYPE=redis: REDIS_URL is set and BACKEND_TYPE is not)"
        );
        let s =
            Settings::from_env(&env(&[("BACKEND_TYPE", "memory"), ("REDIS_URL", "x:1")])).unwrap();
        assert!(s.redis.is_none() && s.backend.contains("BACKEND_TYPE=memory: BACKEND_TYPE"));
    }

    #[test]
    fn host_names_and_connection_ages() {
        let s = Settings::from_env(&env(&[
            ("HOST", "localhost"),
            ("GRPC_HOST", "localhost"),
            ("GRPC_PORT", "9000"),
            ("GRPC_MAX_CONNECTION_AGE", "30m"),
        ]))
        .unwrap();
        assert!(s.http.ip().is_loopback() && s.grpc.ip().is_loopback(), "{:?}", s.grpc);
        assert_eq!(s.grpc.port(), 9000);
        assert_eq!(
            s.grpc_max_connection_age,
            (Duration::from_secs(1800), Duration::from_secs(3600))
        );
        let d = Settings::from_env(&env(&[])).unwrap();
        assert_eq!(d.grpc_max_connection_age.0, Duration::from_secs(86_400), "the Go default");
        let e = Settings::from_env(&env(&[("DEBUG_HOST", "no such host.invalid")])).unwrap_err();
        assert!(e.0.starts_with("DEBUG_HOST=no such host.invalid: "), "{e}");
        let e = Settings::from_env(&env(&[("GRPC_MAX_CONNECTION_AGE_GRACE", "soon")])).unwrap_err();
        assert_eq!(e.0, "GRPC_MAX_CONNECTION_AGE_GRACE=soon: not a duration");
    }

    #[test]
    fn sentinel_tls_and_the_per_second_server_are_read_as_in_go() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "CA").unwrap();
        let ca = ca.display().to_string();
        let s = Settings::from_env(&env(&[
            ("BACKEND_TYPE", "redis"),
            ("REDIS_TYPE", "sentinel"),
            ("REDIS_URL", "mymaster, 10.0.0.5:26379,10.0.0.6:26379"),
            ("REDIS_AUTH", "app:p@ss"),
            ("REDIS_SENTINEL_AUTH", "spw"),
            ("REDIS_TLS", "true"),
            ("REDIS_TLS_CACERT", &ca),
            ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"),
            ("REDIS_PERSECOND", "true"),
            ("REDIS_PERSECOND_SOCKET_TYPE", "tcp"),
            ("REDIS_PERSECOND_URL", "10.0.0.7:6379"),
            ("REDIS_PERSECOND_AUTH", "ps"),
            ("REDIS_PERSECOND_TIMEOUT", "20ms"),
        ]))
        .unwrap();
        assert!(s.notices.is_empty(), "{:?}", s.notices);
        let r = s.redis.unwrap();
        let sentinel = r.sentinel.clone().unwrap();
        assert_eq!(sentinel.name, "mymaster");
        assert_eq!(
            sentinel.sentinels,
            ["redis://:spw@10.0.0.5:26379", "redis://:spw@10.0.0.6:26379"]
        );
        assert_eq!(
            (sentinel.username.as_deref(), sentinel.password.as_deref()),
            (Some("app"), Some("p@ss"))
        );
        let tls = r.tls.clone().unwrap();
        assert_eq!((tls.ca.as_deref(), tls.client.is_none()), (Some(&b"CA"[..]), true));
        assert!(tls.skip_hostname_verification);
        let p = r.per_second.clone().unwrap();
        assert_eq!(p.urls, ["redis://:ps@10.0.0.7:6379"]);
        assert_eq!(p.timeout, Duration::from_millis(20));
        assert!(p.tls.is_none(), "REDIS_PERSECOND_TLS is its own switch");
        assert_eq!(
            r.describe(),
            "the primary mymaster named by the sentinels redis://***@10.0.0.5:26379, \
             redis://***@10.0.0.6:26379 over TLS, per-second limits at redis://***@10.0.0.7:6379"
        );
        let e = Settings::from_env(&env(&[
            ("BACKEND_TYPE", "redis"),
            ("REDIS_TLS", "true"),
            ("REDIS_TLS_CACERT", "/no/such/ca.pem"),
        ]))
        .unwrap_err();
        assert!(e.0.starts_with("REDIS_TLS_CACERT=/no/such/ca.pem: cannot be read"), "{e}");
        let e = Settings::from_env(&env(&[("BACKEND_TYPE", "redis"), ("REDIS_TLS", "true")]))
            .unwrap_err();
        assert_eq!(e.0, "REDIS_TLS: TLS to Redis needs REDIS_SOCKET_TYPE=tcp");
        let s = Settings::from_env(&env(&[("REDIS_TLS", "true"), ("REDIS_PERSECOND", "true")]))
            .unwrap();
        assert!(s.notices.iter().any(|n| n == "REDIS_TLS is ignored: BACKEND_TYPE is memory"));
        let s = Settings::from_env(&env(&[("GRPC_UDS", "/tmp/rl.sock")])).unwrap();
        assert_eq!(s.grpc_uds, Some(PathBuf::from("/tmp/rl.sock")));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_duration("0"), Some(Duration::ZERO));
        assert_eq!(parse_duration("10 parsecs"), None);
    }
}
