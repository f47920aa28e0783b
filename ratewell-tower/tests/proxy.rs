//! The proxy example, started as a process in front of an upstream this test serves: it forwards
//! what its limits admit (with the client in X-Forwarded-For) and answers the rest itself.

mod common;
#[path = "../../ratewell-http/tests/support/proxy_example.rs"]
mod proxy_example;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use common::{client, get, sf_list};
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;

/// The example's binary, built with the `prometheus` feature its `--metrics` needs (`cargo test`
/// builds examples with the test run's features, which may lack it).
fn proxy_binary() -> PathBuf {
    proxy_example::proxy_example(&["-p", "ratewell-tower", "--features", "prometheus"])
}

struct Proxy {
    child: Child,
    addr: String,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The proxy on a free loopback port in front of `upstream`, with `limits` (its other arguments).
fn start_proxy(upstream: &str, limits: &[&str]) -> Proxy {
    start_proxy_reading(upstream, limits).0
}

/// [`start_proxy`], and the lines it printed after `listening on` (`metrics on ...`, when
/// `limits` asks for metrics).
fn start_proxy_reading(upstream: &str, limits: &[&str]) -> (Proxy, Vec<String>) {
    let mut child = Command::new(proxy_binary())
        .args(["--listen", "127.0.0.1:0", "--upstream", upstream])
        .args(limits)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("proxy said {line:?}"))
        .to_owned();
    let mut more = Vec::new();
    if limits.contains(&"--metrics") {
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        more.push(line.trim().to_owned());
    }
    (Proxy { child, addr }, more)
}

struct Upstream {
    addr: String,
    calls: Arc<AtomicUsize>,
    /// The X-Forwarded-For of every request it got.
    forwarded_for: Arc<Mutex<Vec<String>>>,
}

async fn upstream() -> Upstream {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let calls = Arc::new(AtomicUsize::new(0));
    let forwarded_for = Arc::new(Mutex::new(Vec::new()));
    let (c, f) = (Arc::clone(&calls), Arc::clone(&forwarded_for));
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            let (c, f) = (Arc::clone(&c), Arc::clone(&f));
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                c.fetch_add(1, Ordering::SeqCst);
                let xff = req
                    .headers()
                    .get("x-forwarded-for")
                    .map_or("", |v| v.to_str().unwrap())
                    .to_owned();
                f.lock().unwrap().push(xff);
                async {
                    Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from_static(
                        b"upstream",
                    ))))
                }
            });
            tokio::spawn(async move {
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Upstream { addr, calls, forwarded_for }
}

#[tokio::test]
async fn the_proxy_forwards_what_its_limits_admit() {
    let upstream = upstream().await;
    let proxy = start_proxy(
        &upstream.addr,
        &[
            "--policy",
            "fixed-window limit=3 window=1m",
            "--layer",
            "key:header=x-api-key:fixed-window limit=100 window=1m",
        ],
    );
    let client = client();
    let url = format!("http://{}/hello?x=1", proxy.addr);
    for _ in 0..3 {
        let answer = get(&client, &url, &[("x-api-key", b"k")]).await;
        assert_eq!(answer.status, StatusCode::OK);
        assert_eq!(&answer.body[..], b"upstream");
        let field = sf_list(answer.header("ratelimit").unwrap());
        assert_eq!(field.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["ip", "key"]);
    }
    let answer = get(&client, &url, &[]).await;
    assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS);
    let retry_after: u64 = answer.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry_after));
    assert_eq!(upstream.calls.load(Ordering::SeqCst), 3);
    // The upstream saw the client's address appended.
    assert!(upstream.forwarded_for.lock().unwrap().iter().all(|x| x == "127.0.0.1"));
}

