//! OpenTelemetry tracing (`TRACING_ENABLED`): the spans a collector receives over OTLP, gRPC and
//! HTTP, as the Go service sends them: one server span per `ShouldRateLimit` call, in the
//! caller's trace (W3C `traceparent` or B3 in the gRPC metadata) with the caller's span as its
//! parent, a `ShouldRateLimit Execution` child carrying the domain, the resource's service
//! attributes; sampled `ParentBased(TraceIdRatioBased(TRACING_SAMPLING_RATE))`; the spans still
//! queued sent at SIGTERM.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use common::{Binary, Harness, request, wait_until, write_config};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message;
use ratewell_rls::otel::{EXECUTION_SPAN_NAME, SERVER_SPAN_NAME};
use ratewell_rls::proto::Code;

const CONFIG: &str = "
domain: tracing
descriptors:
  - key: k
    rate_limit:
      unit: hour
      requests_per_unit: 1000
";

/// How long a test waits for spans: generous, for a busy machine.
const PATIENCE: Duration = Duration::from_secs(10);

/// What a collector stub received: every export request, in order.
#[derive(Clone, Default)]
struct Received(Arc<Mutex<Vec<ExportTraceServiceRequest>>>);

/// A span as received, with its resource's string attributes.
struct Got {
    resource: HashMap<String, String>,
    span: Span,
}

fn strings(attributes: &[KeyValue]) -> HashMap<String, String> {
    attributes
        .iter()
        .filter_map(|kv| match kv.value.as_ref()?.value.as_ref()? {
            Value::StringValue(s) => Some((kv.key.clone(), s.clone())),
            _ => None,
        })
        .collect()
}

impl Received {
    fn spans(&self) -> Vec<Got> {
        let mut out = Vec::new();
        for request in self.0.lock().unwrap().iter() {
            for resource_spans in &request.resource_spans {
                let resource = resource_spans
                    .resource
                    .as_ref()
                    .map(|r| strings(&r.attributes))
                    .unwrap_or_default();
                for scope in &resource_spans.scope_spans {
                    for span in &scope.spans {
                        out.push(Got { resource: resource.clone(), span: span.clone() });
                    }
                }
            }
        }
        out
    }

    fn named(&self, name: &str) -> Vec<Got> {
        self.spans().into_iter().filter(|g| g.span.name == name).collect()
    }
}

#[tonic::async_trait]
impl TraceService for Received {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// An OTLP/gRPC collector on a free loopback port.
async fn grpc_collector() -> (SocketAddr, Received) {
    let received = Received::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tonic::transport::Server::builder()
        .add_service(TraceServiceServer::new(received.clone()))
        .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener));
    tokio::spawn(server);
    (addr, received)
}

async fn http_export(
    State(received): State<Received>,
    body: Bytes,
) -> impl axum::response::IntoResponse {
    match ExportTraceServiceRequest::decode(body) {
        Ok(request) => {
            received.0.lock().unwrap().push(request);
            let body = ExportTraceServiceResponse::default().encode_to_vec();
            (axum::http::StatusCode::OK, [("content-type", "application/x-protobuf")], body)
        }
        Err(_) => (axum::http::StatusCode::BAD_REQUEST, [("content-type", "text/plain")], vec![]),
    }
}

