//! The native module (ratewell-redis-module) beside the function library: one key decided by
//! both in turn decides as the engine does; a replica and an AOF restart hold what the primary
//! held, byte for byte, with the same absolute expiries; garbage arguments get error replies
//! from a server that goes on answering; and the client finds the module, or goes without it.

mod common;

use std::time::{Duration, Instant};

use common::{Path, Rng, Server, assert_path};
use ratewell::{Limiter, ManualClock, Nanos, Policy};
use ratewell_redis::RedisLimiter;

const POLICIES: &[&str] = &[
    "token-bucket capacity=5 rate=7/s",
    "token-bucket capacity=4 refill=2 every=1s",
    "leaky-bucket rate=10r/s burst=5",
    "leaky-bucket rate=3/s burst=4 delay=2",
    "leaky-bucket rate=3/250ms burst=5 delay=2 compat=nginx",
    "fixed-window limit=5 window=1s",
    "fixed-window limit=3 window=1m align=first",
    "sliding-window limit=5 window=1s",
    "sliding-window limit=100000 window=1d",
    "sliding-log limit=5 window=1s",
];

async fn limiter(server: &Server, prefix: &str, policy: &Policy, module: bool) -> RedisLimiter {
    RedisLimiter::builder(&server.url())
        .layer("l", policy)
        .prefix(prefix)
        .module(module)
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .expect("a limiter")
}

/// A key decided by the library and the module in turn (random, on one server) decides as the
/// engine does, field for field: each reads what the other stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_library_and_the_module_decide_one_key_in_turn() {
    let server = Server::start_on(Path::Module, &[]);
    for (pi, spec) in POLICIES.iter().enumerate() {
        let policy: Policy = spec.parse().unwrap();
        for seed in 1..=4u64 {
            let prefix = format!("turn{pi}s{seed}:");
            let library = limiter(&server, &prefix, &policy, false).await;
            let module = limiter(&server, &prefix, &policy, true).await;
            let engine = Limiter::with_clock(&policy, ManualClock::new(0));
            let mut rng = Rng(seed * 7919 + pi as u64);
            let mut t_us = 1_000_000 + rng.below(10_000_000_000);
            for step in 0..120 {
                t_us += match rng.below(6) {
                    0 => 0,
                    1 => rng.below(1_000),
                    2 => rng.below(300_000),
                    3 => rng.below(2_000_000),
                    _ => rng.below(100_000),
                };
                let c =
                    if rng.below(8) == 0 { 1 + rng.below(policy.limit() + 1) as u32 } else { 1 };
                engine.clock().set(t_us * 1_000);
                let want = engine.check_n(c);
                let by = if rng.below(2) == 0 { &library } else { &module };
                let got = by.check_at(&[Some("k")], c, Nanos::new(t_us * 1_000)).await.unwrap();
                assert_eq!(got.layered().layer(0), Some(&want), "{spec}, seed {seed}, step {step}");
            }
            assert_path(Path::Library, library.metrics());
            assert_path(Path::Module, module.metrics());
        }
    }
}

/// Every key under `prefix` with its value (a string's bytes, or a list's elements) and its
/// absolute expiry (`PEXPIRETIME`, ms).
fn dump(server: &Server, prefix: &str) -> Vec<(String, String, String)> {
    let keys = server.cli(&["--scan", "--pattern", &format!("{prefix}*")]).expect("SCAN");
    let mut keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
    keys.sort();
    keys.iter()
        .map(|k| {
            let kind = server.cli(&["TYPE", k]).expect("TYPE");
            let value = match kind.trim() {
                "list" => server.cli(&["LRANGE", k, "0", "-1"]),
                // Bytes as hex: a state is binary.
                _ => server.cli(&["--no-raw", "GET", k]),
            }
            .expect("a value");
            let at = server.cli(&["PEXPIRETIME", k]).expect("PEXPIRETIME");
            (k.to_string(), value, at.trim().to_string())
        })
        .collect()
}

