//! The service's settings: envoyproxy/ratelimit's environment variables, read as it reads them
//! (its `src/settings/settings.go`), and the ones this service adds. Every variable the Go
//! service reads is either supported, ignored with a startup message that names it, or refused
//! at startup: never silently ignored ([`Settings::from_env`]).

#[cfg(test)]
mod tests;
mod variables;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::env::Env;
pub use crate::env::parse_duration;
use crate::service::{Failover, ServiceSettings, default_header_names};
use crate::stores::redis::RedisSettings;
pub use crate::telemetry::logging::LogLevel;
pub use variables::{GO_VARIABLES, OWN_VARIABLES, Support};
use variables::{REDIS_ONLY, harmless};

/// A setting's value that does not parse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SettingsError(pub String);

impl std::fmt::Display for SettingsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SettingsError {}

impl From<String> for SettingsError {
    fn from(message: String) -> Self {
        SettingsError(message)
    }
}

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
    pub tls: Option<crate::serving::tls::ServerTls>,
    /// Which store decides, and why, for the startup log line.
    pub backend: String,
    /// `CONFIG_TYPE=GRPC_XDS_SOTW`: the configuration comes from an xDS control plane, not from
    /// the directory.
    pub xds: Option<crate::configuration::xds::XdsSettings>,
    /// `USE_STATSD` (the Go default) or `USE_DOG_STATSD`: where statistics are sent.
    pub statsd: Option<crate::telemetry::statsd::StatsdSettings>,
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
    pub redis: Option<crate::stores::redis::RedisSettings>,
    /// `RELOAD_INTERVAL`.
    pub reload_interval: Duration,
    /// `STATE_FILE` (memory store only).
    pub state_file: Option<PathBuf>,
    /// `STATE_INTERVAL`.
    pub state_interval: Duration,
    /// `LOG_LEVEL`: `debug`, `info`, `warn` (default) or `error`.
    pub log_level: LogLevel,
    /// `LOG_FORMAT=json`: log lines as JSON objects with the Go service's field names
    /// ([`crate::telemetry::logging`]); anything else is plain text, as in Go.
    pub log_json: bool,
    /// What the service itself reads.
    pub service: ServiceSettings,
    /// `TRACING_ENABLED`: spans sent over OTLP ([`crate::telemetry::otel`]).
    pub tracing: Option<crate::telemetry::otel::TracingSettings>,
    /// Startup messages: the variables set that are ignored, and why.
    pub notices: Vec<String>,
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
            "redis" => Some(RedisSettings::from_env(env)?),
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
                let n = crate::telemetry::mapper::check(path, &text).map_err(SettingsError)?;
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
        let tls = crate::serving::tls::ServerTls::from_env(env).map_err(SettingsError)?;
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
        let statsd =
            crate::telemetry::statsd::StatsdSettings::from_env(env).map_err(SettingsError)?;
        match e.string("CONFIG_TYPE", "FILE").as_str() {
            "FILE" | "GRPC_XDS_SOTW" => {}
            other => {
                return Err(SettingsError(format!(
                    "CONFIG_TYPE={other}: FILE (the default) or GRPC_XDS_SOTW"
                )));
            }
        }
        let xds = crate::configuration::xds::XdsSettings::from_env(env).map_err(SettingsError)?;
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
                max_stats_keys: e
                    .number("MAX_STATS_KEYS", crate::telemetry::stats::DEFAULT_MAX_STATS_KEYS)?,
                failover,
            },
            tracing: crate::telemetry::otel::TracingSettings::from_env(env)
                .map_err(SettingsError)?,
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
