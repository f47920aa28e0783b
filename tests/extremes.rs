//! Extreme inputs named in the layouts' documentation: a 100-year gap, silences beyond the idle
//! horizon, a rate of 10^9/s, a burst of 2^32 - 1, costs of u32::MAX, clocks at the end of time.
//! Run in debug, so every arithmetic overflow would panic.

use ratewell_model as common;

use common::{Model, Verdict};
use ratewell::{Limiter, ManualClock, Policy};

const S: u64 = 1_000_000_000;
const YEAR: u64 = 31_557_600 * S;

fn limiter(policy: &str, now: u64) -> (Limiter<ManualClock>, ManualClock) {
    let policy: Policy = policy.parse().unwrap_or_else(|e| panic!("{policy}: {e}"));
    let clock = ManualClock::new(now);
    (Limiter::with_clock(&policy, clock.clone()), clock)
}

/// One policy per algorithm whose idle horizon exceeds a century.
const CENTURY_POLICIES: &[&str] = &[
    "token-bucket capacity=5 rate=1/s",
    "token-bucket capacity=5 rate=1000000000/s",
    "token-bucket capacity=5 refill=1 every=1s",
    "leaky-bucket rate=10r/s burst=4 delay=2",
    "fixed-window limit=5 window=1s",
    "fixed-window limit=1 window=1s align=first",
    "sliding-window limit=5 window=1s",
    "sliding-log limit=5 window=1s",
];

#[test]
fn after_a_hundred_years_a_key_is_fresh() {
    for &text in CENTURY_POLICIES {
        let policy: Policy = text.parse().unwrap();
        assert!(policy.idle_horizon_ns() > u128::from(100 * YEAR), "{text}: horizon");
        for start in [0, 12_345, 5 * YEAR] {
            let (old, clock) = limiter(text, start);
            while old.check().is_admitted() {}
            let later = start + 100 * YEAR + 7;
            clock.set(later);
            let (fresh, _) = limiter(text, later);
            for cost in [1, 2, 5, 6, u32::MAX] {
                assert_eq!(
                    old.peek_n(cost),
                    fresh.peek_n(cost),
                    "{text} from {start}, cost {cost}"
                );
            }
            assert_eq!(old.check_n(2), fresh.check_n(2), "{text}");
        }
    }
}

/// Fill a key at `t0`, stay silent for `gap`, then decide: an implementation that aliases the
/// stale state may be stricter than the model, never looser.
fn only_stricter<M: Model>(text: &str, fresh_model: M, gaps: impl Iterator<Item = u64>) {
    for gap in gaps {
        let t0 = 3 * S + 123_456;
        let (lim, clock) = limiter(text, t0);
        let mut model = fresh_model.clone();
        while lim.check().is_admitted() {
            assert!(matches!(model.step(t0.into(), 1), Verdict::Admitted { .. }));
        }
        let t1 = t0.saturating_add(gap).min(i64::MAX as u64);
        clock.set(t1);
        let got = lim.check();
        let want = model.step(t1.into(), 1);
        if got.is_admitted() {
            assert!(
                matches!(want, Verdict::Admitted { .. }),
                "{text}: gap {gap}: looser than the model"
            );
        }
    }
}

/// Gaps around every multiple of the horizon up to 2^63 ns, and a spread in between.
fn gaps(horizon: u128) -> impl Iterator<Item = u64> {
    let h = horizon.min(u128::from(u64::MAX)) as u64;
    let around = (1..64u64).flat_map(move |k| {
        let base = h.saturating_mul(k);
        [base.saturating_sub(S), base, base.saturating_add(1), base.saturating_add(50 * S)]
    });
    let spread = (0..400u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 1);
    around.chain(spread)
}

