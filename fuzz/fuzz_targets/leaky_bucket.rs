#![no_main]
use libfuzzer_sys::fuzz_target;
use ratewell_fuzz::{Scenario, check, common, count, duration, text};

fuzz_target!(|s: Scenario| {
    let burst = if s.d & 1 == 0 { 0 } else { count(s.a) };
    let (n, period) = (count(s.b), duration(s.c));
    let delay = match s.d >> 1 & 3 {
        0 => None,
        1 => Some(0),
        _ => Some(u32::from(s.d >> 3)),
    };
    let mode = delay.map_or(" nodelay".to_string(), |d| format!(" delay={d}"));
    let policy = format!("leaky-bucket rate={n}/{} burst={burst}{mode}", text(period));
    let model = common::Leaky {
        burst: burst.into(),
        count: n.into(),
        period: period.into(),
        delay: delay.map(u128::from),
        state: None,
    };
    check(&policy, model, s.start, &s.ops);
});
