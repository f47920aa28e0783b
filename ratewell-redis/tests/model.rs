//! The reference-model crate (`ratewell-model`: each algorithm written naively, in rational
//! arithmetic, with every reported field derived by search) run against the Redis backend: the
//! same scenarios, the same comparison of every field, as the in-process limiters get.

mod common;

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use common::{PATHS, Path, Server};
use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use ratewell::{Decision, Nanos, Policy};
use ratewell_model::{Backend, Gap, Op, run_on, small_layer};
use ratewell_redis::RedisLimiter;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap()
    })
}

/// One key of a [`RedisLimiter`], decided at the running maximum of the scenario's readings (a
/// caller passing its own time in keeps that maximum, as the in-process limiters do).
struct Redis {
    limiter: RedisLimiter,
    latest: u64,
}

impl Redis {
    fn new(server: &Server, policy: &Policy, case: u64) -> Self {
        let limiter = runtime().block_on(async {
            RedisLimiter::builder(&server.url())
                .layer("m", policy)
                .prefix(format!("model{case}:"))
                .timeout(std::time::Duration::from_secs(5))
                .build()
                .await
                .expect("a limiter")
        });
        Redis { limiter, latest: 0 }
    }

    fn decide(&mut self, now: u64, cost: u32, peek: bool) -> Result<Decision, String> {
        self.latest = self.latest.max(now);
        let at = Nanos::new(self.latest);
        let keys = [Some("key")];
        let verdict = runtime().block_on(async {
            if peek {
                self.limiter.peek_at(&keys, cost, at).await
            } else {
                self.limiter.check_at(&keys, cost, at).await
            }
        });
        let verdict = verdict.map_err(|e| e.to_string())?;
        verdict.layered().layer(0).copied().ok_or_else(|| "no decision for the layer".to_string())
    }
}

impl Backend for Redis {
    fn check(&mut self, now: u64, cost: u32) -> Result<Decision, String> {
        self.decide(now, cost, false)
    }
    fn peek(&mut self, now: u64, cost: u32) -> Result<Decision, String> {
        self.decide(now, cost, true)
    }
}

/// Steps in whole microseconds (the backend's resolution): bursts, steps around the policies'
/// periods (a second, 1.5 s, 250 ms, 7 s and their fractions), long silences, a clock stepping
/// back, peeks.
fn op() -> impl Strategy<Value = Op> {
    let us = prop_oneof![
        3 => Just(0u64),
        1 => Just(1u64),
        2 => 1u64..2_000_000,
        2 => prop::sample::select(vec![83_333u64, 125_000, 250_000, 333_333, 500_000, 750_000, 1_000_000, 1_500_000, 2_333_333, 7_000_000]),
        1 => 0u64..86_400_000_000,
    ];
    (us, 0u8..20, 1u32..6, any::<bool>()).prop_map(|(us, kind, cost, peek)| Op {
        gap: if kind == 0 { Gap::Back(us * 1_000) } else { Gap::Forward(us * 1_000) },
        cost: if kind == 1 { u32::MAX } else { cost },
        peek: peek && kind % 4 == 0,
    })
}

#[test]
fn the_backend_decides_as_the_model() {
    for path in PATHS {
        on(path);
    }
}

fn on(path: Path) {
    // One server for every case, stopped when the test ends (a server held in a static would
    // outlive the test process).
    let server = Server::start_on(path, &[]);
    let case = AtomicU64::new(0);
    let scenarios =
        (0u8..8, 0u8..4, 0u8..4, 0u64..10_000_000_000, prop::collection::vec(op(), 1..60));
    let mut runner = TestRunner::new(ProptestConfig { cases: 96, ..ProptestConfig::default() });
    let result = runner.run(&scenarios, |(kind, limit, variant, start_us, ops)| {
        let case = case.fetch_add(1, Ordering::Relaxed);
        let (policy, model) = small_layer(kind, limit, variant, false);
        let backend = Redis::new(&server, &policy, case);
        let name = format!("redis ({path:?})");
        run_on(&name, backend, &policy, model, start_us * 1_000, &ops).map_err(TestCaseError::fail)
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
