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
