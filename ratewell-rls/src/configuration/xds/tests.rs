use std::collections::HashMap;

use super::*;
use crate::configuration::config::RateLimitConfig as Loaded;
use crate::configuration::xds::proto::{
    RateLimitDescriptor, RateLimitPolicy, RateLimitReplace, RateLimitUnit,
};
use crate::serving::proto::{Entry, RateLimitDescriptor as Request, Unit};

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn xds(pairs: &[(&str, &str)]) -> Result<XdsSettings, String> {
    let mut all = vec![("CONFIG_TYPE", "GRPC_XDS_SOTW")];
    all.extend_from_slice(pairs);
    XdsSettings::from_env(&env(&all)).map(|s| s.expect("GRPC_XDS_SOTW"))
}

#[test]
fn settings_are_none_without_the_xds_config_type() {
    assert_eq!(XdsSettings::from_env(&env(&[])), Ok(None));
    assert_eq!(XdsSettings::from_env(&env(&[("CONFIG_TYPE", "FILE")])), Ok(None));
    assert_eq!(XdsSettings::from_env(&env(&[("CONFIG_TYPE", "grpc_xds_sotw")])), Ok(None));
}

#[test]
fn settings_defaults_are_the_go_services() {
    let s = xds(&[]).unwrap();
    assert_eq!(s, XdsSettings::new("localhost:18000", "default"));
    assert_eq!(s.connect_retry_interval, Duration::from_secs(3));
    assert_eq!(
        s.backoff,
        XdsBackoff {
            initial: Duration::from_secs(10),
            max: Duration::from_secs(60),
            factor: 0.5,
            jitter: true
        }
    );
    assert_eq!((s.max_message_size, s.tls), (None, None));
    assert!(s.headers.is_empty() && s.node_metadata.is_empty());
}

#[test]
fn settings_envoy_gateway() {
    let s = xds(&[
        ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
    ])
    .unwrap();
    assert_eq!(
        (s.server_url.as_str(), s.node_id.as_str()),
        ("envoy-gateway:18001", "envoy-ratelimit")
    );
    let tls = s.tls.unwrap();
    assert_eq!(tls.client_cert, Some(PathBuf::from("/certs/tls.crt")));
    assert_eq!(tls.client_key, Some(PathBuf::from("/certs/tls.key")));
    assert_eq!(tls.ca_cert, Some(PathBuf::from("/certs/ca.crt")));
    assert_eq!(tls.server_name, None);
}

