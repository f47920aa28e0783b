//! The statsd sink over a real service: the Go service's names byte for byte, the counts the
//! service decided, deltas only, `EXTRA_TAGS` in both wire formats, the IPv4 sanitising, and a
//! dead sink that changes nothing.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use ratewell_rls::proto::Code;
use ratewell_rls::stats::Stats;
use ratewell_rls::statsd::{StatsdSettings, spawn};
use tokio::net::UdpSocket;
use tokio::sync::watch;
use tokio::time::{Instant, timeout};

const EDGE: &str = "
domain: edge
descriptors:
  - key: remote_address
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5}
";
const NOW: u64 = 2222;
const KEY: &str = "ratelimit.service.rate_limit.edge.remote_address_10_0_0_1";

fn settings(port: u16, env: &[(&str, &str)]) -> StatsdSettings {
    let port = port.to_string();
    let mut vars: HashMap<String, String> = [
        ("STATSD_HOST", "127.0.0.1"),
        ("STATSD_PORT", port.as_str()),
        ("STATS_FLUSH_INTERVAL", "50ms"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    for (k, v) in env {
        vars.insert(k.to_string(), v.to_string());
    }
    StatsdSettings::from_env(&vars).unwrap().expect("a statsd sink")
}

/// Decide `n` requests from 10.0.0.1; the codes answered.
async fn decide(h: &mut Harness, n: usize) -> Vec<i32> {
    let mut codes = Vec::new();
    for _ in 0..n {
        let r = h.call(request("edge", &[&[("remote_address", "10.0.0.1")]], 1)).await.unwrap();
        codes.push(r.overall_code);
    }
    codes
}

/// Lines received on `socket` until `enough` holds of them all (at most [`DEADLINE`]).
async fn receive(socket: &UdpSocket, enough: impl Fn(&[String]) -> bool) -> Vec<String> {
    let until = Instant::now() + DEADLINE;
    let mut lines = Vec::new();
    let mut buf = vec![0u8; 65_536];
    while !enough(&lines) {
        let left = until.saturating_duration_since(Instant::now());
        let n = timeout(left, socket.recv(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("not enough within {DEADLINE:?}: {lines:#?}"))
            .unwrap();
        assert!(n <= ratewell_rls::statsd::MAX_DATAGRAM, "a datagram of {n} bytes");
        let text = std::str::from_utf8(&buf[..n]).unwrap();
        assert!(text.ends_with('\n'), "{text:?}");
        lines.extend(text.lines().map(str::to_owned));
    }
    lines
}

/// The sum of the values of the lines named `name` (`name:<n>|c`).
fn sum(lines: &[String], name: &str) -> u64 {
    lines
        .iter()
        .filter_map(|l| {
            l.strip_prefix(name)?.strip_prefix(':')?.strip_suffix("|c")?.parse::<u64>().ok()
        })
        .sum::<u64>()
}

fn response_times(lines: &[String], name_end: &str) -> usize {
    let prefix = format!("ratelimit_server.ShouldRateLimit.response_time{name_end}:");
    lines.iter().filter(|l| l.starts_with(&prefix)).count()
}

async fn listener() -> (UdpSocket, u16) {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let port = socket.local_addr().unwrap().port();
    (socket, port)
}

#[tokio::test]
async fn go_names_counts_and_deltas() {
    let mut h = Harness::start(&[("edge.yaml", EDGE)], &[], NOW).await;
    let ok = Code::Ok as i32;
    let over = Code::OverLimit as i32;
    assert_eq!(decide(&mut h, 8).await, [ok, ok, ok, ok, ok, over, over, over]);

    let (socket, port) = listener().await;
    let (stop, stopped) = watch::channel(false);
    let stats: Arc<Stats> = h.running.service.stats().clone();
    let task = spawn(settings(port, &[]), stats, stopped);
    // Limit 5, near at floor(5 * 0.8) = 4: the fifth hit is near, the last three over.
    let mut lines = receive(&socket, |l| response_times(l, "") >= 8).await;
    let times: Vec<String> =
        lines.iter().filter(|l| l.contains(".response_time:")).cloned().collect();
    for t in &times {
        let ms = t.strip_prefix("ratelimit_server.ShouldRateLimit.response_time:").unwrap();
        assert!(ms.strip_suffix("|ms").unwrap().parse::<u64>().is_ok(), "{t}");
    }
    lines.retain(|l| !l.contains(".response_time:"));
    lines.sort();
    let mut want = vec![
        format!("{KEY}.total_hits:8|c"),
        format!("{KEY}.over_limit:3|c"),
        format!("{KEY}.near_limit:1|c"),
        format!("{KEY}.within_limit:5|c"),
        "ratelimit.service.config_load_success:1|c".to_owned(),
        "ratelimit_server.ShouldRateLimit.total_requests:8|c".to_owned(),
    ];
    want.sort();
    assert_eq!(lines, want);
    assert_eq!(times.len(), 8);

    // A second round: only what moved since.
    let codes = decide(&mut h, 2).await;
    assert_eq!(codes, [over, over]);
    let total = format!("{KEY}.total_hits");
    let lines = receive(&socket, |l| {
        sum(l, &total) >= 2
            && sum(l, "ratelimit_server.ShouldRateLimit.total_requests") >= 2
            && response_times(l, "") >= 2
    })
    .await;
    assert_eq!(sum(&lines, &total), 2);
    assert_eq!(sum(&lines, &format!("{KEY}.over_limit")), 2);
    for gone in ["within_limit", "near_limit", "shadow_mode"] {
        assert!(!lines.iter().any(|l| l.contains(gone)), "{gone} did not move: {lines:#?}");
    }
    assert!(!lines.iter().any(|l| l.contains("config_load")), "{lines:#?}");
    let _ = stop.send(true);
    timeout(DEADLINE, task).await.expect("the sink stops").unwrap();
    h.running.stop().await;
}

#[tokio::test]
async fn extra_tags_in_statsd_and_dogstatsd() {
    let mut h = Harness::start(&[("edge.yaml", EDGE)], &[], NOW).await;
    decide(&mut h, 8).await;
    let stats = h.running.service.stats().clone();
    let (_stop, stopped) = watch::channel(false);
    let tags = ("EXTRA_TAGS", "zone:eu.west,app:rls");

    let (plain, port) = listener().await;
    spawn(settings(port, &[tags]), stats.clone(), stopped.clone());
    let lines = receive(&plain, |l| response_times(l, ".__app=rls.__zone=eu_west") >= 8).await;
    for want in [
        format!("{KEY}.total_hits.__app=rls.__zone=eu_west:8|c"),
        format!("{KEY}.over_limit.__app=rls.__zone=eu_west:3|c"),
        "ratelimit_server.ShouldRateLimit.total_requests.__app=rls.__zone=eu_west:8|c".to_owned(),
    ] {
        assert!(lines.contains(&want), "{want} in {lines:#?}");
    }

    let (dog, port) = listener().await;
    let env = [tags, ("USE_STATSD", "false"), ("USE_DOG_STATSD", "true")];
    spawn(settings(port, &env), stats.clone(), stopped.clone());
    let lines =
        receive(&dog, |l| l.iter().filter(|l| l.contains(".response_time:")).count() >= 8).await;
    for want in [
        format!("{KEY}.total_hits:8|c|#app:rls,zone:eu_west"),
        format!("{KEY}.within_limit:5|c|#app:rls,zone:eu_west"),
        "ratelimit.service.config_load_success:1|c|#app:rls,zone:eu_west".to_owned(),
    ] {
        assert!(lines.contains(&want), "{want} in {lines:#?}");
    }
    for t in lines.iter().filter(|l| l.contains(".response_time:")) {
        let value = t.strip_prefix("ratelimit_server.ShouldRateLimit.response_time:").unwrap();
        let ms = value.strip_suffix("|ms|#app:rls,zone:eu_west").unwrap();
        assert!(ms.ends_with(".000000"), "{t}");
    }
    h.running.stop().await;
}

/// The host as a name, resolved by the sink: `localhost`, listened on at 127.0.0.1 (and ::1
/// at the same port when the machine has it).
#[tokio::test]
async fn host_names_resolve() {
    let (v4, port) = listener().await;
    let v6 = UdpSocket::bind(("::1", port)).await.ok();
    let stats = Arc::new(Stats::new(10));
    stats.rule("d.k_1.2.3.4").count(2, 0, 5, 4, false, false);
    let (_stop, stopped) = watch::channel(false);
    spawn(settings(port, &[("STATSD_HOST", "localhost")]), stats, stopped);
    let want = "ratelimit.service.rate_limit.d.k_1_2_3_4.total_hits:2|c".to_owned();
    let got = async {
        let (mut a, mut b) = ([0u8; 2048], [0u8; 2048]);
        let (buf, n) = match &v6 {
            Some(v6) => tokio::select! {
                n = v4.recv(&mut a) => (&a, n),
                n = v6.recv(&mut b) => (&b, n),
            },
            None => {
                let n = v4.recv(&mut a).await;
                (&a, n)
            }
        };
        String::from_utf8_lossy(&buf[..n.unwrap()]).into_owned()
    };
    let text = timeout(DEADLINE, got).await.expect("a datagram");
    assert!(text.lines().any(|l| l == want), "{text}");
}

/// Nobody listening (ICMP port unreachable), or a host that does not resolve: decisions are
/// the same, the sink keeps going and stops when asked, after a last flush.
#[tokio::test]
async fn a_dead_sink_changes_nothing() {
    let mut h = Harness::start(&[("edge.yaml", EDGE)], &[], NOW).await;
    let stats = h.running.service.stats().clone();
    let (_, closed) = listener().await; // dropped at once: the port is closed
    let (stop, stopped) = watch::channel(false);
    let fast = [("STATS_FLUSH_INTERVAL", "5ms")];
    let dead = spawn(settings(closed, &fast), stats.clone(), stopped.clone());
    let nowhere = [("STATSD_HOST", "no-such-host.invalid"), fast[0]];
    let unresolved = spawn(settings(closed, &nowhere), stats.clone(), stopped.clone());
    let ok = Code::Ok as i32;
    let over = Code::OverLimit as i32;
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let codes = decide(&mut h, 3).await;
        assert!(codes.iter().all(|c| *c == ok || *c == over));
    }
    assert_eq!(stats.get("edge.remote_address_10.0.0.1").unwrap().load(), [9, 4, 1, 5, 0]);
    assert!(!dead.is_finished() && !unresolved.is_finished());

    // The last flush at stop reaches a live sink whose interval never came.
    let (live, port) = listener().await;
    let slow = spawn(settings(port, &[("STATS_FLUSH_INTERVAL", "1h")]), stats, stopped);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let _ = stop.send(true);
    for task in [dead, unresolved, slow] {
        timeout(DEADLINE, task).await.expect("the sink stops").unwrap();
    }
    let lines = receive(&live, |l| !l.is_empty()).await;
    assert!(lines.contains(&format!("{KEY}.total_hits:9|c")), "{lines:#?}");
    h.running.stop().await;
}
