//! A clock that jumps: for every algorithm and random policies within the parser's limits, any
//! sequence of clock readings (forward, backward by any amount up to 2^63 ns, repeated) admits no
//! more than the same sequence with every reading replaced by its running maximum. (With the
//! limiter's clock floor the two are decided identically; the test asserts both.)

use proptest::prelude::*;
use ratewell::{KeyedLimiter, Limiter, ManualClock, Policy};

/// A policy of any algorithm, with parameters anywhere in the grammar's ranges (some are
/// refused by the packed layouts: those cases are skipped).
fn policy() -> impl Strategy<Value = String> {
    let count = prop_oneof![1..=10u32, 1..=100_000u32, Just(u32::MAX), 1..=u32::MAX];
    let small = prop_oneof![1..=10u32, 1..=65_536u32];
    let dur = prop_oneof![
        (1..=1000u64).prop_map(|n| format!("{n}ms")),
        (1..=100u64).prop_map(|n| format!("{n}s")),
        (1..=48u64).prop_map(|n| format!("{n}h")),
        (1..=400u64).prop_map(|n| format!("{n}d")),
        (1..=1_000_000u64).prop_map(|n| format!("{n}ns")),
    ];
    prop_oneof![
        (count.clone(), count.clone(), dur.clone())
            .prop_map(|(c, n, d)| format!("token-bucket capacity={c} rate={n}/{d}")),
        (count.clone(), count.clone(), dur.clone())
            .prop_map(|(c, k, d)| format!("token-bucket capacity={c} refill={k} every={d}")),
        (count.clone(), 0..=1000u32, dur.clone(), any::<bool>()).prop_map(|(n, b, d, nd)| {
            let mode = if nd { " nodelay" } else { " delay=3" };
            format!("leaky-bucket rate={n}/{d} burst={b}{mode}")
        }),
        (1..=1000u32, 0..=200_000u32, prop_oneof![Just("s"), Just("m")]).prop_map(
            |(n, b, u)| format!("leaky-bucket rate={n}r/{u} burst={b} nodelay compat=nginx")
        ),
        (count.clone(), dur.clone(), any::<bool>()).prop_map(|(n, d, f)| {
            let align = if f { " align=first" } else { "" };
            format!("fixed-window limit={n} window={d}{align}")
        }),
        (count, dur.clone()).prop_map(|(n, d)| format!("sliding-window limit={n} window={d}")),
        (small, dur).prop_map(|(n, d)| format!("sliding-log limit={n} window={d}")),
    ]
}

#[derive(Clone, Copy, Debug)]
enum Step {
    Forward(u64),
    Back(u64),
    Same,
}

fn steps() -> impl Strategy<Value = Vec<(Step, u32, u8)>> {
    let step = prop_oneof![
        3 => Just(Step::Same),
        4 => (0..=2_000_000_000u64).prop_map(Step::Forward),
        2 => (0..=(1u64 << 50)).prop_map(Step::Forward),
        1 => (0..=(1u64 << 63)).prop_map(Step::Forward),
        2 => (0..=2_000_000_000u64).prop_map(Step::Back),
        2 => (0..=(1u64 << 50)).prop_map(Step::Back),
        2 => (0..=(1u64 << 63)).prop_map(Step::Back),
    ];
    let cost = prop_oneof![4 => Just(1u32), 2 => 1..=100u32, 1 => 1..=u32::MAX];
    prop::collection::vec((step, cost, 0..4u8), 1..60)
}

/// The readings of `steps` from `start`, within 0..2^63.
fn readings(start: u64, steps: &[(Step, u32, u8)]) -> Vec<u64> {
    let mut now = start;
    steps
        .iter()
        .map(|&(step, _, _)| {
            now = match step {
                Step::Same => now,
                Step::Forward(g) => now.saturating_add(g).min(i64::MAX as u64),
                Step::Back(g) => now.saturating_sub(g),
            };
            now
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 600, ..ProptestConfig::default() })]

    #[test]
    fn no_step_back_admits_more_than_the_running_maximum(text in policy(),
                                                           start in prop_oneof![Just(0u64), 0..=(1u64 << 62)],
                                                           steps in steps()) {
        let Ok(policy) = text.parse::<Policy>() else { return Ok(()) };
        let raw = readings(start, &steps);
        let mut max = 0;
        let running: Vec<u64> = raw.iter().map(|&r| { max = max.max(r); max }).collect();

        // One key: the direct limiter.
        let (c1, c2) = (ManualClock::new(0), ManualClock::new(0));
        let (a, b) = (Limiter::with_clock(&policy, c1.clone()), Limiter::with_clock(&policy, c2.clone()));
        let (mut admitted_a, mut admitted_b) = (0u64, 0u64);
        for (i, &(_, cost, _)) in steps.iter().enumerate() {
            c1.set(raw[i]);
            c2.set(running[i]);
            let (da, db) = (a.check_n(cost), b.check_n(cost));
            admitted_a += u64::from(da.is_admitted()) * u64::from(cost);
            admitted_b += u64::from(db.is_admitted()) * u64::from(cost);
            prop_assert_eq!(da, db, "step {} of `{}`: raw {} vs max {}", i, text, raw[i], running[i]);
        }
        prop_assert!(admitted_a <= admitted_b);

        // Several keys in a keyed limiter, sharing one clock.
        let (c1, c2) = (ManualClock::new(0), ManualClock::new(0));
        let a = KeyedLimiter::<u8, _>::with_clock(&policy, 64, c1.clone());
        let b = KeyedLimiter::<u8, _>::with_clock(&policy, 64, c2.clone());
        let (mut admitted_a, mut admitted_b) = (0u64, 0u64);
        for (i, &(_, cost, key)) in steps.iter().enumerate() {
            c1.set(raw[i]);
            c2.set(running[i]);
            let (da, db) = (a.request(&key).cost(cost).check(), b.request(&key).cost(cost).check());
            admitted_a += u64::from(da.is_admitted()) * u64::from(cost);
            admitted_b += u64::from(db.is_admitted()) * u64::from(cost);
            prop_assert_eq!(da, db, "keyed step {} of `{}`", i, text);
        }
        prop_assert!(admitted_a <= admitted_b);
    }
}
