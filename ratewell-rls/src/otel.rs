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

use std::collections::HashMap;
use std::time::Duration;

/// The gRPC method's full name: the server span's name, as otelgrpc names it.
pub const SERVER_SPAN_NAME: &str = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// The name of the span of the decision itself, as the Go service names it.
pub const EXECUTION_SPAN_NAME: &str = "ShouldRateLimit Execution";

/// How spans are sent to the collector (`TRACING_EXPORTER_PROTOCOL`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// `http` (the default): OTLP protobuf in a `POST` to the endpoint (`/v1/traces`).
    Http,
    /// `grpc`: OTLP's `TraceService/Export` over gRPC.
    Grpc,
}

/// The tracing settings, read from `TRACING_*` and the OTLP exporter's standard variables.
#[derive(Clone, Debug, PartialEq)]
pub struct TracingSettings {
    /// `TRACING_SERVICE_NAME` (default `RateLimit`): the resource's `service.name`.
    pub service_name: String,
    /// `TRACING_SERVICE_NAMESPACE` (default empty): the resource's `service.namespace`.
    pub service_namespace: String,
    /// `TRACING_SERVICE_INSTANCE_ID` (default a random UUID, drawn at start): the resource's
    /// `service.instance.id`.
    pub service_instance_id: String,
    /// `TRACING_EXPORTER_PROTOCOL`.
    pub protocol: Protocol,
    /// `TRACING_SAMPLING_RATE` (default 1): the share of traces sampled where the caller did not
    /// decide (1 or more: all, 0 or less: none).
    pub sampling_rate: f64,
    /// Where spans are sent: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as is, else
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` (with `/v1/traces` appended for `http`), else the OTLP
    /// defaults `http://localhost:4318/v1/traces` (`http`) and `http://localhost:4317` (`grpc`).
    pub endpoint: String,
    /// `OTEL_EXPORTER_OTLP_TRACES_HEADERS`, else `OTEL_EXPORTER_OTLP_HEADERS`: headers (gRPC
    /// metadata) sent with every export, `key=value` pairs separated by commas, values
    /// percent-decoded.
    pub headers: Vec<(String, String)>,
    /// `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`, else `OTEL_EXPORTER_OTLP_TIMEOUT` (milliseconds,
    /// default 10000): how long one export may take.
    pub timeout: Duration,
    /// `OTEL_BSP_SCHEDULE_DELAY` (milliseconds, default 5000): how long a span may wait before
    /// its batch is sent.
    pub schedule_delay: Duration,
}

/// A variable's value, unset when empty (as the Go service's `envconfig` and the OTLP exporters
/// read them).
fn get<'a>(env: &'a HashMap<String, String>, name: &str) -> Option<&'a str> {
    env.get(name).map(String::as_str).filter(|v| !v.is_empty())
}

impl TracingSettings {
    /// The tracing settings in `env`, `None` unless `TRACING_ENABLED` is true; an error names
    /// the variable and its value (`NAME=value: why`), except for headers, whose values may be
    /// credentials.
    pub fn from_env(env: &HashMap<String, String>) -> Result<Option<TracingSettings>, String> {
        let enabled = match get(env, "TRACING_ENABLED") {
            None => false,
            Some(v) => match v {
                "1" | "t" | "T" | "TRUE" | "true" | "True" => true,
                "0" | "f" | "F" | "FALSE" | "false" | "False" => false,
                _ => return Err(format!("TRACING_ENABLED={v}: not a boolean (true or false)")),
            },
        };
        if !enabled {
            return Ok(None);
        }
        #[cfg(not(feature = "otel"))]
        return Err(
            "TRACING_ENABLED=true: this ratewell-rls was built without the `otel` feature (build it with its default features to send spans)"
                .to_owned(),
        );
        #[cfg(feature = "otel")]
        parse(env).map(Some)
    }
}

