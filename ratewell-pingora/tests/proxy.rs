//! Through a real pingora proxy on loopback (started with `Server::run` and a shutdown signal in
//! a thread of its own), in front of this test's own upstream: statuses and fields through a
//! burst, `Retry-After`, client addresses behind trusted proxies, layered all-or-nothing
//! charging, a delayed request whose client leaves, bad forwarding headers, and exactness under
//! two concurrent clients.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora_core::Result;
use pingora_core::server::{RunArgs, Server, ShutdownSignal, ShutdownSignalWatch};
use pingora_core::upstreams::peer::HttpPeer;
use pingora_http::ResponseHeader;
use pingora_proxy::{ProxyHttp, Session, http_proxy_service};
use ratewell_pingora::{ForwardedHeader, Key, Limit, RateLimit, RateLimitCtx, TrustedProxies};

/// An upstream on a free loopback port: answers `upstream` to every request, counting them.
struct Upstream {
    addr: String,
    calls: Arc<AtomicUsize>,
}

fn upstream() -> Upstream {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let counted = counted.clone();
            std::thread::spawn(move || {
                // One request per connection is enough: the proxy opens more as it needs.
                while read_head(&mut stream).is_some() {
                    counted.fetch_add(1, Ordering::SeqCst);
                    let reply = "HTTP/1.1 200 OK\r\ncontent-length: 8\r\n\r\nupstream";
                    if stream.write_all(reply.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    Upstream { addr, calls }
}

/// Read a request or response head (to the blank line); `None` at the end of the stream.
fn read_head(stream: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return None,
        }
    }
    Some(String::from_utf8_lossy(&head).into_owned())
}

/// The proxy the tests run: one [`RateLimit`], forwarding to the upstream.
struct TestProxy {
    upstream: String,
    limit: RateLimit,
}

#[async_trait]
impl ProxyHttp for TestProxy {
    type CTX = RateLimitCtx;

    fn new_ctx(&self) -> RateLimitCtx {
        RateLimitCtx::default()
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut RateLimitCtx) -> Result<bool> {
        self.limit.check(session, ctx).await
    }

    async fn upstream_peer(&self, _: &mut Session, _: &mut RateLimitCtx) -> Result<Box<HttpPeer>> {
        Ok(Box::new(HttpPeer::new(self.upstream.as_str(), false, String::new())))
    }

    async fn response_filter(
        &self,
        _: &mut Session,
        response: &mut ResponseHeader,
        ctx: &mut RateLimitCtx,
    ) -> Result<()> {
        self.limit.decorate(response, ctx)
    }
}

/// Stops the server when told.
struct Stop(Arc<tokio::sync::Notify>);

#[async_trait]
impl ShutdownSignalWatch for Stop {
    async fn recv(&self) -> ShutdownSignal {
        self.0.notified().await;
        ShutdownSignal::FastShutdown
    }
}

/// A pingora server on a free loopback port, stopped when dropped.
struct Proxy {
    addr: String,
    stop: Arc<tokio::sync::Notify>,
    thread: Option<std::thread::JoinHandle<()>>,
    upstream: Upstream,
    limit: RateLimit,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn start(limit: RateLimit) -> Proxy {
    let upstream = upstream();
    // A free port: bound, released, and taken by the server (loopback, at once).
    let addr = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    let mut server = Server::new(None).unwrap();
    server.bootstrap();
    let proxy = TestProxy { upstream: upstream.addr.clone(), limit: limit.clone() };
    let mut service = http_proxy_service(&server.configuration, proxy);
    service.add_tcp(&addr);
    server.add_service(service);
    let stop = Arc::new(tokio::sync::Notify::new());
    let signal = Stop(stop.clone());
    let thread = std::thread::spawn(move || {
        server.run(RunArgs { shutdown_signal: Box::new(signal) });
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(&addr).is_err() {
        assert!(Instant::now() < deadline, "the proxy did not listen on {addr}");
        std::thread::sleep(Duration::from_millis(10));
    }
    Proxy { addr, stop, thread: Some(thread), upstream, limit }
}

/// A response: status, headers (names lowercase), body.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// `GET /` with `headers`, on a connection of its own.
fn get(proxy: &Proxy, headers: &[(&str, &str)]) -> Answer {
    let mut stream = TcpStream::connect(&proxy.addr).unwrap();
    let mut request = String::from("GET / HTTP/1.1\r\nhost: test\r\nconnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let head = read_head(&mut stream).expect("a response");
    let mut lines = head.lines();
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let mut body = String::new();
    let _ = stream.read_to_string(&mut body);
    Answer { status, headers, body }
}

fn limit(limits: Vec<Limit>) -> RateLimit {
    limit_with(limits, TrustedProxies::none())
}

fn limit_with(limits: Vec<Limit>, trusted: TrustedProxies) -> RateLimit {
    let mut builder = RateLimit::builder().trusted_proxies(trusted);
    for l in limits {
        builder = builder.limit(l);
    }
    RateLimit::new(builder.build().unwrap())
}

#[test]
fn a_burst_then_429_with_the_fields_and_a_problem() {
    let proxy =
        start(limit(vec![Limit::new("ip", "token-bucket capacity=3 rate=1/h", Key::client_ip())]));
    // Three tokens, one back an hour: the policy states that rate (3 per 3 h), and each
    // field's `t` is the time until the next token (docs/SEMANTICS.md, HTTP).
    for left in [2, 1, 0] {
        let a = get(&proxy, &[]);
        assert_eq!(a.status, 200);
        assert_eq!(a.body, "upstream");
        assert_eq!(a.header("ratelimit-policy"), Some("\"ip\";q=3;w=10800"));
        let field = format!("\"ip\";r={left};t=3600");
        assert_eq!(a.header("ratelimit"), Some(field.as_str()));
    }
    let a = get(&proxy, &[]);
    assert_eq!(a.status, 429);
    // The next token comes in an hour.
    assert_eq!(a.header("retry-after"), Some("3600"));
    assert_eq!(a.header("ratelimit"), Some("\"ip\";r=0;t=3600"));
    assert_eq!(a.header("content-type"), Some("application/problem+json"));
    assert!(a.body.contains("quota-exceeded") && a.body.contains("\"ip\""), "{}", a.body);
    assert_eq!(proxy.upstream.calls.load(Ordering::SeqCst), 3);
    let m = proxy.limit.metrics();
    assert_eq!((m.layers[0].admitted, m.layers[0].rejected), (3, 1));
}

#[test]
fn retry_after_is_at_least_the_true_wait_and_at_least_one() {
    let proxy = start(limit(vec![Limit::new(
        "ip",
        "token-bucket capacity=1 rate=1/2500ms",
        Key::client_ip(),
    )]));
    assert_eq!(get(&proxy, &[]).status, 200);
    let started = Instant::now();
    let a = get(&proxy, &[]);
    assert_eq!(a.status, 429);
    // The true wait is 2.5 s less the time since the admission: rounded up, 3 or less, and
    // never below what it really is.
    let retry: f64 = a.header("retry-after").unwrap().parse().unwrap();
    assert!((1.0..=3.0).contains(&retry), "{retry}");
    std::thread::sleep(
        Duration::from_secs_f64(retry) - started.elapsed().min(Duration::from_secs_f64(retry)),
    );
    assert_eq!(get(&proxy, &[]).status, 200, "after Retry-After the request passes");
}

#[test]
fn forwarded_for_is_ignored_from_an_untrusted_peer_and_honoured_from_a_trusted_one() {
    let one = || vec![Limit::new("ip", "token-bucket capacity=1 rate=1/h", Key::client_ip())];
    // Untrusted: the header does not make a new client.
    let proxy = start(limit(one()));
    assert_eq!(get(&proxy, &[("x-forwarded-for", "203.0.113.1")]).status, 200);
    assert_eq!(get(&proxy, &[("x-forwarded-for", "203.0.113.2")]).status, 429);
    assert_eq!(proxy.limit.metrics().forwarded_untrusted, 2);
    drop(proxy);
    // Trusted (loopback): the rightmost untrusted address is the client.
    let proxy = start(limit_with(one(), TrustedProxies::new(["127.0.0.0/8"]).unwrap()));
    let a = [("x-forwarded-for", "203.0.113.1, 198.51.100.1")];
    assert_eq!(get(&proxy, &a).status, 200);
    assert_eq!(get(&proxy, &[("x-forwarded-for", "198.51.100.2")]).status, 200);
    // The spoofed left part changes nothing: the client is still 198.51.100.1.
    assert_eq!(get(&proxy, &[("x-forwarded-for", "203.0.113.9, 198.51.100.1")]).status, 429);
    drop(proxy);
    // RFC 7239 Forwarded, when asked for.
    let trusted = TrustedProxies::new(["127.0.0.0/8"]).unwrap().header(ForwardedHeader::Forwarded);
    let proxy = start(limit_with(one(), trusted));
    assert_eq!(get(&proxy, &[("forwarded", "for=198.51.100.7")]).status, 200);
    assert_eq!(get(&proxy, &[("forwarded", "for=198.51.100.7")]).status, 429);
    assert_eq!(get(&proxy, &[("forwarded", "for=198.51.100.8")]).status, 200);
}

#[test]
fn malformed_and_huge_forwarding_headers_fall_back_to_the_peer() {
    let trusted = TrustedProxies::new(["127.0.0.0/8"]).unwrap();
    let proxy = start(limit_with(
        vec![Limit::new("ip", "token-bucket capacity=1 rate=1/h", Key::client_ip())],
        trusted,
    ));
    // Malformed: the peer (127.0.0.1) is the client...
    assert_eq!(get(&proxy, &[("x-forwarded-for", "not an address, ::zz")]).status, 200);
    // ...so the peer's own request is over the limit; so is one with a header too long to parse.
    assert_eq!(get(&proxy, &[]).status, 429);
    let huge = vec!["198.51.100.1"; 2_000].join(", ");
    assert_eq!(get(&proxy, &[("x-forwarded-for", &huge)]).status, 429);
    let m = proxy.limit.metrics();
    assert_eq!(m.forwarded_malformed, 2, "{m:?}");
}

#[test]
fn layered_limits_charge_all_or_nothing() {
    let proxy = start(limit(vec![
        Limit::new("ip", "fixed-window limit=5 window=1h", Key::client_ip()),
        Limit::new("key", "fixed-window limit=2 window=1h", Key::header("x-api-key")),
    ]));
    let k = [("x-api-key", "k")];
    assert_eq!(get(&proxy, &k).status, 200);
    assert_eq!(get(&proxy, &k).status, 200);
    // The key's limit rejects: the address is not charged for it.
    for _ in 0..3 {
        let a = get(&proxy, &k);
        assert_eq!(a.status, 429);
        assert!(a.body.contains("\"key\"") && !a.body.contains("\"ip\""), "{}", a.body);
    }
    // Without a key the key's limit is skipped: the address has 3 of 5 left.
    let a = get(&proxy, &[]);
    assert_eq!(a.status, 200);
    assert_eq!(a.header("ratelimit"), Some("\"ip\";r=2;t=3600"));
    assert_eq!(proxy.upstream.calls.load(Ordering::SeqCst), 3);
}

#[test]
fn a_delayed_request_whose_client_leaves_gives_its_charge_back() {
    // One request passes at once; the next waits 1 s (its excess at 1 per second).
    let proxy =
        start(limit(vec![Limit::new("ip", "leaky-bucket rate=1r/s burst=5", Key::client_ip())]));
    assert_eq!(get(&proxy, &[]).status, 200);
    let mut leaving = TcpStream::connect(&proxy.addr).unwrap();
    leaving.write_all(b"GET / HTTP/1.1\r\nhost: test\r\n\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(200));
    drop(leaving);
    let deadline = Instant::now() + Duration::from_secs(5);
    while proxy.limit.metrics().delay_refunds == 0 {
        assert!(Instant::now() < deadline, "the left request was not refunded");
        std::thread::sleep(Duration::from_millis(20));
    }
    let m = proxy.limit.metrics();
    assert_eq!((m.delayed, m.delay_refunds), (1, 1));
    assert_eq!(m.layers[0].refunded, 1);
    std::thread::sleep(Duration::from_millis(1_200));
    assert_eq!(proxy.upstream.calls.load(Ordering::SeqCst), 1, "the left request was not sent");
    // A delayed request whose client waits reaches the upstream after its delay.
    let started = Instant::now();
    assert_eq!(get(&proxy, &[]).status, 200);
    assert_eq!(get(&proxy, &[]).status, 200);
    assert!(started.elapsed() >= Duration::from_millis(900), "{:?}", started.elapsed());
}

#[test]
fn two_concurrent_clients_get_exactly_the_limit() {
    let proxy = start(limit(vec![Limit::new(
        "key",
        "fixed-window limit=150 window=1h",
        Key::header("x-api-key"),
    )]));
    let proxy = Arc::new(proxy);
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let proxy = proxy.clone();
            std::thread::spawn(move || {
                (0..200).filter(|_| get(&proxy, &[("x-api-key", "shared")]).status == 200).count()
            })
        })
        .collect();
    let ok: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(ok, 150);
    assert_eq!(proxy.upstream.calls.load(Ordering::SeqCst), 150);
}