/// Policies whose keys outlive the test (a replica hides keys whose expiry has passed).
const LONG: &[&str] = &[
    "token-bucket capacity=5 rate=1/h",
    "token-bucket capacity=4 refill=2 every=1h",
    "leaky-bucket rate=1r/m burst=5",
    "leaky-bucket rate=1/h burst=4 delay=2",
    "leaky-bucket rate=1r/m burst=5 delay=2 compat=nginx",
    "fixed-window limit=5 window=1h",
    "fixed-window limit=3 window=1h align=first",
    "sliding-window limit=5 window=1h",
    "sliding-log limit=5 window=1h",
];

async fn decide_everything(server: &Server, prefix: &str) {
    for (i, spec) in LONG.iter().enumerate() {
        let policy: Policy = spec.parse().unwrap();
        let l = limiter(server, &format!("{prefix}{i}:"), &policy, true).await;
        for k in 0..(policy.limit().min(8) + 2) {
            l.check(&format!("k{}", k % 3), 1).await;
        }
        let v = l.check("refunded", 1).await;
        if let Some(r) = v.receipt() {
            l.refund(r).await.unwrap();
        }
        assert_path(Path::Module, l.metrics());
    }
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ok() {
        assert!(Instant::now() < deadline, "{what} within 20 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A replica holds the primary's bytes and absolute expiries: the module replicates what it
/// stored (`SET ... PXAT`), never the command, which the replica would decide on its own clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_holds_the_primarys_bytes_and_expiries() {
    let primary = Server::start_on(Path::Module, &[]);
    let port = primary.port.to_string();
    let replica = Server::start_on(Path::Module, &["--replicaof", "127.0.0.1", &port]);
    wait_for("the replica in sync", || {
        replica.cli(&["INFO", "replication"]).is_some_and(|i| i.contains("master_link_status:up"))
    });
    decide_everything(&primary, "rep").await;
    assert_eq!(primary.cli(&["WAIT", "1", "5000"]).unwrap().trim(), "1");
    let on_primary = dump(&primary, "rep");
    assert!(on_primary.len() >= 3 * LONG.len(), "{on_primary:?}");
    assert_eq!(dump(&replica, "rep"), on_primary);
    // A denial writes and replicates nothing: the replication offset stays.
    let offset = |s: &Server| {
        let info = s.cli(&["INFO", "replication"]).unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("master_repl_offset:"))
            .map(|v| v.trim().parse::<u64>().unwrap())
            .unwrap()
    };
    let policy: Policy = "fixed-window limit=1 window=1h".parse().unwrap();
    let l = limiter(&primary, "deny:", &policy, true).await;
    assert!(l.check("k", 1).await.is_admitted());
    let before = offset(&primary);
    for _ in 0..20 {
        assert!(!l.check("k", 1).await.is_admitted());
    }
    assert_eq!(offset(&primary), before, "denials replicated something");
}

/// An AOF restart restores every key, bytes and expiries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aof_restart_restores_every_key() {
    let mut server =
        Server::start_on(Path::Module, &["--appendonly", "yes", "--appendfsync", "always"]);
    decide_everything(&server, "aof").await;
    let before = dump(&server, "aof");
    assert!(before.len() >= 3 * LONG.len(), "{before:?}");
    server.kill();
    server.restart();
    let after = dump(&server, "aof");
    // Keys that expired meanwhile are gone on both sides of the comparison.
    let now_ms =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()
            as i64;
    let live: Vec<_> =
        before.into_iter().filter(|(_, _, at)| at.parse::<i64>().unwrap() > now_ms + 50).collect();
    for key in &live {
        assert!(after.contains(key), "{key:?} was not restored: {after:?}");
    }
}

