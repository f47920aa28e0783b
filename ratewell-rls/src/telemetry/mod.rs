//! What the service tells about itself: its statistics ([`stats`], served on `/metrics`), the
//! statsd sink ([`statsd`]), `PROMETHEUS_MAPPER_YAML` ([`mapper`]), tracing over OTLP
//! ([`otel`]) and its log lines ([`logging`]).

pub mod logging;
pub mod mapper;
pub mod otel;
pub mod stats;
pub mod statsd;
