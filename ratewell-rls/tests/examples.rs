//! The deployment examples (`examples/kubernetes/ratelimit.yaml`,
//! `examples/docker-compose/docker-compose.yml` and its `config/`), run as written: each
//! manifest is parsed, the ratelimit container's environment taken as it is there, and only what
//! must point at this machine replaced (the Redis address, to a `redis-server` started on
//! loopback; `RUNTIME_ROOT`, to a temporary directory holding the example's own configuration
//! files; the listen ports, to free ones). The real binary starts on it and decides, on Redis,
//! what the example's configuration says: admitted up to the limit, then over it. Each test
//! asserts which variables it replaced, so a variable added to a manifest reaches the binary as
//! written, and one the service refuses stops its start.
//!
//! Then the Dockerfile's facts the examples rely on (the binary at `/bin/ratelimit`, run as the
//! image's command), and the environments the Go service's own manifests and Envoy Gateway's
//! deployments set: none may be refused at start.

mod common;
#[path = "../../ratewell-redis/tests/common/mod.rs"]
mod redis_common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Binary, clear_of_boundary, request};
use ratewell_rls::grpc::rate_limit_service_client::RateLimitServiceClient;
use ratewell_rls::proto::{Code, RateLimitResponse, Unit};
use ratewell_rls::settings::Settings;
use redis_common::Server;
use serde_yaml_ng::Value;
use tonic::transport::Channel;

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every document of a multi-document YAML file.
fn documents(text: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|d| serde::Deserialize::deserialize(d).expect("a YAML document"))
        .collect()
}

fn text<'a>(value: &'a Value, path: &[&str]) -> &'a str {
    let mut v = value;
    for key in path {
        v = &v[*key];
    }
    v.as_str().unwrap_or_else(|| panic!("{path:?} is not a string: {v:?}"))
}

fn list<'a>(value: &'a Value, path: &[&str]) -> &'a [Value] {
    let mut v = value;
    for key in path {
        v = &v[*key];
    }
    v.as_sequence().unwrap_or_else(|| panic!("{path:?} is not a list: {v:?}"))
}

/// A manifest's environment with what must point at this machine replaced: the Redis address
/// (`REDIS_URL`), the runtime root (`RUNTIME_ROOT`), and the listen addresses (to the harness's
/// loopback and free ports, which `Binary::spawn` sets when the manifest does not). The
/// environment to run, and the names replaced, in the manifest's order.
fn localize(
    env: &[(String, String)],
    redis: &Server,
    root: &Path,
) -> (Vec<(String, String)>, Vec<String>) {
    let mut out = Vec::new();
    let mut replaced = Vec::new();
    for (name, value) in env {
        let local = match name.as_str() {
            "REDIS_URL" => format!("127.0.0.1:{}", redis.port),
            "RUNTIME_ROOT" => root.display().to_string(),
            "HOST" | "GRPC_HOST" | "DEBUG_HOST" => "127.0.0.1".into(),
            "PORT" | "GRPC_PORT" | "DEBUG_PORT" => "0".into(),
            _ => value.clone(),
        };
        if &local != value {
            replaced.push(name.clone());
        }
        out.push((name.clone(), local));
    }
    (out, replaced)
}

/// The configuration directory the service reads under `env`'s runtime root:
/// `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config` (`RUNTIME_APPDIRECTORY`'s default).
fn config_dir(env: &[(String, String)]) -> String {
    let get = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    assert_eq!(get("RUNTIME_APPDIRECTORY"), None, "the examples keep the default `config`");
    format!("{}/{}/config", get("RUNTIME_ROOT").unwrap(), get("RUNTIME_SUBDIRECTORY").unwrap())
}

async fn client(bin: &Binary) -> RateLimitServiceClient<Channel> {
    bin.client().await
}