/// The settings of an enabled tracing.
#[cfg(feature = "otel")]
fn parse(env: &HashMap<String, String>) -> Result<TracingSettings, String> {
    let protocol = match env.get("TRACING_EXPORTER_PROTOCOL").map(String::as_str) {
        None | Some("") | Some("http") => Protocol::Http,
        Some("grpc") => Protocol::Grpc,
        Some(other) => {
            return Err(format!("TRACING_EXPORTER_PROTOCOL={other}: http (the default) or grpc"));
        }
    };
    let sampling_rate = match get(env, "TRACING_SAMPLING_RATE") {
        None => 1.0,
        Some(v) => match v.trim().parse::<f64>() {
            Ok(rate) if !rate.is_nan() => rate,
            _ => return Err(format!("TRACING_SAMPLING_RATE={v}: not a number")),
        },
    };
    let endpoint = endpoint(env, protocol)?;
    let headers = match get(env, "OTEL_EXPORTER_OTLP_TRACES_HEADERS") {
        Some(v) => headers("OTEL_EXPORTER_OTLP_TRACES_HEADERS", v)?,
        None => match get(env, "OTEL_EXPORTER_OTLP_HEADERS") {
            Some(v) => headers("OTEL_EXPORTER_OTLP_HEADERS", v)?,
            None => Vec::new(),
        },
    };
    let millis = |name: &str| -> Result<Option<Duration>, String> {
        match get(env, name) {
            None => Ok(None),
            Some(v) => match v.trim().parse::<u64>() {
                Ok(ms) if ms > 0 => Ok(Some(Duration::from_millis(ms))),
                _ => Err(format!("{name}={v}: not a number of milliseconds above 0")),
            },
        }
    };
    let timeout = match millis("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")? {
        Some(t) => t,
        None => millis("OTEL_EXPORTER_OTLP_TIMEOUT")?.unwrap_or(Duration::from_secs(10)),
    };
    let schedule_delay = millis("OTEL_BSP_SCHEDULE_DELAY")?.unwrap_or(Duration::from_secs(5));
    Ok(TracingSettings {
        service_name: get(env, "TRACING_SERVICE_NAME").unwrap_or("RateLimit").to_owned(),
        service_namespace: get(env, "TRACING_SERVICE_NAMESPACE").unwrap_or("").to_owned(),
        service_instance_id: match get(env, "TRACING_SERVICE_INSTANCE_ID") {
            Some(id) => id.to_owned(),
            None => random_uuid(),
        },
        protocol,
        sampling_rate,
        endpoint,
        headers,
        timeout,
        schedule_delay,
    })
}

/// The collector's URL for `protocol`, as the OTLP exporter specification resolves it.
#[cfg(feature = "otel")]
fn endpoint(env: &HashMap<String, String>, protocol: Protocol) -> Result<String, String> {
    let (name, url) = match (get(env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), protocol) {
        (Some(url), _) => ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", url.to_owned()),
        (None, Protocol::Http) => match get(env, "OTEL_EXPORTER_OTLP_ENDPOINT") {
            Some(base) => {
                ("OTEL_EXPORTER_OTLP_ENDPOINT", format!("{}/v1/traces", base.trim_end_matches('/')))
            }
            None => ("", "http://localhost:4318/v1/traces".to_owned()),
        },
        (None, Protocol::Grpc) => match get(env, "OTEL_EXPORTER_OTLP_ENDPOINT") {
            Some(url) => ("OTEL_EXPORTER_OTLP_ENDPOINT", url.to_owned()),
            None => ("", "http://localhost:4317".to_owned()),
        },
    };
    let value = || env.get(name).map(String::as_str).unwrap_or_default();
    let uri: axum::http::Uri =
        url.parse().map_err(|e| format!("{name}={}: not a URL: {e}", value()))?;
    match uri.scheme_str() {
        Some("http") if uri.authority().is_some() => Ok(url),
        Some("https") => Err(format!(
            "{name}={}: TLS to the collector is not supported: name it with http://",
            value()
        )),
        _ => Err(format!("{name}={}: not an http:// URL with a host", value())),
    }
}

