//! Policies registered with a keyed limiter and named per call (`register`, `check_with`,
//! `take_with`, `refund`): each key decides exactly as the reference model of the policy it is
//! decided under, a key switched between policies keeps what it consumed as `set_policy` keeps
//! it, charges taken back restore the state, and released policies free their slots.

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

/// Keys of two registered policies interleaved in one table decide as two separate models.
#[test]
fn each_key_decides_as_the_model_of_its_policy() {
    let clock = ManualClock::new(0);
    let limiter = KeyedLimiter::<u64, _>::with_clock(
        &policy("token-bucket capacity=1 rate=1/h"),
        1024,
        clock.clone(),
    );
    let fixed = limiter.register(&policy("fixed-window limit=7 window=1s")).unwrap();
    let gcra = limiter.register(&policy("token-bucket capacity=5 rate=10/s")).unwrap();
    let mut fixed_models: Vec<common::Fixed> = (0..50)
        .map(|_| common::Fixed { limit: 7, window: S.into(), first: false, state: None })
        .collect();
    let mut gcra_models: Vec<common::Gcra> = (0..50)
        .map(|_| common::Gcra { capacity: 5, count: 10, period: S.into(), tat: None })
        .collect();
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
    let mut t = 0;
    for _ in 0..20_000 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        t += rng % (40 * MS);
        clock.set(t);
        let k = (rng >> 20) % 100;
        let cost = 1 + ((rng >> 40) % 3) as u32;
        let (got, want) = if k < 50 {
            let d = limiter.request(&k).policy(&fixed).cost(cost).check();
            (d.is_admitted(), fixed_models[k as usize].step(t.into(), cost.into()))
        } else {
            let d = limiter.request(&k).policy(&gcra).cost(cost).check();
            (d.is_admitted(), gcra_models[(k - 50) as usize].step(t.into(), cost.into()))
        };
        assert_eq!(got, matches!(want, Verdict::Admitted { .. }), "key {k} at {t} cost {cost}");
    }
    limiter.release(fixed);
    limiter.release(gcra);
}

/// A key decided under another policy than last time is converted as `set_policy` converts a
/// limiter's keys: what it consumed stays consumed.
#[test]
fn switching_policies_keeps_what_was_consumed() {
    let limiter = KeyedLimiter::<str, _>::with_clock(
        &policy("fixed-window limit=1 window=1s"),
        100,
        ManualClock::new(0),
    );
    let ten = limiter.register(&policy("fixed-window limit=10 window=1h")).unwrap();
    let fourteen = limiter.register(&policy("fixed-window limit=14 window=1h")).unwrap();
    assert_eq!(limiter.request("k").policy(&ten).cost(10).check().remaining(), 0);
    assert!(!limiter.request("k").policy(&ten).check().is_admitted());
    // The reference: the same consumption converted by a default-policy change.
    let reference = KeyedLimiter::<str, _>::with_clock(
        &policy("fixed-window limit=10 window=1h"),
        100,
        ManualClock::new(0),
    );
    assert!(reference.request("k").cost(10).check().is_admitted());
    reference.set_policy(&policy("fixed-window limit=14 window=1h")).unwrap();
    let want = reference.request("k").peek().remaining();
    assert_eq!(want, 4);
    assert_eq!(limiter.request("k").policy(&fourteen).peek().remaining(), want);
    assert_eq!(limiter.request("k").policy(&fourteen).cost(4).check().remaining(), 0);
    assert!(!limiter.request("k").policy(&fourteen).check().is_admitted());
    // And back: 14 consumed of 10 is still exhausted.
    assert!(!limiter.request("k").policy(&ten).check().is_admitted());
    assert_eq!(ten.policy(), &policy("fixed-window limit=10 window=1h"));
    limiter.release(ten);
    limiter.release(fourteen);
}

#[test]
fn a_refund_restores_the_state_and_is_counted() {
    let limiter = KeyedLimiter::<str, _>::with_clock(
        &policy("fixed-window limit=1 window=1s"),
        100,
        ManualClock::new(5 * S),
    );
    for text in [
        "fixed-window limit=5 window=1m",
        "token-bucket capacity=5 rate=1/s",
        "sliding-window limit=5 window=1m",
        "leaky-bucket rate=1r/s burst=4 nodelay",
    ] {
        let id = limiter.register(&policy(text)).unwrap();
        let before = limiter.request(text).policy(&id).peek();
        let (decision, charge) = limiter.request(text).policy(&id).cost(3).take();
        assert!(decision.is_admitted(), "{text}");
        assert_eq!(decision.remaining(), before.remaining() - 3, "{text}");
        limiter.refund(charge.expect("admitted"));
        assert_eq!(limiter.request(text).policy(&id).peek(), before, "{text}: restored exactly");
        // A rejection charges nothing and hands back no charge.
        let (decision, charge) = limiter.request(text).policy(&id).cost(6).take();
        assert!(!decision.is_admitted() && charge.is_none(), "{text}");
        limiter.release(id);
    }
    assert_eq!(limiter.metrics().refunds, 4);
}