/// Wait until the configuration is loaded: a request of `domain` whose descriptor matches no
/// rule is answered OK (and charges nothing) once it is.
async fn wait_loaded(client: &mut RateLimitServiceClient<Channel>, bin: &Binary, domain: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let probe = request(domain, &[&[("no-such-key", "probe")]], 1);
        match client.should_rate_limit(probe).await {
            Ok(r) if r.get_ref().overall_code == Code::Ok as i32 => return,
            other => assert!(
                Instant::now() < deadline,
                "the example's configuration did not load: {other:?}; log: {:?}",
                bin.lines()
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `n` calls of one descriptor: each answer's code, limit and remaining count.
async fn calls(
    client: &mut RateLimitServiceClient<Channel>,
    domain: &str,
    descriptor: &[(&str, &str)],
    n: usize,
) -> Vec<(i32, u32, i32, u32)> {
    let mut out = Vec::new();
    for _ in 0..n {
        let r: RateLimitResponse = client
            .should_rate_limit(request(domain, &[descriptor], 1))
            .await
            .expect("an answer")
            .into_inner();
        let s = &r.statuses[0];
        let limit = s.current_limit.as_ref().expect("a limit");
        out.push((r.overall_code, limit.requests_per_unit, limit.unit, s.limit_remaining));
    }
    out
}

fn redis_keys(redis: &Server) -> u64 {
    redis.cli(&["DBSIZE"]).and_then(|n| n.trim().parse().ok()).unwrap_or(0)
}

// ---- examples/kubernetes/ratelimit.yaml ----------------------------------------------------

/// Write `files` into `dir` as kubelet mounts a ConfigMap: the files in a dot-named directory of
/// its own, `..data` a link to it, and each name a link through `..data`.
fn mount_config_map(dir: &Path, files: &[(String, String)]) {
    let version = dir.join("..2026_01_01_00_00_00.000000001");
    std::fs::create_dir_all(&version).unwrap();
    for (name, content) in files {
        std::fs::write(version.join(name), content).unwrap();
    }
    std::os::unix::fs::symlink(version.file_name().unwrap(), dir.join("..data")).unwrap();
    for (name, _) in files {
        std::os::unix::fs::symlink(Path::new("..data").join(name), dir.join(name)).unwrap();
    }
}

#[tokio::test]
async fn the_kubernetes_example() {
    let manifest = read(&examples().join("kubernetes/ratelimit.yaml"));
    let docs = documents(&manifest);
    let kinds: Vec<(&str, &str)> =
        docs.iter().map(|d| (text(d, &["kind"]), text(d, &["metadata", "name"]))).collect();
    assert_eq!(
        kinds,
        [
            ("ConfigMap", "ratelimit-config"),
            ("Deployment", "redis"),
            ("Service", "redis"),
            ("Deployment", "ratelimit"),
            ("Service", "ratelimit"),
        ]
    );
    let config_map = &docs[0];
    let pod = &docs[3]["spec"]["template"]["spec"];
    let container = &list(pod, &["containers"])[0];
    assert_eq!(text(container, &["name"]), "ratelimit");
    assert_eq!(text(container, &["image"]), "ratewell-rls:latest");
    let command: Vec<&str> =
        list(container, &["command"]).iter().map(|c| c.as_str().unwrap()).collect();
    assert_eq!(command, ["/bin/ratelimit"], "the Go image's path, which the Dockerfile provides");
    let env: Vec<(String, String)> = list(container, &["env"])
        .iter()
        .map(|e| (text(e, &["name"]).to_owned(), text(e, &["value"]).to_owned()))
        .collect();

    // The ConfigMap is mounted where the environment says the configuration is.
    let mount = &list(container, &["volumeMounts"])[0];
    let volume = &list(pod, &["volumes"])[0];
    assert_eq!(text(mount, &["name"]), text(volume, &["name"]));
    assert_eq!(text(volume, &["configMap", "name"]), "ratelimit-config");
    assert_eq!(text(mount, &["mountPath"]), config_dir(&env));
    // Redis is the manifest's own Service, on its port.
    let redis_env = env.iter().find(|(k, _)| k == "REDIS_URL").unwrap();
    let redis_port = docs[2]["spec"]["ports"][0]["port"].as_u64().unwrap();
    assert_eq!(redis_env.1, format!("{}:{redis_port}", text(&docs[2], &["metadata", "name"])));
    let files: Vec<(String, String)> = config_map["data"]
        .as_mapping()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.as_str().unwrap().to_owned(), v.as_str().unwrap().to_owned()))
        .collect();
    assert_eq!(files.len(), 2);

    let redis = Server::start();
    let root = tempfile::tempdir().unwrap();
    let (local, replaced) = localize(&env, &redis, root.path());
    assert_eq!(replaced, ["REDIS_URL", "RUNTIME_ROOT"]);
    let dir = PathBuf::from(config_dir(&local));
    std::fs::create_dir_all(&dir).unwrap();
    mount_config_map(&dir, &files);

    let vars: Vec<(&str, &str)> = local.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let bin = Binary::spawn(&vars);
    assert!(bin.logged("deciding on Redis at redis://127.0.0.1:"), "{:?}", bin.lines());
    let mut rls = client(&bin).await;
    wait_loaded(&mut rls, &bin, "rl").await;
    // example.yaml: source_cluster=proxy, destination_cluster=mock: 1 a minute.
    clear_of_boundary(60, 5).await;
    let got =
        calls(&mut rls, "rl", &[("source_cluster", "proxy"), ("destination_cluster", "mock")], 3)
            .await;
    let (ok, over, minute) = (Code::Ok as i32, Code::OverLimit as i32, Unit::Minute as i32);
    assert_eq!(got, [(ok, 1, minute, 0), (over, 1, minute, 0), (over, 1, minute, 0)]);
    // config.yaml: the other file of the ConfigMap, loaded too (500 a second).
    let got = calls(&mut rls, "mongo_cps", &[("database", "users")], 1).await;
    assert_eq!(got, [(ok, 500, Unit::Second as i32, 499)]);
    assert!(redis_keys(&redis) > 0, "the counts are on the Redis server");
    let (code, body) = common::http(bin.http, "GET", "/healthcheck", b"").await;
    assert_eq!((code, body.as_str()), (200, "OK"), "the probes' endpoint");
}

// ---- examples/docker-compose -----------------------------------------------------------------

#[tokio::test]
async fn the_docker_compose_example() {
    let base = examples().join("docker-compose");
    let compose: Value = serde_yaml_ng::from_str(&read(&base.join("docker-compose.yml"))).unwrap();
    let services: Vec<&str> =
        compose["services"].as_mapping().unwrap().keys().map(|k| k.as_str().unwrap()).collect();
    assert_eq!(services, ["redis", "ratelimit"]);
    let service = &compose["services"]["ratelimit"];
    assert_eq!(text(service, &["image"]), "ratewell-rls:latest");
    assert_eq!(text(service, &["command"]), "/bin/ratelimit", "the entrypoint named again");
    let env: Vec<(String, String)> = list(service, &["environment"])
        .iter()
        .map(|e| {
            let (k, v) = e.as_str().unwrap().split_once('=').expect("NAME=value");
            (k.to_owned(), v.to_owned())
        })
        .collect();
    let ports: Vec<&str> = list(service, &["ports"]).iter().map(|p| p.as_str().unwrap()).collect();
    assert_eq!(ports, ["8080:8080", "8081:8081", "6070:6070"], "the Go service's ports");
    // ./config is mounted where the environment says the configuration is, and Redis is the
    // compose file's own service.
    let volumes: Vec<&str> =
        list(service, &["volumes"]).iter().map(|v| v.as_str().unwrap()).collect();
    assert_eq!(volumes, [format!("./config:{}", config_dir(&env))]);
    let redis_env = env.iter().find(|(k, _)| k == "REDIS_URL").unwrap();
    assert_eq!(redis_env.1, "redis:6379");
    assert_eq!(list(&compose["services"]["redis"], &["expose"])[0].as_u64(), Some(6379));
    let mut files = Vec::new();
    for entry in std::fs::read_dir(base.join("config")).unwrap() {
        let path = entry.unwrap().path();
        files.push((path.file_name().unwrap().to_str().unwrap().to_owned(), read(&path)));
    }
    files.sort();
    let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["config.yaml", "example.yaml"]);

    let redis = Server::start();
    let root = tempfile::tempdir().unwrap();
    let (local, replaced) = localize(&env, &redis, root.path());
    assert_eq!(replaced, ["REDIS_URL", "RUNTIME_ROOT"]);
    let dir = PathBuf::from(config_dir(&local));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, content) in &files {
        std::fs::write(dir.join(name), content).unwrap();
    }

    let vars: Vec<(&str, &str)> = local.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let bin = Binary::spawn(&vars);
    assert!(bin.logged("deciding on Redis at redis://127.0.0.1:"), "{:?}", bin.lines());
    let mut rls = client(&bin).await;
    wait_loaded(&mut rls, &bin, "rl").await;
    // example.yaml: foo (any value): 2 a minute.
    clear_of_boundary(60, 5).await;
    let got = calls(&mut rls, "rl", &[("foo", "client-1")], 3).await;
    let (ok, over, minute) = (Code::Ok as i32, Code::OverLimit as i32, Unit::Minute as i32);
    assert_eq!(got, [(ok, 2, minute, 1), (ok, 2, minute, 0), (over, 2, minute, 0)]);
    assert!(redis_keys(&redis) > 0, "the counts are on the Redis server");
}

