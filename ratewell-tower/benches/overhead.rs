//! Per-request overhead of a rate-limit layer in process: `ServiceExt::oneshot` through the layer
//! on a no-op service, next to the same without a layer and with tower_governor's layer, in one
//! run (`benches/README.md` of this crate quotes the ratios).
//!
//! Every variant builds the same request (an axum body, the client's `ConnectInfo`, 1,000 client
//! addresses in turn) and admits every request (limits far above the rate measured): the cost
//! measured is the layer's decision and its bookkeeping, not a rejection. ratewell's tables hold
//! 4,096 keys (bounded; governor's map grows to the 1,000 it sees).

use std::convert::Infallible;
use std::future::Future;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use axum::body::Body;
use axum::extract::ConnectInfo;
use criterion::{Criterion, criterion_group, criterion_main};
use http::{Request, Response};
use ratewell_tower::{Key, Limit, RateLimitLayer};
use tower::{Layer, Service, ServiceExt};
use tower_governor::governor::GovernorConfigBuilder;

const CLIENTS: u32 = 1000;
const CAPACITY: usize = 4096;

fn noop()
-> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send> + Clone
{
    tower::service_fn(|_: Request<Body>| {
        std::future::ready(Ok::<_, Infallible>(Response::new(Body::empty())))
    })
}

fn request(i: u32) -> Request<Body> {
    let mut request = Request::new(Body::empty());
    let ip = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i % CLIENTS));
    request.extensions_mut().insert(ConnectInfo(SocketAddr::new(ip, 40_000)));
    request
}

/// Poll a future that is ready at once (every layer here answers without waiting).
fn now<F: Future>(future: F) -> F::Output {
    let mut cx = Context::from_waker(Waker::noop());
    match pin!(future).poll(&mut cx) {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("the layer waited"),
    }
}

fn bench<S>(
    c: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    service: S,
) where
    S: Service<Request<Body>, Error = Infallible> + Clone,
{
    let mut i = 0u32;
    c.bench_function(name, |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            let response = now(service.clone().oneshot(request(i))).unwrap();
            black_box(response);
        })
    });
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

fn overhead(c: &mut Criterion) {
    let mut group = c.benchmark_group("overhead");
    bench(&mut group, "no_layer", noop());

    let governor = GovernorConfigBuilder::default()
        .per_nanosecond(1)
        .burst_size(1_000_000_000)
        .finish()
        .unwrap();
    let governor = tower_governor::GovernorLayer::new(governor).layer(noop());
    let _ = now(governor.clone().oneshot(request(0))).unwrap();
    bench(&mut group, "tower_governor", governor);

    let governor_headers = GovernorConfigBuilder::default()
        .per_nanosecond(1)
        .burst_size(1_000_000_000)
        .use_headers()
        .finish()
        .unwrap();
    bench(
        &mut group,
        "tower_governor_headers",
        tower_governor::GovernorLayer::new(governor_headers).layer(noop()),
    );

    let plain = ratewell_layer(false).layer(noop());
    assert!(!now(plain.clone().oneshot(request(0))).unwrap().headers().contains_key("ratelimit"));
    bench(&mut group, "ratewell", plain);
    let with_headers = ratewell_layer(true).layer(noop());
    assert!(
        now(with_headers.clone().oneshot(request(0))).unwrap().headers().contains_key("ratelimit")
    );
    bench(&mut group, "ratewell_headers", with_headers);
    // One key for every request, on both sides (governor's unkeyed limiter): what remains is
    // the layer's plumbing and the decision, without a client address to find and look up.
    let global = RateLimitLayer::builder()
        .admitted_headers(false)
        .limit(
            Limit::new("g", "token-bucket capacity=1000000000 rate=1000000000/s", Key::global())
                .capacity(CAPACITY),
        )
        .build()
        .unwrap()
        .layer(noop());
    bench(&mut group, "ratewell_global", global);
    let gg = GovernorConfigBuilder::default()
        .per_nanosecond(1)
        .burst_size(1_000_000_000)
        .key_extractor(tower_governor::key_extractor::GlobalKeyExtractor)
        .finish()
        .unwrap();
    bench(&mut group, "governor_global", tower_governor::GovernorLayer::new(gg).layer(noop()));
    group.finish();
}

criterion_group!(benches, overhead);
criterion_main!(benches);
