#![no_main]
use libfuzzer_sys::fuzz_target;
use ratewell_fuzz::{Scenario, check, common, count, duration, text};

fuzz_target!(|s: Scenario| {
    let (capacity, refill, every) = (count(s.a), count(s.b), duration(s.c));
    let policy = format!("token-bucket capacity={capacity} refill={refill} every={}", text(every));
    let model = common::Discrete {
        capacity: capacity.into(),
        refill: refill.into(),
        every: every.into(),
        state: None,
    };
    check(&policy, model, s.start, &s.ops);
});
