//! The proxy example, started as a process in front of an upstream this test serves: it forwards
//! what its limits admit (with the client in X-Forwarded-For) and answers the rest itself.

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use common::{client, get, sf_list};
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;

/// The example's binary: `cargo test` builds examples next to the tests' directory.
fn proxy_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(|deps| deps.parent()).unwrap();
    let binary = dir.join("examples").join(format!("proxy{}", std::env::consts::EXE_SUFFIX));
    if !binary.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-p", "ratewell-tower", "--example", "proxy"])
            .status()
            .unwrap();
        assert!(status.success());
    }
    binary
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
    let mut child = Command::new(proxy_binary())
        .args(["--listen", "127.0.0.1:0", "--upstream", upstream])
        .args(limits)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("proxy said {line:?}"))
        .to_owned();
    Proxy { child, addr }
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
    ] {
        let output = Command::new(proxy_binary()).args(args).output().unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        assert!(!output.stderr.is_empty());
    }
    let help = Command::new(proxy_binary()).arg("--help").output().unwrap();
    assert!(help.status.success());
    assert!(String::from_utf8(help.stdout).unwrap().contains("--trusted-proxy CIDR"));
}
