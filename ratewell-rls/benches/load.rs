//! The service under load, beside a no-op rate limit service on the same tonic stack.
//!
//! `cargo bench -p ratewell-rls --bench load [-- --runs N --seconds S --redis --module --statsd --baseline EXE]`
//!
//! The bench starts each server as a child process of its own (this program again, with
//! `--serve`), pinned to core 0 with `taskset` where there is more than one core, and drives it
//! from a tonic client on a single-threaded runtime, on core 1 when it has been pinned there
//! (`taskset -c 1 cargo bench ...`). Servers:
//!
//! - `noop`: the same gRPC stack (the health service beside it) answering every descriptor OK,
//!   with a status of the service's shape, without deciding anything (the cost of tonic, HTTP/2
//!   and prost alone);
//! - `memory`: `ratewell-rls` deciding in process, without statsd (`USE_STATSD=false`);
//! - `statsd`: the same with statsd on (with `--statsd`), sending to a UDP listener of the
//!   bench's own every second (`STATS_FLUSH_INTERVAL=1s`, ten times the Go default's rate);
//! - `base`: another build's `memory` server (with `--baseline EXE`: that build's `load` bench
//!   binary, run as `EXE --serve memory ROOT`), to compare two builds side by side;
//! - `redis`: `ratewell-rls` on a `redis-server` of the bench's own (with `--redis`), beside the
//!   round trip of a plain `PING` on a raw connection to the same server;
//! - `module`: the same on a second `redis-server` with ratewell-redis-module loaded (with
//!   `--module`; the module built with `cargo build --release`): the store's calls go to the
//!   module's native command instead of the function library.
//!
//! Each run measures, per server: the median and 99th percentile latency of one client sending
//! requests one after another, and the throughput of 64 requests in flight (8 connections, 8
//! each). Runs alternate between the servers (noop, memory[, redis], noop, ...), and the report
//! gives each figure's median over the runs and the ratios the issue sets as bars.

// The module's shared object (`module_path`, built with `--release` from an optimized build).
#[path = "../../ratewell-redis/tests/common/mod.rs"]
mod redis_common;

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ratewell_rls::grpc::rate_limit_service_client::RateLimitServiceClient;
use ratewell_rls::grpc::rate_limit_service_server::{RateLimitService, RateLimitServiceServer};
use ratewell_rls::proto::{
    Code, DescriptorStatus, Entry, RateLimit, RateLimitDescriptor, RateLimitRequest,
    RateLimitResponse, Unit,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::Channel;

const CONFIG: &str = "
domain: bench
descriptors:
  - key: client
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
";

/// The no-op service: OK for every descriptor, nothing decided.
struct Noop;

#[tonic::async_trait]
impl RateLimitService for Noop {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let statuses = request
            .get_ref()
            .descriptors
            .iter()
            // The shape of the service's answer (a limit, what remains, the reset), so that
            // both put the same bytes on the wire and the same decoding on the client.
            .map(|_| DescriptorStatus {
                code: Code::Ok as i32,
                current_limit: Some(RateLimit {
                    name: String::new(),
                    requests_per_unit: 1_000_000_000,
                    unit: Unit::Hour as i32,
                }),
                limit_remaining: 999_999_000,
                duration_until_reset: Some(prost_types::Duration { seconds: 1_800, nanos: 0 }),
            })
            .collect();
        Ok(tonic::Response::new(RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses,
            ..Default::default()
        }))
    }
}