#[tokio::test]
async fn behind_a_trusted_proxy_each_forwarded_client_has_its_budget() {
    let upstream = upstream().await;
    let proxy = start_proxy(
        &upstream.addr,
        &["--policy", "token-bucket capacity=2 rate=1/h", "--trusted-proxy", "127.0.0.0/8"],
    );
    let client = client();
    let url = format!("http://{}/", proxy.addr);
    let a = [("x-forwarded-for", &b"203.0.113.1, 198.51.100.1"[..])];
    let b = [("x-forwarded-for", &b"198.51.100.2"[..])];
    assert_eq!(get(&client, &url, &a).await.status, StatusCode::OK);
    assert_eq!(get(&client, &url, &a).await.status, StatusCode::OK);
    assert_eq!(get(&client, &url, &a).await.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(get(&client, &url, &b).await.status, StatusCode::OK);
    assert_eq!(upstream.calls.load(Ordering::SeqCst), 3);
    assert_eq!(upstream.forwarded_for.lock().unwrap()[0], "203.0.113.1, 198.51.100.1, 127.0.0.1");
}

#[test]
fn bad_arguments_exit_2_with_a_message() {
    for args in [
        &["--listen", "127.0.0.1:0"][..],
        &[
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            "127.0.0.1:1",
            "--policy",
            "token-bucket capacity=0 rate=1/s",
        ],
        &[
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            "127.0.0.1:1",
            "--layer",
            "x:cookie:fixed-window limit=1 window=1s",
        ],
        &[
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            "127.0.0.1:1",
            "--policy",
            "fixed-window limit=1 window=1s",
            "--trusted-proxy",
            "10.0.0.0/99",
        ],
        // The pingora example's comparisons: not options of this one.
        &["--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:1", "--no-limit"],
    ] {
        let output = Command::new(proxy_binary()).args(args).output().unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        assert!(!output.stderr.is_empty());
    }
    let help = Command::new(proxy_binary()).arg("--help").output().unwrap();
    assert!(help.status.success());
    assert!(String::from_utf8(help.stdout).unwrap().contains("--trusted-proxy CIDR"));
}

/// One sample of Prometheus's text format: its name, labels and value.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

/// Prometheus's text exposition format (0.0.4), parsed strictly: `# HELP` / `# TYPE` lines
/// naming a metric before its samples, then `name{label="value",...} number` lines; anything
/// else fails the test.
fn parse_exposition(text: &str) -> Vec<Sample> {
    let name_ok = |n: &str| {
        !n.is_empty()
            && n.chars().enumerate().all(|(i, c)| {
                c.is_ascii_alphabetic() || c == '_' || c == ':' || (i > 0 && c.is_ascii_digit())
            })
    };
    let mut typed = std::collections::HashMap::new();
    let mut samples = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            let (kind, name, what) = (parts.next(), parts.next(), parts.next());
            let name = name.unwrap_or_else(|| panic!("comment {line:?}"));
            assert!(name_ok(name), "{line:?}");
            match kind {
                Some("HELP") => assert!(what.is_some_and(|h| !h.is_empty()), "{line:?}"),
                Some("TYPE") => {
                    let t = what.unwrap_or_default();
                    assert!(["counter", "gauge", "histogram", "summary", "untyped"].contains(&t));
                    typed.insert(name.to_owned(), t.to_owned());
                }
                _ => panic!("comment {line:?}"),
            }
            continue;
        }
        assert!(!line.trim().is_empty(), "an empty line in the exposition");
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("{line:?}"));
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("value of {line:?}"));
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => {
                let body = rest.strip_suffix('}').unwrap_or_else(|| panic!("{line:?}"));
                let labels = body
                    .split(',')
                    .filter(|l| !l.is_empty())
                    .map(|l| {
                        let (k, v) = l.split_once('=').unwrap_or_else(|| panic!("{line:?}"));
                        let v = v.strip_prefix('"').and_then(|v| v.strip_suffix('"'));
                        assert!(name_ok(k), "label {k:?} in {line:?}");
                        (k.to_owned(), v.unwrap_or_else(|| panic!("{line:?}")).to_owned())
                    })
                    .collect();
                (name, labels)
            }
            None => (series, Vec::new()),
        };
        assert!(name_ok(name), "{line:?}");
        assert!(typed.contains_key(name), "{name} has no # TYPE before its samples");
        samples.push(Sample { name: name.to_owned(), labels, value });
    }
    samples
}

#[tokio::test]
async fn the_proxy_serves_metrics_that_count_every_request() {
    let upstream = upstream().await;
    let (proxy, lines) = start_proxy_reading(
        &upstream.addr,
        &["--policy", "fixed-window limit=5 window=1h", "--metrics", "127.0.0.1:0"],
    );
    let metrics = lines[0].strip_prefix("metrics on ").unwrap_or_else(|| panic!("{lines:?}"));
    let client = client();
    let url = format!("http://{}/", proxy.addr);
    let (mut ok, mut limited) = (0u64, 0u64);
    for i in 0..23 {
        // A third of them also try to spoof their address (the proxy trusts no one).
        let spoof: &[(&str, &[u8])] =
            if i % 3 == 0 { &[("x-forwarded-for", b"1.2.3.4")] } else { &[] };
        match get(&client, &url, spoof).await.status {
            StatusCode::OK => ok += 1,
            StatusCode::TOO_MANY_REQUESTS => limited += 1,
            other => panic!("{other}"),
        }
    }
    assert_eq!((ok, limited), (5, 18));
    let answer = get(&client, &format!("http://{metrics}/metrics"), &[]).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert!(answer.header("content-type").unwrap().starts_with("text/plain; version=0.0.4"));
    let text = std::str::from_utf8(&answer.body).unwrap();
    let samples = parse_exposition(text);
    let value = |name: &str, labels: &[(&str, &str)]| {
        let found: Vec<&Sample> = samples
            .iter()
            .filter(|s| {
                s.name == name
                    && s.labels.len() == labels.len()
                    && labels.iter().all(|(k, v)| s.labels.iter().any(|(a, b)| a == k && b == v))
            })
            .collect();
        assert_eq!(found.len(), 1, "{name} {labels:?} in\n{text}");
        found[0].value
    };
    let requests = "ratewell_http_requests_total";
    assert_eq!(value(requests, &[("limit", "ip"), ("outcome", "admitted")]), ok as f64);
    assert_eq!(value(requests, &[("limit", "ip"), ("outcome", "rejected")]), limited as f64);
    assert_eq!(value(requests, &[("limit", "ip"), ("outcome", "skipped")]), 0.0);
    assert_eq!(value("ratewell_http_forwarded_total", &[("outcome", "untrusted")]), 8.0);
    assert_eq!(value("ratewell_keys", &[("limit", "ip")]), 1.0);
    assert!(value("ratewell_key_capacity", &[("limit", "ip")]) >= 100_000.0);
    assert_eq!(
        value("ratewell_table_events_total", &[("limit", "ip"), ("event", "evictions")]),
        0.0
    );
    // Anything but /metrics is not found.
    let other = get(&client, &format!("http://{metrics}/"), &[]).await;
    assert_eq!(other.status, StatusCode::NOT_FOUND);
}

