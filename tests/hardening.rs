//! Regression tests for defects a new user's tests found: each failed before its fix.

use ratewell::{CapacityError, KeyedLimiter, Limiter, ManualClock, Outcome, Policy};

const S: u64 = 1_000_000_000;
const H: u64 = 3600 * S;

fn policy(text: &str) -> Policy {
    text.parse().unwrap()
}

#[test]
fn a_clock_stepped_back_mints_nothing_however_far() {
    // A window used up at 1000 h; the clock then reads up to 72 h earlier (within and beyond the
    // layout's 19.5 h idle horizon): nothing more is admitted.
    for back in [19, 20, 24, 30, 72] {
        let clock = ManualClock::new(1000 * H);
        let limiter = Limiter::with_clock(
            &policy("fixed-window limit=100000 window=1h align=first"),
            clock.clone(),
        );
        assert!(limiter.check_n(100_000).is_admitted());
        clock.set((1000 - back) * H);
        assert!(!limiter.check().is_admitted(), "{back} h back");
        // The same through a keyed limiter.
        let clock = ManualClock::new(1000 * H);
        let keyed = KeyedLimiter::<str, _>::with_clock(
            &policy("fixed-window limit=100000 window=1h align=first"),
            100,
            clock.clone(),
        );
        assert!(keyed.request("k").cost(100_000).check().is_admitted());
        clock.set((1000 - back) * H);
        assert!(!keyed.check("k").is_admitted(), "{back} h back, keyed");
    }
    // nginx's leaky bucket, 4780 h back: no second burst.
    let clock = ManualClock::new(5000 * H);
    let limiter = Limiter::with_clock(
        &policy("leaky-bucket rate=10r/s burst=9 nodelay compat=nginx"),
        clock.clone(),
    );
    assert!(limiter.check_n(10).is_admitted());
    clock.set(220 * H);
    assert!(!limiter.check().is_admitted());
    // Time stands still until the clock catches up, then refills resume from there.
    clock.set(5000 * H + S / 10);
    assert!(limiter.check().is_admitted());
}

#[test]
fn the_sliding_log_reports_its_memory_and_stays_bounded_under_a_key_flood() {
    let limiter = KeyedLimiter::<u64, _>::with_clock(
        &policy("sliding-log limit=10 window=1m"),
        1_000,
        ManualClock::new(0),
    );
    let empty = limiter.metrics().memory_bytes;
    for k in 0..100_000u64 {
        assert!(limiter.check(&k).is_admitted());
    }
    let m = limiter.metrics();
    assert!(m.keys <= limiter.metrics().capacity, "{m:?}");
    assert_eq!(m.evictions, 100_000 - m.keys, "every key beyond the capacity evicted one");
    let full = limiter.metrics().memory_bytes;
    assert!(full > empty, "the logs' memory is reported ({full} bytes)");
    // At most 136 bytes a key of capacity (node and index) and its entry buffer (here, room for
    // 4 entries of 16 bytes): `log_table.rs`, *Memory*.
    let bound = limiter.metrics().capacity * (136 + 16 * 4);
    assert!(full <= bound, "{full} bytes over the bound of {bound}");
    // More of the flood stays within the bound.
    for k in 100_000..300_000u64 {
        limiter.check(&k);
    }
    assert!(limiter.metrics().memory_bytes <= bound);
}

#[test]
fn a_sliding_log_reclaims_expired_keys_before_evicting() {
    let clock = ManualClock::new(0);
    let limiter = KeyedLimiter::<u64, _>::with_clock(
        &policy("sliding-log limit=2 window=1s"),
        64,
        clock.clone(),
    );
    for round in 0..20u64 {
        clock.set(round * 2 * S);
        for k in 0..64u64 {
            let key = round * 1000 + k;
            assert!(limiter.check(&key).is_admitted());
            assert!(limiter.check(&key).is_admitted());
            assert!(!limiter.check(&key).is_admitted(), "key {key} has its own log");
        }
    }
    let m = limiter.metrics();
    assert_eq!((m.evictions, m.reclaims), (0, 19 * 64), "{m:?}");
}

