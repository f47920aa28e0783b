//! Property tests: every algorithm, through the public limiter, against the naive reference model
//! in `common/`, over random sequences of (time step, cost) that include huge gaps (up to the
//! policy's idle horizon: 146 years for whole-ns periods), clocks going backwards, costs above the
//! capacity and `u32::MAX`, and rates from 1/day to 10^9/s.

use ratewell_model as common;

use common::{Gap, Op, duration_text, run};
use proptest::prelude::*;
use ratewell::Policy;

const NS: u64 = 1;
const US: u64 = 1_000;
const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;
const M: u64 = 60 * S;
const H: u64 = 60 * M;
const D: u64 = 24 * H;

/// Counts: small, round, prime, and the extremes.
fn count() -> impl Strategy<Value = u32> {
    prop_oneof![
        1..=12u32,
        Just(100),
        Just(997),
        Just(1000),
        Just(65_535),
        Just(1 << 20),
        Just(u32::MAX),
        1..=5000u32,
    ]
}

/// A rate `count per period`, from 1/day to 10^9/s and beyond.
fn rate() -> impl Strategy<Value = (u32, u64)> {
    let counts = prop_oneof![
        Just(1u32),
        Just(3),
        Just(7),
        Just(10),
        Just(100),
        Just(997),
        Just(1000),
        Just(1_000_000),
        Just(1_000_000_000),
        1..=10_000u32,
    ];
    let periods = prop_oneof![
        Just(NS),
        Just(US),
        Just(MS),
        Just(250 * MS),
        Just(S),
        Just(7 * S),
        Just(M),
        Just(H),
        Just(D),
        1..=10 * S,
    ];
    (counts, periods)
}

/// A window or interval.
fn window() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(MS),
        Just(S),
        Just(1500 * MS),
        Just(M),
        Just(H),
        Just(D),
        1..=10 * S,
        1..=100_000u64
    ]
}

/// Steps of a scenario. `scale` is the policy's natural time scale (window, period).
fn ops(scale: u64, limit: u64) -> impl Strategy<Value = Vec<Op>> {
    let scale = scale.max(1);
    let gap = prop_oneof![
        3 => Just(Gap::Forward(0)),
        3 => (0..16u64).prop_map(Gap::Forward),
        6 => (0..=scale.saturating_mul(2)).prop_map(Gap::Forward),
        2 => (0..=scale.saturating_mul(64)).prop_map(Gap::Forward),
        // Huge: clamped by the runner to half the idle horizon (up to 73 years).
        1 => (0..=u64::MAX).prop_map(Gap::Forward),
        1 => (0..=scale.saturating_mul(2)).prop_map(Gap::Back),
        1 => (0..=u64::MAX).prop_map(Gap::Back),
    ];
    let near = |k: u64| u32::try_from(k.clamp(1, u64::from(u32::MAX))).unwrap();
    let cost = prop_oneof![
        6 => Just(1u32),
        3 => 1..=4u32,
        2 => Just(near(limit.saturating_sub(1))),
        2 => Just(near(limit)),
        2 => Just(near(limit + 1)),
        1 => Just(u32::MAX),
        1 => 1..=u32::MAX,
    ];
    prop::collection::vec(
        (gap, cost, prop::bool::weighted(0.15)).prop_map(|(gap, cost, peek)| Op {
            gap,
            cost,
            peek,
        }),
        1..48,
    )
}

/// Parse, or skip a configuration the packed state rejects (tested in `bad_input.rs`).
fn policy(text: &str) -> Option<Policy> {
    text.parse().ok()
}

fn start() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0u64), 0..=1_000 * S, 0..=(1u64 << 62)]
}

