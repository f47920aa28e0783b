#![no_main]
//! The keyed table against a model of it: a few keys competing for the eight slots of a one-bucket
//! table that refuses new keys when full (so every outcome is determined: a new key gets a slot iff
//! fewer than eight other keys are live; refused, it is told to retry when the first live one is
//! back to full). Keys that are back to full are reclaimable, so they never block anything.
use std::collections::HashMap;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use ratewell::{Decision, KeyedLimiter, ManualClock, OnFull, Policy};
use ratewell_fuzz::common::{self, Expected, Model};
use ratewell_fuzz::{count, duration, text};

#[derive(Arbitrary, Debug)]
struct Input {
    which: u8,
    a: u32,
    c: u32,
    ops: Vec<Step>,
}

#[derive(Arbitrary, Debug)]
struct Step {
    kind: u8,
    advance: u64,
    key: u8,
    cost: u8,
}

fn run<M: Model>(text: &str, fresh: M, ops: &[Step]) {
    let Ok(policy) = text.parse::<Policy>() else { return };
    let clock = ManualClock::new(0);
    let limiter = KeyedLimiter::<u8>::builder(&policy, 8)
        .clock(clock.clone())
        .on_full(OnFull::Refuse)
        .build()
        .expect("a table of this capacity");
    assert_eq!(limiter.metrics().capacity, 8);
    let scale = policy.window_ns().clamp(1, 1 << 40);
    let mut models: HashMap<u8, M> = HashMap::new();
    let mut now = 0u64;
    for (i, step) in ops.iter().take(100).enumerate() {
        now += match step.kind % 4 {
            0 => 0,
            1 => step.advance % 16,
            _ => step.advance % (2 * scale + 1),
        };
        clock.set(now);
        let key = step.key % 12;
        let cost = u32::from(step.cost % 4) + 1;
        if step.kind >> 2 & 7 == 7 {
            limiter.reset(&key);
            models.remove(&key);
            continue;
        }
        let peek = step.kind >> 2 & 7 == 6;
        let t = u128::from(now);
        // Keys back to full are as good as absent.
        models.retain(|_, m| !m.is_full(t));
        let want = match models.get_mut(&key) {
            Some(m) => common::expect(m, t, cost.into(), !peek),
            None => {
                let mut m = fresh.clone();
                let e = common::expect(&mut m, t, cost.into(), !peek);
                let needs_slot = !peek && e.outcome == ratewell::Outcome::Admitted;
                if needs_slot && models.len() >= 8 {
                    let soonest = models.values().map(|m| common::reset_after(m, t)).min().unwrap();
                    Expected {
                        outcome: ratewell::Outcome::TableFull,
                        limit: e.limit,
                        remaining: 0,
                        reset_after: soonest,
                        retry_after: Some(soonest),
                        delay: 0,
                        replenish: Some(soonest),
                    }
                } else {
                    if needs_slot {
                        models.insert(key, m);
                    }
                    e
                }
            }
        };
        let got: Decision = if peek {
            limiter.request(&key).cost(cost).peek()
        } else {
            limiter.request(&key).cost(cost).check()
        };
        assert_eq!(
            Expected::of(&got),
            want,
            "step {i} at t={now}, key {key}, cost {cost}, `{text}`"
        );
        assert!(limiter.metrics().keys <= 8);
    }
}

fuzz_target!(|input: Input| {
    let (n, d) = (count(input.a) % 8 + 1, duration(input.c));
    match input.which % 3 {
        0 => {
            let text = format!("fixed-window limit={n} window={}", text(d));
            let model =
                common::Fixed { limit: n.into(), window: d.into(), first: false, state: None };
            run(&text, model, &input.ops);
        }
        1 => {
            let text = format!("token-bucket capacity={n} rate=1/{}", text(d));
            let model = common::Gcra { capacity: n.into(), count: 1, period: d.into(), tat: None };
            run(&text, model, &input.ops);
        }
        _ => {
            let text = format!("sliding-window limit={n} window={}", text(d));
            let model = common::Sliding { limit: n.into(), window: d.into(), state: (0, 0, 0) };
            run(&text, model, &input.ops);
        }
    }
});
