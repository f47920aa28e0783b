//! A delaying leaky bucket on tokio's paused clock: a request waits its delay before the inner
//! service, and a request dropped while it waits is refunded.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use ratewell_tower::{Key, KeyValue, Limit, RateLimitLayer, TokioClock};
use tower::{Layer, Service, ServiceExt};

type Inner = tower::util::BoxCloneService<Request<()>, Response<String>, Infallible>;

fn counting() -> (Inner, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let service = tower::service_fn(move |_: Request<()>| {
        counter.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, Infallible>(Response::new(String::from("ok"))) }
    });
    (tower::util::BoxCloneService::new(service), calls)
}

fn request() -> Request<()> {
    Request::get("/").header("x-api-key", "k").body(()).unwrap()
}

/// Let every spawned task run as far as it can at the current (paused) instant.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

fn delaying_layer() -> RateLimitLayer<TokioClock> {
    // 1 a second with room for 5 waiting, every request past the first delayed (nginx
    // `limit_req rate=1r/s burst=5`).
    RateLimitLayer::builder()
        .clock(TokioClock::new())
        .limit(Limit::new("api", "leaky-bucket rate=1/s burst=5 delay=0", Key::header("x-api-key")))
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_delayed_request_reaches_the_service_after_its_delay() {
    let layer = delaying_layer();
    let (inner, calls) = counting();
    let service = layer.layer(inner);

    let first = service.clone().oneshot(request()).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // The second waits 1 s, the third 2 s.
    let second = tokio::spawn(service.clone().oneshot(request()));
    let third = tokio::spawn(service.clone().oneshot(request()));
    settle().await;
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    tokio::time::advance(Duration::from_millis(999)).await;
    settle().await;
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the second ran before its delay");
    tokio::time::advance(Duration::from_millis(1)).await;
    settle().await;
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert!(second.is_finished());
    assert!(!third.is_finished());
    tokio::time::advance(Duration::from_secs(1)).await;
    settle().await;
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    let response = third.await.unwrap().unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.headers().contains_key("ratelimit"));
    assert_eq!(layer.metrics().delayed, 2);
}

#[tokio::test(start_paused = true)]
async fn a_request_dropped_while_delayed_is_refunded() {
    let layer = delaying_layer();
    let (inner, calls) = counting();
    let mut service = layer.layer(inner);
    let limiter = Arc::clone(layer.limiter());
    let remaining = || limiter.peek(&[&KeyValue::from("k")], 1).unwrap().decision().remaining();

    service.ready().await.unwrap();
    service.call(request()).await.unwrap();
    let before = remaining();
    service.ready().await.unwrap();
    let delayed = service.call(request());
    assert_eq!(remaining(), before - 1, "the delayed request holds a place");
    drop(delayed);
    assert_eq!(remaining(), before, "its place came back when it was dropped");
    assert_eq!(layer.metrics().delay_refunds, 1);

    // The next request waits as the dropped one would have: 1 s, not 2.
    let next = tokio::spawn(service.clone().oneshot(request()));
    tokio::time::advance(Duration::from_secs(1)).await;
    settle().await;
    assert!(next.is_finished());
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(layer.metrics().delay_refunds, 1);
}

/// Beyond the burst, a delaying bucket rejects, with the wait until a place frees up.
#[tokio::test(start_paused = true)]
async fn a_full_delaying_bucket_rejects() {
    let layer = delaying_layer();
    let (inner, calls) = counting();
    let service = layer.layer(inner);
    let mut waiting = Vec::new();
    // 1 passes, 5 wait, the 7th is rejected.
    for _ in 0..6 {
        waiting.push(tokio::spawn(service.clone().oneshot(request())));
    }
    settle().await;
    let rejected = service.clone().oneshot(request()).await.unwrap();
    assert_eq!(rejected.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(rejected.headers()["retry-after"], "1");
    tokio::time::advance(Duration::from_secs(5)).await;
    for task in waiting {
        assert_eq!(task.await.unwrap().unwrap().status(), StatusCode::OK);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 6);
}
