#![no_main]
use libfuzzer_sys::fuzz_target;
use ratewell_fuzz::{Scenario, check, common, count, duration, text};

fuzz_target!(|s: Scenario| {
    let (limit, window, first) = (count(s.a), duration(s.c), s.d & 1 == 1);
    let align = if first { " align=first" } else { "" };
    let policy = format!("fixed-window limit={limit} window={}{align}", text(window));
    let model = common::Fixed { limit: limit.into(), window: window.into(), first, state: None };
    check(&policy, model, s.start, &s.ops);
});
