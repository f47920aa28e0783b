#![no_main]
use libfuzzer_sys::fuzz_target;
use ratewell_fuzz::{Scenario, check, common, count, duration, text};

fuzz_target!(|s: Scenario| {
    let (capacity, n, period) = (count(s.a), count(s.b), duration(s.c));
    let policy = format!("token-bucket capacity={capacity} rate={n}/{}", text(period));
    let model = common::Gcra {
        capacity: capacity.into(),
        count: n.into(),
        period: period.into(),
        tat: None,
    };
    check(&policy, model, s.start, &s.ops);
});
