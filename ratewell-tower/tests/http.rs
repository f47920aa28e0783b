//! The layer in front of a real hyper server on 127.0.0.1, driven by a real hyper client: statuses,
//! headers read back with a Structured Fields parser (`sfv`), client addresses, bad input, gRPC.

mod common;

use bytes::Bytes;
use common::{client, get, http2_client, param, send, serve, sf_list};
use http::{Request, StatusCode};
use http_body_util::Empty;
use ratewell::ManualClock;
use ratewell_tower::{Absent, ForwardedHeader, Key, Limit, RateLimitLayer, TrustedProxies};

const SECOND: u64 = 1_000_000_000;

fn layer_at(clock: &ManualClock, limits: Vec<Limit>) -> RateLimitLayer<ManualClock> {
    let mut builder = RateLimitLayer::builder().clock(clock.clone());
    for limit in limits {
        builder = builder.limit(limit);
    }
    builder.build().unwrap()
}

/// A burst through a fixed window of 3 a minute: three 200s with a `RateLimit` counting down,
/// then 429s whose `Retry-After` is the window's end rounded up, and which a wait of exactly that
/// long (not a second less) turns back into a 200.
#[tokio::test]
async fn a_burst_then_429_with_retry_after_and_ratelimit_fields() {
    let clock = ManualClock::new(SECOND / 2);
    let layer = layer_at(
        &clock,
        vec![Limit::new("ip", "fixed-window limit=3 window=1m", Key::client_ip())],
    );
    let server = serve(layer, true).await;
    let client = client();
    let url = server.url("/");
    for remaining in [2, 1, 0] {
        let answer = get(&client, &url, &[]).await;
        assert_eq!(answer.status, StatusCode::OK);
        assert_eq!(&answer.body[..], b"ok");
        let policy = sf_list(answer.header("ratelimit-policy").unwrap());
        assert_eq!(policy.len(), 1);
        assert_eq!(policy[0].0, "ip");
        assert_eq!((param(&policy[0], "q"), param(&policy[0], "w")), (Some(3), Some(60)));
        let field = sf_list(answer.header("ratelimit").unwrap());
        assert_eq!(field[0].0, "ip");
        assert_eq!(param(&field[0], "r"), Some(remaining));
        // The window ends 59.5 s after the first request: t rounds up.
        assert_eq!(param(&field[0], "t"), Some(60));
        assert!(answer.header("retry-after").is_none());
    }
    let answer = get(&client, &url, &[]).await;
    assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS);
    let retry_after: u64 = answer.header("retry-after").unwrap().parse().unwrap();
    let true_wait = 60 * SECOND - SECOND / 2;
    assert!(retry_after * SECOND >= true_wait && retry_after >= 1, "{retry_after}");
    assert_eq!(retry_after, 60);
    let field = sf_list(answer.header("ratelimit").unwrap());
    assert_eq!(param(&field[0], "r"), Some(0));
    assert!(param(&field[0], "t").unwrap() as u64 <= retry_after);
    assert_eq!(answer.header("content-type"), Some("application/problem+json"));
    let body = std::str::from_utf8(&answer.body).unwrap();
    assert!(
        body.contains(r#""type":"https://iana.org/assignments/http-problem-types#quota-exceeded""#),
        "{body}"
    );
    assert!(
        body.contains(r#""status":429"#) && body.contains(r#""violated-policies":["ip"]"#),
        "{body}"
    );
    assert_eq!(server.calls(), 3);

    // One second short of Retry-After: still rejected; at Retry-After: admitted.
    clock.advance((retry_after - 1) * SECOND);
    assert_eq!(get(&client, &url, &[]).await.status, StatusCode::TOO_MANY_REQUESTS);
    clock.advance(SECOND);
    assert_eq!(get(&client, &url, &[]).await.status, StatusCode::OK);
}

/// A wait under a second is sent as 1, never 0; and is the true wait rounded up.
#[tokio::test]
async fn retry_after_rounds_a_short_wait_up_to_one_second() {
    let clock = ManualClock::new(0);
    let layer = layer_at(
        &clock,
        vec![Limit::new("ip", "token-bucket capacity=1 rate=10/s", Key::client_ip())],
    );
    let server = serve(layer, true).await;
    let client = client();
    assert_eq!(get(&client, &server.url("/"), &[]).await.status, StatusCode::OK);
    let answer = get(&client, &server.url("/"), &[]).await;
    assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(answer.header("retry-after"), Some("1"));
    let field = sf_list(answer.header("ratelimit").unwrap());
    assert_eq!((param(&field[0], "r"), param(&field[0], "t")), (Some(0), Some(1)));
    // The true wait is 100 ms.
    clock.advance(SECOND / 10 - 1);
    assert_eq!(get(&client, &server.url("/"), &[]).await.status, StatusCode::TOO_MANY_REQUESTS);
    clock.advance(1);
    assert_eq!(get(&client, &server.url("/"), &[]).await.status, StatusCode::OK);
}

/// Layers: IP for everyone, API key when present, a route on its own budget. Lists of one item
/// per layer that decided; the item of a skipped layer is missing.
#[tokio::test]
async fn layered_limits_list_one_item_per_layer() {
    let clock = ManualClock::new(0);
    let search = Key::from_fn(|cx| (cx.uri().path() == "/search").then_some("search".into()));
    let layer = layer_at(
        &clock,
        vec![
            Limit::new("ip", "fixed-window limit=100 window=1m", Key::client_ip()),
            Limit::new("api-key", "fixed-window limit=5 window=1m", Key::header("x-api-key")),
            Limit::new("search", "fixed-window limit=2 window=10s", search),
        ],
    );
    let server = serve(layer.clone(), true).await;
    let client = client();
    let anonymous = get(&client, &server.url("/"), &[]).await;
    assert_eq!(anonymous.status, StatusCode::OK);
    let policy = sf_list(anonymous.header("ratelimit-policy").unwrap());
    let names: Vec<&str> = policy.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["ip", "api-key", "search"]);
    let field = sf_list(anonymous.header("ratelimit").unwrap());
    assert_eq!(field.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["ip"]);

    let keyed = [("x-api-key", &b"k1"[..])];
    for expected in [StatusCode::OK, StatusCode::OK, StatusCode::TOO_MANY_REQUESTS] {
        let answer = get(&client, &server.url("/search"), &keyed).await;
        assert_eq!(answer.status, expected);
        let field = sf_list(answer.header("ratelimit").unwrap());
        assert_eq!(
            field.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
            ["ip", "api-key", "search"]
        );
        if expected == StatusCode::TOO_MANY_REQUESTS {
            let body = std::str::from_utf8(&answer.body).unwrap();
            assert!(body.contains(r#""violated-policies":["search"]"#), "{body}");
            assert_eq!(answer.header("retry-after"), Some("10"));
        }
    }
    // The rejected request was charged nowhere (all or nothing): the key has 5 - 2 left.
    let answer = get(&client, &server.url("/"), &keyed).await;
    let field = sf_list(answer.header("ratelimit").unwrap());
    assert_eq!(param(&field[1], "r"), Some(2));
    let metrics = layer.metrics();
    assert_eq!(metrics.layers[2].rejected, 1);
    assert_eq!(metrics.layers[2].admitted, 2);
    assert_eq!(metrics.layers[1].skipped, 1);
    assert_eq!(metrics.layers[2].skipped, 2);
}

/// An absent key answers 401 when the limit says so, and charges nothing.
#[tokio::test]
async fn an_absent_key_can_be_required() {
    let clock = ManualClock::new(0);
    let layer = layer_at(
        &clock,
        vec![
            Limit::new("ip", "fixed-window limit=2 window=1m", Key::client_ip()),
            Limit::new("token", "fixed-window limit=100 window=1m", Key::bearer_token())
                .when_absent(Absent::Reject(StatusCode::UNAUTHORIZED)),
        ],
    );
    let server = serve(layer.clone(), true).await;
    let client = client();
    for _ in 0..3 {
        let answer = get(&client, &server.url("/"), &[("authorization", b"Basic abc")]).await;
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
        assert!(std::str::from_utf8(&answer.body).unwrap().contains(r#""status":401"#));
    }
    let bearer = [("authorization", &b"Bearer t0ken"[..])];
    assert_eq!(get(&client, &server.url("/"), &bearer).await.status, StatusCode::OK);
    assert_eq!(get(&client, &server.url("/"), &bearer).await.status, StatusCode::OK);
    assert_eq!(get(&client, &server.url("/"), &bearer).await.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(layer.metrics().layers[1].absent_rejected, 3);
    assert_eq!(server.calls(), 2);
}

/// From an untrusted peer, `X-Forwarded-For` is ignored: the peer is the key, whatever the client
/// writes.
#[tokio::test]
async fn a_spoofed_forwarding_header_from_an_untrusted_peer_is_ignored() {
    let clock = ManualClock::new(0);
    let layer = RateLimitLayer::builder()
        .clock(clock.clone())
        .trusted_proxies(TrustedProxies::new(["10.0.0.0/8"]).unwrap())
        .limit(Limit::new("ip", "fixed-window limit=1 window=1m", Key::client_ip()))
        .build()
        .unwrap();
    let server = serve(layer.clone(), true).await;
    let client = client();
    let url = server.url("/");
    assert_eq!(
        get(&client, &url, &[("x-forwarded-for", b"198.51.100.1")]).await.status,
        StatusCode::OK
    );
    for spoofed in [&b"198.51.100.2"[..], b"10.0.0.1", b"203.0.113.9, 198.51.100.3"] {
        let answer = get(&client, &url, &[("x-forwarded-for", spoofed)]).await;
        assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS);
    }
    assert_eq!(
        get(&client, &url, &[("forwarded", b"for=198.51.100.4")]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Four carried the header the proxies would write; the `Forwarded` one is not that header.
    assert_eq!(layer.metrics().forwarded_untrusted, 4);
}

fn trusting_loopback(clock: &ManualClock, header: ForwardedHeader) -> RateLimitLayer<ManualClock> {
    RateLimitLayer::builder()
        .clock(clock.clone())
        .trusted_proxies(TrustedProxies::new(["127.0.0.1", "10.0.0.0/8"]).unwrap().header(header))
        .limit(Limit::new("ip", "fixed-window limit=1 window=1m", Key::client_ip()))
        .build()
        .unwrap()
}

/// From a trusted peer, the key is the rightmost address that is not a trusted proxy.
#[tokio::test]
async fn from_a_trusted_peer_the_rightmost_untrusted_address_is_the_key() {
    let clock = ManualClock::new(0);
    let server = serve(trusting_loopback(&clock, ForwardedHeader::XForwardedFor), true).await;
    let client = client();
    let url = server.url("/");
    let xff = |v: &'static [u8]| [("x-forwarded-for", v)];
    assert_eq!(
        get(&client, &url, &xff(b"6.6.6.6, 198.51.100.1, 10.0.0.5")).await.status,
        StatusCode::OK
    );
    // The same client behind a spoofed prefix and another proxy hop.
    assert_eq!(
        get(&client, &url, &xff(b"9.9.9.9, 198.51.100.1, 10.1.1.1, 10.0.0.5")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // A client that writes someone else's address on the left is still itself.
    assert_eq!(
        get(&client, &url, &xff(b"198.51.100.1, 198.51.100.2")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        get(&client, &url, &xff(b"198.51.100.2")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // IPv6, one /64: two addresses, one key; a zone id is dropped.
    assert_eq!(get(&client, &url, &xff(b"2001:db8:1:2::a")).await.status, StatusCode::OK);
    assert_eq!(
        get(&client, &url, &xff(b"[2001:db8:1:2::b]:443")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(get(&client, &url, &xff(b"fe80::1%eth0")).await.status, StatusCode::OK);
    assert_eq!(get(&client, &url, &xff(b"fe80::2")).await.status, StatusCode::TOO_MANY_REQUESTS);
}

/// RFC 7239 `Forwarded`, with quoted strings, escapes, obfuscated identifiers and zone ids.
#[tokio::test]
async fn forwarded_rfc_7239_from_a_trusted_peer() {
    let clock = ManualClock::new(0);
    let layer = trusting_loopback(&clock, ForwardedHeader::Forwarded);
    let server = serve(layer.clone(), true).await;
    let client = client();
    let url = server.url("/");
    let fwd = |v: &'static [u8]| [("forwarded", v)];
    let ok = StatusCode::OK;
    let limited = StatusCode::TOO_MANY_REQUESTS;
    assert_eq!(
        get(
            &client,
            &url,
            &fwd(br#"for=_spoofed, for="[2001:db8:cafe::17]:4711";proto=https, for=10.0.0.3"#)
        )
        .await
        .status,
        ok
    );
    assert_eq!(get(&client, &url, &fwd(br#"for="[2001:db8:cafe::99]""#)).await.status, limited);
    assert_eq!(get(&client, &url, &fwd(br#"for="\1\98.51.100.7";by="a,b""#)).await.status, ok);
    assert_eq!(get(&client, &url, &fwd(br#"For=198.51.100.7"#)).await.status, limited);
    assert_eq!(get(&client, &url, &fwd(br#"for="[fe80::1%25eth0]:80""#)).await.status, ok);
    // An obfuscated client, `unknown`, or no `for=` at all: the peer (127.0.0.1) is the key.
    assert_eq!(get(&client, &url, &fwd(br#"for=_hidden"#)).await.status, ok);
    for bad in [
        &br#"for=unknown"#[..],
        br#"proto=https"#,
        br#"for="[2001:db8::1]"#,
        br#"for=198.51.100.8;for=1.1.1.1"#,
    ] {
        assert_eq!(
            get(&client, &url, &fwd(bad)).await.status,
            limited,
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
    assert_eq!(layer.metrics().forwarded_malformed, 5);
}

/// A malformed, non-UTF-8 or huge forwarding header from a trusted peer: the peer is the key,
/// and it is counted. Nothing panics; every request gets the documented status.
#[tokio::test]
async fn malformed_and_huge_forwarding_headers_fall_back_to_the_peer() {
    let clock = ManualClock::new(0);
    let layer = trusting_loopback(&clock, ForwardedHeader::XForwardedFor);
    let server = serve(layer.clone(), true).await;
    let client = client();
    let url = server.url("/");
    let huge = format!("{}198.51.100.1", "203.0.113.1, ".repeat(100 * 1024 / 13));
    assert!(huge.len() >= 100 * 1024);
    let cases: Vec<Vec<u8>> = vec![
        b"not an address".to_vec(),
        b"198.51.100.1, ".to_vec(),
        b"\xff\xfe\x80".to_vec(),
        b"198.51.100.1:70000".to_vec(),
        huge.into_bytes(),
    ];
    let first = get(&client, &url, &[("x-forwarded-for", &cases[0])]).await;
    assert_eq!(first.status, StatusCode::OK);
    for case in &cases[1..] {
        let answer = get(&client, &url, &[("x-forwarded-for", case)]).await;
        assert_eq!(
            answer.status,
            StatusCode::TOO_MANY_REQUESTS,
            "{}",
            String::from_utf8_lossy(&case[..case.len().min(40)])
        );
    }
    // Without any header the peer is the key too: the same budget, already spent.
    assert_eq!(get(&client, &url, &[]).await.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(layer.metrics().forwarded_malformed, 5);
    // A well-formed one still works after all that.
    assert_eq!(
        get(&client, &url, &[("x-forwarded-for", b"198.51.100.1")]).await.status,
        StatusCode::OK
    );
}

/// Header keys take any bytes (non-UTF-8 values included) as the key.
#[tokio::test]
async fn non_utf8_header_values_are_keys_like_any_other() {
    let clock = ManualClock::new(0);
    let layer = layer_at(
        &clock,
        vec![Limit::new("api-key", "fixed-window limit=1 window=1m", Key::header("x-api-key"))],
    );
    let server = serve(layer, true).await;
    let client = client();
    let url = server.url("/");
    assert_eq!(get(&client, &url, &[("x-api-key", b"\xff\xfe")]).await.status, StatusCode::OK);
    assert_eq!(
        get(&client, &url, &[("x-api-key", b"\xff\xfe")]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(get(&client, &url, &[("x-api-key", b"\xff\xfd")]).await.status, StatusCode::OK);
}

/// No peer address in the request (a server that does not insert one): client-address keys are
/// absent, so the limit is skipped (or rejects, if required), and it is counted.
#[tokio::test]
async fn a_missing_peer_address_is_an_absent_key() {
    let clock = ManualClock::new(0);
    let skip = layer_at(
        &clock,
        vec![Limit::new("ip", "fixed-window limit=1 window=1m", Key::client_ip())],
    );
    let server = serve(skip.clone(), false).await;
    let client = client();
    for _ in 0..3 {
        let answer = get(&client, &server.url("/"), &[("x-forwarded-for", b"1.2.3.4")]).await;
        assert_eq!(answer.status, StatusCode::OK);
        assert!(answer.header("ratelimit").is_none());
    }
    assert_eq!(skip.metrics().missing_peer, 3);
    assert_eq!(skip.metrics().layers[0].skipped, 3);

    let required = layer_at(
        &clock,
        vec![
            Limit::new("ip", "fixed-window limit=1 window=1m", Key::client_ip())
                .when_absent(Absent::Reject(StatusCode::BAD_REQUEST)),
        ],
    );
    let server = serve(required, false).await;
    assert_eq!(get(&client, &server.url("/"), &[]).await.status, StatusCode::BAD_REQUEST);
}

/// Two clients on two connections, concurrently, on one key: exactly the policy's number of 200s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_concurrent_clients_on_one_key_get_exactly_the_limit() {
    let layer = RateLimitLayer::builder()
        .limit(Limit::new("api-key", "fixed-window limit=150 window=1h", Key::header("x-api-key")))
        .build()
        .unwrap();
    let server = serve(layer, true).await;
    let url = server.url("/");
    let tasks: Vec<_> = (0..2)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move {
                let client = client();
                let mut ok = 0;
                for _ in 0..200 {
                    if get(&client, &url, &[("x-api-key", b"shared")]).await.status
                        == StatusCode::OK
                    {
                        ok += 1;
                    }
                }
                ok
            })
        })
        .collect();
    let mut total = 0;
    for task in tasks {
        total += task.await.unwrap();
    }
    assert_eq!(total, 150);
    assert_eq!(server.calls(), 150);
}

/// A gRPC request (HTTP/2, `application/grpc`) over its limit: a trailers-only answer with
/// `grpc-status` 8 and the same retry information.
#[tokio::test]
async fn grpc_requests_get_resource_exhausted() {
    let clock = ManualClock::new(0);
    let layer = layer_at(
        &clock,
        vec![
            Limit::new("ip", "token-bucket capacity=1 rate=2/s", Key::client_ip()),
            Limit::new("huge", "token-bucket capacity=5 rate=5/s", Key::global()),
        ],
    );
    let server = serve(layer, true).await;
    let client = http2_client();
    let call = || {
        Request::post(server.url("/echo.Echo/Say"))
            .header("content-type", "application/grpc+proto")
            .header("te", "trailers")
            .body(Empty::<Bytes>::new())
            .unwrap()
    };
    let first = send(&client, call()).await;
    assert_eq!(first.status, StatusCode::OK);
    assert!(first.header("grpc-status").is_none());
    let second = send(&client, call()).await;
    assert_eq!(second.status, StatusCode::OK);
    assert_eq!(second.header("grpc-status"), Some("8"));
    assert_eq!(second.header("content-type"), Some("application/grpc+proto"));
    assert_eq!(second.header("grpc-retry-pushback-ms"), Some("500"));
    assert_eq!(second.header("retry-after"), Some("1"));
    assert!(second.header("grpc-message").unwrap().contains("ip"));
    assert!(second.body.is_empty());
    assert_eq!(sf_list(second.header("ratelimit").unwrap()).len(), 2);
    assert_eq!(server.calls(), 1);
}

/// A request costlier than a limit's capacity: no wait admits it, so no `Retry-After` (and a
/// gRPC pushback of -1: do not retry).
#[tokio::test]
async fn an_impossible_request_has_no_retry_after() {
    let clock = ManualClock::new(0);
    let layer = RateLimitLayer::builder()
        .clock(clock.clone())
        .limit(Limit::new("bytes", "token-bucket capacity=100 rate=100/s", Key::client_ip()))
        .cost(|cx| {
            cx.headers().get("x-cost").and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(1)
        })
        .impossible_status(StatusCode::PAYLOAD_TOO_LARGE)
        .build()
        .unwrap();
    let server = serve(layer, true).await;
    let client = client();
    let url = server.url("/");
    assert_eq!(get(&client, &url, &[("x-cost", b"100")]).await.status, StatusCode::OK);
    let answer = get(&client, &url, &[("x-cost", b"101")]).await;
    assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(answer.header("retry-after").is_none());
    assert!(std::str::from_utf8(&answer.body).unwrap().contains(r#""status":413"#));
    // A huge cost is impossible too, not an overflow.
    let answer = get(&client, &url, &[("x-cost", b"4294967295")]).await;
    assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE);
}

/// Dry run: nothing rejected; headers and metrics as if enforcing.
#[tokio::test]
async fn a_dry_run_rejects_nothing_and_reports_what_it_would_have_done() {
    let clock = ManualClock::new(0);
    let layer = RateLimitLayer::builder()
        .clock(clock.clone())
        .dry_run(true)
        .limit(Limit::new("ip", "fixed-window limit=2 window=1m", Key::client_ip()))
        .build()
        .unwrap();
    let server = serve(layer.clone(), true).await;
    let client = client();
    for remaining in [1, 0, 0, 0] {
        let answer = get(&client, &server.url("/"), &[]).await;
        assert_eq!(answer.status, StatusCode::OK);
        assert_eq!(param(&sf_list(answer.header("ratelimit").unwrap())[0], "r"), Some(remaining));
    }
    let m = layer.metrics();
    assert_eq!((m.layers[0].admitted, m.layers[0].would_reject, m.layers[0].rejected), (2, 2, 0));
    assert_eq!(server.calls(), 4);

    // One limit a dry run by its policy's flag, the other enforcing.
    let layer = layer_at(
        &clock,
        vec![
            Limit::new("new", "fixed-window limit=1 window=1m dry-run", Key::client_ip()),
            Limit::new("old", "fixed-window limit=3 window=1m", Key::client_ip()),
        ],
    );
    let server = serve(layer.clone(), true).await;
    let statuses: Vec<u16> = {
        let mut v = Vec::new();
        for _ in 0..4 {
            v.push(get(&client, &server.url("/"), &[]).await.status.as_u16());
        }
        v
    };
    assert_eq!(statuses, [200, 200, 200, 429]);
    let m = layer.metrics();
    assert_eq!(m.layers[0].would_reject, 3);
    assert_eq!(m.layers[1].rejected, 1);
}

/// Admitted responses without the fields, when configured so; rejections keep them.
#[tokio::test]
async fn admitted_headers_can_be_turned_off() {
    let clock = ManualClock::new(0);
    let layer = RateLimitLayer::builder()
        .clock(clock.clone())
        .admitted_headers(false)
        .limit(Limit::new("ip", "fixed-window limit=1 window=1m", Key::client_ip()))
        .build()
        .unwrap();
    let server = serve(layer, true).await;
    let client = client();
    let ok = get(&client, &server.url("/"), &[]).await;
    assert!(ok.header("ratelimit").is_none() && ok.header("ratelimit-policy").is_none());
    let limited = get(&client, &server.url("/"), &[]).await;
    assert!(limited.header("ratelimit").is_some() && limited.header("ratelimit-policy").is_some());
}