// ---- the Dockerfile --------------------------------------------------------------------------

#[test]
fn the_dockerfile_runs_the_binary_where_the_examples_do() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dockerfile = read(&root.join("Dockerfile"));
    let instructions: Vec<&str> =
        dockerfile.lines().filter(|l| !l.starts_with('#') && !l.starts_with(' ')).collect();
    let has = |line: &str| instructions.contains(&line);
    assert!(has("COPY --from=build /out/ratelimit /bin/ratelimit"), "{instructions:?}");
    // The Go image's entrypoint; the compose files' `command: /bin/ratelimit` then arrives as
    // an argument, which the binary skips (`the_binary_named_as_its_own_argument_is_skipped`).
    assert!(has("ENTRYPOINT [\"/bin/ratelimit\"]"), "{instructions:?}");
    assert!(!instructions.iter().any(|l| l.starts_with("CMD")), "{instructions:?}");
    assert!(has("EXPOSE 8080 8081 6070"));
    assert!(has("USER 65532:65532"));
    assert!(dockerfile.contains("cargo build --release --locked -p ratewell-rls"));
    let ignore = read(&root.join("../.dockerignore"));
    for pattern in ["**/target/", ".git/", "fuzz/", "**/benches/results/"] {
        assert!(ignore.lines().any(|l| l == pattern), ".dockerignore lacks {pattern}");
    }
}