/// `--serve KIND ROOT [REDIS_URL | STATSD_PORT]`: run one server on a free loopback port, print
/// its address.
fn serve(kind: &str, root: &str, extra: Option<&str>) {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let addr = match kind {
            "noop" => {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                let addr = listener.local_addr().unwrap();
                let incoming =
                    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
                // The service's own stack: the health service beside it, and a shutdown signal.
                let (_reporter, health) = tonic_health::server::health_reporter();
                let (stop, mut stopped) = tokio::sync::watch::channel(false);
                std::mem::forget(stop);
                tokio::spawn(
                    tonic::transport::Server::builder()
                        .tcp_nodelay(true)
                        .add_service(health)
                        .add_service(RateLimitServiceServer::new(Noop))
                        .serve_with_incoming_shutdown(incoming, async move {
                            let _ = stopped.wait_for(|s| *s).await;
                        }),
                );
                addr
            }
            _ => {
                let mut env: std::collections::HashMap<String, String> = [
                    ("GRPC_HOST", "127.0.0.1"),
                    ("GRPC_PORT", "0"),
                    ("HOST", "127.0.0.1"),
                    ("PORT", "0"),
                    ("DEBUG_HOST", "127.0.0.1"),
                    ("DEBUG_PORT", "0"),
                    ("RUNTIME_ROOT", root),
                    ("RUNTIME_SUBDIRECTORY", "ratelimit"),
                    ("RELOAD_INTERVAL", "10s"),
                    ("MEMORY_CAPACITY", "100000"),
                    ("REDIS_TIMEOUT", "1s"),
                ]
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
                match (kind, extra) {
                    ("redis" | "module", Some(url)) => {
                        env.insert("BACKEND_TYPE".into(), "redis".into());
                        env.insert("REDIS_URL".into(), url.into());
                    }
                    ("statsd", Some(port)) => {
                        env.insert("USE_STATSD".into(), "true".into());
                        env.insert("STATSD_HOST".into(), "127.0.0.1".into());
                        env.insert("STATSD_PORT".into(), port.into());
                        env.insert("STATS_FLUSH_INTERVAL".into(), "1s".into());
                    }
                    _ => {
                        env.insert("USE_STATSD".into(), "false".into());
                    }
                }
                let settings = ratewell_rls::settings::Settings::from_env(&env).unwrap();
                let clock = ratewell_rls::clock::EpochClock::new();
                let running = ratewell_rls::server::start(settings, clock).await.unwrap();
                let addr = running.grpc;
                std::mem::forget(running);
                addr
            }
        };
        println!("{addr}");
        std::future::pending::<()>().await;
    });
}

fn pinned(core: usize) -> Command {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores > 1
        && std::env::var_os("NO_PIN").is_none()
        && Command::new("taskset").arg("-V").output().is_ok()
    {
        let mut c = Command::new("taskset");
        c.arg("-c").arg(core.to_string());
        c
    } else {
        Command::new("nice")
    }
}

struct Spawned {
    child: Child,
    addr: String,
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_server(kind: &str, root: &str, extra: Option<&str>, baseline: Option<&str>) -> Spawned {
    let mut cmd = pinned(0);
    match (kind, baseline) {
        ("base", Some(exe)) => cmd.arg(exe).args(["--serve", "memory", root]),
        _ => cmd.arg(std::env::current_exe().unwrap()).args(["--serve", kind, root]),
    };
    if let Some(extra) = extra {
        cmd.arg(extra);
    }
    let mut child =
        cmd.stdout(Stdio::piped()).stderr(Stdio::null()).spawn().expect("the server starts");
    let mut out = child.stdout.take().unwrap();
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while std::io::Read::read(&mut out, &mut byte).unwrap_or(0) == 1 && byte[0] != b'\n' {
        line.push(byte[0]);
    }
    Spawned { child, addr: String::from_utf8(line).unwrap() }
}

fn request(i: u64) -> RateLimitRequest {
    RateLimitRequest {
        domain: "bench".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "client".into(),
                value: format!("10.0.{}.{}", (i / 250) % 4, i % 250),
            }],
            ..Default::default()
        }],
        hits_addend: 1,
    }
}

async fn connect(addr: &str) -> RateLimitServiceClient<Channel> {
    let channel = tonic::transport::Endpoint::try_from(format!("http://{addr}"))
        .unwrap()
        .tcp_nodelay(true)
        .connect()
        .await
        .unwrap();
    RateLimitServiceClient::new(channel)
}

/// One client, one request at a time, for `seconds`: the latencies (ns), sorted.
async fn latencies(addr: &str, seconds: f64) -> Vec<u64> {
    let mut client = connect(addr).await;
    for i in 0..200 {
        client.should_rate_limit(request(i)).await.unwrap();
    }
    let mut out = Vec::new();
    let start = Instant::now();
    let mut i = 0;
    while start.elapsed().as_secs_f64() < seconds {
        let t = Instant::now();
        let r = client.should_rate_limit(request(i)).await.unwrap().into_inner();
        out.push(t.elapsed().as_nanos() as u64);
        assert_eq!(r.overall_code, Code::Ok as i32);
        i += 1;
    }
    out.sort_unstable();
    out
}

