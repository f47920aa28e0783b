//! `replay --backend redis://...` prints exactly what the in-process `replay` prints: every
//! algorithm and layered limits, on generated traces with microsecond times (bursts at one
//! instant, steps on and next to the policies' boundaries, mixed and impossible costs, idle gaps
//! of hours, several keys), against a `redis-server` the test starts on a free loopback port: with
//! the function library deciding, and with ratewell-redis-module loaded (its native command
//! deciding).

mod common;
#[path = "../../ratewell-redis/tests/common/mod.rs"]
mod redis_server;

use std::fmt::Write;

use common::ratewell;
use redis_server::{PATHS, Path, Rng, Server};

/// A trace of `lines` requests on `keys` keys, times in whole microseconds.
fn trace(seed: u64, lines: usize, keys: usize, step_us: u64, window_us: u64, limit: u64) -> String {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut t = rng.below(5_000_000_000);
    let mut out = String::new();
    for _ in 0..lines {
        t += match rng.below(12) {
            0..=3 => 0,
            4 => 1,
            5 => step_us,
            6 => step_us.saturating_sub(1),
            7 => step_us + 1,
            8 => window_us,
            9 => window_us.saturating_sub(1),
            10 => rng.below(window_us.max(1)),
            _ => 3_600_000_000 * (1 + rng.below(5)),
        };
        let key = format!("k{}", rng.below(keys as u64));
        let cost = match rng.below(10) {
            0..=6 => 1,
            7 | 8 => 1 + rng.below(limit),
            _ => limit + 1,
        };
        writeln!(out, "{},{key},{cost}", t * 1_000).unwrap();
    }
    out
}

fn compare(server: &Server, policies: &[&str], input: &str, extra: &[&str]) {
    let mut args = vec!["replay"];
    for p in policies {
        args.push("--policy");
        args.push(p);
    }
    args.extend_from_slice(extra);
    let local = ratewell(&args, input);
    assert_eq!(local.code, Some(0), "{policies:?}: {}", local.err);
    let url = server.url();
    let mut remote_args = args.clone();
    remote_args.extend_from_slice(&["--backend", &url]);
    let remote = ratewell(&remote_args, input);
    assert_eq!(remote.code, Some(0), "{policies:?} --backend: {}", remote.err);
    assert!(!local.out.is_empty());
    if local.out != remote.out {
        let first = local.out.lines().zip(remote.out.lines()).position(|(a, b)| a != b);
        panic!("{policies:?} {extra:?}: outputs differ first at line {first:?}");
    }
}

#[test]
fn every_algorithm_replays_as_in_process() {
    for path in PATHS {
        every_algorithm_replays_as_in_process_on(path);
    }
}

fn every_algorithm_replays_as_in_process_on(path: Path) {
    let server = Server::start_on(path, &[]);
    let cases: &[(&str, u64, u64, u64)] = &[
        // (policy, emission step us, window us, limit)
        ("token-bucket capacity=5 rate=7/s", 142_857, 714_286, 5),
        ("token-bucket capacity=3 refill=2 every=250ms", 125_000, 250_000, 3),
        ("leaky-bucket rate=10r/s burst=5", 100_000, 600_000, 6),
        ("leaky-bucket rate=3/s burst=4 delay=2", 333_333, 1_666_667, 5),
        ("leaky-bucket rate=3/250ms burst=5 delay=2 compat=nginx", 83_333, 500_000, 6),
        ("fixed-window limit=5 window=1s", 200_000, 1_000_000, 5),
        ("fixed-window limit=3 window=1m align=first", 20_000_000, 60_000_000, 3),
        ("sliding-window limit=7 window=3s", 428_571, 3_000_000, 7),
        ("sliding-log limit=5 window=1s", 200_000, 1_000_000, 5),
        ("token-bucket capacity=4 rate=4/s dry-run", 250_000, 1_000_000, 4),
    ];
    for (i, &(policy, step, window, limit)) in cases.iter().enumerate() {
        for seed in 1..=3u64 {
            let input = trace(seed * 31 + i as u64, 400, 3, step, window, limit);
            compare(&server, &[policy], &input, &[]);
        }
        let input = trace(i as u64 + 7, 300, 2, step, window, limit);
        compare(&server, &[policy], &input, &["--format", "full"]);
        compare(&server, &[policy], &input, &["--summary"]);
    }
}

#[test]
fn layered_limits_replay_as_in_process() {
    for path in PATHS {
        layered_limits_replay_as_in_process_on(path);
    }
}