#[test]
fn the_sliding_log_registers_logs_only() {
    let limiter = KeyedLimiter::<str, _>::with_clock(
        &policy("sliding-log limit=2 window=1s"),
        100,
        ManualClock::new(0),
    );
    let err = limiter.register(&policy("fixed-window limit=3 window=1s")).unwrap_err();
    assert!(err.expected().contains("same kind"), "{err}");
    let three = limiter.register(&policy("sliding-log limit=3 window=1s")).unwrap();
    let (_, charge) = limiter.request("k").policy(&three).cost(3).take();
    assert!(!limiter.request("k").policy(&three).check().is_admitted());
    limiter.refund(charge.unwrap());
    assert_eq!(limiter.request("k").policy(&three).check().remaining(), 2);
    limiter.release(three);
}

/// Registrations come and go with reloads: released policies free their slots, so a limiter
/// registers any number of policies over its life, at most 255 at once.
#[test]
fn released_policies_free_their_slots() {
    let limiter = KeyedLimiter::<str, _>::with_clock(
        &policy("fixed-window limit=1 window=1s"),
        1000,
        ManualClock::new(0),
    );
    let keep = limiter.register(&policy("fixed-window limit=9 window=1h")).unwrap();
    assert!(limiter.request("kept").policy(&keep).cost(4).check().is_admitted());
    for n in 1..=2000u64 {
        let id = limiter.register(&policy(&format!("fixed-window limit={n} window=1h"))).unwrap();
        assert_eq!(limiter.request("churn").policy(&id).check().limit(), n);
        limiter.release(id);
    }
    assert_eq!(limiter.request("kept").policy(&keep).peek().remaining(), 5, "survived every sweep");
    // Registering one policy twice takes one slot; 255 distinct at once is the most.
    let a = limiter.register(&policy("fixed-window limit=9 window=1h")).unwrap();
    let mut held = vec![a];
    let mut n = 0;
    let err = loop {
        n += 1;
        match limiter.register(&policy(&format!("fixed-window limit={n} window=1m"))) {
            Ok(id) => held.push(id),
            Err(e) => break e,
        }
    };
    assert!(err.expected().contains("255"), "{err}");
    // The default and `keep`'s slot are taken: 253 more.
    assert_eq!(n - 1, 253);
    for id in held {
        limiter.release(id);
    }
    limiter.release(keep);
}

#[test]
#[should_panic(expected = "another KeyedLimiter")]
fn an_id_of_another_limiter_is_refused() {
    let p = policy("fixed-window limit=1 window=1s");
    let a = KeyedLimiter::<str>::new(&p, 10);
    let b = KeyedLimiter::<str>::new(&p, 10);
    let id = a.register(&p).unwrap();
    let _ = b.request("k").policy(&id).check();
}

/// Threads charging two keys under two policies, refunding the first when the second rejects:
/// each key ends with exactly what the admitted pairs took, and no more pairs than the tighter
/// key allows are admitted.
#[test]
fn pairs_charged_and_refunded_by_threads_stay_exact() {
    let limiter = Arc::new(KeyedLimiter::<str, _>::with_clock(
        &policy("fixed-window limit=1 window=1s"),
        1024,
        ManualClock::new(0),
    ));
    let wide = Arc::new(limiter.register(&policy("fixed-window limit=1000 window=1h")).unwrap());
    let tight = Arc::new(limiter.register(&policy("fixed-window limit=300 window=1h")).unwrap());
    let threads = 4;
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (limiter, wide, tight, barrier) =
                (limiter.clone(), wide.clone(), tight.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                let mut admitted = 0u64;
                for _ in 0..250 {
                    let (_, first) = limiter.request("wide").policy(&wide).take();
                    let Some(first) = first else { continue };
                    let (second, _) = limiter.request("tight").policy(&tight).take();
                    if second.is_admitted() {
                        admitted += 1;
                    } else {
                        limiter.refund(first);
                    }
                }
                admitted
            })
        })
        .collect();
    let admitted: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(admitted, 300);
    assert_eq!(limiter.request("tight").policy(&tight).peek().remaining(), 0);
    assert_eq!(limiter.request("wide").policy(&wide).peek().remaining(), 700);
}
