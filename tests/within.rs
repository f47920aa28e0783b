//! Limits chosen per call (`take_within`, `peek_within`): one registered fixed window decides
//! keys each at the limit its call names, exactly as the reference model of a fixed window at
//! that limit; a key whose limit changes between calls keeps its count; charges taken back
//! restore the state; concurrent calls admit exactly the limit.

use ratewell_model as common;

use std::sync::{Arc, Barrier};
use std::thread;

use common::{Model, Verdict};
use ratewell::{KeyedLimiter, ManualClock, Policy};

const S: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;

fn policy(text: &str) -> Policy {
    text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn xorshift(rng: &mut u64) -> u64 {
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    *rng
}

/// 200 keys, each with a limit of its own (up to 5,000 distinct limits over the run, some keys'
/// limits changing between calls), decided on one registered window against one model each.
#[test]
fn every_call_decides_as_the_model_at_its_limit() {
    let clock = ManualClock::new(0);
    let limiter = KeyedLimiter::<u64, _>::with_clock(
        &policy("token-bucket capacity=1 rate=1/h"),
        4096,
        clock.clone(),
    );
    let window = limiter.register(&policy("fixed-window limit=4294967295 window=1s")).unwrap();
    let mut models: Vec<common::Fixed> = (0..200)
        .map(|_| common::Fixed { limit: 0, window: S.into(), first: false, state: None })
        .collect();
    let mut rng = 0x2545_f491_4f6c_dd1d_u64;
    let mut t = 0;
    for step in 0..30_000 {
        let r = xorshift(&mut rng);
        t += r % (30 * MS);
        clock.set(t);
        let k = (r >> 16) % 200;
        // Most keys keep their limit (1..=25); one call in eight names another.
        let limit = if (r >> 30).is_multiple_of(8) {
            1 + ((r >> 33) % 5_000) as u32
        } else {
            1 + (k % 25) as u32
        };
        let cost = 1 + ((r >> 50) % 4) as u32;
        let model = &mut models[k as usize];
        model.limit = limit.into();
        if step % 5 == 0 {
            let d = limiter.request(&k).within(&window, limit).cost(cost).peek();
            let (_, count) = model_count(model, t);
            assert_eq!(d.limit(), u64::from(limit));
            assert_eq!(u128::from(d.remaining()), u128::from(limit).saturating_sub(count));
            continue;
        }
        let want = model.step(t.into(), cost.into());
        let (d, charge) = limiter.request(&k).within(&window, limit).cost(cost).take();
        let admitted = matches!(want, Verdict::Admitted { .. });
        assert_eq!(d.is_admitted(), admitted, "key {k} at {t}, cost {cost}, limit {limit}");
        assert_eq!(charge.is_some(), admitted);
        assert_eq!(d.limit(), u64::from(limit));
        let (_, count) = model_count(model, t);
        assert_eq!(u128::from(d.remaining()), u128::from(limit).saturating_sub(count), "key {k}");
        // One admission in seven is taken back at once: the model forgets it too.
        if let Some(charge) = charge.filter(|_| (r >> 60) == 0) {
            limiter.refund(charge);
            let (start, count) = model_count(model, t);
            model.state = Some((start, count - u128::from(cost)));
        }
    }
    limiter.release(window);
}

/// The model's window at `t` and its count.
fn model_count(model: &common::Fixed, t: u64) -> (u128, u128) {
    match model.state {
        Some((start, count)) if u128::from(t) < start + model.window => (start, count),
        _ => (u128::from(t) / model.window * model.window, 0),
    }
}

/// A key's limit lowered below what it has consumed reads as a full window until the window
/// ends; raised again, the count is what it was.
#[test]
fn a_changed_limit_keeps_the_count() {
    let clock = ManualClock::new(0);
    let limiter =
        KeyedLimiter::<str, _>::with_clock(&policy("fixed-window limit=1 window=1s"), 64, clock);
    let window = limiter.register(&policy("fixed-window limit=4294967295 window=1m")).unwrap();
    assert_eq!(limiter.request("k").within(&window, 10).cost(8).take().0.remaining(), 2);
    let d = limiter.request("k").within(&window, 5).take().0;
    assert!(!d.is_admitted());
    assert_eq!((d.limit(), d.remaining()), (5, 0));
    assert_eq!(limiter.request("k").within(&window, 10).cost(2).take().0.remaining(), 0);
    limiter.release(window);
}

/// A policy other than a fixed window decides by its own limit (`take_with`'s decision), and
/// a limit above the window's own is the window's.
#[test]
fn limits_apply_to_fixed_windows_only() {
    let clock = ManualClock::new(0);
    let limiter =
        KeyedLimiter::<str, _>::with_clock(&policy("fixed-window limit=1 window=1s"), 64, clock);
    let bucket = limiter.register(&policy("token-bucket capacity=5 rate=1/s")).unwrap();
    let d = limiter.request("k").within(&bucket, 2).take().0;
    assert_eq!((d.limit(), d.remaining()), (5, 4));
    let small = limiter.register(&policy("fixed-window limit=3 window=1s")).unwrap();
    let d = limiter.request("j").within(&small, 1_000).take().0;
    assert_eq!((d.limit(), d.remaining()), (3, 2));
    limiter.release(bucket);
    limiter.release(small);
}

/// Four threads, 250 calls each of cost 1 on one key at a limit of 300: exactly 300 admitted.
#[test]
fn concurrent_calls_admit_exactly_the_limit() {
    let limiter = Arc::new(KeyedLimiter::<str, _>::with_clock(
        &policy("fixed-window limit=1 window=1s"),
        64,
        ManualClock::new(0),
    ));
    let window =
        Arc::new(limiter.register(&policy("fixed-window limit=4294967295 window=1h")).unwrap());
    let barrier = Arc::new(Barrier::new(4));
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let (limiter, window, barrier) = (limiter.clone(), window.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                (0..250)
                    .filter(|_| limiter.request("k").within(&window, 300).take().0.is_admitted())
                    .count()
            })
        })
        .collect();
    let admitted: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(admitted, 300);
    assert_eq!(limiter.request("k").within(&window, 300).peek().remaining(), 0);
    assert_eq!(limiter.request("k").within(&window, 1_000).peek().remaining(), 700);
}