#[test]
fn absurd_capacities_are_errors() {
    let p = policy("token-bucket capacity=10 rate=1/s");
    for capacity in [1usize << 60, (1 << 63) - 1, usize::MAX] {
        let err = KeyedLimiter::<str>::builder(&p, capacity).build().unwrap_err();
        assert!(matches!(err, CapacityError::TooLarge { .. }), "{err}");
        assert!(err.to_string().contains("maximum"), "{err}");
        let log = KeyedLimiter::<str>::builder(&policy("sliding-log limit=5 window=1s"), capacity)
            .build();
        assert!(log.is_err());
    }
    let max = KeyedLimiter::<str>::MAX_CAPACITY;
    assert!(KeyedLimiter::<str>::builder(&p, max as usize + 1).build().is_err());
    let panic = std::panic::catch_unwind(|| KeyedLimiter::<str>::new(&p, usize::MAX));
    assert!(panic.is_err(), "the infallible constructor panics, as its docs say");
}

#[test]
fn peek_reports_the_state_as_it_is() {
    for text in [
        "token-bucket capacity=10 rate=1/s",
        "token-bucket capacity=10 refill=1 every=1s",
        "leaky-bucket rate=1/s burst=9 nodelay",
        "leaky-bucket rate=1r/s burst=9 nodelay compat=nginx",
        "fixed-window limit=10 window=1s",
        "sliding-window limit=10 window=1s",
        "sliding-log limit=10 window=1s",
    ] {
        let limiter = Limiter::with_clock(&policy(text), ManualClock::new(0));
        let d = limiter.peek_n(1);
        assert!(d.is_admitted());
        assert_eq!(
            (d.remaining(), d.reset_after_ns(), d.replenish_after_ns()),
            (10, 0, None),
            "{text}"
        );
        assert_eq!(limiter.peek_n(4).remaining(), 10, "{text}");
        limiter.check_n(3);
        assert_eq!(limiter.peek_n(1).remaining(), 7, "{text}");
        let keyed = KeyedLimiter::<str, _>::with_clock(&policy(text), 100, ManualClock::new(0));
        assert_eq!(keyed.request("k").peek().remaining(), 10, "{text}");
        keyed.request("k").cost(3).check();
        assert_eq!(keyed.request("k").cost(2).peek().remaining(), 7, "{text}");
        let d = keyed.request("k").cost(8).peek();
        assert_eq!((d.outcome(), d.remaining()), (Outcome::Rejected, 7), "{text}");
    }
}

#[test]
fn a_full_table_is_its_own_outcome() {
    let limiter = KeyedLimiter::<u64>::builder(&policy("token-bucket capacity=5 rate=1/h"), 8)
        .clock(ManualClock::new(0))
        .on_full(ratewell::OnFull::Refuse)
        .build()
        .expect("a table of this capacity");
    let mut refused = None;
    for k in 0..64u64 {
        let d = limiter.check(&k);
        if !d.is_admitted() {
            refused = Some(d);
            break;
        }
    }
    let d = refused.expect("a table of 8 refuses a new key among 64");
    assert_eq!(d.outcome(), Outcome::TableFull);
    assert!(d.is_table_full() && !d.is_impossible());
    assert!(d.retry_after_ns().is_some());
}

/// Every algorithm's policies, each with a limit of `n` (a leaky bucket: burst `n - 1`).
fn of_limit(n: u32) -> Vec<String> {
    vec![
        format!("token-bucket capacity={n} rate=1/h"),
        format!("token-bucket capacity={n} refill=1 every=1h"),
        format!("leaky-bucket rate=1/h burst={} nodelay", n - 1),
        format!("leaky-bucket rate=1r/m burst={} nodelay compat=nginx", n - 1),
        format!("fixed-window limit={n} window=1h"),
        format!("sliding-window limit={n} window=1h"),
    ]
}

#[test]
fn a_policy_change_keeps_what_keys_consumed() {
    // Every pair of one-word algorithms, to a larger, an equal and a smaller limit: a key that
    // consumed `used` of 10 has `max(0, new - used)` left, not a fresh budget.
    for from in of_limit(10) {
        for (to_limit, used) in [(14u64, 10u32), (10, 4), (6, 9), (6, 3)] {
            for to in of_limit(to_limit as u32) {
                let limiter = KeyedLimiter::<str, _>::with_clock(
                    &policy(&from),
                    100,
                    ManualClock::new(5 * H),
                );
                assert!(limiter.request("k").cost(used).check().is_admitted(), "{from}");
                assert!(limiter.check("fresh-later").is_admitted());
                limiter.set_policy(&policy(&to)).unwrap();
                let left = to_limit.saturating_sub(u64::from(used));
                assert_eq!(
                    limiter.request("k").peek().remaining(),
                    left,
                    "{from} -> {to} after {used}"
                );
                assert_eq!(limiter.request("never-seen").peek().remaining(), to_limit, "{to}");
            }
        }
    }
    // A sliding log keeps its log: the same requests, read under the new limit.
    let limiter = KeyedLimiter::<str, _>::with_clock(
        &policy("sliding-log limit=10 window=1m"),
        100,
        ManualClock::new(0),
    );
    assert!(limiter.request("k").cost(7).check().is_admitted());
    limiter.set_policy(&policy("sliding-log limit=9 window=1m")).unwrap();
    assert_eq!(limiter.request("k").peek().remaining(), 2);
}

