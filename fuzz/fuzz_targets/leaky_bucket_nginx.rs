#![no_main]
use libfuzzer_sys::fuzz_target;
use ratewell_fuzz::{Scenario, check, common, count, duration, text};

fuzz_target!(|s: Scenario| {
    let burst = if s.d & 1 == 0 { 0 } else { count(s.a) % 300_000 };
    let (n, period) = (count(s.b), duration(s.c));
    let delay = if s.d >> 1 & 1 == 0 { None } else { Some(u32::from(s.d >> 2)) };
    let mode = delay.map_or(" nodelay".to_string(), |d| format!(" delay={d}"));
    let policy = format!("leaky-bucket rate={n}/{} burst={burst}{mode} compat=nginx", text(period));
    let model = common::Nginx::new(n.into(), period.into(), burst.into(), delay.map(u128::from));
    check(&policy, model, s.start, &s.ops);
});