fn layered_limits_replay_as_in_process_on(path: Path) {
    let server = Server::start_on(path, &[]);
    let sets: &[&[&str]] = &[
        &["token-bucket capacity=5 rate=7/s", "fixed-window limit=8 window=1s"],
        &[
            "leaky-bucket rate=3/s burst=4 delay=2",
            "sliding-window limit=6 window=2s",
            "sliding-log limit=9 window=3s dry-run",
        ],
    ];
    for (i, set) in sets.iter().enumerate() {
        for seed in 1..=3u64 {
            let input = trace(seed * 17 + i as u64, 400, 3, 150_000, 1_000_000, 5);
            compare(&server, set, &input, &[]);
            compare(&server, set, &input, &["--format", "full"]);
            // One key per layer, separated by `|`.
            let lists: String = input
                .lines()
                .enumerate()
                .map(|(j, l)| {
                    let mut f = l.splitn(3, ',');
                    let (t, k, c) = (f.next().unwrap(), f.next().unwrap(), f.next().unwrap());
                    let keys: Vec<String> =
                        (0..set.len()).map(|layer| format!("{k}-{}", (j + layer) % 2)).collect();
                    format!("{t},{},{c}\n", keys.join("|"))
                })
                .collect();
            compare(&server, set, &lists, &[]);
        }
    }
}

#[test]
fn access_logs_replay_as_in_process() {
    let server = Server::start();
    let format = r#"$remote_addr [$msec] "$request" $status $body_bytes_sent key=$http_x_api_key"#;
    let mut rng = Rng(11);
    let mut t_ms = 1_712_311_872_000u64;
    let log: String = (0..600)
        .map(|_| {
            t_ms += rng.below(120);
            let (ip, key, bytes) = (rng.below(3), rng.below(4), rng.below(3) + 1);
            format!(
                "10.0.0.{ip} [{}.{:03}] \"GET / HTTP/1.1\" 200 {bytes} key=k|{key}\n",
                t_ms / 1000,
                t_ms % 1000
            )
        })
        .collect();
    let log_args = ["--log", "nginx", "--log-format", format, "--cost", "$body_bytes_sent"];
    let per_layer =
        [&log_args[..], &["--key", "$remote_addr", "--key", "$http_x_api_key"]].concat();
    let set = ["token-bucket capacity=6 rate=5/s", "sliding-window limit=9 window=2s"];
    compare(&server, &set[..1], &log, &log_args);
    compare(&server, &set, &log, &per_layer);
    compare(&server, &set, &log, &[&per_layer[..], &["--format", "full"]].concat());
}

#[test]
fn the_backend_refuses_what_it_cannot_decide_and_bad_input() {
    let server = Server::start();
    let url = server.url();
    // Times that are not whole microseconds: an error naming the line.
    let r = ratewell(
        &["replay", "--policy", "fixed-window limit=2 window=1s", "--backend", &url],
        "1000,a\n1500,a\n",
    );
    assert_eq!(r.code, Some(2));
    assert!(r.err.contains("line 2") && r.err.contains("microseconds"), "{}", r.err);
    // A policy outside the script's exact domain.
    let r = ratewell(
        &["replay", "--policy", "fixed-window limit=2 window=1500ns", "--backend", &url],
        "0,a\n",
    );
    assert_eq!(r.code, Some(2));
    assert!(r.err.contains("whole number of microseconds"), "{}", r.err);
    // A URL that does not parse, and a port where nothing listens.
    let r = ratewell(
        &["replay", "--policy", "fixed-window limit=2 window=1s", "--backend", "http://x"],
        "0,a\n",
    );
    assert_eq!(r.code, Some(2));
    assert!(r.err.contains("not a Redis URL"), "{}", r.err);
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let r = ratewell(
        &[
            "replay",
            "--policy",
            "fixed-window limit=2 window=1s",
            "--backend",
            &format!("redis://127.0.0.1:{dead}"),
        ],
        "0,a\n",
    );
    assert_eq!(r.code, Some(2));
    assert!(r.err.contains("does not answer"), "{}", r.err);
    // A key the trace grammar does not allow is a bad line, as in process.
    let r = ratewell(
        &["replay", "--policy", "fixed-window limit=2 window=1s", "--backend", &url],
        "0,a\n1000,{tag}x\n",
    );
    assert_eq!(r.code, Some(2));
    assert!(r.err.contains("line 2"), "{}", r.err);
    assert_eq!(r.out, "1\n");
    // The replay deletes its keys when it ends.
    let keys = server.cli(&["DBSIZE"]).unwrap();
    assert_eq!(keys.trim(), "0", "keys left behind");
}