// ---- the environments of the Go service's manifests and of Envoy Gateway's --------------------

/// The environments envoyproxy/ratelimit's own files set for it (its repository at f2fb157, July
/// 2026), each as written there.
const GO_ENVIRONMENTS: &[(&str, &[(&str, &str)])] = &[
    (
        "envoyproxy/ratelimit docker-compose.yml",
        &[
            ("USE_STATSD", "false"),
            ("LOG_LEVEL", "debug"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "redis:6379"),
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("MEMCACHE_HOST_PORT", "memcached:11211"),
        ],
    ),
    (
        "envoyproxy/ratelimit docker-compose-example.yml (README: CONFIG_TYPE=FILE)",
        &[
            ("USE_STATSD", "true"),
            ("STATSD_HOST", "statsd"),
            ("STATSD_PORT", "9125"),
            ("LOG_LEVEL", "debug"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "redis:6379"),
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_WATCH_ROOT", "false"),
            ("CONFIG_TYPE", "FILE"),
            ("CONFIG_GRPC_XDS_NODE_ID", "test-node-id"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "ratelimit-xds-config-server:18000"),
        ],
    ),
    (
        "envoyproxy/ratelimit docker-compose-example.yml (README: CONFIG_TYPE=GRPC_XDS_SOTW)",
        &[
            ("USE_STATSD", "true"),
            ("STATSD_HOST", "statsd"),
            ("STATSD_PORT", "9125"),
            ("LOG_LEVEL", "debug"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "redis:6379"),
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_WATCH_ROOT", "false"),
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_NODE_ID", "test-node-id"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "ratelimit-xds-config-server:18000"),
        ],
    ),
    (
        "envoyproxy/ratelimit integration-test/docker-compose-integration-test.yml",
        &[
            ("USE_STATSD", "true"),
            ("STATSD_HOST", "statsd"),
            ("STATSD_PORT", "9125"),
            ("LOG_LEVEL", "debug"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "redis:6379"),
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_WATCH_ROOT", "false"),
            ("RESPONSE_DYNAMIC_METADATA", "true"),
        ],
    ),
    (
        "envoyproxy/ratelimit README.md, Building and Testing (running the server locally)",
        &[
            ("USE_STATSD", "false"),
            ("LOG_LEVEL", "debug"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "localhost:6379"),
            ("RUNTIME_ROOT", "/home/user/src/runtime/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_APPDIRECTORY", "config"),
        ],
    ),
    ("envoyproxy/ratelimit README.md, Log Format", &[("LOG_FORMAT", "json")]),
    ("envoyproxy/ratelimit README.md, GRPC server", &[("GRPC_UDS", "/<dir>/ratelimit.sock")]),
];

