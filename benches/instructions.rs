#![allow(missing_docs)] // the benchmark macros generate undocumented modules
//! Instructions per decision (iai-callgrind: deterministic, so a real regression gate).
//!
//! Every benchmark runs twice, making `N` and `2N` decisions after the same setup: the difference
//! divided by `N` is the cost of one decision, whatever constant work (function entry, anything
//! of the setup callgrind sees) surrounds the loop; the loop itself adds about 2 instructions. `benches/iai.py summary` prints that table;
//! `.ci/run` checks the raw totals against `benches/ceilings.txt`.

use std::hint::black_box;
use std::num::NonZeroU32;

use governor::clock::FakeRelativeClock;
use governor::{Quota, RateLimiter};
use iai_callgrind::{
    Callgrind, LibraryBenchmarkConfig, library_benchmark, library_benchmark_group, main,
};
use ratewell::{
    KeyedLimiter, Layer, LayerKey, LayeredDecision, LayeredLimiter, Limiter, ManualClock, Nanos,
    Policy, PolicyId, QuantaClock, State, WordPolicy,
};

/// Decisions in the `x1` run (the `x2` run makes twice as many).
const N: u64 = 1000;

fn policy(text: &str) -> Policy {
    text.parse().unwrap()
}

const GCRA: &str = "token-bucket capacity=1000000000 rate=1000000000/s";

#[library_benchmark]
#[bench::gcra_x1("token-bucket capacity=1000000 rate=1000/s", N)]
#[bench::gcra_x2("token-bucket capacity=1000000 rate=1000/s", 2 * N)]
#[bench::discrete_x1("token-bucket capacity=1000000 refill=1000 every=1s", N)]
#[bench::discrete_x2("token-bucket capacity=1000000 refill=1000 every=1s", 2 * N)]
#[bench::leaky_x1("leaky-bucket rate=1000r/s burst=1000000 nodelay", N)]
#[bench::leaky_x2("leaky-bucket rate=1000r/s burst=1000000 nodelay", 2 * N)]
#[bench::nginx_x1("leaky-bucket rate=1000r/s burst=200000 nodelay compat=nginx", N)]
#[bench::nginx_x2("leaky-bucket rate=1000r/s burst=200000 nodelay compat=nginx", 2 * N)]
#[bench::fixed_x1("fixed-window limit=1000000 window=1s", N)]
#[bench::fixed_x2("fixed-window limit=1000000 window=1s", 2 * N)]
#[bench::sliding_x1("sliding-window limit=1000000 window=1s", N)]
#[bench::sliding_x2("sliding-window limit=1000000 window=1s", 2 * N)]
fn decide(text: &str, n: u64) -> u64 {
    let pure = WordPolicy::new(&policy(text)).unwrap();
    let mut state = State::FRESH;
    for i in 0..n {
        let (d, next) = black_box(&pure).decide(state, Nanos::new(black_box(i * 1_000_000)), 1);
        state = next.unwrap_or(state);
        black_box(d);
    }
    state.to_bits()
}

fn quanta_limiter(text: &str, drain: bool) -> Limiter<QuantaClock> {
    let l = Limiter::new(&policy(text));
    if drain {
        l.check();
    }
    l
}

fn manual_limiter(text: &str, drain: bool) -> Limiter<ManualClock> {
    let l = Limiter::with_clock(&policy(text), ManualClock::new(0));
    if drain {
        l.check();
    }
    l
}

#[library_benchmark]
#[bench::allowed_x1(quanta_limiter(GCRA, false), N)]
#[bench::allowed_x2(quanta_limiter(GCRA, false), 2 * N)]
#[bench::denied_x1(quanta_limiter("token-bucket capacity=1 rate=1/h", true), N)]
#[bench::denied_x2(quanta_limiter("token-bucket capacity=1 rate=1/h", true), 2 * N)]
fn direct_tsc(limiter: Limiter<QuantaClock>, n: u64) {
    for _ in 0..n {
        black_box(limiter.check());
    }
}

#[library_benchmark]
#[bench::allowed_x1(manual_limiter(GCRA, false), N)]
#[bench::allowed_x2(manual_limiter(GCRA, false), 2 * N)]
#[bench::denied_x1(manual_limiter("token-bucket capacity=1 rate=1/h", true), N)]
#[bench::denied_x2(manual_limiter("token-bucket capacity=1 rate=1/h", true), 2 * N)]
fn direct_manual(limiter: Limiter<ManualClock>, n: u64) {
    for _ in 0..n {
        black_box(limiter.check());
    }
}

#[library_benchmark]
#[bench::allowed_x1(quanta_limiter(GCRA, false), N)]
#[bench::allowed_x2(quanta_limiter(GCRA, false), 2 * N)]
#[bench::denied_x1(quanta_limiter("token-bucket capacity=1 rate=1/h", true), N)]
#[bench::denied_x2(quanta_limiter("token-bucket capacity=1 rate=1/h", true), 2 * N)]
fn allow_tsc(limiter: Limiter<QuantaClock>, n: u64) {
    for _ in 0..n {
        black_box(limiter.allow());
    }
}

