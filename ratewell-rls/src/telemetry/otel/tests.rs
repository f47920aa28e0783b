use std::collections::HashMap;
use std::time::Duration;

use super::settings::{Protocol, TracingSettings};

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
    assert_eq!((s.timeout, s.schedule_delay), (Duration::from_secs(10), Duration::from_secs(5)));
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
    assert_eq!((t.headers, t.timeout), (vec![("b".into(), "2".into())], Duration::from_millis(7)));
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
