//! The script decides exactly as the engine does: every algorithm, field for field, on
//! generated sequences with microsecond times (bursts at one instant, steps on and next to the
//! policies' boundaries, mixed and impossible costs, idle gaps of hours), against
//! `ratewell::Limiter` on a manual clock; layered requests against `ratewell::LayeredLimiter`;
//! and the refunds against the engine's reservations.

mod common;

use common::{PATHS, Path, Rng, Server};
use ratewell::{Layer, LayeredLimiter, Limiter, ManualClock, Nanos, Policy};
use ratewell_redis::RedisLimiter;

const POLICIES: &[&str] = &[
    "token-bucket capacity=5 rate=7/s",
    "token-bucket capacity=1 rate=3/s",
    "token-bucket capacity=100 rate=1000/s",
    "token-bucket capacity=10 rate=10/m",
    "token-bucket capacity=4 refill=2 every=1s",
    "token-bucket capacity=7 refill=3 every=250ms",
    "leaky-bucket rate=10r/s burst=5",
    "leaky-bucket rate=3/s burst=4 delay=2",
    "leaky-bucket rate=30r/m burst=2 nodelay",
    "leaky-bucket rate=7/s burst=0",
    "leaky-bucket rate=3/250ms burst=5 delay=2 compat=nginx",
    "leaky-bucket rate=10r/s burst=3 nodelay compat=nginx",
    "leaky-bucket rate=1r/m burst=1 compat=nginx",
    "fixed-window limit=5 window=1s",
    "fixed-window limit=3 window=1m align=first",
    "fixed-window limit=10 window=1500ms",
    "sliding-window limit=5 window=1s",
    "sliding-window limit=100 window=1500ms",
    "sliding-window limit=7 window=3s",
    // Counts times the window beyond 2^52: divided in base-256 digits by the script.
    "sliding-window limit=100000 window=1d",
    "sliding-window limit=3000000 window=7d",
    "sliding-window limit=16777215 window=52d",
    "sliding-log limit=5 window=1s",
    "sliding-log limit=3 window=250ms",
];

/// The next gap (us): on, before and after the policy's boundaries, inside them, or hours.
fn gap(rng: &mut Rng, policy: &Policy) -> u64 {
    let w = (policy.window_ns() / 1_000).max(1);
    let step = (w / policy.limit().max(1)).max(1);
    match rng.below(12) {
        0..=2 => 0,
        3 => 1,
        4 => step,
        5 => step - 1,
        6 => step + 1,
        7 => w,
        8 => w.saturating_sub(1),
        9 => rng.below(w),
        10 => rng.below(step * 3),
        _ => 3_600_000_000 * (1 + rng.below(30)),
    }
}

fn cost(rng: &mut Rng, policy: &Policy) -> u32 {
    match rng.below(10) {
        0..=5 => 1,
        6 | 7 => 1 + rng.below(policy.limit()) as u32,
        8 => policy.limit() as u32 + 1,
        _ => 2,
    }
}