/// 64 requests in flight (8 connections, 8 each) for `seconds`: requests per second.
async fn throughput(addr: &str, seconds: f64) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for c in 0..8u64 {
        let client = connect(addr).await;
        for k in 0..8u64 {
            let (mut client, done, stop) = (client.clone(), done.clone(), stop.clone());
            tasks.push(tokio::spawn(async move {
                let mut i = c * 1_000 + k * 100;
                while !stop.load(Ordering::Relaxed) {
                    client.should_rate_limit(request(i)).await.unwrap();
                    done.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            }));
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (before, start) = (done.load(Ordering::Relaxed), Instant::now());
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    let rate = (done.load(Ordering::Relaxed) - before) as f64 / start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    rate
}

/// Raw RESP `PING`s on one connection for `seconds`: the latencies (ns), sorted.
async fn pings(port: u16, seconds: f64) -> Vec<u64> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let mut buf = [0u8; 7];
    let mut out = Vec::new();
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < seconds {
        let t = Instant::now();
        stream.write_all(b"PING\r\n").await.unwrap();
        stream.read_exact(&mut buf).await.unwrap();
        out.push(t.elapsed().as_nanos() as u64);
        assert_eq!(&buf, b"+PONG\r\n");
    }
    out.sort_unstable();
    out
}

fn pct(sorted: &[u64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p) as usize] as f64 / 1_000.0
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

struct RedisServer {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = &self.dir;
    }
}

