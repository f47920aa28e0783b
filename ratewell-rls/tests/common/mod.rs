//! What the service's tests share: a service started in process on loopback (free ports, a
//! manual clock, a configuration directory of their own), a gRPC client, and request builders.
#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ratewell::ManualClock;
use ratewell_rls::grpc::rate_limit_service_client::RateLimitServiceClient;
use ratewell_rls::proto::{
    Code, DescriptorStatus, Entry, RateLimit, RateLimitDescriptor, RateLimitRequest,
    RateLimitResponse, Unit,
};
use ratewell_rls::server::{Running, start};
use ratewell_rls::settings::Settings;
use tonic::transport::Channel;

pub const S: u64 = 1_000_000_000;

/// A service running in process, its configuration directory, clock and client.
pub struct Harness {
    pub running: Running<ManualClock>,
    pub clock: ManualClock,
    pub dir: tempfile::TempDir,
    pub client: RateLimitServiceClient<Channel>,
}

/// The settings of a test service: loopback, free ports, `RUNTIME_ROOT` at `root`, the
/// directory checked every 20 ms, and `env` on top.
pub fn settings(root: &Path, env: &[(&str, &str)]) -> Settings {
    let mut vars: HashMap<String, String> = [
        ("HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", "0"),
        ("DEBUG_HOST", "127.0.0.1"),
        ("DEBUG_PORT", "0"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("RELOAD_INTERVAL", "20ms"),
        ("MEMORY_CAPACITY", "10000"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    vars.insert("RUNTIME_ROOT".into(), root.display().to_string());
    for (k, v) in env {
        vars.insert(k.to_string(), v.to_string());
    }
    Settings::from_env(&vars).expect("valid test settings")
}

/// The configuration directory under `root`.
pub fn config_dir(root: &Path) -> PathBuf {
    root.join("ratelimit").join("config")
}

/// Write `files` (name, YAML) into the configuration directory under `root`.
pub fn write_config(root: &Path, files: &[(&str, &str)]) {
    let dir = config_dir(root);
    std::fs::create_dir_all(&dir).unwrap();
    for (name, yaml) in files {
        std::fs::write(dir.join(name), yaml).unwrap();
    }
}

impl Harness {
    /// A service with `files` as its configuration, its clock at `now_s` seconds.
    pub async fn start(files: &[(&str, &str)], env: &[(&str, &str)], now_s: u64) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        write_config(dir.path(), files);
        let clock = ManualClock::new(now_s * S);
        let running =
            start(settings(dir.path(), env), clock.clone()).await.expect("the service starts");
        let client = RateLimitServiceClient::connect(format!("http://{}", running.grpc))
            .await
            .expect("a connection");
        Harness { running, clock, dir, client }
    }

    /// One `ShouldRateLimit` call.
    pub async fn call(
        &mut self,
        request: RateLimitRequest,
    ) -> Result<RateLimitResponse, tonic::Status> {
        self.client.should_rate_limit(request).await.map(|r| r.into_inner())
    }

    /// Replace the configuration and wait until the service has loaded or refused it.
    pub async fn reconfigure(&self, files: &[(&str, &str)]) {
        let stats = self.running.service.stats();
        let before = stats.config_load_success.load(Ordering::Relaxed)
            + stats.config_load_error.load(Ordering::Relaxed);
        let dir = config_dir(self.dir.path());
        for entry in std::fs::read_dir(&dir).unwrap() {
            std::fs::remove_file(entry.unwrap().path()).unwrap();
        }
        write_config(self.dir.path(), files);
        wait_until(Duration::from_secs(2), || {
            stats.config_load_success.load(Ordering::Relaxed)
                + stats.config_load_error.load(Ordering::Relaxed)
                > before
        })
        .await;
    }
}

/// Poll `done` until it holds or `limit` passes; panics on the limit.
pub async fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "not done within {limit:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A request of `descriptors` (each a list of entries) in `domain`, with `hits` as the
/// request's `hits_addend`.
pub fn request(domain: &str, descriptors: &[&[(&str, &str)]], hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: descriptors
            .iter()
            .map(|entries| RateLimitDescriptor {
                entries: entries
                    .iter()
                    .map(|(k, v)| Entry { key: k.to_string(), value: v.to_string() })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        hits_addend: hits,
    }
}

/// A status with a limit.
pub fn status(code: Code, rpu: u32, unit: Unit, remaining: u32, reset_s: i64) -> DescriptorStatus {
    named(code, "", rpu, unit, remaining, reset_s)
}

/// A status with a named limit.
pub fn named(
    code: Code,
    name: &str,
    rpu: u32,
    unit: Unit,
    remaining: u32,
    reset_s: i64,
) -> DescriptorStatus {
    DescriptorStatus {
        code: code as i32,
        current_limit: Some(RateLimit {
            name: name.into(),
            requests_per_unit: rpu,
            unit: unit as i32,
        }),
        limit_remaining: remaining,
        duration_until_reset: Some(prost_types::Duration { seconds: reset_s, nanos: 0 }),
    }
}

/// A status without a limit.
pub fn no_limit(remaining: u32) -> DescriptorStatus {
    DescriptorStatus { code: Code::Ok as i32, limit_remaining: remaining, ..Default::default() }
}

/// A response of `statuses`.
pub fn response(code: Code, statuses: Vec<DescriptorStatus>) -> RateLimitResponse {
    RateLimitResponse { overall_code: code as i32, statuses, ..Default::default() }
}
