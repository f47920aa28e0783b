//! `TRACING_*` and the standard `OTEL_*` variables, read as the Go service reads them.

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
