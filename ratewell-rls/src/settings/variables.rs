//! Every environment variable of envoyproxy/ratelimit's settings (its
//! `src/settings/settings.go`), what this service does with each, and the ones it adds.

use crate::env::parse_bool;

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
pub(crate) const REDIS_ONLY: &[&str] = &[
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
pub(crate) fn harmless(value: &str) -> bool {
    let v = value.trim();
    v.is_empty() || parse_bool(v) == Some(false)
}
