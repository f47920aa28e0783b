//! Round trips against a `redis-server` this benchmark starts on a free loopback port (pinned to
//! core 0, the client to core 1, where `taskset` and two cores exist), one run side by side:
//! - a decision's latency next to `PING`'s from the same client;
//! - throughput with 64 concurrent tasks on distinct keys next to pipelined `INCR`'s on the same
//!   connection type, with the server's CPU time per decision next to its time per `INCR`
//!   (`/proc/PID/stat`);
//! - the same with batches of at most 1, 4, 16 and 64 requests ([`Builder::batch`]);
//! - leases on one hot key next to the in-process keyed limiter, with the global count checked
//!   exact.
//!
//! `cargo bench -p ratewell-redis`; `--quick` for a short run (what CI does); `--module` loads
//! ratewell-redis-module into the server (built with `--release`) and measures both paths side by
//! side: every decision row and the batch sweep for the module's native command and for the
//! function library (a limiter built with `module(false)`); `--only latency`, `--only concurrent`
//! or `--only leases` runs one part.
//!
//! [`Builder::batch`]: ratewell_redis::Builder::batch

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{Path, Server};
use ratewell::{KeyedLimiter, Policy};
use ratewell_redis::{Leases, RedisLimiter, Source};
use redis::aio::ConnectionManager;

/// The least a decision script can do: read the clock, read the state, write it with a TTL,
/// answer a short array. What any script costs beyond a plain command, next to ours.
const FLOOR: &str = "local t = redis.call('TIME'); local g = redis.call('GET', KEYS[1]); \
    redis.call('SET', KEYS[1], '1700000000000000 123', 'PX', 1000); return {1, 1, 0, 5, 100, 0, 100, '1 2|3 4'}";

async fn floor_script(conn: &ConnectionManager, key: &str) {
    let _: redis::Value =
        redis::Script::new(FLOOR).key(key).invoke_async(&mut conn.clone()).await.unwrap();
}

