//! Layered limits against the naive layered model (`ratewell_model::run_layered`): every pair of
//! algorithms (the leaky bucket both nodelay and delaying), mixed costs including impossible ones,
//! skipped layers, dry-run layers, one key for every layer (bands) or one per layer, reservations
//! cancelled at once (exact) and cancelled later (never more than the request took).

use ratewell_model as common;

use common::{Action, LayeredOp, run_layered, small_layer};
use proptest::prelude::*;

fn ops() -> impl Strategy<Value = Vec<LayeredOp>> {
    let gap = prop_oneof![
        3 => Just(0u64),
        3 => 0..2_000_000_000u64,
        1 => 0..20_000_000_000u64,
        1 => 0..1_000u64,
    ];
    let key = prop_oneof![8 => (0..3u8).prop_map(Some), 1 => Just(None)];
    let action = prop_oneof![
        6 => Just(Action::Check),
        2 => Just(Action::CancelNow),
        2 => Just(Action::Hold),
        1 => Just(Action::Release),
    ];
    let op = (
        gap,
        key.clone(),
        key,
        prop::bool::weighted(0.3),
        prop_oneof![4 => Just(1u32), 2 => 1..=5u32, 1 => Just(u32::MAX)],
        action,
    )
        .prop_map(|(gap, k0, k1, one_key, cost, action)| LayeredOp {
            gap,
            keys: [k0, k1],
            one_key,
            cost,
            action,
        });
    prop::collection::vec(op, 1..40)
}

fn layer() -> impl Strategy<Value = (u8, u8, bool)> {
    (any::<u8>(), any::<u8>(), prop::bool::weighted(0.2))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4_000, ..ProptestConfig::default() })]

    #[test]
    fn two_layers_match_the_model(a in 0..8u8, b in 0..8u8, (la, va, da) in layer(), (lb, vb, db) in layer(),
                                  start in prop_oneof![Just(0u64), 0..(1u64 << 40)], steps in ops()) {
        let specs = [small_layer(a, la, va, da), small_layer(b, lb, vb, db)];
        run_layered(&specs, start, &steps).map_err(TestCaseError::fail)?;
    }
}

/// Every ordered pair of the eight kinds, so that no combination is left to chance.
#[test]
fn every_pair_of_algorithms() {
    use proptest::test_runner::{Config, TestRunner};
    for a in 0..8u8 {
        for b in 0..8u8 {
            let mut runner = TestRunner::new(Config { cases: 128, ..Config::default() });
            runner
                .run(&(layer(), layer(), ops()), |((la, va, da), (lb, vb, db), steps)| {
                    let specs = [small_layer(a, la, va, da), small_layer(b, lb, vb, db)];
                    run_layered(&specs, 0, &steps).map_err(TestCaseError::fail)
                })
                .unwrap_or_else(|e| panic!("kinds {a} and {b}: {e}"));
        }
    }
}

mod api {
    use std::sync::Arc;

    use ratewell::{Absent, Layer, LayeredLimiter, LayersError, MAX_LAYERS, ManualClock, Policy};

    fn layer(name: &str, text: &str) -> Layer {
        Layer::new(name, &text.parse::<Policy>().unwrap()).capacity(64)
    }

    #[test]
    fn bad_layer_sets_are_errors() {
        let clock = ManualClock::new(0);
        let err = LayeredLimiter::with_clock(vec![], clock.clone()).unwrap_err();
        assert_eq!(err, LayersError::NoLayers);
        let many = (0..=MAX_LAYERS)
            .map(|i| layer(&format!("l{i}"), "fixed-window limit=1 window=1s"))
            .collect();
        let err = LayeredLimiter::with_clock(many, clock.clone()).unwrap_err();
        assert_eq!(err, LayersError::TooManyLayers { layers: MAX_LAYERS + 1 });
        assert!(err.to_string().contains("at most 8"), "{err}");
        let twice = vec![
            layer("a", "fixed-window limit=1 window=1s"),
            layer("a", "fixed-window limit=2 window=1s"),
        ];
        let err = LayeredLimiter::with_clock(twice, clock.clone()).unwrap_err();
        assert_eq!(err, LayersError::DuplicateName("a".into()));
        let huge = vec![layer("a", "fixed-window limit=1 window=1s").capacity(usize::MAX)];
        let err = LayeredLimiter::with_clock(huge, clock.clone()).unwrap_err();
        assert!(matches!(err, LayersError::Capacity { ref layer, .. } if layer == "a"), "{err}");
        let most = (0..MAX_LAYERS)
            .map(|i| layer(&format!("l{i}"), "fixed-window limit=1 window=1s"))
            .collect();
        assert_eq!(LayeredLimiter::with_clock(most, clock).unwrap().len(), MAX_LAYERS);
    }

    #[test]
    fn a_wrong_number_of_keys_is_an_error_and_charges_nothing() {
        let layers = vec![
            layer("a", "fixed-window limit=1 window=1s"),
            layer("b", "fixed-window limit=1 window=1s"),
            layer("c", "fixed-window limit=1 window=1s"),
        ];
        let limiter = LayeredLimiter::with_clock(layers, ManualClock::new(0)).unwrap();
        for keys in [&[][..], &[&"x" as &dyn ratewell::LayerKey, &"y"][..]] {
            let err = limiter.check(keys, 1).unwrap_err();
            assert_eq!(err, ratewell::KeyCountError { keys: keys.len(), layers: 3 });
            assert!(limiter.reserve(keys, 1).is_err() && limiter.peek(keys, 1).is_err());
        }
        assert!(limiter.check(&[&"x"], 1).unwrap().is_admitted(), "nothing was charged");
    }

