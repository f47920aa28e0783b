//! Health over xDS with `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`: the service in process, its
//! configuration from an ADS server of the test (plaintext). NOT_SERVING before any
//! configuration and while the one in force has no domain; SERVING once one with a domain is
//! in force; and the runtime directory, which holds a configuration of its own, is never read.

#[path = "common/ads.rs"]
mod ads;
mod common;

use std::time::{Duration, Instant};

use ads::{AdsServer, any, response};
use common::*;
use ratewell::ManualClock;
use ratewell_rls::server::start;
use ratewell_rls::xds_proto::{
    DiscoveryResponse, RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

fn discovery(version: &str, configs: Vec<RateLimitConfig>) -> DiscoveryResponse {
    response(version, &format!("n-{version}"), configs.iter().map(any).collect())
}

/// Poll gRPC health for `ratelimit` until it reads `want` (a deadline for a hang only).
async fn until_status(grpc: std::net::SocketAddr, want: ServingStatus) {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{grpc}")).unwrap();
    let mut health = HealthClient::new(endpoint.connect().await.unwrap());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = health.check(HealthCheckRequest { service: "ratelimit".into() }).await;
        if r.unwrap().into_inner().status == want as i32 {
            return;
        }
        assert!(Instant::now() < deadline, "health never read {want:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn health_waits_for_a_configuration_with_a_domain() {
    let mut control = AdsServer::bind(None).await;
    let dir = tempfile::tempdir().unwrap();
    // A file configuration that must not be read over xDS.
    write_config(dir.path(), &[("d.yaml", "domain: files\ndescriptors: []\n")]);
    let url = control.addr.to_string();
    let env = [
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("CONFIG_GRPC_XDS_SERVER_URL", url.as_str()),
        ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true"),
        ("USE_STATSD", "false"),
    ];
    let running = start(settings(dir.path(), &env), ManualClock::new(600 * S)).await.unwrap();
    until_status(running.grpc, ServingStatus::NotServing).await;
    assert!(!running.service.config_state().0, "the directory is not read over xDS");

    let mut stream = control.stream().await;
    stream.request().await;
    stream.send(discovery("empty", vec![]));
    assert_eq!(stream.request().await.version_info, "empty");
    assert_eq!(running.service.config_state(), (true, false));
    until_status(running.grpc, ServingStatus::NotServing).await;

    let with_domain = RateLimitConfig {
        name: "eg".into(),
        domain: "eg".into(),
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
    stream.send(discovery("v1", vec![with_domain]));
    assert_eq!(stream.request().await.version_info, "v1");
    until_status(running.grpc, ServingStatus::Serving).await;
    let (code, _) = http(running.http, "GET", "/healthcheck", b"").await;
    assert_eq!(code, 200);
    running.stop().await;
    control.shutdown(vec![stream]).await;
}
