//! `Request::burst`: one leaky bucket decided at a burst and delay chosen per call, against the
//! naive reference models (`ratewell_model::Leaky` and `Nginx`) whose burst and delay are set
//! before each step, on random traces whose calls name random bursts and delays; and a take at
//! one burst refunded restores the key's state exactly.

use proptest::prelude::*;
use ratewell::{KeyedLimiter, ManualClock, Policy};
use ratewell_model::{Leaky, Model, Nginx, Verdict};

const MS: u64 = 1_000_000;

/// One call: the gap before it (ns), its cost, its burst, its delay (`None`: nodelay), and
/// whether it is taken and at once refunded.
type Call = (u64, u32, u32, Option<u32>, bool);

fn calls(max_burst: u32) -> impl Strategy<Value = Vec<Call>> {
    let gap = prop_oneof![Just(0u64), 0..3 * MS, 0..400 * MS, Just(5_000 * MS)];
    let delay = prop_oneof![Just(None), (0..=max_burst).prop_map(Some)];
    proptest::collection::vec(
        (gap, 1..=4u32, 0..=max_burst + 2, delay, proptest::bool::weighted(0.1)),
        1..300,
    )
}

/// Replays `calls` on one key through the limiter and through `model` (whose burst and delay
/// `set` changes per call), decision for decision.
fn replay<M: Model>(
    policy: &str,
    own_burst: u32,
    mut model: M,
    set: impl Fn(&mut M, u32, Option<u32>),
    calls: &[Call],
) -> Result<(), TestCaseError> {
    let policy: Policy = policy.parse().unwrap();
    let clock = ManualClock::new(0);
    let limiter = KeyedLimiter::<str, _>::with_clock(&policy, 64, clock.clone());
    let mut now = 0u64;
    for (i, &(gap, cost, burst, delay, refund)) in calls.iter().enumerate() {
        now += gap;
        clock.set(now);
        // A burst above the policy's own is the policy's.
        set(&mut model, burst.min(own_burst), delay);
        let before = model.clone();
        let expected = model.step(u128::from(now), u128::from(cost));
        let request = limiter.request("k").burst(burst, delay).cost(cost);
        let (decision, charge) = request.take();
        let got = match (decision.is_admitted(), decision.is_impossible()) {
            (true, _) => Verdict::Admitted { delay: u128::from(decision.delay_ns()) },
            (false, true) => Verdict::Impossible,
            (false, false) => Verdict::Rejected,
        };
        prop_assert_eq!(&got, &expected, "call {} at {} ns: {:?}", i, now, calls[i]);
        prop_assert_eq!(decision.limit(), u64::from(burst.min(own_burst)) + 1);
        if let (true, Some(charge)) = (refund, charge) {
            limiter.refund(charge);
            model = before;
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn nginx_bursts_per_call_match_the_model(calls in calls(12)) {
        replay(
            "leaky-bucket rate=10r/s burst=12 nodelay compat=nginx",
            12,
            Nginx::new(10, 1_000_000_000, 12, None),
            |m, burst, delay| {
                m.burst = i128::from(burst);
                m.delay = delay.map(i128::from);
            },
            &calls,
        )?;
    }

    #[test]
    fn exact_bursts_per_call_match_the_model(calls in calls(12)) {
        replay(
            "leaky-bucket rate=7r/s burst=12 nodelay",
            12,
            Leaky { burst: 12, count: 7, period: 1_000_000_000, delay: None, state: None },
            |m, burst, delay| {
                m.burst = u128::from(burst);
                m.delay = delay.map(u128::from);
            },
            &calls,
        )?;
    }
}

#[test]
fn a_burst_applies_only_to_leaky_buckets() {
    let policy: Policy = "token-bucket capacity=2 rate=1/h".parse().unwrap();
    let limiter = KeyedLimiter::<str, _>::with_clock(&policy, 64, ManualClock::new(0));
    let admitted = (0..5).filter(|_| limiter.request("k").burst(4, None).allow()).count();
    assert_eq!(admitted, 2, "the token bucket's own capacity");
}
