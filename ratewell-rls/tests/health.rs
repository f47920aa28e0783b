//! The crate README's health table, row for row: for every combination of `CONFIG_TYPE`,
//! `FORCE_START_WITHOUT_INITIAL_CONFIG` and `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`, the
//! answer of `/healthcheck` and of gRPC health (`""`, `ratelimit` and the service's name) before
//! the first configuration, after one with a domain, one without, a refused one, and on stop.
//! The expected answers are the table's (the Go service's, `src/server/health.go`), written out
//! here, not derived from the service's rule. The service runs in process (the binary's SIGTERM
//! is `tests/shutdown.rs`'s and `tests/envoy_gateway.rs`'s), the configuration from a directory
//! or from an ADS server of the test.

#[path = "common/ads.rs"]
mod ads;
mod common;

use std::time::{Duration, Instant};

use ads::{AdsServer, Stream, any, response};
use common::*;
use ratewell::ManualClock;
use ratewell_rls::server::{Running, SERVICE_NAME, start};
use ratewell_rls::xds_proto::{
    DiscoveryResponse, RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// Only a hang reaches it: every wait below is for an event, bounded by this.
const DEADLINE: Duration = Duration::from_secs(20);

/// Every name gRPC health answers for.
const NAMES: [&str; 3] = ["", "ratelimit", SERVICE_NAME];

const WITH_DOMAIN: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
const REFUSED: &str = "domain: d\nnot_a_key: 1\n";

/// What the configuration is.
#[derive(Clone, Copy, Debug)]
enum Load {
    /// One file (or resource) with a domain.
    Domain,
    /// None: no domain (an empty directory, or a response without resources).
    Empty,
    /// One that is refused.
    Refused,
}

/// The health read at one moment: `/healthcheck` 200, and each name SERVING.
async fn read(running: &Running<ManualClock>) -> [bool; 4] {
    let (code, _) = http(running.http, "GET", "/healthcheck", b"").await;
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", running.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = HealthClient::new(endpoint);
    let mut out = [code == 200, false, false, false];
    for (i, name) in NAMES.iter().enumerate() {
        let status = client.check(HealthCheckRequest { service: name.to_string() }).await;
        out[i + 1] = status.unwrap().into_inner().status == ServingStatus::Serving as i32;
    }
    out
}

/// Wait until every probe reads `healthy` (the gRPC status follows a load on the service's own
/// task, so it is waited for, not assumed).
async fn until(running: &Running<ManualClock>, healthy: bool, row: &str) {
    let start = Instant::now();
    loop {
        let seen = read(running).await;
        if seen == [healthy; 4] {
            return;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "{row}: want every probe {}, read /healthcheck, \"\", ratelimit, service = {seen:?}",
            if healthy { "healthy" } else { "unhealthy" }
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Stop the service with a gRPC health watch open on every name: each reads NOT_SERVING.
async fn stop_reads_not_serving(running: Running<ManualClock>, row: &str) {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", running.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut watches = Vec::new();
    for name in NAMES {
        let mut client = HealthClient::new(endpoint.clone());
        let mut watch =
            client.watch(HealthCheckRequest { service: name.into() }).await.unwrap().into_inner();
        let first = watch.message().await.unwrap().unwrap();
        assert_eq!(first.status, ServingStatus::Serving as i32, "{row}: {name:?} before the stop");
        watches.push(watch);
    }
    let stopping = tokio::spawn(running.stop());
    for (name, mut watch) in NAMES.iter().zip(watches) {
        let next = tokio::time::timeout(DEADLINE, watch.message()).await;
        let status = next.expect("an update before the deadline").unwrap().unwrap().status;
        assert_eq!(status, ServingStatus::NotServing as i32, "{row}: {name:?} on stop");
    }
    tokio::time::timeout(DEADLINE, stopping).await.unwrap().unwrap();
}

fn flags(force: bool, needs: bool) -> Vec<(&'static str, &'static str)> {
    vec![
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", if force { "true" } else { "false" }),
        ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", if needs { "true" } else { "false" }),
        ("USE_STATSD", "false"),
    ]
}

/// `CONFIG_TYPE=FILE`: the directory holding `load`'s file, named `name` (a reload changes the
/// name, so that two loads of the same kind in a row still change the directory).
fn files(load: Load, name: &str) -> Vec<(&str, &'static str)> {
    match load {
        Load::Domain => vec![(name, WITH_DOMAIN)],
        Load::Empty => vec![],
        Load::Refused => vec![(name, REFUSED)],
    }
}

/// A service reading its configuration from a directory that holds `load` at start.
async fn file_service(force: bool, needs: bool, load: Load) -> (Running<ManualClock>, Directory) {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), &files(load, "d0.yaml"));
    let running =
        start(settings(dir.path(), &flags(force, needs)), ManualClock::new(600 * S)).await.unwrap();
    (running, Directory { dir, reloads: std::cell::Cell::new(0) })
}

/// The directory of a [`file_service`].
struct Directory {
    dir: tempfile::TempDir,
    reloads: std::cell::Cell<u32>,
}

impl Directory {
    /// Replace the directory's files with `load`'s, and wait until the service loaded or
    /// refused them (its counters move).
    async fn reload(&self, running: &Running<ManualClock>, load: Load) {
        use std::sync::atomic::Ordering::Relaxed;
        let stats = running.service.stats();
        let count =
            || stats.config_load_success.load(Relaxed) + stats.config_load_error.load(Relaxed);
        let before = count();
        for entry in std::fs::read_dir(config_dir(self.dir.path())).unwrap() {
            std::fs::remove_file(entry.unwrap().path()).unwrap();
        }
        self.reloads.set(self.reloads.get() + 1);
        let name = format!("d{}.yaml", self.reloads.get());
        write_config(self.dir.path(), &files(load, &name));
        wait_until(DEADLINE, || count() > before).await;
    }
}

/// `CONFIG_TYPE=GRPC_XDS_SOTW`: `load` as a control plane's response.
fn discovery(version: &str, load: Load) -> DiscoveryResponse {
    let config = |domain: &str| RateLimitConfig {
        name: "c".into(),
        domain: domain.into(),
        descriptors: vec![RateLimitDescriptor {
            key: "k".into(),
            rate_limit: Some(RateLimitPolicy {
                unit: RateLimitUnit::Second as i32,
                requests_per_unit: 1,
                ..Default::default()
            }),
            ..Default::default()
        }],
    };
    let resources = match load {
        Load::Domain => vec![any(&config("d"))],
        Load::Empty => vec![],
        // A configuration without a domain: refused, as the file loader refuses it.
        Load::Refused => vec![any(&config(""))],
    };
    response(version, &format!("n-{version}"), resources)
}

/// A service configured over xDS, the control plane of the test, and the stream it opened.
async fn xds_service(force: bool, needs: bool) -> (Running<ManualClock>, AdsServer, Stream) {
    let mut control = AdsServer::bind(None).await;
    let dir = tempfile::tempdir().unwrap();
    // A directory configuration with a domain: over xDS it must not count.
    write_config(dir.path(), &files(Load::Domain, "d.yaml"));
    let url = control.addr.to_string();
    let mut env: Vec<(&str, &str)> = flags(force, needs);
    env.push(("CONFIG_TYPE", "GRPC_XDS_SOTW"));
    env.push(("CONFIG_GRPC_XDS_SERVER_URL", url.as_str()));
    let running = start(settings(dir.path(), &env), ManualClock::new(600 * S)).await.unwrap();
    let mut stream = control.stream().await;
    assert_eq!(stream.request().await.version_info, "", "the first request");
    (running, control, stream)
}

/// Send `load` as version `version`, and wait for the client's ACK (or NACK, when refused).
async fn push(stream: &mut Stream, version: &str, load: Load) {
    stream.send(discovery(version, load));
    let answer = stream.request().await;
    assert_eq!(answer.response_nonce, format!("n-{version}"));
    assert_eq!(answer.error_detail.is_some(), matches!(load, Load::Refused), "{load:?}");
}

const BOTH: [bool; 2] = [false, true];

/// Rows 1 to 3 and 7 of the table: `CONFIG_TYPE=FILE` without
/// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED` is healthy whatever the directory holds, and
/// unhealthy once stopping.
#[tokio::test]
async fn file_without_healthy_with_config() {
    for force in BOTH {
        for load in [Load::Refused, Load::Empty, Load::Domain] {
            let row = format!("FILE, FORCE_START={force}, at start: {load:?}");
            let (running, dir) = file_service(force, false, load).await;
            until(&running, true, &row).await;
            dir.reload(&running, Load::Refused).await;
            until(&running, true, &format!("{row}, then a refused reload")).await;
            dir.reload(&running, Load::Empty).await;
            until(&running, true, &format!("{row}, then one without a domain")).await;
            stop_reads_not_serving(running, &row).await;
        }
    }
}

/// Rows 4 to 7: with `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`, healthy only while the
/// configuration in force has a domain; a refused reload changes nothing.
#[tokio::test]
async fn file_with_healthy_with_config() {
    for force in BOTH {
        let row = format!("FILE, FORCE_START={force}, HEALTHY_WITH=true");
        for load in [Load::Refused, Load::Empty] {
            let (running, dir) = file_service(force, true, load).await;
            until(&running, false, &format!("{row}, at start: {load:?}")).await;
            dir.reload(&running, Load::Domain).await;
            until(&running, true, &format!("{row}, {load:?} then a domain")).await;
            dir.reload(&running, Load::Refused).await;
            until(&running, true, &format!("{row}, a domain then a refused reload")).await;
            dir.reload(&running, Load::Empty).await;
            until(&running, false, &format!("{row}, a domain then none")).await;
            dir.reload(&running, Load::Domain).await;
            until(&running, true, &format!("{row}, a domain again")).await;
            stop_reads_not_serving(running, &row).await;
        }
        let (running, _dir) = file_service(force, true, Load::Domain).await;
        until(&running, true, &format!("{row}, at start: Domain")).await;
        running.stop().await;
    }
}

/// Rows 8, 9, 11, 13 and 15 over xDS without `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`:
/// healthy from the start with `FORCE_START_WITHOUT_INITIAL_CONFIG` (Envoy Gateway's
/// environment), else from the control plane's first answer, accepted or refused; then whatever
/// it sends.
#[tokio::test]
async fn xds_without_healthy_with_config() {
    for force in BOTH {
        for first in [Load::Refused, Load::Empty, Load::Domain] {
            let row = format!("GRPC_XDS_SOTW, FORCE_START={force}, first answer {first:?}");
            let (running, control, mut stream) = xds_service(force, false).await;
            // Before any answer: what FORCE_START says.
            until(&running, force, &format!("{row}: before it")).await;
            push(&mut stream, "1", first).await;
            until(&running, true, &row).await;
            push(&mut stream, "2", Load::Refused).await;
            until(&running, true, &format!("{row}, then a refused one")).await;
            push(&mut stream, "3", Load::Empty).await;
            until(&running, true, &format!("{row}, then one without a domain")).await;
            stop_reads_not_serving(running, &row).await;
            control.shutdown(vec![stream]).await;
        }
    }
}

/// Rows 10, 12, 14 and 15 over xDS with `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`: unhealthy
/// until a configuration with a domain is in force, whatever `FORCE_START` says.
#[tokio::test]
async fn xds_with_healthy_with_config() {
    for force in BOTH {
        let row = format!("GRPC_XDS_SOTW, FORCE_START={force}, HEALTHY_WITH=true");
        let (running, control, mut stream) = xds_service(force, true).await;
        until(&running, false, &format!("{row}: before the first answer")).await;
        push(&mut stream, "1", Load::Refused).await;
        until(&running, false, &format!("{row}: a refused first answer")).await;
        push(&mut stream, "2", Load::Empty).await;
        until(&running, false, &format!("{row}: one without a domain")).await;
        push(&mut stream, "3", Load::Domain).await;
        until(&running, true, &format!("{row}: one with a domain")).await;
        push(&mut stream, "4", Load::Refused).await;
        until(&running, true, &format!("{row}: a domain, then a refused one")).await;
        push(&mut stream, "5", Load::Empty).await;
        until(&running, false, &format!("{row}: a domain, then none")).await;
        push(&mut stream, "6", Load::Domain).await;
        until(&running, true, &format!("{row}: a domain again")).await;
        stop_reads_not_serving(running, &row).await;
        control.shutdown(vec![stream]).await;
    }
}