#[test]
fn beyond_the_idle_horizon_decisions_are_only_stricter() {
    let text = "leaky-bucket rate=2r/s burst=3 nodelay compat=nginx";
    let horizon = text.parse::<Policy>().unwrap().idle_horizon_ns();
    assert!(horizon < u128::from(YEAR), "198 days");
    only_stricter(text, common::Nginx::new(2, S.into(), 3, None), gaps(horizon));

    let text = "token-bucket capacity=5 rate=997/s";
    let horizon = text.parse::<Policy>().unwrap().idle_horizon_ns();
    let model = common::Gcra { capacity: 5, count: 997, period: S.into(), tat: None };
    only_stricter(text, model, gaps(horizon));

    let text = "fixed-window limit=1000 window=1s align=first";
    let horizon = text.parse::<Policy>().unwrap().idle_horizon_ns();
    let model = common::Fixed { limit: 1000, window: S.into(), first: true, state: None };
    only_stricter(text, model, gaps(horizon));

    let text = "sliding-window limit=1000 window=1us";
    let horizon = text.parse::<Policy>().unwrap().idle_horizon_ns();
    let model = common::Sliding { limit: 1000, window: 1000, state: (0, 0, 0) };
    only_stricter(text, model, gaps(horizon));
}

#[test]
fn a_billion_per_second_with_a_bucket_of_two_to_the_thirty_two() {
    let (lim, clock) = limiter("token-bucket capacity=4294967295 rate=1000000000/s", 0);
    let d = lim.check_n(u32::MAX);
    assert!(d.is_admitted());
    assert_eq!((d.remaining(), d.reset_after_ns()), (0, u64::from(u32::MAX)));
    assert_eq!(lim.check().retry_after_ns(), Some(1));
    clock.set(u64::from(u32::MAX));
    assert!(lim.check_n(u32::MAX).is_admitted());
}

#[test]
fn a_burst_of_two_to_the_thirty_two_minus_one() {
    // Leaky bucket: burst + 1 = 2^32 at once from idle, more than any single cost.
    let (lim, _) = limiter("leaky-bucket rate=1000000000/s burst=4294967295 nodelay", 0);
    let d = lim.check_n(u32::MAX);
    assert!(d.is_admitted());
    assert_eq!((d.limit(), d.remaining()), (1 << 32, 1));
    assert!(lim.check().is_admitted());
    assert_eq!(lim.check().retry_after_ns(), Some(1));
    // Envoy-style bucket and fixed window of the same size.
    for text in [
        "token-bucket capacity=4294967295 refill=4294967295 every=1s",
        "fixed-window limit=4294967295 window=1s",
    ] {
        let (lim, clock) = limiter(text, 0);
        assert!(lim.check_n(u32::MAX).is_admitted(), "{text}");
        assert!(!lim.check().is_admitted(), "{text}");
        clock.set(S);
        assert!(lim.check_n(u32::MAX).is_admitted(), "{text}");
    }
}

#[test]
fn costs_of_u32_max_are_impossible_and_change_nothing() {
    for &text in CENTURY_POLICIES {
        let (lim, _) = limiter(text, 1_000);
        let d = lim.check_n(u32::MAX);
        assert!(d.is_impossible(), "{text}");
        assert_eq!(d.retry_after_ns(), None, "{text}");
        assert_eq!(d.retry_after_header(), None, "{text}");
        let (fresh, _) = limiter(text, 1_000);
        assert_eq!(lim.check(), fresh.check(), "{text}: the impossible request changed state");
    }
}

#[test]
fn clocks_at_the_end_of_time_do_not_overflow() {
    let policies = CENTURY_POLICIES.iter().chain(&[
        "leaky-bucket rate=1r/m burst=268435 delay=7 compat=nginx",
        "token-bucket capacity=4294967295 refill=1 every=1d",
        "sliding-log limit=65536 window=106751d",
    ]);
    for &text in policies {
        for start in [i64::MAX as u64 - 1, i64::MAX as u64, u64::MAX - 1, u64::MAX] {
            let (lim, clock) = limiter(text, start);
            for cost in [1, 2, u32::MAX] {
                let _ = lim.check_n(cost);
                let _ = lim.peek_n(cost);
            }
            // And backwards from there, and forward again.
            clock.set(0);
            let _ = lim.check();
            clock.set(u64::MAX);
            let _ = lim.check();
        }
    }
}