/// The environment of Envoy Gateway's ratelimit container in its deployment builder's expected
/// output (envoyproxy/gateway at d32f282, August 2026,
/// `internal/infrastructure/kubernetes/ratelimit/testdata/deployments/default.yaml`, and the
/// same in `custom.yaml`, `default-env.yaml`, `merge-annotations.yaml`, `merge-labels.yaml`,
/// `patch-deployment.yaml`, `with-hpa.yaml`, `with-node-selector.yaml` and
/// `with-topology-spread-constraints.yaml`), in its order.
const EG_DEFAULT: &[(&str, &str)] = &[
    ("RUNTIME_ROOT", "/data"),
    ("RUNTIME_SUBDIRECTORY", "ratelimit"),
    ("RUNTIME_IGNOREDOTFILES", "true"),
    ("RUNTIME_WATCH_ROOT", "false"),
    ("LOG_LEVEL", "info"),
    ("USE_STATSD", "false"),
    ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
    ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
    ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
    ("GRPC_SERVER_USE_TLS", "true"),
    ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
    ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
    ("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"),
    ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"),
    ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
    ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
    ("REDIS_SOCKET_TYPE", "tcp"),
    ("REDIS_URL", "redis.redis.svc:6379"),
    ("USE_PROMETHEUS", "true"),
    ("PROMETHEUS_ADDR", ":19001"),
    ("PROMETHEUS_MAPPER_YAML", "/etc/statsd-exporter/conf.yaml"),
];

