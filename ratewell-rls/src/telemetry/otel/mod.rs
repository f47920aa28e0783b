//! OpenTelemetry tracing, as envoyproxy/ratelimit does it (its `src/trace/trace.go` and the
//! otelgrpc server interceptor of `src/server/server_impl.go`), with `TRACING_ENABLED=true`:
//!
//! - one server span per `ShouldRateLimit` call, named
//!   `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`, a child of the caller's span
//!   when the call's gRPC metadata carries one (W3C `traceparent`, B3 single or multiple headers,
//!   and W3C `baggage`, the Go service's propagators), with a child span
//!   `ShouldRateLimit Execution` carrying the request's `domain` (B3 is read by this module's own
//!   propagator, as go.opentelemetry.io/contrib's reads it: the Rust one is in the deprecated
//!   opentelemetry-zipkin crate);
//! - sampled as the Go service samples: `ParentBased(TraceIdRatioBased(TRACING_SAMPLING_RATE))`;
//! - the resource's `service.name`, `service.namespace` and `service.instance.id` from
//!   `TRACING_SERVICE_NAME`, `TRACING_SERVICE_NAMESPACE` and `TRACING_SERVICE_INSTANCE_ID` (a random
//!   UUID when not set);
//! - sent in batches, from a task on the service's tokio runtime, over OTLP
//!   (`TRACING_EXPORTER_PROTOCOL`: `http`, protobuf over HTTP/1.1, or `grpc`) to the collector the
//!   standard variables name (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`,
//!   `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_EXPORTER_OTLP_TRACES_HEADERS`,
//!   `OTEL_EXPORTER_OTLP_TIMEOUT`, `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`, `OTEL_BSP_SCHEDULE_DELAY`);
//! - the spans still queued sent when the service stops ([`Tracing::shutdown`]).
//!
//! The collector is reached in plain text (`http://`): an `https://` endpoint is refused at start.
//!
//! [`TracingSettings::from_env`] is read in every build; sending spans needs the `otel` cargo
//! feature (a default one), and a build without it refuses `TRACING_ENABLED=true` at start.

#[cfg(feature = "otel")]
mod enabled;
mod settings;
#[cfg(all(test, feature = "otel"))]
mod tests;

pub use settings::{EXECUTION_SPAN_NAME, Protocol, SERVER_SPAN_NAME, TracingSettings};

#[cfg(feature = "otel")]
pub use enabled::{SHUTDOWN_TIMEOUT, Tracing};

/// The tracing of a running service: none can exist in a build without the `otel` feature,
/// where [`TracingSettings::from_env`] refuses `TRACING_ENABLED=true`.
#[cfg(not(feature = "otel"))]
#[derive(Debug)]
pub enum Tracing {}

#[cfg(not(feature = "otel"))]
impl Tracing {
    /// Never called: no [`TracingSettings`] can be read in this build.
    pub fn start(
        _settings: &TracingSettings,
        _log: std::sync::Arc<dyn Fn(String) + Send + Sync>,
    ) -> Result<Tracing, String> {
        Err("TRACING_ENABLED=true: this ratewell-rls was built without the `otel` feature".into())
    }

    /// Never called: no [`Tracing`] exists in this build.
    pub async fn should_rate_limit<T>(
        &self,
        _metadata: &tonic::metadata::MetadataMap,
        _domain: &str,
        _call: impl Future<Output = Result<T, tonic::Status>>,
    ) -> Result<T, tonic::Status> {
        match *self {}
    }

    /// Never called: no [`Tracing`] exists in this build.
    pub async fn shutdown(&self) {
        match *self {}
    }
}

#[cfg(all(test, not(feature = "otel")))]
mod tests_without_the_feature {
    use std::collections::HashMap;

    use super::TracingSettings;

    #[test]
    fn enabled_is_refused() {
        let env: HashMap<String, String> =
            [("TRACING_ENABLED".to_owned(), "true".to_owned())].into_iter().collect();
        let e = TracingSettings::from_env(&env).unwrap_err();
        assert!(e.contains("built without the `otel` feature"), "{e}");
        let off: HashMap<String, String> =
            [("TRACING_ENABLED".to_owned(), "false".to_owned())].into_iter().collect();
        assert_eq!(TracingSettings::from_env(&off), Ok(None));
    }
}
