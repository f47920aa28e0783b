//! The services `overhead.rs` times and `callgrind.rs` counts: the same request (an axum body, the
//! client's `ConnectInfo`, 1,000 client addresses in turn) through a no-op service, without a
//! layer, with tower_governor's and with ratewell's. Every request is admitted (limits far above
//! any rate measured): what is measured is the layer's decision and its bookkeeping, not a
//! rejection. ratewell's tables hold 4,096 keys (bounded; governor's map grows to the 1,000 it
//! sees).
#![allow(dead_code, unreachable_pub)]

use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use axum::body::Body;
use axum::extract::ConnectInfo;
use http::{Request, Response};
use ratewell_tower::{Key, Limit, RateLimitLayer};
use tower::{Layer, Service, ServiceExt};
use tower_governor::governor::GovernorConfigBuilder;

pub const CLIENTS: u32 = 1000;
const CAPACITY: usize = 4096;

/// Every variant's name, in the order `overhead.rs` runs them: each pair compared side by side
/// in time, so that the machine's drift over a run falls on both of a pair alike.
pub const NAMES: [&str; 7] = [
    "no_layer",
    "tower_governor",
    "ratewell",
    "tower_governor_headers",
    "ratewell_headers",
    "governor_global",
    "ratewell_global",
];

pub fn noop()
-> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send> + Clone
{
    tower::service_fn(|_: Request<Body>| {
        std::future::ready(Ok::<_, Infallible>(Response::new(Body::empty())))
    })
}

/// The `i`th request: from client `10.0.0.0 + i % CLIENTS`.
pub fn request(i: u32) -> Request<Body> {
    let mut request = Request::new(Body::empty());
    let ip = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i % CLIENTS));
    request.extensions_mut().insert(ConnectInfo(SocketAddr::new(ip, 40_000)));
    request
}

/// Poll a future that is ready at once (every layer here answers without waiting).
pub fn now<F: Future>(future: F) -> F::Output {
    let mut cx = Context::from_waker(Waker::noop());
    match pin!(future).poll(&mut cx) {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("the layer waited"),
    }
}

/// One request through a clone of `service`, as a server's connection task sends it.
#[inline]
pub fn one<S>(service: &S, i: u32) -> S::Response
where
    S: Service<Request<Body>, Error = Infallible> + Clone,
{
    now(service.clone().oneshot(request(i))).unwrap()
}

fn ratewell_layer(headers: bool) -> RateLimitLayer {
    RateLimitLayer::builder()
        .peer_addr(|ext| ext.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip()))
        .admitted_headers(headers)
        .limit(
            Limit::new(
                "ip",
                "token-bucket capacity=1000000000 rate=1000000000/s",
                Key::client_ip(),
            )
            .capacity(CAPACITY),
        )
        .build()
        .unwrap()
}

/// A visitor of each variant's service (their types differ).
pub trait Visit {
    fn visit<S, B>(&mut self, name: &str, service: S)
    where
        S: Service<Request<Body>, Response = Response<B>, Error = Infallible> + Clone;
}

/// Hands the variant `name` (every variant if `None`) to `v`, in the order of [`NAMES`]. Each
/// service is checked once: the layer that must send headers sends them, the others do not.
pub fn each(only: Option<&str>, v: &mut impl Visit) {
    let on = |name: &str| only.is_none_or(|o| o == name);
    if on("no_layer") {
        v.visit("no_layer", noop());
    }
    let mut governor = GovernorConfigBuilder::default();
    governor.per_nanosecond(1).burst_size(1_000_000_000);
    if on("tower_governor") {
        let config = governor.finish().unwrap();
        let service = tower_governor::GovernorLayer::new(config).layer(noop());
        let _ = one(&service, 0);
        v.visit("tower_governor", service);
    }
    if on("ratewell") {
        let service = ratewell_layer(false).layer(noop());
        assert!(!one(&service, 0).headers().contains_key("ratelimit"));
        v.visit("ratewell", service);
    }
    if on("tower_governor_headers") {
        let config = governor.use_headers().finish().unwrap();
        let service = tower_governor::GovernorLayer::new(config).layer(noop());
        assert!(one(&service, 0).headers().contains_key("x-ratelimit-remaining"));
        v.visit("tower_governor_headers", service);
    }
    if on("ratewell_headers") {
        let service = ratewell_layer(true).layer(noop());
        assert!(one(&service, 0).headers().contains_key("ratelimit"));
        v.visit("ratewell_headers", service);
    }
    if on("governor_global") {
        let config = GovernorConfigBuilder::default()
            .per_nanosecond(1)
            .burst_size(1_000_000_000)
            .key_extractor(tower_governor::key_extractor::GlobalKeyExtractor)
            .finish()
            .unwrap();
        v.visit("governor_global", tower_governor::GovernorLayer::new(config).layer(noop()));
    }
    // One key for every request, on both sides (governor's unkeyed limiter): what remains is the
    // layer's plumbing and the decision, without a client address to find and look up.
    if on("ratewell_global") {
        let service = RateLimitLayer::builder()
            .admitted_headers(false)
            .limit(
                Limit::new(
                    "g",
                    "token-bucket capacity=1000000000 rate=1000000000/s",
                    Key::global(),
                )
                .capacity(CAPACITY),
            )
            .build()
            .unwrap()
            .layer(noop());
        v.visit("ratewell_global", service);
    }
}
