use super::*;

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

#[test]
fn defaults_are_the_go_services() {
    let s = Settings::from_env(&env(&[])).unwrap();
    assert_eq!(s.grpc.port(), 8081);
    assert_eq!(s.http.port(), 8080);
    assert_eq!(s.debug.port(), 6070);
    assert_eq!(s.config_dir(), PathBuf::from("/srv/runtime_data/current/config"));
    assert!(s.watch_root && s.prometheus.is_none() && s.notices.is_empty());
}

#[test]
fn unsupported_variables_are_named() {
    let s = Settings::from_env(&env(&[
        ("REDIS_POOL_SIZE", "10"),
        ("LOCAL_CACHE_SIZE_IN_BYTES", "100"),
    ]))
    .unwrap();
    assert_eq!(s.notices.len(), 2);
    assert!(
        s.notices[0].starts_with("LOCAL_CACHE_SIZE_IN_BYTES is ignored")
            || s.notices[1].starts_with("LOCAL_CACHE_SIZE_IN_BYTES is ignored")
    );
    let s = Settings::from_env(&env(&[("CONFIG_TYPE", "GRPC_XDS_SOTW")])).unwrap();
    assert_eq!(s.xds.unwrap().server_url, "localhost:18000", "the Go default");
    let e = Settings::from_env(&env(&[("CONFIG_TYPE", "GRPC_XDS_DELTA")])).unwrap_err();
    assert_eq!(e.0, "CONFIG_TYPE=GRPC_XDS_DELTA: FILE (the default) or GRPC_XDS_SOTW");
    assert!(Settings::from_env(&env(&[("CONFIG_TYPE", "FILE")])).unwrap().xds.is_none());
    assert!(Settings::from_env(&env(&[("TRACING_ENABLED", "false")])).is_ok());
    let e = Settings::from_env(&env(&[("BACKEND_TYPE", "memcache")])).unwrap_err();
    assert!(e.0.contains("BACKEND_TYPE=memcache"), "{e}");
    let e = Settings::from_env(&env(&[("BACKEND_TYPE", "redis"), ("REDIS_TYPE", "SENTINEL")]))
        .unwrap_err();
    assert!(e.0.starts_with("Expected master name and a list of urls"), "{e}");
    let e =
        Settings::from_env(&env(&[("BACKEND_TYPE", "redis"), ("REDIS_TYPE", "ring")])).unwrap_err();
    assert_eq!(e.0, "REDIS_TYPE=RING is not supported: SINGLE, CLUSTER or SENTINEL");
    let e = Settings::from_env(&env(&[("SHADOW_MODE", "yes")])).unwrap_err();
    assert_eq!(e.0, "SHADOW_MODE=yes: not a boolean (true or false)");
}