async fn limiter(server: &Server, prefix: &str, layers: &[(&str, &Policy)]) -> RedisLimiter {
    let mut b = RedisLimiter::builder(&server.url()).prefix(prefix);
    for (name, p) in layers {
        b = b.layer(*name, p);
    }
    b.timeout(std::time::Duration::from_secs(5)).build().await.expect("a limiter")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_algorithm_decides_as_the_engine_does() {
    for path in PATHS {
        every_algorithm_decides_as_the_engine_does_on(path).await;
    }
}

async fn every_algorithm_decides_as_the_engine_does_on(path: Path) {
    let server = Server::start_on(path, &[]);
    for (pi, spec) in POLICIES.iter().enumerate() {
        let policy: Policy = spec.parse().unwrap();
        for seed in 1..=12u64 {
            let redis = limiter(&server, &format!("p{pi}s{seed}:"), &[("l", &policy)]).await;
            let clock = ManualClock::new(0);
            let engine = Limiter::with_clock(&policy, clock);
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) + pi as u64);
            // Start anywhere, not only at the epoch: windows and fills are aligned to it.
            let mut t_us = rng.below(10_000_000_000);
            let mut history = Vec::new();
            for step in 0..150 {
                t_us += gap(&mut rng, &policy);
                let c = cost(&mut rng, &policy);
                history.push((t_us, c));
                engine.clock().set(t_us * 1_000);
                let want = engine.check_n(c);
                let got = redis.check_at(&[Some("k")], c, Nanos::new(t_us * 1_000)).await.unwrap();
                assert_eq!(
                    got.layered().layer(0),
                    Some(&want),
                    "{spec}, seed {seed}, step {step}: (t_us, cost) so far {history:?}"
                );
                assert_eq!(got.is_admitted(), want.is_admitted());
            }
            common::assert_path(path, redis.metrics());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layered_requests_decide_as_the_engine_does() {
    for path in PATHS {
        layered_requests_decide_as_the_engine_does_on(path).await;
    }
}

async fn layered_requests_decide_as_the_engine_does_on(path: Path) {
    let server = Server::start_on(path, &[]);
    let sets: &[&[&str]] = &[
        &["token-bucket capacity=5 rate=7/s", "fixed-window limit=8 window=1s"],
        &[
            "leaky-bucket rate=3/s burst=4 delay=2",
            "sliding-window limit=6 window=2s",
            "sliding-log limit=9 window=3s",
        ],
        &["fixed-window limit=2 window=1s dry-run", "token-bucket capacity=3 refill=1 every=500ms"],
        &[
            "leaky-bucket rate=10r/s burst=3 compat=nginx",
            "token-bucket capacity=2 rate=1/s dry-run",
        ],
    ];
    for (si, set) in sets.iter().enumerate() {
        let policies: Vec<Policy> = set.iter().map(|s| s.parse().unwrap()).collect();
        let names: Vec<String> = (0..policies.len()).map(|i| format!("l{i}")).collect();
        for seed in 1..=10u64 {
            let layers: Vec<(&str, &Policy)> =
                names.iter().map(String::as_str).zip(policies.iter()).collect();
            let redis = limiter(&server, &format!("set{si}s{seed}:"), &layers).await;
            let engine = LayeredLimiter::with_clock(
                names.iter().zip(&policies).map(|(n, p)| Layer::new(n.clone(), p)).collect(),
                ManualClock::new(0),
            )
            .unwrap();
            let mut rng = Rng(seed * 7919 + si as u64);
            let mut t_us = rng.below(1_000_000_000);
            for step in 0..150 {
                t_us += gap(&mut rng, &policies[0]);
                let c = cost(&mut rng, &policies[1]).min(4);
                // Two keys: a layer's key is sometimes absent (the layer skipped).
                let who = if rng.below(2) == 0 { "a" } else { "b" };
                let skip = rng.below(5) == 0;
                let keys: Vec<Option<&str>> = (0..policies.len())
                    .map(|i| if skip && i == 1 { None } else { Some(who) })
                    .collect();
                let dyn_keys: Vec<&dyn ratewell::LayerKey> = keys
                    .iter()
                    .map(|k| match k {
                        Some(k) => k as &dyn ratewell::LayerKey,
                        None => &ratewell::Absent as &dyn ratewell::LayerKey,
                    })
                    .collect();
                engine.clock().set(t_us * 1_000);
                let want = engine.check(&dyn_keys, c).unwrap();
                let got = redis.check_at(&keys, c, Nanos::new(t_us * 1_000)).await.unwrap();
                let ctx = format!("{set:?}, seed {seed}, step {step}");
                if std::env::var("DEBUG_PARITY").is_ok() {
                    eprintln!(
                        "t={t_us} c={c} keys={keys:?} want={:?} got={:?}",
                        want.decision(),
                        got.decision()
                    );
                }
                assert_eq!(got.is_admitted(), want.is_admitted(), "{ctx}");
                assert_eq!(got.decision(), want.decision(), "{ctx}");
                assert_eq!(got.layered().decided_by(), want.decided_by(), "{ctx}");
                assert_eq!(
                    got.layered().would_reject().collect::<Vec<_>>(),
                    want.would_reject().collect::<Vec<_>>(),
                    "{ctx}"
                );
                for i in 0..policies.len() {
                    assert_eq!(got.layered().layer(i), want.layer(i), "{ctx}, layer {i}");
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_restore_what_the_engine_restores() {
    for path in PATHS {
        refunds_restore_what_the_engine_restores_on(path).await;
    }
}

async fn refunds_restore_what_the_engine_restores_on(path: Path) {
    let server = Server::start_on(path, &[]);
    for (pi, spec) in POLICIES.iter().enumerate() {
        let policy: Policy = spec.parse().unwrap();
        for seed in 1..=6u64 {
            let redis = limiter(&server, &format!("r{pi}s{seed}:"), &[("l", &policy)]).await;
            let engine =
                LayeredLimiter::with_clock(vec![Layer::new("l", &policy)], ManualClock::new(0))
                    .unwrap();
            let mut rng = Rng(seed * 104_729 + pi as u64);
            let mut t_us = rng.below(1_000_000_000);
            // Reservations held, to cancel later: (engine's, Redis's receipt).
            let mut held: Vec<(ratewell::OwnedReservation<ManualClock>, ratewell_redis::Receipt)> =
                Vec::new();
            let engine = std::sync::Arc::new(engine);
            for step in 0..120 {
                t_us += gap(&mut rng, &policy) / 4;
                engine.clock().set(t_us * 1_000);
                let now = Nanos::new(t_us * 1_000);
                let ctx = format!("{spec}, seed {seed}, step {step}");
                if !held.is_empty() && rng.below(3) == 0 {
                    let (reservation, receipt) = held.remove(rng.below(held.len() as u64) as usize);
                    reservation.cancel();
                    redis.refund_at(&receipt, now).await.unwrap();
                } else {
                    let c = cost(&mut rng, &policy).min(3);
                    let want = engine.clone().reserve_owned(&[&"k"], c).unwrap();
                    let got = redis.check_at(&[Some("k")], c, now).await.unwrap();
                    assert_eq!(got.layered().layer(0), want.decision().layer(0), "{ctx}");
                    if want.decision().is_admitted() && rng.below(2) == 0 {
                        held.push((want, got.receipt().expect("an admitted charge").clone()));
                    } else {
                        want.commit();
                    }
                }
                // The states agree: the same probe decides the same.
                let probe = engine.peek(&[&"k"], 1).unwrap();
                let got = redis.peek_at(&[Some("k")], 1, now).await.unwrap();
                assert_eq!(got.layered().layer(0), probe.layer(0), "{ctx}: after the step");
            }
        }
    }
}

/// The server's clock may step back: the script then decides as the engine's pure decision does
/// with no running maximum (the per-key rule: a reading earlier than the key's state never mints
/// capacity), field for field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_stepping_back_decides_as_the_per_key_rule() {
    for path in PATHS {
        a_clock_stepping_back_decides_as_the_per_key_rule_on(path).await;
    }
}

async fn a_clock_stepping_back_decides_as_the_per_key_rule_on(path: Path) {
    use ratewell::{State, WordPolicy};
    let server = Server::start_on(path, &[]);
    for (pi, spec) in POLICIES.iter().enumerate() {
        let policy: Policy = spec.parse().unwrap();
        let Some(pure) = WordPolicy::new(&policy) else { continue };
        for seed in 1..=6u64 {
            let redis = limiter(&server, &format!("back{pi}s{seed}:"), &[("l", &policy)]).await;
            let mut state = State::FRESH;
            let mut rng = Rng(seed.wrapping_mul(0x51_7cc1_b727_220a) + pi as u64);
            let mut t_us = 10_000_000_000 + rng.below(1_000_000_000);
            for step in 0..150 {
                if rng.below(4) == 0 {
                    // Back by up to a few windows (far less than any idle horizon).
                    t_us -= rng.below(3 * (policy.window_ns() / 1_000).max(1)).min(t_us);
                } else {
                    t_us += gap(&mut rng, &policy).min(100_000_000_000);
                }
                let c = cost(&mut rng, &policy);
                let (want, next) = pure.decide(state, Nanos::new(t_us * 1_000), c);
                state = next.unwrap_or(state);
                let got = redis.check_at(&[Some("k")], c, Nanos::new(t_us * 1_000)).await.unwrap();
                assert_eq!(got.layered().layer(0), Some(&want), "{spec}, seed {seed}, step {step}");
            }
        }
    }
}