/// An OTLP/HTTP collector (`POST /v1/traces`, protobuf) on a free loopback port.
async fn http_collector() -> (SocketAddr, Received) {
    let received = Received::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app =
        axum::Router::new().route("/v1/traces", post(http_export)).with_state(received.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, received)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A caller's trace id and span id, distinct for each `n`.
fn caller(n: u8) -> (String, String) {
    (format!("4bf92f3577b34da6a3ce929d0e0e47{n:02x}"), format!("00f067aa0ba902{n:02x}"))
}

/// One `ShouldRateLimit` call with `headers` in its gRPC metadata; it must be answered OK.
async fn call(h: &mut Harness, headers: &[(&'static str, String)]) {
    let mut r = tonic::Request::new(request("tracing", &[&[("k", "v")]], 1));
    for (name, value) in headers {
        r.metadata_mut().insert(*name, value.parse().unwrap());
    }
    let response = h.client.should_rate_limit(r).await.expect("answered").into_inner();
    assert_eq!(response.overall_code, Code::Ok as i32);
}

fn traceparent(n: u8, flags: &str) -> (&'static str, String) {
    let (trace, span) = caller(n);
    ("traceparent", format!("00-{trace}-{span}-{flags}"))
}

/// Calls carrying a W3C or B3 parent give one server span each, in the caller's trace, its
/// parent the caller's span, with the execution span under it and the resource's attributes.
async fn one_server_span_per_call(protocol: &str, collector: (SocketAddr, Received)) {
    let (addr, received) = collector;
    let endpoint = format!("http://{addr}");
    let mut h = Harness::start(
        &[("tracing.yaml", CONFIG)],
        &[
            ("TRACING_ENABLED", "true"),
            ("TRACING_EXPORTER_PROTOCOL", protocol),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
            ("TRACING_SERVICE_NAME", "rl-under-test"),
            ("TRACING_SERVICE_NAMESPACE", "tests"),
            ("TRACING_SERVICE_INSTANCE_ID", "instance-1"),
        ],
        1,
    )
    .await;
    call(&mut h, &[traceparent(1, "01")]).await;
    call(&mut h, &[traceparent(2, "01")]).await;
    let (trace, span) = caller(3);
    call(&mut h, &[("b3", format!("{trace}-{span}-1"))]).await;
    let (trace, span) = caller(4);
    call(
        &mut h,
        &[("x-b3-traceid", trace), ("x-b3-spanid", span), ("x-b3-sampled", "1".to_owned())],
    )
    .await;
    wait_until(PATIENCE, || received.named(EXECUTION_SPAN_NAME).len() >= 4).await;
    wait_until(PATIENCE, || received.named(SERVER_SPAN_NAME).len() >= 4).await;
    // Everything queued is sent by the stop: the counts are final after it.
    h.running.stop().await;

    let servers = received.named(SERVER_SPAN_NAME);
    let executions = received.named(EXECUTION_SPAN_NAME);
    assert_eq!(servers.len(), 4, "one server span per call");
    assert_eq!(executions.len(), 4, "one execution span per call");
    for n in 1..=4 {
        let (trace, span) = caller(n);
        let got = servers
            .iter()
            .find(|g| hex(&g.span.trace_id) == trace)
            .unwrap_or_else(|| panic!("no server span in trace {trace}"));
        assert_eq!(hex(&got.span.parent_span_id), span, "the caller's span is the parent");
        assert_eq!(got.span.kind, SpanKind::Server as i32);
        assert_eq!(got.resource["service.name"], "rl-under-test");
        assert_eq!(got.resource["service.namespace"], "tests");
        assert_eq!(got.resource["service.instance.id"], "instance-1");
        let attributes = strings(&got.span.attributes);
        assert_eq!(attributes["rpc.system"], "grpc");
        assert_eq!(attributes["rpc.method"], "ShouldRateLimit");
        let execution = executions
            .iter()
            .find(|g| g.span.trace_id == got.span.trace_id)
            .expect("an execution span in the same trace");
        assert_eq!(execution.span.parent_span_id, got.span.span_id);
        assert_eq!(strings(&execution.span.attributes)["domain"], "tracing");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_exporter_one_server_span_per_call() {
    one_server_span_per_call("grpc", grpc_collector().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_exporter_one_server_span_per_call() {
    one_server_span_per_call("http", http_collector().await).await;
}

/// `TRACING_SAMPLING_RATE=0`: a call without a parent is not traced; one whose parent was
/// sampled is (ParentBased), and one whose parent was not is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_rate_zero_follows_a_sampled_parent() {
    let (addr, received) = http_collector().await;
    let endpoint = format!("http://{addr}");
    let mut h = Harness::start(
        &[("tracing.yaml", CONFIG)],
        &[
            ("TRACING_ENABLED", "true"),
            ("TRACING_SAMPLING_RATE", "0"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ],
        1,
    )
    .await;
    call(&mut h, &[]).await;
    call(&mut h, &[traceparent(5, "00")]).await;
    call(&mut h, &[traceparent(6, "01")]).await;
    wait_until(PATIENCE, || !received.named(SERVER_SPAN_NAME).is_empty()).await;
    h.running.stop().await;
    let servers = received.named(SERVER_SPAN_NAME);
    let (trace, span) = caller(6);
    assert_eq!(servers.len(), 1, "only the call whose parent was sampled");
    assert_eq!(
        (hex(&servers[0].span.trace_id), hex(&servers[0].span.parent_span_id)),
        (trace, span)
    );
    assert_eq!(servers[0].resource["service.name"], "RateLimit", "the Go default");
    assert_eq!(received.named(EXECUTION_SPAN_NAME).len(), 1);
}

/// A protocol other than `http` or `grpc` stops the start, as in Go (`logger.Fatalf`).
#[test]
fn a_bad_exporter_protocol_is_refused() {
    let vars: HashMap<String, String> =
        [("TRACING_ENABLED", "true"), ("TRACING_EXPORTER_PROTOCOL", "udp")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    let e = ratewell_rls::settings::Settings::from_env(&vars).unwrap_err();
    assert_eq!(e.0, "TRACING_EXPORTER_PROTOCOL=udp: http (the default) or grpc");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ratewell-rls"))
        .env_clear()
        .envs([("TRACING_ENABLED", "true"), ("TRACING_EXPORTER_PROTOCOL", "udp")])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("TRACING_EXPORTER_PROTOCOL=udp: http (the default) or grpc"),
        "{stderr}"
    );
}

/// At SIGTERM the binary sends the spans still queued: the batch delay here is a minute, so
/// only the stop sends them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_sends_the_queued_spans() {
    let (addr, received) = grpc_collector().await;
    let root = tempfile::tempdir().unwrap();
    write_config(root.path(), &[("tracing.yaml", CONFIG)]);
    let root_s = root.path().display().to_string();
    let endpoint = format!("http://{addr}");
    let bin = Binary::spawn(&[
        ("RUNTIME_ROOT", &root_s),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("TRACING_ENABLED", "true"),
        ("TRACING_EXPORTER_PROTOCOL", "grpc"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
        ("OTEL_BSP_SCHEDULE_DELAY", "60000"),
    ]);
    let mut client = bin.client().await;
    // The configuration is read before the binary listens.
    let mut r = tonic::Request::new(request("tracing", &[&[("k", "v")]], 1));
    let (name, value) = traceparent(7, "01");
    r.metadata_mut().insert(name, value.parse().unwrap());
    let response = client.should_rate_limit(r).await.expect("answered").into_inner();
    assert_eq!(response.overall_code, Code::Ok as i32);
    assert!(bin.logged("tracing: spans sent over OTLP (Grpc) to http://"), "the startup line");
    let mut bin = bin;
    let status = tokio::task::spawn_blocking(move || {
        let status = bin.terminate();
        (status, bin)
    })
    .await
    .unwrap()
    .0;
    assert!(status.success(), "{status:?}");
    let (trace, span) = caller(7);
    wait_until(PATIENCE, || {
        received.named(SERVER_SPAN_NAME).iter().any(|g| hex(&g.span.trace_id) == trace)
    })
    .await;
    let servers = received.named(SERVER_SPAN_NAME);
    let got = servers.iter().find(|g| hex(&g.span.trace_id) == trace).unwrap();
    assert_eq!(hex(&got.span.parent_span_id), span);
}