/// `key=value` pairs separated by commas (the W3C baggage form the OTLP specification gives its
/// headers), values percent-decoded; checked as HTTP header names and values.
#[cfg(feature = "otel")]
fn headers(name: &str, text: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for (i, pair) in text.split(',').map(str::trim).enumerate().filter(|(_, p)| !p.is_empty()) {
        let why = |what: &str| {
            format!("{name}=(not shown: it may hold credentials): entry {}: {what}", i + 1)
        };
        let (key, value) = pair.split_once('=').ok_or_else(|| why("not key=value"))?;
        let key = key.trim().to_ascii_lowercase();
        let value = percent_decode(value.trim()).ok_or_else(|| why("bad percent-encoding"))?;
        axum::http::HeaderName::from_bytes(key.as_bytes())
            .map_err(|_| why(&format!("{key:?} is not a header name")))?;
        axum::http::HeaderValue::from_str(&value)
            .map_err(|_| why(&format!("the value of {key:?} is not a header value")))?;
        out.push((key, value));
    }
    Ok(out)
}

/// `text` with its `%XX` escapes decoded, if they are well formed and make UTF-8.
#[cfg(feature = "otel")]
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A random (version 4) UUID, as the Go service draws its default instance id.
#[cfg(feature = "otel")]
fn random_uuid() -> String {
    use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator};
    let random = u128::from_be_bytes(RandomIdGenerator::default().new_trace_id().to_bytes());
    let v4 = (random & !(0xF << 76) & !(0x3 << 62)) | (0x4 << 76) | (0x2 << 62);
    let hex = format!("{v4:032x}");
    format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
}

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