/// The other deployments in the same folder, as changes to [`EG_DEFAULT`]: the variables they
/// drop, and those they set (a new value, or one more variable). Values Kubernetes fills in
/// (`valueFrom`) are given as it would: the Redis URL from a Secret as the default's, the pod's
/// name as one.
#[allow(clippy::type_complexity)]
const EG_VARIANTS: &[(&str, &[&str], &[(&str, &str)])] = &[
    (
        "disable-prometheus.yaml",
        &["USE_PROMETHEUS", "PROMETHEUS_ADDR", "PROMETHEUS_MAPPER_YAML"],
        &[],
    ),
    (
        "enable-tracing.yaml",
        &[],
        &[
            ("TRACING_ENABLED", "true"),
            ("TRACING_SERVICE_NAME", "envoy-ratelimit"),
            ("TRACING_SERVICE_NAMESPACE", "envoy-gateway-system"),
            ("TRACING_SERVICE_INSTANCE_ID", "envoy-ratelimit-5d9c7b8f6d-x7k2p"),
            ("TRACING_SAMPLING_RATE", "1.0"),
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "http://trace-collector.envoy-gateway-system.svc.cluster.local:4318",
            ),
        ],
    ),
    (
        "enable-tracing-custom.yaml",
        &[],
        &[
            ("TRACING_ENABLED", "true"),
            ("TRACING_SERVICE_NAME", "envoy-ratelimit"),
            ("TRACING_SERVICE_NAMESPACE", "envoy-gateway-system"),
            ("TRACING_SERVICE_INSTANCE_ID", "envoy-ratelimit-5d9c7b8f6d-x7k2p"),
            ("TRACING_SAMPLING_RATE", "0.6"),
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "http://trace-collector.envoy-gateway-system.svc.cluster.local:4317",
            ),
        ],
    ),
    ("extension-env.yaml", &[], &[("env_a", "env_a_value"), ("env_b", "env_b_value")]),
    ("override-env.yaml", &[], &[("USE_STATSD", "true")]),
    ("patch-deployment-containers.yaml", &[], &[("REDIS_TYPE", "sentinel")]),
    (
        "redis-tls-settings.yaml, tolerations.yaml, volumes.yaml",
        &[],
        &[
            ("USE_STATSD", "true"),
            ("REDIS_TLS", "true"),
            ("REDIS_TLS_CLIENT_CERT", "/redis-certs/tls.crt"),
            ("REDIS_TLS_CLIENT_KEY", "/redis-certs/tls.key"),
            ("REDIS_AUTH", "redis_auth_password"),
        ],
    ),
    ("redis-url-secret-ref.yaml", &[], &[("REDIS_URL", "redis.redis.svc:6379")]),
];

/// Every environment to check: its source, and its variables.
fn environments() -> Vec<(String, Vec<(String, String)>)> {
    let owned = |env: &[(&str, &str)]| -> Vec<(String, String)> {
        env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    };
    let mut out: Vec<(String, Vec<(String, String)>)> =
        GO_ENVIRONMENTS.iter().map(|(source, env)| (source.to_string(), owned(env))).collect();
    out.push(("envoyproxy/gateway default.yaml".into(), owned(EG_DEFAULT)));
    for (files, dropped, set) in EG_VARIANTS {
        let mut env = owned(EG_DEFAULT);
        env.retain(|(k, _)| !dropped.contains(&k.as_str()));
        for (name, value) in *set {
            match env.iter_mut().find(|(k, _)| k == name) {
                Some(slot) => slot.1 = value.to_string(),
                None => env.push((name.to_string(), value.to_string())),
            }
        }
        out.push((format!("envoyproxy/gateway {files}"), env));
    }
    out
}