#[test]
fn settings_formats() {
    let s = xds(&[
        ("CONFIG_GRPC_XDS_NODE_METADATA", "a=1,b=x=y,c:3,,a=2"),
        ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "X-Tenant:t1,x-zone:eu"),
        ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "250ms"),
        ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "1s"),
        ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "1m30s"),
        ("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "2"),
        ("XDS_CLIENT_BACKOFF_JITTER", "F"),
        ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "8388608"),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "false"),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/ignored/without/tls"),
    ])
    .unwrap();
    // Go: split on `,`, then on the first `=`; `c:3` and the empty entry are skipped.
    let metadata: Vec<_> = s.node_metadata.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(metadata, [("a", "2"), ("b", "x=y")]);
    let headers: Vec<_> = s.headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(headers, [("x-tenant", "t1"), ("x-zone", "eu")]);
    assert_eq!(s.connect_retry_interval, Duration::from_millis(250));
    assert_eq!(
        s.backoff,
        XdsBackoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(90),
            factor: 2.0,
            jitter: false
        }
    );
    assert_eq!(s.max_message_size, Some(8 << 20));
    assert_eq!(s.tls, None);
    assert_eq!(xds(&[("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "0")]).unwrap().max_message_size, None);
    let san = xds(&[
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "1"),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/ca.pem"),
        ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "xds.internal"),
    ])
    .unwrap();
    let tls = san.tls.unwrap();
    assert_eq!((tls.server_name.as_deref(), tls.client_cert), (Some("xds.internal"), None));
}

#[test]
fn settings_errors_name_the_variable() {
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[("CONFIG_GRPC_XDS_SERVER_URL", "http://cp:18000")], "without a scheme"),
        (&[("CONFIG_GRPC_XDS_SERVER_URL", "cp")], "not host:port"),
        (&[("CONFIG_GRPC_XDS_SERVER_URL", "cp:18000/x")], "not host:port"),
        (&[("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "3")], "not a duration"),
        (&[("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "soon")], "XDS_CLIENT_BACKOFF_MAX_INTERVAL=soon"),
        (&[("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "NaN")], "not a number"),
        (&[("XDS_CLIENT_BACKOFF_JITTER", "yes")], "not a boolean"),
        (&[("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "-1")], "not a number of bytes"),
        (&[("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "a:b,")], "invalid map item: \"\""),
        (&[("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "a:b:c")], "invalid map item"),
        (&[("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "a b:c")], "not a gRPC metadata key"),
        (&[("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "k-bin:c")], "binary metadata"),
        (&[("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "k:\u{7f}")], "not a gRPC metadata value"),
        (&[("CONFIG_GRPC_XDS_SERVER_USE_TLS", "on")], "CONFIG_GRPC_XDS_SERVER_USE_TLS=on"),
        (&[("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true")], "needs CONFIG_GRPC_XDS_SERVER_TLS_CACERT"),
        (
            &[
                ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
                ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/ca"),
                ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/c"),
            ],
            "go together",
        ),
        (
            &[
                ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
                ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/ca"),
                ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "a b"),
            ],
            "CONFIG_GRPC_XDS_SERVER_TLS_SAN=a b",
        ),
    ];
    for (pairs, expected) in cases {
        let e = xds(pairs).unwrap_err();
        assert!(e.contains(expected), "{pairs:?}: {e}");
    }
}

#[test]
fn backoff_is_jpillora_backoff() {
    let go = XdsBackoff::default();
    // Factor 0.5 < 1: always the initial interval, whatever the attempt or the draw.
    for attempt in [0, 1, 5, 1000, u64::MAX] {
        for r in [0.0, 0.5, 0.999] {
            assert_eq!(backoff_delay(&go, attempt, r), Duration::from_secs(10));
        }
    }
    let grow = XdsBackoff { factor: 2.0, jitter: false, ..go };
    let secs: Vec<u64> = (0..5).map(|n| backoff_delay(&grow, n, 0.0).as_secs()).collect();
    assert_eq!(secs, [10, 20, 40, 60, 60]);
    let jitter = XdsBackoff { factor: 2.0, ..go };
    assert_eq!(backoff_delay(&jitter, 2, 0.0), Duration::from_secs(10));
    assert_eq!(backoff_delay(&jitter, 2, 0.5), Duration::from_secs(25));
    assert_eq!(backoff_delay(&jitter, 100_000, 0.5), Duration::from_secs(60));
    let zero =
        XdsBackoff { initial: Duration::ZERO, max: Duration::ZERO, factor: 0.0, jitter: false };
    assert_eq!(backoff_delay(&zero, 1, 0.0), Duration::from_millis(200));
    let inverted =
        XdsBackoff { initial: Duration::from_secs(5), max: Duration::from_secs(1), ..go };
    assert_eq!(backoff_delay(&inverted, 0, 0.0), Duration::from_secs(1));
}

#[test]
fn connect_retry_is_linear_with_half_jitter() {
    let d = Duration::from_secs(3);
    assert_eq!(linear_jitter(d, 0.0), Duration::from_millis(1500));
    assert_eq!(linear_jitter(d, 0.5), d);
    assert!(linear_jitter(d, 0.999_999) < Duration::from_millis(4500));
    assert_eq!(linear_jitter(Duration::MAX, 0.9), Duration::MAX);
    for _ in 0..100 {
        let r = random_unit();
        assert!((0.0..1.0).contains(&r), "{r}");
    }
}

fn any(value: Vec<u8>, type_url: &str) -> prost_types::Any {
    prost_types::Any { type_url: type_url.into(), value }
}

#[test]
fn decode_checks_each_resource_type_and_bytes() {
    let config = RateLimitConfig { name: "n".into(), domain: "d".into(), descriptors: vec![] };
    let ok = decode(&[
        any(config.encode_to_vec(), RATE_LIMIT_CONFIG_TYPE_URL),
        any(config.encode_to_vec(), RESOURCE_NAME),
        any(config.encode_to_vec(), &format!("example.com/x/{RESOURCE_NAME}")),
    ])
    .unwrap();
    assert_eq!(ok.iter().map(|f| (f.name(), f.domain())).collect::<Vec<_>>(), [("n", "d"); 3]);
    let wrong = format!("type.googleapis.com/x{RESOURCE_NAME}");
    for bad in [
        any(config.encode_to_vec(), "type.googleapis.com/envoy.config.cluster.v3.Cluster"),
        any(config.encode_to_vec(), &wrong),
        any(config.encode_to_vec(), ""),
    ] {
        let e =
            decode(&[any(config.encode_to_vec(), RATE_LIMIT_CONFIG_TYPE_URL), bad]).unwrap_err();
        assert!(e.starts_with("resource 1: mismatched message type"), "{e}");
    }
    for garbage in [vec![0xff], vec![0x0a, 5, b'x'], vec![0x1a, 0x80]] {
        let e = decode(&[any(garbage, RATE_LIMIT_CONFIG_TYPE_URL)]).unwrap_err();
        assert!(e.starts_with("resource 0: failed to decode"), "{e}");
    }
    // Nested past prost's recursion limit: an error, not a stack overflow.
    let mut deep = RateLimitDescriptor { key: "k".into(), ..Default::default() };
    for _ in 0..200 {
        deep =
            RateLimitDescriptor { key: "k".into(), descriptors: vec![deep], ..Default::default() };
    }
    let config =
        RateLimitConfig { domain: "d".into(), descriptors: vec![deep], ..Default::default() };
    assert!(decode(&[any(config.encode_to_vec(), RATE_LIMIT_CONFIG_TYPE_URL)]).is_err());
}

fn policy(unit: RateLimitUnit, requests_per_unit: u32) -> Option<RateLimitPolicy> {
    Some(RateLimitPolicy { unit: unit as i32, requests_per_unit, ..Default::default() })
}

/// A resource loads as the YAML file of the same content does (Go's `ConfigXdsProtoToYaml`).
#[test]
fn a_resource_loads_as_its_yaml_file() {
    let number =
        |n: f64| prost_types::Value { kind: Some(prost_types::value::Kind::NumberValue(n)) };
    let resource = RateLimitConfig {
        name: "edge-config".into(),
        domain: "edge".into(),
        descriptors: vec![
            RateLimitDescriptor {
                key: "k1".into(),
                value: "v1".into(),
                rate_limit: policy(RateLimitUnit::Minute, 5),
                descriptors: vec![RateLimitDescriptor {
                    key: "k2".into(),
                    rate_limit: Some(RateLimitPolicy {
                        unit: RateLimitUnit::Week as i32,
                        requests_per_unit: 7,
                        name: "weekly".into(),
                        replaces: vec![RateLimitReplace { name: "daily".into() }],
                        ..Default::default()
                    }),
                    shadow_mode: true,
                    detailed_metric: true,
                    ..Default::default()
                }],
                quota_mode: true,
                metadata: Some(prost_types::Struct {
                    fields: [("n".to_owned(), number(1.5))].into(),
                }),
                ..Default::default()
            },
            RateLimitDescriptor {
                key: "open".into(),
                rate_limit: Some(RateLimitPolicy { unlimited: true, ..Default::default() }),
                ..Default::default()
            },
        ],
    };
    let yaml = "
domain: edge
descriptors:
  - key: k1
    value: v1
    rate_limit: {unit: minute, requests_per_unit: 5}
    quota_mode: true
    metadata: {n: 1.5}
    descriptors:
      - key: k2
        rate_limit: {unit: week, requests_per_unit: 7, name: weekly, replaces: [{name: daily}]}
        shadow_mode: true
        detailed_metric: true
  - key: open
    rate_limit: {unlimited: true}
";
    let from_xds = ConfigFile::from_xds(&resource);
    assert_eq!((from_xds.name(), from_xds.domain()), ("edge-config", "edge"));
    let from_xds = Loaded::new(&[from_xds], false).unwrap();
    let from_yaml = Loaded::new(&[ConfigFile::parse("edge.yaml", yaml).unwrap()], false).unwrap();
    assert_eq!(from_xds.dump(), from_yaml.dump());
    let request = |entries: &[(&str, &str)]| Request {
        entries: entries
            .iter()
            .map(|(k, v)| Entry { key: k.to_string(), value: v.to_string() })
            .collect(),
        ..Default::default()
    };
    for entries in [&[("k1", "v1")][..], &[("k1", "v1"), ("k2", "x")], &[("open", "y")]] {
        let (a, b) = (
            from_xds.get_limit("edge", &request(entries)),
            from_yaml.get_limit("edge", &request(entries)),
        );
        assert_eq!(format!("{a:?}"), format!("{b:?}"), "{entries:?}");
        assert!(a.is_some());
    }
    let weekly = from_xds.get_limit("edge", &request(&[("k1", "v1"), ("k2", "x")])).unwrap();
    assert_eq!(
        (weekly.unit, weekly.name.as_str(), &weekly.replaces[..]),
        (Unit::Week, "weekly", &["daily".to_owned()][..])
    );
    assert!(weekly.shadow_mode && weekly.detailed_metric);
    let k1 = from_xds.get_limit("edge", &request(&[("k1", "v1")])).unwrap();
    assert!(k1.quota_mode);
    assert_eq!(k1.metadata.unwrap().fields["n"], number(1.5));
}

/// What Go's loader refuses in a resource, ours refuses with the same words, the file named
/// by the resource's `name`.
#[test]
fn a_bad_resource_is_refused_with_gos_words() {
    let load = |descriptors: Vec<RateLimitDescriptor>| {
        let resource = RateLimitConfig { name: "cfg".into(), domain: "d".into(), descriptors };
        Loaded::new(&[ConfigFile::from_xds(&resource)], false).unwrap_err().to_string()
    };
    let limited = |unit: i32| RateLimitDescriptor {
        key: "k".into(),
        rate_limit: Some(RateLimitPolicy { unit, requests_per_unit: 1, ..Default::default() }),
        ..Default::default()
    };
    assert_eq!(load(vec![limited(0)]), "cfg: invalid rate limit unit 'UNKNOWN'");
    assert_eq!(load(vec![limited(42)]), "cfg: invalid rate limit unit '42'");
    let unlimited_with_unit = RateLimitDescriptor {
        key: "k".into(),
        rate_limit: Some(RateLimitPolicy { unit: 1, unlimited: true, ..Default::default() }),
        ..Default::default()
    };
    assert_eq!(
        load(vec![unlimited_with_unit]),
        "cfg: should not specify rate limit unit when unlimited"
    );
    assert_eq!(load(vec![limited(1), limited(2)]), "cfg: duplicate descriptor composite key 'd.k'");
    let resource = RateLimitConfig { name: "nameless".into(), ..Default::default() };
    let e = Loaded::new(&[ConfigFile::from_xds(&resource)], false).unwrap_err();
    assert_eq!(e.to_string(), "nameless: config file cannot have empty domain");
    let twice = RateLimitConfig { name: "b".into(), domain: "d".into(), descriptors: vec![] };
    let first = RateLimitConfig { name: "a".into(), ..twice.clone() };
    let files = [ConfigFile::from_xds(&first), ConfigFile::from_xds(&twice)];
    assert_eq!(
        Loaded::new(&files, false).unwrap_err().to_string(),
        "b: duplicate domain 'd' in config file"
    );
    assert!(Loaded::new(&files, true).is_ok());
}

#[test]
fn the_node_is_gos() {
    let mut s = XdsSettings::new("cp:1", "n1");
    assert_eq!(node(&s).encode_to_vec(), [0x0a, 2, b'n', b'1', 0x1a, 0]);
    s.node_metadata.insert("k".into(), "v".into());
    let n = node(&s);
    assert_eq!(
        n.metadata.unwrap().fields["k"].kind,
        Some(prost_types::value::Kind::StringValue("v".into()))
    );
}