    #[test]
    fn reservations_refund_when_dropped_or_cancelled_and_keep_when_committed() {
        let layers = vec![
            layer("ip", "token-bucket capacity=2 rate=1/h"),
            layer("route", "fixed-window limit=5 window=1h"),
        ];
        let limiter = Arc::new(LayeredLimiter::with_clock(layers, ManualClock::new(0)).unwrap());
        let left = |l: &LayeredLimiter<ManualClock>| {
            let d = l.peek(&[&"k"], 1).unwrap();
            (d.layer(0).unwrap().remaining(), d.layer(1).unwrap().remaining())
        };
        limiter.reserve(&[&"k"], 2).unwrap().cancel();
        assert_eq!(left(&limiter), (2, 5));
        drop(limiter.reserve_owned(&[&"k"], 1).unwrap());
        assert_eq!(left(&limiter), (2, 5));
        limiter.reserve(&[&"k"], 1).unwrap().commit();
        assert_eq!(left(&limiter), (1, 4));
        // A rejected reservation holds nothing: dropping it changes nothing.
        let r = limiter.reserve(&[&"k"], 2).unwrap();
        assert!(!r.decision().is_admitted());
        drop(r);
        assert_eq!(left(&limiter), (1, 4));
        assert_eq!(limiter.metrics(0).unwrap().refunds, 2);
    }

    #[test]
    fn skipped_layers_are_not_charged_or_reported() {
        let layers = vec![
            layer("ip", "fixed-window limit=3 window=1s"),
            layer("key", "fixed-window limit=1 window=1s"),
        ];
        let limiter = LayeredLimiter::with_clock(layers, ManualClock::new(0)).unwrap();
        let d = limiter.check(&[&"1.2.3.4", &Absent], 1).unwrap();
        assert!(d.is_admitted() && d.is_skipped(1) && d.layer(1).is_none());
        assert_eq!(limiter.ratelimit_field(&d), r#""ip";r=2;t=1"#);
        let d = limiter.check(&[&Absent], 1).unwrap();
        assert!(d.is_admitted() && d.decided_by().is_none(), "no layer applies: admitted");
    }

    #[test]
    fn a_rejection_reports_every_layer_and_the_largest_wait() {
        let layers = vec![
            layer("second", "fixed-window limit=1 window=1s"),
            layer("minute", "fixed-window limit=1 window=1m"),
        ];
        let limiter = LayeredLimiter::with_clock(layers, ManualClock::new(0)).unwrap();
        assert!(limiter.check(&[&"k"], 1).unwrap().is_admitted());
        let d = limiter.check(&[&"k"], 1).unwrap();
        assert_eq!(d.decided_by(), Some(0));
        // Both reject: the request passes once the minute is over.
        assert_eq!(d.decision().retry_after_ns(), Some(60_000_000_000));
        assert_eq!(d.retry_after_header().as_deref(), Some("60"));
        assert_eq!(limiter.ratelimit_field(&d), r#""second";r=0;t=1, "minute";r=0;t=60"#);
        // The lean path stops at the first rejection; it admits exactly what check does.
        assert!(!limiter.allow(&[&"k"], 1).unwrap());
    }
}

/// A refund whose charge another admission followed at the same instant (the compare-exchange
/// back to the state before fails; the algorithm gives back): still exact, the state of the other
/// admission alone, for every one-word algorithm but a window that the refunded charge opened
/// under `align=first` (which keeps it: see docs/SEMANTICS.md, *Layered limits*).
mod give_back {
    use proptest::prelude::*;
    use ratewell::{Nanos, State, WordPolicy};
    use ratewell_model::small_layer;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 4_000, ..ProptestConfig::default() })]

        #[test]
        fn exact_at_the_instant_of_the_charge(kind in 0..7u8, limit: u8, variant: u8,
                                              warm in prop::collection::vec((0..3_000_000_000u64, 1..=3u32), 0..4),
                                              gap in 0..3_000_000_000u64, a in 1..=4u32, b in 1..=4u32) {
            let (policy, _) = small_layer(kind, limit, variant, false);
            let first_aligned = policy.to_string().contains("align=first");
            let pure = WordPolicy::new(&policy).unwrap();
            // Some history, then the charge A and another admission B at the same instant.
            let (mut state, mut now) = (State::FRESH, 0u64);
            for (step, cost) in warm {
                now += step;
                if let (_, Some(next)) = pure.decide(state, Nanos::new(now), cost) {
                    state = next;
                }
            }
            now += gap;
            let t = Nanos::new(now);
            let before = state;
            let Some(after_a) = pure.decide(before, t, a).1 else { return Ok(()) };
            let Some(after_both) = pure.decide(after_a, t, b).1 else { return Ok(()) };
            let refunded = pure.refund(after_both, t, before, after_a, a);
            let b_alone = pure.decide(before, t, b).1.expect("B fits without A");
            let opened = first_aligned && pure.peek(before, t, 1).remaining() == pure.peek(State::FRESH, t, 1).remaining();
            for wait in [0u64, 1, 250_000_000, 1_000_000_000, 7_000_000_000] {
                let at = Nanos::new(now + wait);
                let got = pure.peek(refunded, at, 1).remaining();
                let want = pure.peek(b_alone, at, 1).remaining();
                let kept = pure.peek(after_both, at, 1).remaining();
                if opened {
                    prop_assert!(got >= kept, "{policy}: +{wait}: {got} < {kept}");
                } else {
                    prop_assert_eq!(got, want, "{}: +{} ns", policy, wait);
                }
            }
        }
    }
}