#[test]
fn redis_urls_are_read_as_the_go_service_reads_them() {
    let redis = |pairs: &[(&str, &str)]| {
        let mut all = vec![("BACKEND_TYPE", "redis")];
        all.extend_from_slice(pairs);
        Settings::from_env(&env(&all)).unwrap().redis.unwrap()
    };
    let r = redis(&[
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", "localhost:6379"),
        ("REDIS_AUTH", "p@ss"),
    ]);
    assert_eq!(r.urls, ["redis://:p%40ss@localhost:6379"]);
    assert_eq!(r.timeout, Duration::from_millis(50));
    let r = redis(&[("REDIS_SOCKET_TYPE", "tcp"), ("REDIS_AUTH", "user:pw")]);
    assert_eq!(r.urls, ["redis://user:pw@/var/run/nutcracker/ratelimit.sock"]);
    let r = redis(&[]);
    assert_eq!(r.urls, ["unix:///var/run/nutcracker/ratelimit.sock"]);
    let r = redis(&[
        ("REDIS_TYPE", "cluster"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", "a:1, b:2"),
        ("REDIS_TIMEOUT", "20ms"),
    ]);
    assert_eq!(
        (r.urls.clone(), r.cluster, r.timeout),
        (
            vec!["redis://a:1".to_string(), "redis://b:2".to_string()],
            true,
            Duration::from_millis(20)
        )
    );
    let r = redis(&[("REDIS_URL", "redis://127.0.0.1:7000/2"), ("CACHE_KEY_PREFIX", "rl:")]);
    assert_eq!((r.urls[0].as_str(), r.prefix.as_str()), ("redis://127.0.0.1:7000/2", "rl:"));
    let e = Settings::from_env(&env(&[("BACKEND_TYPE", "memory"), ("REDIS_URL", "x")])).unwrap();
    assert_eq!(e.notices, ["REDIS_URL is ignored: BACKEND_TYPE is memory"]);
}

#[test]
fn the_backend_follows_the_go_default_where_a_redis_is_named() {
    let s = Settings::from_env(&env(&[])).unwrap();
    assert!(s.redis.is_none());
    assert!(s.backend.starts_with("deciding in process"), "{}", s.backend);
    let s = Settings::from_env(&env(&[
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", "redis.redis.svc:6379"),
        ("REDIS_AUTH", "secret"),
    ]))
    .unwrap();
    assert_eq!(s.redis.unwrap().urls, ["redis://:secret@redis.redis.svc:6379"]);
    assert_eq!(
        s.backend,
        "deciding on Redis at redis://***@redis.redis.svc:6379 (BACKEND_TYPE=redis: REDIS_URL is set and BACKEND_TYPE is not)"
    );
    let s = Settings::from_env(&env(&[("BACKEND_TYPE", "memory"), ("REDIS_URL", "x:1")])).unwrap();
    assert!(s.redis.is_none() && s.backend.contains("BACKEND_TYPE=memory: BACKEND_TYPE"));
}

#[test]
fn host_names_and_connection_ages() {
    let s = Settings::from_env(&env(&[
        ("HOST", "localhost"),
        ("GRPC_HOST", "localhost"),
        ("GRPC_PORT", "9000"),
        ("GRPC_MAX_CONNECTION_AGE", "30m"),
    ]))
    .unwrap();
    assert!(s.http.ip().is_loopback() && s.grpc.ip().is_loopback(), "{:?}", s.grpc);
    assert_eq!(s.grpc.port(), 9000);
    assert_eq!(s.grpc_max_connection_age, (Duration::from_secs(1800), Duration::from_secs(3600)));
    let d = Settings::from_env(&env(&[])).unwrap();
    assert_eq!(d.grpc_max_connection_age.0, Duration::from_secs(86_400), "the Go default");
    let e = Settings::from_env(&env(&[("DEBUG_HOST", "no such host.invalid")])).unwrap_err();
    assert!(e.0.starts_with("DEBUG_HOST=no such host.invalid: "), "{e}");
    let e = Settings::from_env(&env(&[("GRPC_MAX_CONNECTION_AGE_GRACE", "soon")])).unwrap_err();
    assert_eq!(e.0, "GRPC_MAX_CONNECTION_AGE_GRACE=soon: not a duration");
}

#[test]
fn sentinel_tls_and_the_per_second_server_are_read_as_in_go() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, "CA").unwrap();
    let ca = ca.display().to_string();
    let s = Settings::from_env(&env(&[
        ("BACKEND_TYPE", "redis"),
        ("REDIS_TYPE", "sentinel"),
        ("REDIS_URL", "mymaster, 10.0.0.5:26379,10.0.0.6:26379"),
        ("REDIS_AUTH", "app:p@ss"),
        ("REDIS_SENTINEL_AUTH", "spw"),
        ("REDIS_TLS", "true"),
        ("REDIS_TLS_CACERT", &ca),
        ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"),
        ("REDIS_PERSECOND", "true"),
        ("REDIS_PERSECOND_SOCKET_TYPE", "tcp"),
        ("REDIS_PERSECOND_URL", "10.0.0.7:6379"),
        ("REDIS_PERSECOND_AUTH", "ps"),
        ("REDIS_PERSECOND_TIMEOUT", "20ms"),
    ]))
    .unwrap();
    assert!(s.notices.is_empty(), "{:?}", s.notices);
    let r = s.redis.unwrap();
    let sentinel = r.sentinel.clone().unwrap();
    assert_eq!(sentinel.name, "mymaster");
    assert_eq!(sentinel.sentinels, ["redis://:spw@10.0.0.5:26379", "redis://:spw@10.0.0.6:26379"]);
    assert_eq!(
        (sentinel.username.as_deref(), sentinel.password.as_deref()),
        (Some("app"), Some("p@ss"))
    );
    let tls = r.tls.clone().unwrap();
    assert_eq!((tls.ca.as_deref(), tls.client.is_none()), (Some(&b"CA"[..]), true));
    assert!(tls.skip_hostname_verification);
    let p = r.per_second.clone().unwrap();
    assert_eq!(p.urls, ["redis://:ps@10.0.0.7:6379"]);
    assert_eq!(p.timeout, Duration::from_millis(20));
    assert!(p.tls.is_none(), "REDIS_PERSECOND_TLS is its own switch");
    assert_eq!(
        r.describe(),
        "the primary mymaster named by the sentinels redis://***@10.0.0.5:26379, \
             redis://***@10.0.0.6:26379 over TLS, per-second limits at redis://***@10.0.0.7:6379"
    );
    let e = Settings::from_env(&env(&[
        ("BACKEND_TYPE", "redis"),
        ("REDIS_TLS", "true"),
        ("REDIS_TLS_CACERT", "/no/such/ca.pem"),
    ]))
    .unwrap_err();
    assert!(e.0.starts_with("REDIS_TLS_CACERT=/no/such/ca.pem: cannot be read"), "{e}");
    let e =
        Settings::from_env(&env(&[("BACKEND_TYPE", "redis"), ("REDIS_TLS", "true")])).unwrap_err();
    assert_eq!(e.0, "REDIS_TLS: TLS to Redis needs REDIS_SOCKET_TYPE=tcp");
    let s =
        Settings::from_env(&env(&[("REDIS_TLS", "true"), ("REDIS_PERSECOND", "true")])).unwrap();
    assert!(s.notices.iter().any(|n| n == "REDIS_TLS is ignored: BACKEND_TYPE is memory"));
    let s = Settings::from_env(&env(&[("GRPC_UDS", "/tmp/rl.sock")])).unwrap();
    assert_eq!(s.grpc_uds, Some(PathBuf::from("/tmp/rl.sock")));
}

#[test]
fn durations() {
    assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
    assert_eq!(parse_duration("1h30m"), Some(Duration::from_secs(5400)));
    assert_eq!(parse_duration("0"), Some(Duration::ZERO));
    assert_eq!(parse_duration("10 parsecs"), None);
}