/// The server's CPU time so far (user + system), in seconds, from `/proc/PID/stat` (ticks of
/// 1/100 s); `None` where there is no `/proc`.
fn server_cpu(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name (which may hold spaces) in parentheses.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

/// Pin the server to core 0 and this process to core 1 (`taskset`): says whether it did.
fn pin(server_pid: u32) -> bool {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let run = |args: &[&str]| {
        std::process::Command::new("taskset")
            .args(args)
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    cores >= 2
        && run(&["-a", "-pc", "0", &server_pid.to_string()])
        && run(&["-a", "-pc", "1", &std::process::id().to_string()])
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

async fn limiter(server: &Server, policy: &str, prefix: &str) -> RedisLimiter {
    batched(server, policy, prefix, 64, Path::Library).await
}

async fn batched(
    server: &Server,
    policy: &str,
    prefix: &str,
    batch: usize,
    path: Path,
) -> RedisLimiter {
    RedisLimiter::builder(&server.url())
        .layer("bench", &policy.parse::<Policy>().unwrap())
        .prefix(prefix)
        .timeout(Duration::from_secs(5))
        .batch(batch)
        .module(path == Path::Module)
        .build()
        .await
        .unwrap()
}

fn label(path: Path) -> &'static str {
    match path {
        Path::Library => "library",
        Path::Module => "module",
    }
}

/// Latency of one client doing one thing at a time: PING and decisions interleaved in blocks, so
/// that all see the same machine; each decision row on every path.
async fn latency(server: &Server, conn: &ConnectionManager, rounds: usize, paths: &[Path]) {
    let mut single = Vec::new();
    let mut layered = Vec::new();
    for &path in paths {
        let prefix = label(path);
        single.push(
            batched(
                server,
                "token-bucket capacity=1000 rate=1000/s",
                &format!("lat{prefix}:"),
                64,
                path,
            )
            .await,
        );
        layered.push(
            RedisLimiter::builder(&server.url())
                .layer("ip", &"token-bucket capacity=1000 rate=1000/s".parse().unwrap())
                .layer("minute", &"fixed-window limit=100000 window=1m".parse().unwrap())
                .layer("day", &"sliding-window limit=10000 window=1d".parse().unwrap())
                .prefix(format!("lat3{prefix}:"))
                .module(path == Path::Module)
                .build()
                .await
                .unwrap(),
        );
    }
    let keys: Vec<String> = (0..1000).map(|i| format!("client-{i}")).collect();
    let mut ping = Vec::new();
    let mut floor = Vec::new();
    let mut decide = vec![Vec::new(); paths.len()];
    let mut three = vec![Vec::new(); paths.len()];
    for round in 0..rounds {
        for _ in 0..100 {
            let t = Instant::now();
            let _: String = redis::cmd("PING").query_async(&mut conn.clone()).await.unwrap();
            ping.push(t.elapsed());
        }
        for (p, l) in single.iter().enumerate() {
            for i in 0..100 {
                let key = &keys[(round * 100 + i) % keys.len()];
                let t = Instant::now();
                let v = l.check(key, 1).await;
                decide[p].push(t.elapsed());
                assert_eq!(v.source(), Source::Server);
            }
        }
        for i in 0..100 {
            let key = &keys[(round * 100 + i) % keys.len()];
            let t = Instant::now();
            floor_script(conn, key).await;
            floor.push(t.elapsed());
        }
        for (p, l) in layered.iter().enumerate() {
            for i in 0..100 {
                let key = keys[(round * 100 + i) % keys.len()].as_str();
                let t = Instant::now();
                let v = l.check_layers(&[Some(key); 3], 1).await.unwrap();
                three[p].push(t.elapsed());
                assert_eq!(v.source(), Source::Server);
            }
        }
    }
    for (&path, (l, three)) in paths.iter().zip(single.iter().zip(&layered)) {
        let (m, m3) = (l.metrics(), three.metrics());
        assert_eq!(m.module_calls > 0, path == Path::Module, "{m:?}");
        assert_eq!(m3.module_calls > 0, path == Path::Module, "{m3:?}");
    }
    let mut rows: Vec<(String, Vec<Duration>)> = vec![("PING".into(), ping)];
    for (p, &path) in paths.iter().enumerate() {
        rows.push((
            format!("decision (token bucket, {})", label(path)),
            std::mem::take(&mut decide[p]),
        ));
        rows.push((format!("decision (3 layers, {})", label(path)), std::mem::take(&mut three[p])));
    }
    rows.push(("floor script".into(), floor));
    for (_, v) in &mut rows {
        v.sort();
    }
    let p50 = percentile(&rows[0].1, 0.5);
    println!("latency, one client, {} each (interleaved blocks of 100):", rows[0].1.len());
    for (name, v) in &rows {
        let m = percentile(v, 0.5);
        println!(
            "  {name:<34} p50 {m:>8.1?}  p99 {:>8.1?}  p50/PING {:.2}",
            percentile(v, 0.99),
            m.as_secs_f64() / p50.as_secs_f64()
        );
    }
}

/// Requests per second with 64 tasks sharing one client, for `secs`.
async fn throughput<F, Fut>(secs: f64, op: F) -> f64
where
    F: Fn(u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..64u64)
        .map(|task| {
            let (stop, done, op) = (stop.clone(), done.clone(), op.clone());
            tokio::spawn(async move {
                // Each task's operations name keys no other task's do.
                let mut i = task * 1_000_000;
                while !stop.load(Ordering::Relaxed) {
                    op(i).await;
                    i += 1;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    let n = done.load(Ordering::Relaxed);
    let elapsed = start.elapsed().as_secs_f64();
    for t in tasks {
        t.await.unwrap();
    }
    n as f64 / elapsed
}

/// Throughput of `op` and the server's CPU seconds per operation over the run.
async fn measured<F, Fut>(pid: u32, secs: f64, op: F) -> (f64, Option<f64>)
where
    F: Fn(u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let before = server_cpu(pid);
    let start = Instant::now();
    let rate = throughput(secs, op).await;
    let ops = rate * start.elapsed().as_secs_f64();
    let cpu = before.zip(server_cpu(pid)).map(|(b, a)| (a - b) / ops.max(1.0));
    (rate, cpu)
}

fn us(cpu: Option<f64>) -> String {
    cpu.map_or("n/a".into(), |c| format!("{:.2} us", c * 1e6))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

async fn concurrent(
    server: &Server,
    conn: &ConnectionManager,
    runs: usize,
    secs: f64,
    paths: &[Path],
) {
    let pid = server.pid();
    let policy = "token-bucket capacity=1000 rate=1000/s";
    let sweep = [1usize, 4, 16, 64];
    let mut limiters = Vec::new();
    for &path in paths {
        for n in sweep {
            let prefix = format!("tp{}{n}:", label(path));
            limiters.push((path, n, batched(server, policy, &prefix, n, path).await));
        }
    }
    // Per (path, batch): decisions over INCR, and server CPU per decision over per INCR.
    let mut ratios = vec![Vec::new(); limiters.len()];
    let mut cpu_ratios = vec![Vec::new(); limiters.len()];
    println!(
        "throughput, 64 tasks on one client (one multiplexed connection), distinct keys, {runs} \
         alternating runs of {secs} s; server CPU per operation from /proc:"
    );
    // Each measurement starts on an empty keyspace: the keys an earlier one left to expire are
    // not collected on its clock.
    let flush = || server.cli(&["FLUSHALL", "SYNC"]).expect("FLUSHALL");
    for run in 0..runs {
        flush();
        let c = conn.clone();
        let (incr, incr_cpu) = measured(pid, secs, move |i| {
            let mut c = c.clone();
            async move {
                let _: i64 =
                    redis::cmd("INCR").arg(format!("incr-{i}")).query_async(&mut c).await.unwrap();
            }
        })
        .await;
        println!("  run {run}: pipelined INCR {incr:>7.0}/s, server {}/INCR", us(incr_cpu));
        for (k, (path, n, l)) in limiters.iter().enumerate() {
            flush();
            let before = l.metrics();
            let l2 = l.clone();
            let (decide, cpu) = measured(pid, secs, move |i| {
                let l = l2.clone();
                async move {
                    let v = l.check(&format!("client-{i}"), 1).await;
                    assert_eq!(v.source(), Source::Server);
                }
            })
            .await;
            let after = l.metrics();
            assert_eq!(after.module_calls > before.module_calls, *path == Path::Module);
            let mean =
                (after.server - before.server) as f64 / (after.calls - before.calls).max(1) as f64;
            ratios[k].push(decide / incr);
            if let (Some(d), Some(i)) = (cpu, incr_cpu) {
                cpu_ratios[k].push(d / i);
            }
            println!(
                "    {:<7} batch <= {n:>2}: {decide:>7.0} decisions/s  decision/INCR {:.2}  mean \
                 batch {mean:>5.1}  server {}/decision",
                label(*path),
                decide / incr,
                us(cpu)
            );
        }
    }
    for (k, (path, n, _)) in limiters.iter().enumerate() {
        let cpu = if cpu_ratios[k].is_empty() {
            "n/a".to_string()
        } else {
            format!("{:.2}", median(cpu_ratios[k].clone()))
        };
        println!(
            "  median {:<7} batch <= {n:>2}: decision/INCR {:.2}, server CPU per decision / per \
             INCR {cpu}",
            label(*path),
            median(ratios[k].clone())
        );
    }
}

/// Leases on one hot key against the in-process keyed limiter, one thread each in turn.
async fn leases(server: &Server, runs: usize, n: u64) {
    // A day's window on the clock (align=first holds at most 131071): a run that crosses midnight
    // UTC sees the window roll over, and then the count is not checked.
    const LIMIT: u64 = (1 << 32) - 1;
    let policy = format!("fixed-window limit={LIMIT} window=1d");
    let day = || {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
            / 86_400
    };
    let first_day = day();
    let leased = Leases::new(
        limiter(server, &policy, "lease:").await,
        1024,
        1 << 16,
        Duration::from_millis(100),
    );
    let local: KeyedLimiter<str> = KeyedLimiter::new(&policy.parse().unwrap(), 1024);
    let mut ratios = Vec::new();
    let mut admitted = 0u64;
    println!("one hot key, {n} decisions a run, {runs} alternating runs:");
    for run in 0..runs {
        let t = Instant::now();
        let mut ok = 0u64;
        for _ in 0..n {
            ok += u64::from(local.allow("hot"));
        }
        let in_process = n as f64 / t.elapsed().as_secs_f64();
        assert_eq!(ok, n);
        let t = Instant::now();
        for _ in 0..n {
            if leased.acquire("hot", 1).await {
                admitted += 1;
            }
        }
        let lease = n as f64 / t.elapsed().as_secs_f64();
        ratios.push(in_process / lease);
        println!(
            "  run {run}: in-process keyed {:>6.1} M/s   leases {:>6.1} M/s   in-process / leases {:.2}",
            in_process / 1e6,
            lease / 1e6,
            in_process / lease
        );
    }
    ratios.sort_by(f64::total_cmp);
    let m = leased.metrics();
    leased.close().await;
    let probe = limiter(server, &policy, "lease:").await;
    let remaining = probe.peek_layers(&[Some("hot")], 1).await.unwrap().decision().remaining();
    println!(
        "  median in-process / leases {:.2}; {} leases of {} units in all, {} units spent in process, {} round trips",
        ratios[ratios.len() / 2],
        m.leases,
        m.leased_units,
        m.local_units,
        m.round_trips
    );
    if day() != first_day {
        println!("  the day's window rolled over during the run: the global count is not checked");
        return;
    }
    println!(
        "  global count: {admitted} admitted, the server counts {} (exact: {})",
        LIMIT - remaining,
        LIMIT - remaining == admitted
    );
    assert_eq!(LIMIT - remaining, admitted, "the server's count is what was admitted");
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let paths: &[Path] = if std::env::args().any(|a| a == "--module") {
        &[Path::Library, Path::Module]
    } else {
        &[Path::Library]
    };
    let server = Server::start_on(*paths.last().unwrap(), &[]);
    let version = server.cli(&["INFO", "server"]).unwrap_or_default();
    let version =
        version.lines().find(|l| l.starts_with("redis_version")).unwrap_or("").trim().to_string();
    let pinned = pin(server.pid());
    println!(
        "redis-server {version} on 127.0.0.1:{}, {} cores, {}",
        server.port,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        if pinned { "server pinned to core 0, client to core 1" } else { "not pinned" }
    );
    // One client thread (the server has the other core): no wake-up crosses threads.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let client = redis::Client::open(server.url()).unwrap();
        let conn = ConnectionManager::new(client).await.unwrap();
        let (rounds, runs, secs, n) =
            if quick { (5, 1, 0.2, 200_000) } else { (100, 5, 2.0, 5_000_000) };
        // `--only NAME` runs one part: latency, concurrent or leases.
        let only = std::env::args().skip_while(|a| a != "--only").nth(1);
        let part = |name: &str| only.as_deref().is_none_or(|o| o == name);
        if part("latency") {
            latency(&server, &conn, rounds, paths).await;
        }
        if part("concurrent") {
            concurrent(&server, &conn, runs, secs, paths).await;
        }
        if part("leases") {
            leases(&server, runs, n).await;
        }
    });
}