#[cfg(feature = "otel")]
mod enabled {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use opentelemetry::propagation::{Extractor, TextMapCompositePropagator, TextMapPropagator};
    use opentelemetry::propagation::{Injector, text_map_propagator::FieldIter};
    use opentelemetry::trace::{
        Span as _, SpanKind, Status, TraceContextExt as _, Tracer as _, TracerProvider as _,
    };
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};
    use opentelemetry::{Context, KeyValue};
    use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _, WithTonicConfig as _};
    use opentelemetry_sdk::Resource;
    use opentelemetry_sdk::error::OTelSdkResult;
    use opentelemetry_sdk::propagation::{BaggagePropagator, TraceContextPropagator};
    use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
    use opentelemetry_sdk::trace::{
        BatchConfigBuilder, Sampler, SdkTracer, SdkTracerProvider, SpanData, SpanExporter,
    };

    use super::{EXECUTION_SPAN_NAME, Protocol, SERVER_SPAN_NAME, TracingSettings};

    /// The semantic conventions' schema the resource's attributes follow (the Go service's
    /// `semconv/v1.7.0`).
    const SCHEMA_URL: &str = "https://opentelemetry.io/schemas/1.7.0";

    /// How long a stop waits for the last spans to be sent: within Kubernetes' grace period
    /// once the gRPC drain ([`crate::server::DRAIN_TIMEOUT`]) is over.
    pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

    /// A running service's tracing: the tracer its handler starts spans with, the propagators
    /// that read the caller's context, and the provider that sends them.
    pub struct Tracing {
        /// The provider and its tracer: taken by a drop without [`Tracing::shutdown`].
        sdk: Option<(SdkTracerProvider, SdkTracer)>,
        propagator: TextMapCompositePropagator,
        /// Set by [`Tracing::shutdown`].
        shut: AtomicBool,
    }

    impl std::fmt::Debug for Tracing {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Tracing")
                .field("provider", &self.sdk.as_ref().map(|(provider, _)| provider))
                .finish_non_exhaustive()
        }
    }

    impl Drop for Tracing {
        /// The provider's own drop sends the queued spans, blocking until the batch task (on
        /// the runtime) has: done on a thread of its own, so that a drop on the runtime's thread
        /// (a current-thread runtime) does not wait on itself.
        fn drop(&mut self) {
            if self.shut.load(Ordering::SeqCst) {
                return;
            }
            if let Some(sdk) = self.sdk.take() {
                let _ = std::thread::Builder::new()
                    .name("otel-shutdown".into())
                    .spawn(move || drop(sdk));
            }
        }
    }

    /// The OTLP exporter, with its failures logged (`log`) rather than dropped.
    struct Logged {
        inner: opentelemetry_otlp::SpanExporter,
        endpoint: String,
        log: Arc<dyn Fn(String) + Send + Sync>,
    }

    impl std::fmt::Debug for Logged {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Logged").field("endpoint", &self.endpoint).finish_non_exhaustive()
        }
    }

    impl SpanExporter for Logged {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            let spans = batch.len();
            let result = self.inner.export(batch).await;
            if let Err(e) = &result {
                (self.log)(format!("tracing: {spans} spans not sent to {}: {e}", self.endpoint));
            }
            result
        }

        fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
            self.inner.shutdown_with_timeout(timeout)
        }

        fn force_flush(&self) -> OTelSdkResult {
            self.inner.force_flush()
        }

        fn set_resource(&mut self, resource: &Resource) {
            self.inner.set_resource(resource);
        }
    }

    /// The gRPC metadata of a call, as the propagators read it.
    struct Metadata<'a>(&'a tonic::metadata::MetadataMap);

    impl Extractor for Metadata<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            self.0.get(key).and_then(|v| v.to_str().ok())
        }

        fn keys(&self) -> Vec<&str> {
            self.0
                .keys()
                .filter_map(|k| match k {
                    tonic::metadata::KeyRef::Ascii(k) => Some(k.as_str()),
                    tonic::metadata::KeyRef::Binary(_) => None,
                })
                .collect()
        }
    }

    /// The B3 propagator as the Go service configures it (`b3.New()` of
    /// go.opentelemetry.io/contrib/propagators/b3): the single `b3` header read first, the
    /// multiple `x-b3-*` headers if it is absent or invalid; injected as multiple headers. A
    /// context without a sampling decision (deferred) is taken as not sampled, as there.
    #[derive(Debug)]
    struct B3;

    /// The multiple headers B3 injects.
    const B3_FIELDS: [&str; 3] = ["x-b3-traceid", "x-b3-spanid", "x-b3-sampled"];

    /// `text` if it is `len` lowercase hex digits.
    fn lower_hex(text: &str, len: usize) -> Option<&str> {
        (text.len() == len && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
            .then_some(text)
    }

    /// A B3 trace id: 32 hex digits, or 16 (the high half zero).
    fn b3_trace_id(text: &str) -> Option<TraceId> {
        let hex = lower_hex(text, 32).or_else(|| lower_hex(text, 16))?;
        TraceId::from_hex(hex).ok().filter(|id| *id != TraceId::INVALID)
    }

    /// A B3 span id: 16 hex digits.
    fn b3_span_id(text: &str) -> Option<SpanId> {
        SpanId::from_hex(lower_hex(text, 16)?).ok().filter(|id| *id != SpanId::INVALID)
    }

    impl B3 {
        /// `b3: {trace id}-{span id}[-{sampling state}[-{parent span id}]]`.
        fn single(value: &str) -> Option<SpanContext> {
            let mut parts = value.split('-');
            let trace_id = b3_trace_id(parts.next()?)?;
            let span_id = b3_span_id(parts.next()?)?;
            let sampled = match parts.next() {
                None => false,
                Some("1" | "d") => true,
                Some("0") => false,
                Some(_) => return None,
            };
            match parts.next() {
                None => {}
                Some(parent) => {
                    b3_span_id(parent)?;
                }
            }
            if parts.next().is_some() {
                return None;
            }
            Some(Self::context(trace_id, span_id, sampled))
        }

        /// `x-b3-traceid`, `x-b3-spanid`, `x-b3-sampled`, `x-b3-flags` (`1`: debug, sampled).
        fn multiple(extractor: &dyn Extractor) -> Option<SpanContext> {
            let trace_id = b3_trace_id(extractor.get("x-b3-traceid")?)?;
            let span_id = b3_span_id(extractor.get("x-b3-spanid")?)?;
            if let Some(parent) = extractor.get("x-b3-parentspanid") {
                b3_span_id(parent)?;
            }
            let debug = match extractor.get("x-b3-flags") {
                None | Some("") | Some("0") => false,
                Some("1") => true,
                Some(_) => return None,
            };
            let sampled = match extractor.get("x-b3-sampled") {
                None | Some("") => false,
                Some("1" | "true") => true,
                Some("0" | "false") => false,
                Some(_) => return None,
            };
            Some(Self::context(trace_id, span_id, debug || sampled))
        }

        fn context(trace_id: TraceId, span_id: SpanId, sampled: bool) -> SpanContext {
            let flags = if sampled { TraceFlags::SAMPLED } else { TraceFlags::default() };
            SpanContext::new(trace_id, span_id, flags, true, TraceState::default())
        }
    }

    impl TextMapPropagator for B3 {
        fn inject_context(&self, cx: &Context, injector: &mut dyn Injector) {
            let span = cx.span();
            let context = span.span_context();
            if context.is_valid() {
                injector.set(B3_FIELDS[0], context.trace_id().to_string());
                injector.set(B3_FIELDS[1], context.span_id().to_string());
                let sampled = if context.is_sampled() { "1" } else { "0" };
                injector.set(B3_FIELDS[2], sampled.to_owned());
            }
        }

        fn extract_with_context(&self, cx: &Context, extractor: &dyn Extractor) -> Context {
            let single = extractor.get("b3").and_then(B3::single);
            match single.or_else(|| B3::multiple(extractor)) {
                Some(context) => cx.with_remote_span_context(context),
                None => cx.clone(),
            }
        }

        fn fields(&self) -> FieldIter<'_> {
            static FIELDS: std::sync::LazyLock<Vec<String>> =
                std::sync::LazyLock::new(|| B3_FIELDS.iter().map(|f| (*f).to_owned()).collect());
            FieldIter::new(&FIELDS)
        }
    }

    /// Whether otelgrpc marks a server span with `code` as failed: the codes that mean the
    /// server failed, not the caller.
    fn server_error(code: tonic::Code) -> bool {
        matches!(
            code,
            tonic::Code::Unknown
                | tonic::Code::DeadlineExceeded
                | tonic::Code::Unimplemented
                | tonic::Code::Internal
                | tonic::Code::Unavailable
                | tonic::Code::DataLoss
        )
    }

    impl Tracing {
        /// Start sending spans as `settings` say, from a task on the current tokio runtime (this
        /// must be called on one); `log` is told of every batch that could not be sent.
        pub fn start(
            settings: &TracingSettings,
            log: Arc<dyn Fn(String) + Send + Sync>,
        ) -> Result<Tracing, String> {
            let inner = match settings.protocol {
                Protocol::Http => opentelemetry_otlp::SpanExporter::builder()
                    .with_http()
                    .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                    .with_endpoint(&settings.endpoint)
                    .with_timeout(settings.timeout)
                    .with_headers(settings.headers.iter().cloned().collect())
                    .build(),
                Protocol::Grpc => {
                    let mut metadata = tonic::metadata::MetadataMap::new();
                    for (key, value) in &settings.headers {
                        // Checked when the settings were read.
                        if let (Ok(key), Ok(value)) = (
                            tonic::metadata::AsciiMetadataKey::from_bytes(key.as_bytes()),
                            value.parse(),
                        ) {
                            metadata.append(key, value);
                        }
                    }
                    opentelemetry_otlp::SpanExporter::builder()
                        .with_tonic()
                        .with_protocol(opentelemetry_otlp::Protocol::Grpc)
                        .with_endpoint(&settings.endpoint)
                        .with_timeout(settings.timeout)
                        .with_metadata(metadata)
                        .build()
                }
            }
            .map_err(|e| format!("tracing: the OTLP exporter to {}: {e}", settings.endpoint))?;
            let exporter = Logged { inner, endpoint: settings.endpoint.clone(), log };
            let batch = BatchSpanProcessor::builder(exporter, opentelemetry_sdk::runtime::Tokio)
                .with_batch_config(
                    BatchConfigBuilder::default()
                        .with_scheduled_delay(settings.schedule_delay)
                        .build(),
                )
                .build();
            let rate = settings.sampling_rate;
            let ratio = if rate >= 1.0 {
                Sampler::AlwaysOn
            } else if rate <= 0.0 {
                Sampler::AlwaysOff
            } else {
                Sampler::TraceIdRatioBased(rate)
            };
            let resource = Resource::builder_empty()
                .with_schema_url(
                    [
                        KeyValue::new("service.name", settings.service_name.clone()),
                        KeyValue::new("service.namespace", settings.service_namespace.clone()),
                        KeyValue::new("service.instance.id", settings.service_instance_id.clone()),
                    ],
                    SCHEMA_URL,
                )
                .build();
            let provider = SdkTracerProvider::builder()
                .with_sampler(Sampler::ParentBased(Box::new(ratio)))
                .with_span_processor(batch)
                .with_resource(resource)
                .build();
            let tracer = provider.tracer("ratelimit");
            let sdk = Some((provider, tracer));
            // The Go service's: W3C trace context, then B3 (single or multiple headers), then
            // W3C baggage.
            let propagator = TextMapCompositePropagator::new(vec![
                Box::new(TraceContextPropagator::new()),
                Box::new(B3),
                Box::new(BaggagePropagator::new()),
            ]);
            Ok(Tracing { sdk, propagator, shut: AtomicBool::new(false) })
        }

        /// Run `call`, the decision on a `ShouldRateLimit` request for `domain` whose gRPC
        /// metadata is `metadata`, inside a server span (the caller's span its parent, if the
        /// metadata names one) and its `ShouldRateLimit Execution` child.
        pub async fn should_rate_limit<T>(
            &self,
            metadata: &tonic::metadata::MetadataMap,
            domain: &str,
            call: impl Future<Output = Result<T, tonic::Status>>,
        ) -> Result<T, tonic::Status> {
            let Some((_, tracer)) = &self.sdk else { return call.await };
            let parent = self.propagator.extract(&Metadata(metadata));
            let server = tracer
                .span_builder(SERVER_SPAN_NAME)
                .with_kind(SpanKind::Server)
                .with_attributes([
                    KeyValue::new("rpc.system", "grpc"),
                    KeyValue::new("rpc.service", crate::server::SERVICE_NAME),
                    KeyValue::new("rpc.method", "ShouldRateLimit"),
                ])
                .start_with_context(tracer, &parent);
            let cx = parent.with_span(server);
            let mut execution = tracer
                .span_builder(EXECUTION_SPAN_NAME)
                .with_attributes([KeyValue::new("domain", domain.to_owned())])
                .start_with_context(tracer, &cx);
            let result = call.await;
            execution.end();
            let span = cx.span();
            let code = match &result {
                Ok(_) => tonic::Code::Ok,
                Err(status) => status.code(),
            };
            span.set_attribute(KeyValue::new("rpc.grpc.status_code", code as i64));
            match &result {
                Err(status) if server_error(code) => {
                    span.set_status(Status::error(status.message().to_owned()));
                }
                _ => {}
            }
            span.end();
            result
        }

        /// Send the spans still queued, then stop sending: waits for the collector at most
        /// [`SHUTDOWN_TIMEOUT`] (the sending goes on in the background past it).
        pub async fn shutdown(&self) {
            let Some((provider, _)) = &self.sdk else { return };
            if self.shut.swap(true, Ordering::SeqCst) {
                return;
            }
            let provider = provider.clone();
            // The provider's shutdown blocks until the batch task has sent the queue: off the
            // runtime's workers, so that task can run.
            let blocking = tokio::task::spawn_blocking(move || provider.shutdown());
            let _ = tokio::time::timeout(SHUTDOWN_TIMEOUT, blocking).await;
        }
    }

    #[cfg(test)]
    mod tests {
        use std::collections::HashMap;

        use opentelemetry::propagation::TextMapPropagator;
        use opentelemetry::trace::TraceContextExt;

        use super::B3;

        fn extract(headers: &[(&str, &str)]) -> Option<(String, String, bool)> {
            let map: HashMap<String, String> =
                headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            let cx = B3.extract(&map);
            let span = cx.span();
            let c = span.span_context();
            c.is_valid()
                .then(|| (c.trace_id().to_string(), c.span_id().to_string(), c.is_sampled()))
        }

        const T: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
        const S: &str = "00f067aa0ba902b7";

        #[test]
        fn single_header() {
            let sampled = Some((T.to_owned(), S.to_owned(), true));
            assert_eq!(extract(&[("b3", &format!("{T}-{S}-1"))]), sampled);
            assert_eq!(extract(&[("b3", &format!("{T}-{S}-d-{S}"))]), sampled);
            assert!(!extract(&[("b3", &format!("{T}-{S}-0"))]).unwrap().2);
            assert!(!extract(&[("b3", &format!("{T}-{S}"))]).unwrap().2, "deferred");
            let short = extract(&[("b3", &format!("a3ce929d0e0e4736-{S}-1"))]).unwrap();
            assert_eq!(short.0, "0000000000000000a3ce929d0e0e4736");
            assert_eq!(extract(&[("b3", "1")]), None);
            assert_eq!(extract(&[("b3", &format!("{T}-{S}-x"))]), None);
            assert_eq!(extract(&[("b3", &format!("{}-{S}-1", T.to_uppercase()))]), None);
        }

        #[test]
        fn multiple_headers() {
            let h = |sampled: &str, flags: &str| {
                extract(&[
                    ("x-b3-traceid", T),
                    ("x-b3-spanid", S),
                    ("x-b3-sampled", sampled),
                    ("x-b3-flags", flags),
                ])
            };
            assert_eq!(h("1", ""), Some((T.to_owned(), S.to_owned(), true)));
            assert!(h("true", "").unwrap().2);
            assert!(!h("0", "").unwrap().2);
            assert!(!h("", "").unwrap().2, "deferred");
            assert!(h("", "1").unwrap().2, "debug");
            assert_eq!(h("yes", ""), None);
            assert_eq!(extract(&[("x-b3-traceid", T)]), None);
            // An invalid single header falls back to the multiple ones.
            assert_eq!(
                extract(&[("b3", "bad"), ("x-b3-traceid", T), ("x-b3-spanid", S)]).unwrap().0,
                T
            );
        }
    }
}

