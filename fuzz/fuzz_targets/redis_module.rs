#![no_main]
//! The native Redis module's command (`RATEWELL.BATCH`), in process on its in-memory keyspace:
//! arbitrary keys and argument vectors never panic (a panic here would be one inside
//! redis-server); and valid single-layer requests, on microsecond times, decide as the naive
//! reference model does, field for field (`ratewell_model::run_on`).
use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use ratewell::{Decision, Outcome, Policy};
use ratewell_fuzz::common::{self, Backend, Gap, Op};
use ratewell_redis_module::{Memory, Policies, Reply, frames};

#[derive(Arbitrary, Debug)]
struct Input {
    /// Garbage: keys and arguments as they come, and a blob to split.
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
    blob: Vec<u8>,
    /// A policy for the differential part, and its steps.
    layer: (u8, u8, u8),
    start: u32,
    ops: Vec<(u8, u32, u8, bool)>,
}

/// One key on the module's keyspace, decided at the running maximum of the readings.
struct Module {
    store: Memory,
    policies: Policies,
    arg: Vec<u8>,
    limit: u64,
    latest: u64,
}

impl Module {
    fn decide(&mut self, now: u64, cost: u32, peek: bool) -> Result<Decision, String> {
        self.latest = self.latest.max(now);
        let now_us = self.latest / 1_000;
        self.store.now_us = now_us;
        let when = (now_us as f64).to_le_bytes();
        let cost = cost.to_string();
        let op: &[u8] = if peek { b"peek" } else { b"take" };
        let args: [&[u8]; 9] =
            [b"1", b"1", b"6", &when, cost.as_bytes(), op, b"86400000", &self.arg, b"0"];
        let reply = self.store.run(&mut self.policies, &[b"k"], &args)?;
        let int = |i: usize| match reply.get(i) {
            Some(Reply::Int(v)) => Ok(*v),
            other => Err(format!("field {i}: {other:?}")),
        };
        let outcome = match int(2)? {
            0 => Outcome::Admitted,
            1 => Outcome::Rejected,
            _ => Outcome::Impossible,
        };
        let ns = |v: i64| u64::try_from(v).unwrap_or(0);
        let replenish = int(6)?;
        Ok(Decision::from_parts(
            outcome,
            self.limit,
            ns(int(3)?),
            ns(int(4)?),
            ns(int(5)?),
            (replenish > 0).then(|| ns(replenish)),
        ))
    }
}

impl Backend for Module {
    fn check(&mut self, now: u64, cost: u32) -> Result<Decision, String> {
        self.decide(now, cost, false)
    }
    fn peek(&mut self, now: u64, cost: u32) -> Result<Decision, String> {
        self.decide(now, cost, true)
    }
}

fuzz_target!(|input: Input| {
    // Garbage never panics.
    let mut store = Memory::new(u64::from(input.start) * 1_000_000);
    let mut policies = Policies::default();
    let keys: Vec<&[u8]> = input.keys.iter().take(8).map(Vec::as_slice).collect();
    let args: Vec<&[u8]> = input.args.iter().take(64).map(Vec::as_slice).collect();
    let _ = store.run(&mut policies, &keys, &args);
    if let Some(split) = frames(&input.blob) {
        let _ = store.run(&mut policies, &keys, &split);
    }

    // Valid requests decide as the model does.
    let (kind, limit, variant) = input.layer;
    let (policy, model): (Policy, _) = common::small_layer(kind, limit, variant, false);
    let ops: Vec<Op> = input
        .ops
        .iter()
        .take(48)
        .map(|&(kind, amount, cost, peek)| {
            let us = match kind % 6 {
                0 | 1 => 0,
                2 => u64::from(amount % 1_000),
                3 => u64::from(amount % 2_000_000),
                4 => u64::from(amount),
                _ => u64::from(amount) * 1_000,
            };
            Op {
                gap: if kind % 11 == 10 { Gap::Back(us * 1_000) } else { Gap::Forward(us * 1_000) },
                cost: if cost == 255 { u32::MAX } else { u32::from(cost % 6) + 1 },
                peek,
            }
        })
        .collect();
    let start = (u64::from(input.start) + 1_000_000) * 1_000_000;
    let backend = Module {
        store: Memory::new(start / 1_000),
        policies: Policies::default(),
        arg: format!("x|{policy}").into_bytes(),
        limit: policy.limit(),
        latest: 0,
    };
    if let Err(e) = common::run_on("module", backend, &policy, model, start, &ops) {
        panic!("{e}");
    }
});