/// Thousands of argument vectors, random and half-valid, to the module's command: each answered
/// (the batch's reply or an error reply), the server alive throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_arguments_get_error_replies_and_the_server_goes_on() {
    let server = Server::start_on(Path::Module, &[]);
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut rng = Rng(0x5eed);
    let words: &[&[u8]] = &[
        b"",
        b"0",
        b"1",
        b"2",
        b"-1",
        b"take",
        b"peek",
        b"refund",
        b"x",
        b"99999999999999999999",
        b"0",
        b"1",
        b"q",
        b"r",
        b"0:3",
        b"r:x",
        b"gcra 5 7 1000000000 0 0 0|token-bucket capacity=5 rate=7/s",
        b"|sliding-log limit=3 window=1s",
        b"|fixed-window limit=2 window=1s",
        b"|nonsense",
        b"\x02\0\0\0\0\0\0\xf0\x3f\0\0\0\0\0\0\0\0",
        b"\x01\xff\xff\xff\xff\xff\xff\xff\xff",
        b"1 2",
        b"5|",
        b"\x02",
        &[0xff; 9],
    ];
    let (mut arrays, mut errors) = (0, 0);
    for i in 0..4000 {
        let nkeys = rng.below(4) as usize;
        let mut cmd = redis::cmd("RATEWELL.BATCH");
        for k in 0..nkeys {
            cmd.arg(format!("g{}", (k as u64 + rng.below(3)) % 4));
        }
        let word = |rng: &mut Rng| words[rng.below(words.len() as u64) as usize].to_vec();
        let blob: Vec<u8> = match rng.below(3) {
            0 => (0..rng.below(64)).map(|_| rng.next() as u8).collect(),
            1 => {
                let n = rng.below(14) as usize;
                let args: Vec<Vec<u8>> = (0..n).map(|_| word(&mut rng)).collect();
                frame(&args)
            }
            _ => {
                // One request shaped as the counts say, its fields drawn from the words: what
                // reaches the decision.
                let refund = rng.below(4) == 0;
                let per = if refund { 3 } else { 2 };
                let mut args = vec![b"1".to_vec(), nkeys.to_string().into_bytes()];
                args.push((4 + per * nkeys).to_string().into_bytes());
                args.push(if rng.below(2) == 0 { Vec::new() } else { word(&mut rng) });
                args.push(word(&mut rng));
                args.push(if refund { b"refund".to_vec() } else { word(&mut rng) });
                args.push(if rng.below(2) == 0 { Vec::new() } else { word(&mut rng) });
                for _ in 0..per * nkeys {
                    args.push(word(&mut rng));
                }
                frame(&args)
            }
        };
        cmd.arg(blob);
        // The reply as it came (`query_async` would turn an error inside an array into one).
        match redis::aio::ConnectionLike::req_packed_command(&mut conn, &cmd).await {
            // The module's reply: one string holding the batch's fields.
            Ok(redis::Value::BulkString(_)) => arrays += 1,
            Ok(redis::Value::ServerError(_)) => errors += 1,
            Ok(other) => panic!("vector {i}: neither a batch's reply nor an error: {other:?}"),
            Err(e) if e.kind() == redis::ErrorKind::Io || e.is_connection_dropped() => {
                panic!("vector {i}: the server went away: {e}")
            }
            Err(_) => errors += 1,
        }
        if i % 500 == 0 {
            assert_eq!(server.cli(&["PING"]).unwrap().trim(), "PONG");
        }
    }
    assert!(errors > 1000 && arrays > 500, "{arrays} replies, {errors} errors");
    assert_eq!(server.cli(&["PING"]).unwrap().trim(), "PONG");
}

/// The command's framing (as `ratewell_redis_module::frame`).
fn frame(args: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for a in args {
        out.extend_from_slice(&(a.len() as u32).to_le_bytes());
        out.extend_from_slice(a);
    }
    out
}

/// The client finds the module at connect, goes without it when told to, and when the server
/// it reaches after a restart has none, calls the function library from the first "unknown
/// command" on; a later restart with the module is found again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_finds_the_module_or_goes_without_it() {
    let policy: Policy = "fixed-window limit=100 window=1h".parse().unwrap();
    let mut server = Server::start_on(Path::Module, &[]);
    let l = limiter(&server, "find:", &policy, true).await;
    assert!(l.check("k", 1).await.is_admitted());
    assert_path(Path::Module, l.metrics());
    let forced = limiter(&server, "find:", &policy, false).await;
    assert!(forced.check("k", 1).await.is_admitted());
    assert_path(Path::Library, forced.metrics());

    // The same port, a server without the module (an empty one: the state died).
    server.kill();
    let port = server.port;
    let mut plain = Guard(
        std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server"),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut decided = false;
    while Instant::now() < deadline {
        let v = l.check("k", 1).await;
        if v.source() == ratewell_redis::Source::Server {
            decided = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(decided, "decisions returned to the server");
    let m = l.metrics();
    assert!(m.calls > m.module_calls, "the library decided after the restart: {m:?}");
    let _ = plain.0.kill();
}

/// A child process killed on drop.
struct Guard(std::process::Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