#[cfg(all(test, feature = "otel"))]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn settings(pairs: &[(&str, &str)]) -> Result<Option<TracingSettings>, String> {
        let mut all = vec![("TRACING_ENABLED", "true")];
        all.extend_from_slice(pairs);
        TracingSettings::from_env(&env(&all))
    }

    #[test]
    fn off_unless_enabled() {
        assert_eq!(TracingSettings::from_env(&env(&[])), Ok(None));
        assert_eq!(TracingSettings::from_env(&env(&[("TRACING_ENABLED", "false")])), Ok(None));
        assert_eq!(
            TracingSettings::from_env(&env(&[("TRACING_ENABLED", "yes")])),
            Err("TRACING_ENABLED=yes: not a boolean (true or false)".into())
        );
    }

    #[test]
    fn the_go_defaults() {
        let s = settings(&[]).unwrap().unwrap();
        assert_eq!(s.service_name, "RateLimit");
        assert_eq!(s.service_namespace, "");
        assert_eq!(s.protocol, Protocol::Http);
        assert_eq!(s.sampling_rate, 1.0);
        assert_eq!(s.endpoint, "http://localhost:4318/v1/traces");
        assert_eq!(
            (s.timeout, s.schedule_delay),
            (Duration::from_secs(10), Duration::from_secs(5))
        );
        let id = &s.service_instance_id;
        assert_eq!((id.len(), &id[14..15]), (36, "4"), "{id}");
        assert!("89ab".contains(&id[19..20]), "{id}");
        assert_ne!(id, &settings(&[]).unwrap().unwrap().service_instance_id, "random");
        let g = settings(&[("TRACING_EXPORTER_PROTOCOL", "grpc")]).unwrap().unwrap();
        assert_eq!((g.protocol, g.endpoint.as_str()), (Protocol::Grpc, "http://localhost:4317"));
    }

    #[test]
    fn endpoints_as_the_otlp_specification_resolves_them() {
        let http = |pairs: &[(&str, &str)]| settings(pairs).unwrap().unwrap().endpoint;
        assert_eq!(
            http(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")]),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(
            http(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
                ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://other:9/traces")
            ]),
            "http://other:9/traces"
        );
        assert_eq!(
            http(&[
                ("TRACING_EXPORTER_PROTOCOL", "grpc"),
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")
            ]),
            "http://collector:4317"
        );
        assert_eq!(
            settings(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4318")]).unwrap_err(),
            "OTEL_EXPORTER_OTLP_ENDPOINT=https://collector:4318: TLS to the collector is not supported: name it with http://"
        );
        assert!(
            settings(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "collector:4317")])
                .unwrap_err()
                .starts_with("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=collector:4317: ")
        );
    }

    #[test]
    fn the_rest() {
        let s = settings(&[
            ("TRACING_SERVICE_NAME", "rl"),
            ("TRACING_SERVICE_NAMESPACE", "ns"),
            ("TRACING_SERVICE_INSTANCE_ID", "i-1"),
            ("TRACING_SAMPLING_RATE", "0.25"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Bearer%20x, tenant=a"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (s.service_name.as_str(), s.service_namespace.as_str(), s.service_instance_id.as_str()),
            ("rl", "ns", "i-1")
        );
        assert_eq!(s.sampling_rate, 0.25);
        assert_eq!(
            s.headers,
            [("authorization".into(), "Bearer x".into()), ("tenant".into(), "a".into())]
        );
        assert_eq!(s.timeout, Duration::from_millis(2500));
        assert_eq!(s.schedule_delay, Duration::from_millis(100));
        let t = settings(&[
            ("OTEL_EXPORTER_OTLP_HEADERS", "a=1"),
            ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "b=2"),
            ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "7"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "9"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (t.headers, t.timeout),
            (vec![("b".into(), "2".into())], Duration::from_millis(7))
        );
        assert_eq!(
            settings(&[("TRACING_EXPORTER_PROTOCOL", "udp")]).unwrap_err(),
            "TRACING_EXPORTER_PROTOCOL=udp: http (the default) or grpc"
        );
        assert_eq!(
            settings(&[("TRACING_SAMPLING_RATE", "half")]).unwrap_err(),
            "TRACING_SAMPLING_RATE=half: not a number"
        );
        assert_eq!(
            settings(&[("OTEL_BSP_SCHEDULE_DELAY", "soon")]).unwrap_err(),
            "OTEL_BSP_SCHEDULE_DELAY=soon: not a number of milliseconds above 0"
        );
        let e = settings(&[("OTEL_EXPORTER_OTLP_HEADERS", "secret")]).unwrap_err();
        assert_eq!(
            e,
            "OTEL_EXPORTER_OTLP_HEADERS=(not shown: it may hold credentials): entry 1: not key=value"
        );
    }
}

#[cfg(all(test, not(feature = "otel")))]
mod tests_without_the_feature {
    use super::*;

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