#[library_benchmark]
#[bench::allowed_x1(manual_limiter(GCRA, false), N)]
#[bench::allowed_x2(manual_limiter(GCRA, false), 2 * N)]
#[bench::denied_x1(manual_limiter("token-bucket capacity=1 rate=1/h", true), N)]
#[bench::denied_x2(manual_limiter("token-bucket capacity=1 rate=1/h", true), 2 * N)]
fn allow_manual(limiter: Limiter<ManualClock>, n: u64) {
    for _ in 0..n {
        black_box(limiter.allow());
    }
}

/// Calls `f` with the keys `0..N` in turn, `n` times in all (`n` a multiple of `N`), read from a
/// vector: a decision's loop is a pointer increment and a compare, not a `%` (6-8 instructions,
/// as many for every limiter). The vector is built in both runs alike, so it cancels out.
#[inline(always)]
fn each_key(n: u64, mut f: impl FnMut(&u64)) {
    let keys: Vec<u64> = (0..N).collect();
    for _ in 0..n / N {
        keys.iter().for_each(&mut f);
    }
}

/// 1,000 keys of `text`, all present: a table sized so that none was evicted (see the table's
/// load notes).
fn keyed_limiter(text: &str) -> KeyedLimiter<u64, ManualClock> {
    let l = KeyedLimiter::with_clock(&policy(text), 8 * N as usize, ManualClock::new(0));
    for k in 0..N {
        l.check(&k);
    }
    assert_eq!((l.metrics().keys, l.metrics().evictions), (N, 0));
    l
}

/// A policy that rejects every request after a key's first.
const DENYING: &str = "token-bucket capacity=1 rate=1/h";

#[library_benchmark]
#[bench::hit_1k_x1(keyed_limiter(GCRA), N)]
#[bench::hit_1k_x2(keyed_limiter(GCRA), 2 * N)]
#[bench::denied_1k_x1(keyed_limiter(DENYING), N)]
#[bench::denied_1k_x2(keyed_limiter(DENYING), 2 * N)]
fn keyed(limiter: KeyedLimiter<u64, ManualClock>, n: u64) {
    each_key(n, |k| {
        black_box(limiter.check(k));
    });
}

#[library_benchmark]
#[bench::hit_1k_x1(keyed_limiter(GCRA), N)]
#[bench::hit_1k_x2(keyed_limiter(GCRA), 2 * N)]
fn keyed_allow(limiter: KeyedLimiter<u64, ManualClock>, n: u64) {
    each_key(n, |k| {
        black_box(limiter.allow(k));
    });
}

/// 1,000 keys stored under a registered fixed window at the widest limit, and its id: the
/// policy named per call (`take_with`) beside the same window at a limit chosen per call
/// (`take_within`), which one slot serves for any number of distinct limits.
fn registered_limiter() -> (KeyedLimiter<u64, ManualClock>, PolicyId) {
    let l = KeyedLimiter::with_clock(&policy(GCRA), 8 * N as usize, ManualClock::new(0));
    let id = l.register(&policy("fixed-window limit=4294967295 window=1h")).expect("registered");
    for k in 0..N {
        l.request(&k).policy(&id).take();
    }
    assert_eq!((l.metrics().keys, l.metrics().evictions), (N, 0));
    (l, id)
}

#[library_benchmark]
#[bench::hit_1k_x1(registered_limiter(), N)]
#[bench::hit_1k_x2(registered_limiter(), 2 * N)]
fn keyed_take_with((limiter, id): (KeyedLimiter<u64, ManualClock>, PolicyId), n: u64) {
    each_key(n, |k| {
        black_box(limiter.request(k).policy(&id).take());
    });
}

#[library_benchmark]
#[bench::hit_1k_x1(registered_limiter(), N)]
#[bench::hit_1k_x2(registered_limiter(), 2 * N)]
fn keyed_take_within((limiter, id): (KeyedLimiter<u64, ManualClock>, PolicyId), n: u64) {
    each_key(n, |k| {
        black_box(limiter.request(k).within(&id, 1_000_000).take());
    });
}

/// A layered limiter of `texts`, in order, with the keys `0..N` present on every layer (each
/// key is every layer's: bands on one key).
fn layered_limiter(texts: &[&str]) -> LayeredLimiter<ManualClock> {
    let layers = texts
        .iter()
        .enumerate()
        .map(|(i, t)| Layer::new(format!("l{i}"), &policy(t)).capacity(8 * N as usize))
        .collect();
    let l = LayeredLimiter::with_clock(layers, ManualClock::new(0)).unwrap();
    for k in 0..N {
        let _ = l.check(&[&k], 1);
    }
    l
}

