#![no_main]
use libfuzzer_sys::fuzz_target;
use ratewell_fuzz::{Scenario, check, common, count, duration, text};

fuzz_target!(|s: Scenario| {
    let (limit, window) = (count(s.a), duration(s.c));
    let policy = format!("sliding-window limit={limit} window={}", text(window));
    let model = common::Sliding { limit: limit.into(), window: window.into(), state: (0, 0, 0) };
    check(&policy, model, s.start, &s.ops);
});
