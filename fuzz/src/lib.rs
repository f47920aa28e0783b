//! Shared harness of the differential fuzz targets: shape raw fuzz input into a policy and a
//! scenario, run it through the limiter and the naive reference model (`ratewell-model`), and panic
//! at the first field of the first decision that differs.

#![allow(clippy::missing_panics_doc)]

pub use ratewell_model as common;

use arbitrary::Arbitrary;
use common::{Gap, Model, Op};
use ratewell::Policy;

/// One raw step: a time move, a cost, peek or take.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub struct RawOp {
    kind: u8,
    amount: u64,
    cost: u32,
    peek: bool,
}

/// A scenario: a few parameters for the policy, a start time and the steps.
#[derive(Arbitrary, Debug)]
pub struct Scenario {
    pub a: u32,
    pub b: u32,
    pub c: u32,
    pub d: u8,
    pub start: u64,
    pub ops: Vec<RawOp>,
}

const S: u64 = 1_000_000_000;

/// A count: mostly small, sometimes round or extreme.
pub fn count(x: u32) -> u32 {
    match x % 8 {
        0 => u32::MAX,
        1 => 1 + (x >> 3) % 1_000_000,
        2 => [100, 997, 1000, 65_535, 65_536, 1 << 20][(x >> 3) as usize % 6],
        _ => 1 + (x >> 3) % 12,
    }
}

/// A duration: a unit times a small factor, or raw nanoseconds.
pub fn duration(x: u32) -> u64 {
    let units = [1, 1_000, 1_000_000, 250_000_000, S, 60 * S, 3_600 * S, 86_400 * S];
    match x % 4 {
        0 => 1 + u64::from(x >> 2) % (10 * S),
        _ => units[(x >> 2) as usize % units.len()] * (1 + u64::from(x >> 5) % 10),
    }
}

impl RawOp {
    fn op(&self, scale: u64, limit: u64) -> Op {
        let scale = scale.max(1);
        let gap = match self.kind % 8 {
            0 | 1 => Gap::Forward(0),
            2 => Gap::Forward(self.amount % 16),
            3 | 4 => Gap::Forward(self.amount % scale.saturating_mul(2).saturating_add(1)),
            5 => Gap::Forward(self.amount % scale.saturating_mul(64).saturating_add(1)),
            6 => Gap::Forward(self.amount),
            _ => Gap::Back(self.amount % scale.saturating_mul(2).saturating_add(1)),
        };
        let near = |k: u64| k.clamp(1, u64::from(u32::MAX)) as u32;
        let cost = match (self.kind >> 3) % 6 {
            0 | 1 => 1,
            2 => 1 + self.cost % 4,
            3 => near(limit.saturating_sub(1) + u64::from(self.cost % 3)),
            4 => self.cost.max(1),
            _ => u32::MAX,
        };
        Op { gap, cost, peek: self.peek }
    }
}

/// Parse `text` (skipping configurations the parser refuses) and compare limiter and model.
pub fn check<M: Model>(text: &str, model: M, start: u64, raw: &[RawOp]) {
    let Ok(policy) = text.parse::<Policy>() else { return };
    let scale = policy.window_ns().clamp(1, 1 << 50);
    let ops: Vec<Op> = raw.iter().take(64).map(|r| r.op(scale, policy.limit())).collect();
    if let Err(e) = common::run(&policy, model, start % (1 << 62), &ops) {
        panic!("{e}");
    }
}

/// A duration as the policy grammar spells it (the property tests' own spelling).
pub use common::duration_text as text;
