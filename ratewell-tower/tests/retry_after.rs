//! A 429's `Retry-After` and fields are its own rejection's, even when other requests and the
//! clock move the key's state while the layer answers: two threads on one key race through the
//! lean path (no fields on admitted responses), each moving a shared clock before its requests,
//! and every 429 is checked against the admissions that preceded it.

mod common;

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use common::{param, sf_list};
use http::{Request, Response, StatusCode};
use http_body_util::Empty;
use ratewell::Clock;
use ratewell_tower::{Key, Limit, RateLimitLayer};
use tower::{Layer, ServiceExt};

const SECOND: u64 = 1_000_000_000;
/// One token every 2 s, none banked: after an admission at `a` the next is possible at `a + P`.
const POLICY: &str = "token-bucket capacity=1 rate=1/2s";
const P: u64 = 2 * SECOND;
/// The clock moves this much before every request (a refill every 8 steps).
const STEP: u64 = SECOND / 4;
const REQUESTS: usize = 20_000;

/// The shared clock both threads move: each move one atomic add, so that none is lost and the
/// reading never goes back, however the threads interleave (a `ManualClock`'s `advance` is a
/// read then a write: two threads moving it at once can lose a move, and a thread preempted
/// between the two takes the clock back).
#[derive(Clone)]
struct SharedClock(Arc<AtomicU64>);

impl SharedClock {
    fn advance(&self, ns: u64) {
        self.0.fetch_add(ns, Ordering::SeqCst);
    }
}

impl Clock for SharedClock {
    fn now(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

struct Record {
    /// The order the request began and ended in, among both threads' (one counter).
    began: u64,
    ended: u64,
    /// The clock just before and just after the request: its decision was at an instant between.
    t0: u64,
    t1: u64,
    status: StatusCode,
    retry_after_s: Option<u64>,
    remaining: Option<i64>,
}

#[test]
fn every_429_reports_its_own_rejection_and_waits_at_least_the_true_wait() {
    let clock = SharedClock(Arc::new(AtomicU64::new(0)));
    let layer = RateLimitLayer::builder()
        .clock(clock.clone())
        .admitted_headers(false)
        .limit(Limit::new("g", POLICY, Key::global()))
        .build()
        .unwrap();
    let inner = tower::service_fn(|_: Request<Empty<Bytes>>| {
        std::future::ready(Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new())))
    });
    let service = layer.layer(inner);
    let order = Arc::new(AtomicU64::new(0));
    let start = Arc::new(Barrier::new(2));
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let (service, clock, order, start) =
                (service.clone(), clock.clone(), Arc::clone(&order), Arc::clone(&start));
            std::thread::spawn(move || {
                let mut cx = Context::from_waker(Waker::noop());
                start.wait();
                let mut records = Vec::with_capacity(REQUESTS);
                for _ in 0..REQUESTS {
                    clock.advance(STEP);
                    let t0 = clock.now();
                    let began = order.fetch_add(1, Ordering::SeqCst);
                    let mut future =
                        std::pin::pin!(service.clone().oneshot(Request::new(Empty::new())));
                    let Poll::Ready(Ok(response)) = future.as_mut().poll(&mut cx) else {
                        panic!("the layer answers at once")
                    };
                    let ended = order.fetch_add(1, Ordering::SeqCst);
                    let t1 = clock.now();
                    let header = |name: &str| {
                        response.headers().get(name).map(|v| v.to_str().unwrap().to_owned())
                    };
                    let remaining = header("ratelimit").map(|field| {
                        let items = sf_list(&field);
                        assert_eq!(items.len(), 1, "{field}");
                        param(&items[0], "r").expect("r")
                    });
                    records.push(Record {
                        began,
                        ended,
                        t0,
                        t1,
                        status: response.status(),
                        retry_after_s: header("retry-after").map(|v| v.parse().unwrap()),
                        remaining,
                    });
                }
                records
            })
        })
        .collect();
    let records: Vec<Record> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
    let mut admissions: Vec<&Record> =
        records.iter().filter(|r| r.status == StatusCode::OK).collect();
    admissions.sort_by_key(|r| r.ended);
    let (mut rejections, mut bounded) = (0, 0);
    for r in records.iter().filter(|r| r.status != StatusCode::OK) {
        rejections += 1;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
        // The report is a rejection's: nothing left for a request of cost 1. (A report taken
        // after the rejection can find the refill that came meanwhile, and say `r=1` with
        // `Retry-After: 1`, a wait the rejection never had.)
        assert_eq!(r.remaining, Some(0), "a 429 whose RateLimit field says it fits");
        let retry_ns = r.retry_after_s.expect("a 429 has Retry-After") * SECOND;
        // The true wait at the rejection's instant T (at most t1) is at least a + P - T for every
        // admission a that was over before this request began (decided at a time >= its t0).
        let before = admissions.partition_point(|a| a.ended < r.began);
        if let Some(a) = admissions[..before].iter().map(|a| a.t0).max() {
            let lower = (a + P).saturating_sub(r.t1);
            bounded += u64::from(lower > 0);
            assert!(
                retry_ns >= lower,
                "Retry-After {} s, but no admission could come within {lower} ns",
                retry_ns / SECOND
            );
        }
    }
    // The race ran: both outcomes, many times, and the wait bound applied.
    assert!(admissions.len() > 100 && rejections > 1000, "{} / {rejections}", admissions.len());
    assert!(bounded > 1000, "{bounded}");
    // The budget is exact: no more admissions than the clock's span allows.
    let end = clock.now();
    assert!(admissions.len() as u64 <= end / P + 1, "{} in {end} ns", admissions.len());
}
