#![no_main]
use libfuzzer_sys::fuzz_target;
use ratewell_fuzz::{Scenario, check, common, count, duration, text};

fuzz_target!(|s: Scenario| {
    let (limit, window) = (count(s.a) % 70_000, duration(s.c));
    let policy = format!("sliding-log limit={limit} window={}", text(window));
    let model = common::Log { limit: limit.into(), window: window.into(), entries: vec![] };
    check(&policy, model, s.start, &s.ops);
});