#[test]
fn policies_change_any_number_of_times_under_load() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let limiter = std::sync::Arc::new(KeyedLimiter::<u64, _>::with_clock(
        &policy("fixed-window limit=1 window=1s"),
        4096,
        ManualClock::new(0),
    ));
    let done = std::sync::Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..2u64)
        .map(|t| {
            let (limiter, done) = (limiter.clone(), done.clone());
            std::thread::spawn(move || {
                let mut decisions = 0u64;
                // At least one round, however late the thread is scheduled.
                loop {
                    for k in 0..200u64 {
                        let d = limiter.check(&(k * 2 + t));
                        // Every decision is one of the policies' own.
                        assert!((1..=400).contains(&d.limit()), "{d:?}");
                        decisions += 1;
                    }
                    if done.load(Ordering::Relaxed) {
                        break;
                    }
                }
                decisions
            })
        })
        .collect();
    for n in 1..=2000u64 {
        let limit = n % 400 + 1;
        limiter.set_policy(&policy(&format!("fixed-window limit={limit} window=1s"))).unwrap();
        if n % 7 == 0 {
            limiter
                .set_override(
                    &(n % 50),
                    Some(&policy(&format!("fixed-window limit={} window=1s", n % 300 + 1))),
                )
                .unwrap();
        }
        if n % 11 == 0 {
            limiter.set_override(&(n % 50), None).expect("clearing an override cannot fail");
        }
    }
    done.store(true, Ordering::Relaxed);
    for w in workers {
        assert!(w.join().unwrap() > 0);
    }
    // The last default: 2000 % 400 + 1.
    assert_eq!(limiter.check(&1_000_000).limit(), 1);
}

/// Any 64-bit state word, as a store that lost or corrupted its data could hand back: the pure
/// decision and the refund take it without a panic or an overflow (debug builds check), and a
/// decision on it never admits more than the policy's limit at once.
#[test]
fn any_state_word_decides_and_refunds_without_panicking() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    use ratewell::{Nanos, State, WordPolicy};
    let texts = [
        "token-bucket capacity=100000 rate=1/h",
        "token-bucket capacity=3 rate=7/s",
        "token-bucket capacity=4294967295 refill=1 every=1s",
        "token-bucket capacity=5 refill=2 every=250ms",
        "leaky-bucket rate=7/s burst=100000000 delay=3",
        "leaky-bucket rate=1r/m burst=0 nodelay",
        "leaky-bucket rate=1000r/s burst=268435 nodelay compat=nginx",
        "leaky-bucket rate=1r/m burst=3 delay=1 compat=nginx",
        "fixed-window limit=4294967295 window=1s",
        "fixed-window limit=5 window=1m align=first",
        "sliding-window limit=100000 window=1h",
        "sliding-window limit=3 window=1500ms",
    ];
    for text in texts {
        let pure = WordPolicy::new(&policy(text)).unwrap();
        let limit = pure.policy().limit();
        let mut runner = TestRunner::new(Config { cases: 2_000, ..Config::default() });
        let words = (any::<u64>(), any::<u64>(), any::<u64>(), 0..=(i64::MAX as u64), any::<u32>());
        runner
            .run(&words, |(w, before, after, now, cost)| {
                let (w, now) = (State::from_bits(w), Nanos::new(now));
                let (d, next) = pure.decide(w, now, cost);
                prop_assert!(!d.is_admitted() || u64::from(cost.max(1)) <= limit);
                if let Some(next) = next {
                    prop_assert!(pure.peek(next, now, 1).remaining() <= limit);
                }
                let back =
                    pure.refund(w, now, State::from_bits(before), State::from_bits(after), cost);
                let _ = pure.peek(back, now, cost);
                let _ = pure.reset_after_ns(back, now);
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{text}: {e}"));
    }
}