/// A benchmark of the layered limiter named `$name`, running `$body` on `$limiter` for `$n`
/// decisions, on one and two layers, admitted and rejected by the first layer.
macro_rules! layered_bench {
    ($name:ident, |$limiter:ident, $n:ident| $body:block) => {
        #[library_benchmark]
        #[bench::one_admitted_x1(layered_limiter(&[GCRA]), N)]
        #[bench::one_admitted_x2(layered_limiter(&[GCRA]), 2 * N)]
        #[bench::two_admitted_x1(layered_limiter(&[GCRA, GCRA]), N)]
        #[bench::two_admitted_x2(layered_limiter(&[GCRA, GCRA]), 2 * N)]
        #[bench::one_rejected_x1(layered_limiter(&[DENYING]), N)]
        #[bench::one_rejected_x2(layered_limiter(&[DENYING]), 2 * N)]
        #[bench::two_first_rejects_x1(layered_limiter(&[DENYING, GCRA]), N)]
        #[bench::two_first_rejects_x2(layered_limiter(&[DENYING, GCRA]), 2 * N)]
        fn $name($limiter: LayeredLimiter<ManualClock>, $n: u64) $body
    };
}

layered_bench!(layered, |limiter, n| {
    // By reference: a layered decision is 328 bytes, which a `black_box` by value would copy.
    each_key(n, |k| {
        let decision = limiter.check(&[k as &dyn LayerKey], 1);
        black_box(&decision);
    });
});

layered_bench!(layered_into, |limiter, n| {
    let mut decision = LayeredDecision::default();
    each_key(n, |k| {
        let _ = limiter.check_into(&[k as &dyn LayerKey], 1, &mut decision);
        black_box(&decision);
    });
});

layered_bench!(layered_allow, |limiter, n| {
    each_key(n, |k| {
        black_box(limiter.allow(&[k as &dyn LayerKey], 1).unwrap());
    });
});

type GovernorDirect = RateLimiter<
    governor::state::NotKeyed,
    governor::state::InMemoryState,
    FakeRelativeClock,
    governor::middleware::NoOpMiddleware<governor::nanos::Nanos>,
>;

fn governor_direct(per_second: u32, drain: bool) -> GovernorDirect {
    let quota = Quota::per_second(NonZeroU32::new(per_second).unwrap());
    let l = RateLimiter::direct_with_clock(quota, FakeRelativeClock::default());
    if drain {
        while l.check().is_ok() {}
    }
    l
}

#[library_benchmark]
#[bench::allowed_x1(governor_direct(1_000_000_000, false), N)]
#[bench::allowed_x2(governor_direct(1_000_000_000, false), 2 * N)]
#[bench::denied_x1(governor_direct(1, true), N)]
#[bench::denied_x2(governor_direct(1, true), 2 * N)]
fn governor_direct_check(limiter: GovernorDirect, n: u64) {
    for _ in 0..n {
        black_box(limiter.check().is_ok());
    }
}

type GovernorKeyed = RateLimiter<
    u64,
    governor::state::keyed::DefaultKeyedStateStore<u64>,
    FakeRelativeClock,
    governor::middleware::NoOpMiddleware<governor::nanos::Nanos>,
>;

fn governor_keyed() -> GovernorKeyed {
    let quota = Quota::per_second(NonZeroU32::new(1_000_000_000).unwrap());
    let l = RateLimiter::dashmap_with_clock(quota, FakeRelativeClock::default());
    for k in 0..N {
        let _ = l.check_key(&k);
    }
    l
}

#[library_benchmark]
#[bench::hit_1k_x1(governor_keyed(), N)]
#[bench::hit_1k_x2(governor_keyed(), 2 * N)]
fn governor_keyed_check(limiter: GovernorKeyed, n: u64) {
    each_key(n, |k| {
        black_box(limiter.check_key(k).is_ok());
    });
}

// Two governor keyed limiters checked in sequence: the nearest governor has to two layers (not
// all or nothing: the first is charged when the second rejects).
#[library_benchmark]
#[bench::hit_1k_x1((governor_keyed(), governor_keyed()), N)]
#[bench::hit_1k_x2((governor_keyed(), governor_keyed()), 2 * N)]
fn governor_two_keyed_checks(limiters: (GovernorKeyed, GovernorKeyed), n: u64) {
    each_key(n, |k| {
        black_box(limiters.0.check_key(k).is_ok() && limiters.1.check_key(k).is_ok());
    });
}

library_benchmark_group!(
    name = ratewell_group;
    benchmarks = decide, direct_tsc, direct_manual, allow_tsc, allow_manual, keyed, keyed_allow,
        keyed_take_with, keyed_take_within, layered, layered_into, layered_allow
);

library_benchmark_group!(
    name = governor_group;
    benchmarks = governor_direct_check, governor_keyed_check, governor_two_keyed_checks
);

// `dump-instr`: the outputs keep each instruction's address, which `benches/profile.py` maps to
// the inlined source line it came from (the counts do not change).
main!(
    config = LibraryBenchmarkConfig::default().tool(Callgrind::with_args(["dump-instr=yes"]));
    library_benchmark_groups = ratewell_group, governor_group
);
