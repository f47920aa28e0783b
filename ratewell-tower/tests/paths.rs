//! The layer's shortcuts decide as its general path does. One limit keyed by the client's
//! address (no trusted proxy, no cost function) is decided without a key context, and a
//! `Key::global()` limit by a hash computed once; the same requests through a layer that takes
//! the general path (a cost function that says 1, a key function for the one global key) get
//! the same statuses, fields and metrics.

use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Empty;
use ratewell::ManualClock;
use ratewell_tower::{Key, KeyValue, Limit, RateLimitLayer};
use tower::{Layer, ServiceExt};

const POLICY: &str = "token-bucket capacity=3 rate=1/s";

fn layer(
    key: Key,
    general: bool,
    headers: bool,
    clock: &ManualClock,
) -> RateLimitLayer<ManualClock> {
    let builder = RateLimitLayer::builder()
        .clock(clock.clone())
        .admitted_headers(headers)
        .limit(Limit::new("l", POLICY, key).capacity(64));
    let builder = if general { builder.cost(|_| 1) } else { builder };
    builder.build().unwrap()
}

/// The status and the rate-limit headers of one request through `layer`.
fn send(layer: &RateLimitLayer<ManualClock>, peer: Option<IpAddr>, forwarded: bool) -> Vec<String> {
    let inner = tower::service_fn(|_: Request<Empty<Bytes>>| {
        std::future::ready(Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new())))
    });
    let mut request = Request::new(Empty::new());
    if let Some(ip) = peer {
        request.extensions_mut().insert(SocketAddr::new(ip, 4000));
    }
    if forwarded {
        request.headers_mut().insert("x-forwarded-for", "203.0.113.7".parse().unwrap());
    }
    let mut future = std::pin::pin!(layer.layer(inner).oneshot(request));
    let Poll::Ready(Ok(response)) = future.as_mut().poll(&mut Context::from_waker(Waker::noop()))
    else {
        panic!("the layer answers at once")
    };
    let mut seen = vec![response.status().to_string()];
    for name in ["ratelimit", "ratelimit-policy", "retry-after"] {
        seen.push(format!("{name}: {:?}", response.headers().get(name)));
    }
    seen
}

#[test]
fn one_client_address_limit_decides_as_the_general_path() {
    let peers: Vec<Option<IpAddr>> = vec![
        Some(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1))),
        Some(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2))),
        // An IPv4-mapped IPv6 peer is the IPv4 client; two addresses of one /64 are one key.
        Some(IpAddr::V6(Ipv4Addr::new(192, 0, 2, 1).to_ipv6_mapped())),
        Some(IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 1, 0, 0, 0, 1))),
        Some(IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 1, 0, 0, 0, 2))),
        None,
    ];
    for headers in [false, true] {
        let (c1, c2) = (ManualClock::new(0), ManualClock::new(0));
        let direct = layer(Key::client_ip(), false, headers, &c1);
        let general = layer(Key::client_ip(), true, headers, &c2);
        for i in 0..600u64 {
            // A pseudo-random peer, sometimes with a forwarding header, at 50 ms steps.
            let peer = peers[(i.wrapping_mul(0x9e37_79b9) >> 7) as usize % peers.len()];
            let forwarded = i % 3 == 0;
            c1.set(i * 50_000_000);
            c2.set(i * 50_000_000);
            assert_eq!(
                send(&direct, peer, forwarded),
                send(&general, peer, forwarded),
                "request {i}"
            );
        }
        let (a, b) = (direct.metrics(), general.metrics());
        assert_eq!(a, b);
        assert!(
            a.layers[0].rejected > 0 && a.layers[0].admitted > 0 && a.layers[0].skipped > 0,
            "{a:?}"
        );
        assert!(a.forwarded_untrusted > 0 && a.missing_peer > 0);
    }
}

#[test]
fn the_global_key_decides_as_a_key_function_for_one_key() {
    for headers in [false, true] {
        let (c1, c2) = (ManualClock::new(0), ManualClock::new(0));
        let global = layer(Key::global(), false, headers, &c1);
        let one = layer(Key::from_fn(|_| Some(KeyValue::U64(0))), false, headers, &c2);
        for i in 0..200u64 {
            c1.set(i * 300_000_000);
            c2.set(i * 300_000_000);
            let peer = Some(IpAddr::V4(Ipv4Addr::new(198, 51, 100, (i % 7) as u8)));
            assert_eq!(send(&global, peer, false), send(&one, peer, false), "request {i}");
        }
        let m = global.metrics();
        assert_eq!(m, one.metrics());
        assert!(m.layers[0].rejected > 0 && m.layers[0].admitted > 0);
        assert_eq!(m.layers[0].keys, 1);
    }
}