fn config() -> ProptestConfig {
    ProptestConfig { cases: 400, ..ProptestConfig::default() }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn token_bucket_matches_model(capacity in count(), (n, p) in rate(), start in start(),
                                  steps in ops(S, 1000)) {
        let text = format!("token-bucket capacity={capacity} rate={n}/{}", duration_text(p));
        let Some(policy) = policy(&text) else { return Ok(()) };
        let model = common::Gcra { capacity: capacity.into(), count: n.into(), period: p.into(), tat: None };
        run(&policy, model, start, &steps).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn token_bucket_small_periods(capacity in 1..=20u32, n in 1..=20u32, p in 1..=200u64,
                                  start in 0..=1000u64, steps in ops(100, 20)) {
        let text = format!("gcra burst={capacity} rate={n}/{p}ns");
        let Some(policy) = policy(&text) else { return Ok(()) };
        let model = common::Gcra { capacity: capacity.into(), count: n.into(), period: p.into(), tat: None };
        run(&policy, model, start, &steps).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn discrete_bucket_matches_model(capacity in count(), refill in count(), every in window(),
                                     start in start(), steps in ops(S, 1000)) {
        let text = format!("token-bucket capacity={capacity} refill={refill} every={}", duration_text(every));
        let Some(policy) = policy(&text) else { return Ok(()) };
        let model = common::Discrete { capacity: capacity.into(), refill: refill.into(), every: every.into(), state: None };
        run(&policy, model, start, &steps).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn leaky_bucket_matches_model(burst in prop_oneof![Just(0u32), count()], (n, p) in rate(),
                                  delay in prop_oneof![Just(None), Just(Some(0u32)), (0..=30u32).prop_map(Some)],
                                  start in start(), steps in ops(S, 100)) {
        let mode = match delay { None => " nodelay".to_string(), Some(d) => format!(" delay={d}") };
        let text = format!("leaky-bucket rate={n}/{} burst={burst}{mode}", duration_text(p));
        let Some(policy) = policy(&text) else { return Ok(()) };
        let model = common::Leaky { burst: burst.into(), count: n.into(), period: p.into(),
                                    delay: delay.map(u128::from), state: None };
        run(&policy, model, start, &steps).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn leaky_bucket_nginx_matches_model(burst in prop_oneof![Just(0u32), 1..=50u32, Just(268_435)],
                                        n in prop_oneof![1..=100u32, Just(1_000_000)],
                                        per in prop_oneof![Just("s"), Just("m"), Just("250ms"), Just("1h"), Just("7s")],
                                        delay in prop_oneof![Just(None), (0..=10u32).prop_map(Some)],
                                        start in start(), steps in ops(S, 10)) {
        let mode = match delay { None => " nodelay".to_string(), Some(d) => format!(" delay={d}") };
        let text = format!("leaky-bucket rate={n}/{per} burst={burst}{mode} compat=nginx");
        let Some(policy) = policy(&text) else { return Ok(()) };
        let period = match per { "s" => S, "m" => M, "250ms" => 250 * MS, "1h" => H, _ => 7 * S };
        let model = common::Nginx::new(n.into(), period.into(), burst.into(), delay.map(u128::from));
        run(&policy, model, start, &steps).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn fixed_window_matches_model(limit in count(), window in window(), first in any::<bool>(),
                                  start in start(), steps in ops(S, 1000)) {
        let align = if first { " align=first" } else { "" };
        let text = format!("fixed-window limit={limit} window={}{align}", duration_text(window));
        let Some(policy) = policy(&text) else { return Ok(()) };
        let model = common::Fixed { limit: limit.into(), window: window.into(), first, state: None };
        run(&policy, model, start, &steps).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn sliding_window_matches_model(limit in count(), window in window(), start in start(),
                                    steps in ops(S, 1000)) {
        let text = format!("sliding-window limit={limit} window={}", duration_text(window));
        let Some(policy) = policy(&text) else { return Ok(()) };
        let model = common::Sliding { limit: limit.into(), window: window.into(), state: (0, 0, 0) };
        run(&policy, model, start, &steps).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn sliding_log_matches_model(limit in prop_oneof![1..=12u32, Just(100), Just(65_536)],
                                 window in window(), start in start(), steps in ops(S, 10)) {
        let text = format!("sliding-log limit={limit} window={}", duration_text(window));
        let Some(policy) = policy(&text) else { return Ok(()) };
        let model = common::Log { limit: limit.into(), window: window.into(), entries: vec![] };
        run(&policy, model, start, &steps).map_err(TestCaseError::fail)?;
    }
}