fn redis_server(module: Option<&str>) -> RedisServer {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    // On the client's core: the client waits while a request is at the server, so the service
    // and Redis each have a core to themselves on the latency path, as across machines.
    let child = pinned(1)
        .arg("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--dir")
        .arg(dir.path())
        .args(module.map(|m| ["--loadmodule", m]).into_iter().flatten())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server (Debian's package redis-server) on PATH");
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(start.elapsed() < Duration::from_secs(10), "redis-server did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
    RedisServer { child, port, dir }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--serve") {
        serve(&args[2], &args[3], args.get(4).map(String::as_str));
        return;
    }
    // `--drive ADDR SECONDS`: only the 64-in-flight load, against a server started elsewhere
    // (to profile it: `perf record -p PID` while this runs).
    if args.get(1).map(String::as_str) == Some("--drive") {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let rate = runtime.block_on(throughput(&args[2], args[3].parse().unwrap_or(5.0)));
        println!("{rate:.0} req/s");
        return;
    }
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse::<f64>().ok())
    };
    let runs = flag("--runs").unwrap_or(5.0) as usize;
    let seconds = flag("--seconds").unwrap_or(2.0);
    let with_redis = args.iter().any(|a| a == "--redis");
    let with_module = args.iter().any(|a| a == "--module");
    let with_statsd = args.iter().any(|a| a == "--statsd");
    let baseline =
        args.iter().position(|a| a == "--baseline").and_then(|i| args.get(i + 1)).cloned();
    // The statsd listener: a thread that takes every datagram (so that no send is refused).
    let sink = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let sink_port = sink.local_addr().unwrap().port().to_string();
    let received = Arc::new(AtomicU64::new(0));
    let counted = received.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 65_536];
        while let Ok(n) = sink.recv(&mut buf) {
            counted.fetch_add(n as u64, Ordering::Relaxed);
        }
    });

    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("ratelimit").join("config");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("bench.yaml"), CONFIG).unwrap();
    let root_s = root.path().display().to_string();
    let redis = with_redis.then(|| redis_server(None));
    let redis_url = redis.as_ref().map(|r| format!("redis://127.0.0.1:{}", r.port));
    let module = with_module.then(|| redis_server(Some(redis_common::module_path())));
    let module_url = module.as_ref().map(|r| format!("redis://127.0.0.1:{}", r.port));

    let mut kinds = vec!["noop", "memory"];
    if with_redis {
        kinds.push("redis");
    }
    if with_module {
        kinds.push("module");
    }
    if with_statsd {
        kinds.push("statsd");
    }
    if baseline.is_some() {
        kinds.push("base");
    }
    let servers: Vec<Spawned> = kinds
        .iter()
        .map(|&k| {
            let extra = match k {
                "redis" => redis_url.as_deref(),
                "module" => module_url.as_deref(),
                "statsd" => Some(sink_port.as_str()),
                _ => None,
            };
            spawn_server(k, &root_s, extra, baseline.as_deref())
        })
        .collect();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut p50: Vec<Vec<f64>> = vec![Vec::new(); kinds.len()];
    let mut p99: Vec<Vec<f64>> = vec![Vec::new(); kinds.len()];
    let mut rps: Vec<Vec<f64>> = vec![Vec::new(); kinds.len()];
    let mut ping50 = Vec::new();
    println!(
        "ratewell-rls load: {runs} alternating runs, {seconds} s per measure, {} cores",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    for run in 0..runs {
        for (i, s) in servers.iter().enumerate() {
            let lat = runtime.block_on(latencies(&s.addr, seconds));
            let rate = runtime.block_on(throughput(&s.addr, seconds));
            println!(
                "run {run} {:<6} p50 {:>7.1} us  p99 {:>7.1} us  ({} requests)  64 in flight: {:>8.0} req/s",
                kinds[i],
                pct(&lat, 0.5),
                pct(&lat, 0.99),
                lat.len(),
                rate
            );
            p50[i].push(pct(&lat, 0.5));
            p99[i].push(pct(&lat, 0.99));
            rps[i].push(rate);
        }
        if let Some(r) = redis.as_ref().or(module.as_ref()) {
            let lat = runtime.block_on(pings(r.port, seconds / 2.0));
            println!("run {run} PING   p50 {:>7.1} us", pct(&lat, 0.5));
            ping50.push(pct(&lat, 0.5));
        }
    }
    println!("\nmedians over {runs} runs:");
    for (i, kind) in kinds.iter().enumerate() {
        println!(
            "{kind:<6} p50 {:>7.1} us  p99 {:>7.1} us  64 in flight {:>8.0} req/s",
            median(p50[i].clone()),
            median(p99[i].clone()),
            median(rps[i].clone())
        );
    }
    let (noop50, mem50) = (median(p50[0].clone()), median(p50[1].clone()));
    let (noop_rps, mem_rps) = (median(rps[0].clone()), median(rps[1].clone()));
    println!("memory / noop p50: {:.3} (bar: at most 1.1)", mem50 / noop50);
    println!("memory / noop throughput: {:.3} (bar: at least 0.9)", mem_rps / noop_rps);
    let at = |kind: &str| kinds.iter().position(|k| *k == kind);
    if let Some(i) = at("statsd") {
        let (s50, s_rps) = (median(p50[i].clone()), median(rps[i].clone()));
        println!("statsd / memory p50: {:.3} (bar: at most 1.05)", s50 / mem50);
        println!("statsd / memory throughput: {:.3} (bar: at least 0.95)", s_rps / mem_rps);
        println!("statsd bytes received: {}", received.load(Ordering::Relaxed));
    }
    if let Some(i) = at("base") {
        let (b50, b_rps) = (median(p50[i].clone()), median(rps[i].clone()));
        println!("memory / base p50: {:.3}", mem50 / b50);
        println!("memory / base throughput: {:.3}", mem_rps / b_rps);
    }
    for kind in ["redis", "module"] {
        let Some(i) = at(kind) else { continue };
        let (redis50, ping) = (median(p50[i].clone()), median(ping50.clone()));
        println!(
            "{kind} p50 {:.1} us; noop p50 + 1.3 x PING p50 = {:.1} + 1.3 x {:.1} = {:.1} us (bar: {kind} at most that): {:.3} of it",
            redis50,
            noop50,
            ping,
            noop50 + 1.3 * ping,
            redis50 / (noop50 + 1.3 * ping)
        );
    }
    if let (Some(r), Some(m)) = (at("redis"), at("module")) {
        let (r_rps, m_rps) = (median(rps[r].clone()), median(rps[m].clone()));
        println!(
            "64 in flight: module {m_rps:.0} req/s, library {r_rps:.0} req/s: module / library {:.3}",
            m_rps / r_rps
        );
    }
}
