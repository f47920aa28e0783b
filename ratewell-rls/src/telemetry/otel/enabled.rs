//! Spans sent over OTLP (the `otel` feature): the tracer, the propagators and the batch
//! export.

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

use crate::telemetry::otel::settings::{
    EXECUTION_SPAN_NAME, Protocol, SERVER_SPAN_NAME, TracingSettings,
};

/// The semantic conventions' schema the resource's attributes follow (the Go service's
/// `semconv/v1.7.0`).
const SCHEMA_URL: &str = "https://opentelemetry.io/schemas/1.7.0";

/// How long a stop waits for the last spans to be sent: within Kubernetes' grace period
/// once the gRPC drain (`DRAIN_TIMEOUT`, 20 s) is over.
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
            let _ =
                std::thread::Builder::new().name("otel-shutdown".into()).spawn(move || drop(sdk));
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
                BatchConfigBuilder::default().with_scheduled_delay(settings.schedule_delay).build(),
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
                KeyValue::new("rpc.service", crate::serving::proto::SERVICE_NAME),
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
        c.is_valid().then(|| (c.trace_id().to_string(), c.span_id().to_string(), c.is_sampled()))
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
