#![no_main]
//! Layered decisions and refunds against the naive layered model (`ratewell_model::run_layered`):
//! two layers of any two algorithms (dry-run or not), keys per layer or one for both, skipped
//! layers, mixed and impossible costs, reservations cancelled at once (exact) or later (never more
//! than the request took).
use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use ratewell_fuzz::common::{self, Action, LayeredOp};

#[derive(Arbitrary, Debug)]
struct Input {
    layers: [(u8, u8, u8, bool); 2],
    start: u32,
    ops: Vec<Step>,
}

#[derive(Arbitrary, Debug)]
struct Step {
    kind: u8,
    advance: u64,
    keys: [u8; 2],
    cost: u8,
}

fuzz_target!(|input: Input| {
    let specs = input
        .layers
        .map(|(kind, limit, variant, dry)| common::small_layer(kind, limit, variant, dry));
    let ops: Vec<LayeredOp> = input
        .ops
        .iter()
        .take(64)
        .map(|s| LayeredOp {
            gap: match s.kind % 4 {
                0 => 0,
                1 => s.advance % 1_000,
                2 => s.advance % 2_000_000_000,
                _ => s.advance % 20_000_000_000,
            },
            keys: s.keys.map(|k| (k % 8 != 7).then_some(k % 3)),
            one_key: s.kind >> 2 & 3 == 0,
            cost: match s.cost % 8 {
                7 => u32::MAX,
                c => u32::from(c % 5) + 1,
            },
            action: match s.kind >> 4 & 7 {
                0..=3 => Action::Check,
                4 => Action::CancelNow,
                5 | 6 => Action::Hold,
                _ => Action::Release,
            },
        })
        .collect();
    if let Err(e) = common::run_layered(&specs, u64::from(input.start) * 1_000, &ops) {
        panic!("{e}");
    }
});