/// What `Settings::from_env` says of `env`: every refusal ("... is not supported"), and every
/// other error. Each error is set aside with the variable it is about, and the rest read again,
/// so that one error does not hide the next: the variable it starts with (`NAME=value: ...`,
/// `NAME is ...`), else the first whose removal changes the answer (the stats sinks' conflict,
/// the Sentinel URL's format name none).
fn refusals(env: &[(String, String)]) -> (Vec<String>, Vec<String>) {
    let mut vars: HashMap<String, String> = env.iter().cloned().collect();
    let (mut refused, mut other) = (Vec::new(), Vec::new());
    while let Err(e) = Settings::from_env(&vars) {
        let prefixed = vars
            .keys()
            .filter(|k| e.0.starts_with(&format!("{k}=")) || e.0.starts_with(&format!("{k} ")))
            .max_by_key(|k| k.len())
            .cloned();
        let named = prefixed.or_else(|| {
            env.iter()
                .map(|(k, _)| k)
                .find(|k| {
                    let mut without = vars.clone();
                    without.remove(*k).is_some()
                        && Settings::from_env(&without).err() != Some(e.clone())
                })
                .cloned()
        });
        if e.0.contains("is not supported") {
            refused.push(e.0.clone());
        } else {
            other.push(e.0.clone());
        }
        match named {
            Some(name) => vars.remove(&name),
            None => break,
        };
    }
    (refused, other)
}

/// The errors that are not refusals and are expected of these environments on this machine:
/// - the stats sinks' conflict (`USE_STATSD=true` with `USE_PROMETHEUS=true`, in Envoy Gateway's
///   override-env.yaml and redis-tls-settings.yaml): the Go service exits on it too, with the
///   same message (its `src/service_cmd/runner/runner.go`);
/// - `REDIS_TYPE=sentinel` over a `REDIS_URL` without a master name (Envoy Gateway's
///   patch-deployment-containers.yaml): the Go service panics on it too, with the same message
///   (its `src/redis/driver_impl.go`);
/// - a file named by a variable that is not on this machine (`/redis-certs/tls.crt`: `NAME=path:
///   cannot be read: ...`); the files read later, at start (`/certs/...`), are not read here;
/// - a listen host name that does not resolve here (`HOST`, `GRPC_HOST`, `DEBUG_HOST` are
///   resolved when read; these environments set none).
///
/// The control plane, the statsd host and Redis are not reached by `Settings::from_env`: they are
/// connected to when the service starts.
fn expected(error: &str) -> bool {
    error.starts_with("Error: unable to use more than one stats sink at the same time")
        || error.starts_with("Expected master name and a list of urls for the sentinels")
        || error.contains(": cannot be read: ")
        || error.contains(": not an address: ")
        || error.ends_with(": resolves to no address")
}

#[test]
fn no_variable_of_the_go_and_envoy_gateway_manifests_is_refused() {
    let mut refused = Vec::new();
    let mut unexpected = Vec::new();
    for (source, env) in environments() {
        let (r, other) = refusals(&env);
        refused.extend(r.into_iter().map(|e| format!("{source}: {e}")));
        for e in other {
            eprintln!("{source}: {e}");
            if !expected(&e) {
                unexpected.push(format!("{source}: {e}"));
            }
        }
    }
    assert!(
        refused.is_empty() && unexpected.is_empty(),
        "refused:\n  {}\nother errors:\n  {}",
        refused.join("\n  "),
        unexpected.join("\n  ")
    );
}

/// The Go image's entrypoint with the compose files' `command: /bin/ratelimit` runs the binary
/// with its own path as its argument: skipped, as the Go binary ignores its arguments. Any other
/// argument is still refused.
#[test]
fn the_binary_named_as_its_own_argument_is_skipped() {
    let bin = env!("CARGO_BIN_EXE_ratewell-rls");
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let out = std::process::Command::new(bin)
            .args(args)
            .env_clear()
            .envs(env.iter().copied())
            .output()
            .expect("the binary runs");
        (
            out.status.code(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let (code, out) = run(&[bin, "--help"], &[]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("GRPC_UDS"), "{out}");
    // Past the arguments, to the settings: a bad one stops the start with its message.
    let (code, out) = run(&[bin], &[("SHADOW_MODE", "yes")]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("SHADOW_MODE=yes: not a boolean"), "{out}");
    let (code, out) = run(&["/bin/sh"], &[]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("unknown argument \"/bin/sh\""), "{out}");
}