/// Wait until the process `pid` catches SIGTERM. The proxy installs its handler after it prints
/// `listening on`, so a SIGTERM sent at once can meet the default action (death by the signal).
/// Linux shows the signals a process catches in `/proc/PID/status` (`SigCgt`); where it does
/// not, this returns at once.
fn wait_catches_sigterm(pid: u32) {
    const SIGTERM: u32 = 15;
    let path = format!("/proc/{pid}/status");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let Ok(status) = std::fs::read_to_string(&path) else { return };
        let caught = status
            .lines()
            .find_map(|l| l.strip_prefix("SigCgt:"))
            .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok());
        match caught {
            None => return,
            Some(mask) if mask & (1 << (SIGTERM - 1)) != 0 => return,
            Some(_) => {}
        }
        assert!(std::time::Instant::now() < deadline, "SIGTERM not caught within 20 s");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Stop the proxy as a service manager does (SIGTERM) and wait for it: it writes `--state` and
/// exits 0.
fn terminate(mut proxy: Proxy) {
    wait_catches_sigterm(proxy.child.id());
    let pid = proxy.child.id().to_string();
    let sent = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(sent.success(), "kill -TERM {pid}");
    let status = proxy.child.wait().unwrap();
    assert!(status.success(), "the proxy exits 0 on SIGTERM: {status}");
}

#[tokio::test]
async fn a_restart_with_state_keeps_each_clients_spent_budget() {
    let upstream = upstream().await;
    let dir = std::env::temp_dir().join(format!("ratewell-proxy-state-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let state = dir.join("state.bin");
    let state_arg = state.to_str().unwrap();
    let args = [
        "--policy",
        "fixed-window limit=3 window=1h",
        "--layer",
        "key:header=x-api-key:fixed-window limit=5 window=1h",
        "--state",
        state_arg,
    ];
    let client = client();
    let proxy = start_proxy(&upstream.addr, &args);
    let url = format!("http://{}/", proxy.addr);
    for _ in 0..3 {
        assert_eq!(get(&client, &url, &[("x-api-key", b"alice")]).await.status, StatusCode::OK);
    }
    assert_eq!(get(&client, &url, &[]).await.status, StatusCode::TOO_MANY_REQUESTS);
    terminate(proxy);
    assert!(state.exists(), "written on SIGTERM");

    // Restarted: the address's budget is still spent, its window where it was.
    let proxy = start_proxy(&upstream.addr, &args);
    let url = format!("http://{}/", proxy.addr);
    let answer = get(&client, &url, &[]).await;
    assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS);
    let retry_after: u64 = answer.header("retry-after").unwrap().parse().unwrap();
    assert!(retry_after > 3000 && retry_after <= 3600, "{retry_after}");
    assert_eq!(upstream.calls.load(Ordering::SeqCst), 3);
    terminate(proxy);

    // Without --state the restart forgets; a file that is not a snapshot is reported and the
    // limits start empty.
    let proxy = start_proxy(&upstream.addr, &args[..4]);
    assert_eq!(get(&client, &format!("http://{}/", proxy.addr), &[]).await.status, StatusCode::OK);
    drop(proxy);
    std::fs::write(&state, b"garbage").unwrap();
    let proxy = start_proxy(&upstream.addr, &args);
    assert_eq!(get(&client, &format!("http://{}/", proxy.addr), &[]).await.status, StatusCode::OK);
    drop(proxy);
    let _ = std::fs::remove_dir_all(&dir);
}
