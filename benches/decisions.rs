//! Nanoseconds per decision, against governor and the physical baselines, in one run.
//!
//! Groups: `baseline` (TSC reads, an uncontended CAS, a TSC read plus a CAS); `direct` (every
//! algorithm's allowed and denied paths next to governor's direct check); `keyed` (hits at 1k, 1M
//! and 10M keys, single calls and batches over one request stream, with the TSC clock and the
//! coarse clock, next to governor's keyed limiter on its default clock and on its upkeep clock,
//! and a dependent DRAM pointer chase over the same bytes); `contention` (1 and 2 threads, or the counts in `RATEWELL_BENCH_THREADS`, on
//! distinct keys in and out of cache, the in-cache keys again in a sparse table, and on one hot
//! key, allowed and denied, and governor on the same distinct keys); `flood` (a new key into a
//! full table, sliding log and one-word); `layered` (1k keys in cache: a layered limiter of one
//! and of two layers, admitted, and rejected by its first layer, next to a keyed limiter's check
//! and rejection and to two governor keyed checks in sequence). See benches/README.md for the
//! commands and the recorded results.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use governor::clock::QuantaUpkeepClock;
use governor::{Quota, RateLimiter};
use ratewell::{
    CoarseClock, KeyedLimiter, Layer, LayerKey, LayeredDecision, LayeredLimiter, Limiter, Policy,
};

fn policy(text: &str) -> Policy {
    text.parse().unwrap()
}

/// A policy of each algorithm that always admits (at one decision per ns at most), and one that
/// denies after its first decision.
const ALLOWING: &[(&str, &str)] = &[
    ("gcra", "token-bucket capacity=1000000000 rate=1000000000/s"),
    ("discrete", "token-bucket capacity=1000000000 refill=1000000000 every=1s"),
    ("leaky", "leaky-bucket rate=1000000000/s burst=1000000000 nodelay"),
    ("leaky_nginx", "leaky-bucket rate=1000000000r/s burst=200000 nodelay compat=nginx"),
    ("fixed", "fixed-window limit=4000000000 window=1s"),
    ("sliding", "sliding-window limit=100000 window=1ms"),
    ("sliding_log", "sliding-log limit=65536 window=1us"),
];

const DENYING: &[(&str, &str)] = &[
    ("gcra", "token-bucket capacity=1 rate=1/h"),
    ("discrete", "token-bucket capacity=1 refill=1 every=1h"),
    ("leaky", "leaky-bucket rate=1/h nodelay"),
    ("leaky_nginx", "leaky-bucket rate=1r/m nodelay compat=nginx"),
    ("fixed", "fixed-window limit=1 window=1h"),
    ("sliding", "sliding-window limit=1 window=1h"),
    ("sliding_log", "sliding-log limit=1 window=1h"),
];

fn baseline(c: &mut Criterion) {
    let mut g = c.benchmark_group("baseline");
    g.warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(2));
    let clock = quanta::Clock::new();
    g.bench_function("quanta_raw", |b| b.iter(|| black_box(clock.raw())));
    g.bench_function("quanta_now", |b| b.iter(|| black_box(clock.now())));
    let _upkeep = quanta::Upkeep::new(Duration::from_millis(1)).start();
    g.bench_function("quanta_recent", |b| b.iter(|| black_box(clock.recent())));
    let word = AtomicU64::new(0);
    g.bench_function("cas_uncontended", |b| {
        b.iter(|| {
            let v = word.load(Ordering::Relaxed);
            black_box(word.compare_exchange(v, v + 1, Ordering::Relaxed, Ordering::Relaxed))
        })
    });
    g.bench_function("quanta_raw_plus_cas", |b| {
        b.iter(|| {
            let t = clock.raw();
            let v = word.load(Ordering::Relaxed);
            black_box(word.compare_exchange(v, v ^ t, Ordering::Relaxed, Ordering::Relaxed))
        })
    });
    g.finish();
}

fn direct(c: &mut Criterion) {
    let mut g = c.benchmark_group("direct");
    g.warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(2));
    for (name, text) in ALLOWING {
        let limiter = Limiter::new(&policy(text));
        g.bench_function(BenchmarkId::new("allowed", name), |b| {
            b.iter(|| black_box(limiter.check()))
        });
    }
    for (name, text) in DENYING {
        let limiter = Limiter::new(&policy(text));
        limiter.check();
        g.bench_function(BenchmarkId::new("denied", name), |b| {
            b.iter(|| black_box(limiter.check()))
        });
    }
    let lean = Limiter::new(&policy(ALLOWING[0].1));
    g.bench_function(BenchmarkId::new("allowed", "gcra_allow"), |b| {
        b.iter(|| black_box(lean.allow()))
    });
    let lean = Limiter::new(&policy(DENYING[0].1));
    lean.allow();
    g.bench_function(BenchmarkId::new("denied", "gcra_allow"), |b| {
        b.iter(|| black_box(lean.allow()))
    });
    let quota = Quota::per_second(NonZeroU32::new(1_000_000_000).unwrap());
    let governor = RateLimiter::direct(quota);
    g.bench_function(BenchmarkId::new("allowed", "governor"), |b| {
        b.iter(|| black_box(governor.check().is_ok()))
    });
    let governor = RateLimiter::direct(Quota::per_hour(NonZeroU32::new(1).unwrap()));
    let _ = governor.check();
    g.bench_function(BenchmarkId::new("denied", "governor"), |b| {
        b.iter(|| black_box(governor.check().is_ok()))
    });
    g.finish();
}

/// A cheap, full-period sequence over `0..2^64`, mapped into `0..n`: keys in random order.
struct Keys {
    x: u64,
    n: u64,
}

impl Keys {
    #[inline]
    fn next(&mut self) -> u64 {
        self.x =
            self.x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        ((u128::from(self.x >> 16) * u128::from(self.n)) >> 48) as u64
    }
}

/// A random cyclic permutation over `bytes / 64` cache lines: each step is one dependent access.
fn pointer_chase(bytes: usize) -> Vec<u64> {
    let lines = bytes / 64;
    let stride = 8; // u64s per line
    let mut order: Vec<usize> = (0..lines).collect();
    let mut x = 0x2545_f491_4f6c_dd1d_u64;
    // Sattolo's algorithm: a single cycle through every line.
    for i in (1..lines).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let j = (x % i as u64) as usize;
        order.swap(i, j);
    }
    let mut next = vec![0u64; lines * stride];
    for w in 0..lines {
        next[order[w] * stride] = (order[(w + 1) % lines] * stride) as u64;
    }
    next
}

/// Requests a `*_stream` benchmark generates and decides at a time (single calls one by one,
/// the batch as one `check_batch`): the same keys, the same generator, the same per-request work.
const STREAM: usize = 64;

fn keyed(c: &mut Criterion) {
    let mut g = c.benchmark_group("keyed");
    g.warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3)).sample_size(30);
    // The coarse clocks of both limiters read quanta's recent time, kept by one upkeep thread:
    // governor's (started here, for the run) and ratewell's `CoarseClock`, which shares it.
    let upkeep = QuantaUpkeepClock::from_interval(Duration::from_millis(1))
        .expect("quanta's upkeep thread: no other may run in this process");
    let coarse = CoarseClock::new(Duration::from_millis(1));
    // A table at 25% load has a free candidate slot for every key (free slots are taken before
    // reclaimable ones), so every key stays present: every lookup is a hit.
    let text = "token-bucket capacity=1000000000 rate=1/s";
    for n in [1_000u64, 1_000_000, 10_000_000] {
        let limiter = KeyedLimiter::<u64>::new(&policy(text), 4 * n as usize);
        for k in 0..n {
            limiter.check(&k);
        }
        // (A handful may have been reclaimed: a lookup of one of them re-inserts it.)
        let m = limiter.metrics();
        assert!(m.keys >= n - n / 1000 && m.evictions == 0, "{m:?}");
        eprintln!("keyed/{n}: {m:?}; {}", huge_pages());
        let mut keys = Keys { x: 1, n };
        g.bench_function(BenchmarkId::new("ratewell", n), |b| {
            b.iter(|| black_box(limiter.check(&keys.next())))
        });
        g.bench_function(BenchmarkId::new("ratewell_allow", n), |b| {
            b.iter(|| black_box(limiter.allow(&keys.next())))
        });
        // Single calls and batches over the same stream of requests, per decision.
        let stream = |b: &mut criterion::Bencher, keys: &mut Keys, batched: bool| {
            let mut out = Vec::with_capacity(STREAM);
            b.iter_custom(|iters| {
                let start = Instant::now();
                for _ in 0..iters.div_ceil(STREAM as u64) {
                    let ks: [u64; STREAM] = std::array::from_fn(|_| keys.next());
                    let requests: [(&u64, u32); STREAM] = std::array::from_fn(|i| (&ks[i], 1));
                    if batched {
                        limiter.batch(&requests, &mut out);
                        black_box(&out);
                    } else {
                        for &(k, cost) in &requests {
                            black_box(limiter.request(k).cost(cost).check());
                        }
                    }
                }
                start
                    .elapsed()
                    .mul_f64(iters as f64 / (iters.div_ceil(STREAM as u64) * STREAM as u64) as f64)
            })
        };
        g.bench_function(BenchmarkId::new("ratewell_stream_single", n), |b| {
            stream(b, &mut keys, false)
        });
        g.bench_function(BenchmarkId::new("ratewell_stream_batch", n), |b| {
            stream(b, &mut keys, true)
        });
        let bytes = limiter.metrics().memory_bytes as usize;
        drop(limiter);

        let limiter =
            KeyedLimiter::<u64, _>::with_clock(&policy(text), 4 * n as usize, coarse.clone());
        for k in 0..n {
            limiter.check(&k);
        }
        g.bench_function(BenchmarkId::new("ratewell_coarse", n), |b| {
            b.iter(|| black_box(limiter.check(&keys.next())))
        });
        drop(limiter);

        // On 4 KiB pages (a plain allocation: THP here is `madvise`; see benches/README.md).
        let chase = pointer_chase(bytes);
        let mut at = 0u64;
        g.bench_function(BenchmarkId::new("dram_chase", n), |b| {
            b.iter(|| {
                at = chase[at as usize];
                black_box(at)
            })
        });
        drop(chase);

        let quota = Quota::per_second(NonZeroU32::new(1_000_000_000).unwrap());
        let governor = RateLimiter::keyed(quota);
        for k in 0..n {
            let _ = governor.check_key(&k);
        }
        g.bench_function(BenchmarkId::new("governor", n), |b| {
            b.iter(|| black_box(governor.check_key(&keys.next()).is_ok()))
        });
        drop(governor);
        let governor = RateLimiter::dashmap_with_clock(quota, upkeep.clone());
        for k in 0..n {
            let _ = governor.check_key(&k);
        }
        g.bench_function(BenchmarkId::new("governor_upkeep", n), |b| {
            b.iter(|| black_box(governor.check_key(&keys.next()).is_ok()))
        });
    }
    g.finish();
}

/// This process's memory on transparent huge pages, from `/proc/self/smaps_rollup` (Linux).
fn huge_pages() -> String {
    let smaps = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap_or_default();
    let field = |name: &str| {
        smaps
            .lines()
            .find(|l| l.starts_with(name))
            .map_or("?".to_string(), |l| l.split_whitespace().nth(1).unwrap_or("?").to_string())
    };
    format!("Rss {} KiB, AnonHugePages {} KiB", field("Rss:"), field("AnonHugePages:"))
}

/// `threads` threads each make `iters` decisions with `op(thread, i)`; the wall time.
fn parallel(threads: usize, iters: u64, op: Arc<dyn Fn(usize, u64) + Send + Sync>) -> Duration {
    let barrier = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (barrier, op) = (Arc::clone(&barrier), Arc::clone(&op));
            thread::spawn(move || {
                barrier.wait();
                for i in 0..iters {
                    op(t, i);
                }
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    for h in handles {
        h.join().unwrap();
    }
    start.elapsed()
}

fn contention(c: &mut Criterion) {
    let mut g = c.benchmark_group("contention");
    g.warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3)).sample_size(20);
    let hot_allowed = Arc::new(Limiter::new(&policy(ALLOWING[0].1)));
    let hot_denied = Arc::new(Limiter::new(&policy(DENYING[0].1)));
    hot_denied.check();
    // 1 and 2 threads; `RATEWELL_BENCH_THREADS=1,2,4,8,16` on a machine with more cores.
    let counts = std::env::var("RATEWELL_BENCH_THREADS").unwrap_or_else(|_| "1,2".into());
    let counts = counts.split(',').map(|t| t.trim().parse::<u64>().expect("thread counts"));
    for threads in counts {
        // Each thread its own 8,192 keys, all present, in a table of `slots` slots a key (8:
        // 12.5% load, the same for every thread count).
        let keyed = |text: &str, slots: u64| {
            let l = Arc::new(KeyedLimiter::<u64>::new(
                &policy(text),
                ((threads * slots) << 13) as usize,
            ));
            for k in 0..threads << 13 {
                l.check(&k);
            }
            l
        };
        let (allowing, keyed_denied) = (keyed(ALLOWING[0].1, 8), keyed(DENYING[0].1, 8));
        let threads = threads as usize;
        // Distinct keys: thread t walks its own 8,192 keys.
        let l = Arc::clone(&allowing);
        let op: Arc<dyn Fn(usize, u64) + Send + Sync> = Arc::new(move |t, i| {
            black_box(l.check(&((t as u64) << 13 | (i & 8191))));
        });
        g.bench_function(BenchmarkId::new("distinct_keys_allowed", threads), |b| {
            b.iter_custom(|iters| parallel(threads, iters, Arc::clone(&op)))
        });
        let l = Arc::clone(&keyed_denied);
        let op: Arc<dyn Fn(usize, u64) + Send + Sync> = Arc::new(move |t, i| {
            black_box(l.check(&((t as u64) << 13 | (i & 8191))));
        });
        g.bench_function(BenchmarkId::new("distinct_keys_denied", threads), |b| {
            b.iter_custom(|iters| parallel(threads, iters, Arc::clone(&op)))
        });
        drop((allowing, keyed_denied));
        // The control for the false-sharing explanation (benches/README): the same keys, walked
        // the same way, touching as many lines, in a table 16 times larger (0.8% load), where a
        // key's bucket holds a key of another thread with probability ~3% instead of ~39%.
        let sparse = keyed(ALLOWING[0].1, 128);
        let op: Arc<dyn Fn(usize, u64) + Send + Sync> = Arc::new(move |t, i| {
            black_box(sparse.check(&((t as u64) << 13 | (i & 8191))));
        });
        g.bench_function(BenchmarkId::new("distinct_keys_sparse_allowed", threads), |b| {
            b.iter_custom(|iters| parallel(threads, iters, Arc::clone(&op)))
        });
        // The same with governor's keyed limiter (DashMap: a shard's read lock per decision).
        let governor = Arc::new(RateLimiter::keyed(Quota::per_second(
            NonZeroU32::new(1_000_000_000).unwrap(),
        )));
        for k in 0..(threads as u64) << 13 {
            let _ = governor.check_key(&k);
        }
        let op: Arc<dyn Fn(usize, u64) + Send + Sync> = Arc::new(move |t, i| {
            black_box(governor.check_key(&((t as u64) << 13 | (i & 8191))).is_ok());
        });
        g.bench_function(BenchmarkId::new("governor_distinct_keys_allowed", threads), |b| {
            b.iter_custom(|iters| parallel(threads, iters, Arc::clone(&op)))
        });
        // Out of cache: each thread its own 2^20 keys in random order (25% load, as `keyed`), so
        // that a bucket is rarely in another core's cache when a thread writes it.
        let big = Arc::new(KeyedLimiter::<u64>::new(&policy(ALLOWING[0].1), threads << 22));
        for k in 0..(threads as u64) << 20 {
            big.check(&k);
        }
        let op: Arc<dyn Fn(usize, u64) + Send + Sync> = Arc::new(move |t, i| {
            let k = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 44; // 20 bits, scattered
            black_box(big.check(&((t as u64) << 20 | k)));
        });
        g.bench_function(BenchmarkId::new("distinct_keys_out_of_cache_allowed", threads), |b| {
            b.iter_custom(|iters| parallel(threads, iters, Arc::clone(&op)))
        });
        let l = Arc::clone(&hot_allowed);
        let op: Arc<dyn Fn(usize, u64) + Send + Sync> = Arc::new(move |_, _| {
            black_box(l.check());
        });
        g.bench_function(BenchmarkId::new("hot_key_allowed", threads), |b| {
            b.iter_custom(|iters| parallel(threads, iters, Arc::clone(&op)))
        });
        let l = Arc::clone(&hot_denied);
        let op: Arc<dyn Fn(usize, u64) + Send + Sync> = Arc::new(move |_, _| {
            black_box(l.check());
        });
        g.bench_function(BenchmarkId::new("hot_key_denied", threads), |b| {
            b.iter_custom(|iters| parallel(threads, iters, Arc::clone(&op)))
        });
    }
    g.finish();
}

/// A flood of new keys into a full table (an attacker rotating addresses): the time a new key
/// costs once every slot is taken, for the sliding log (a log per key, a lock per shard) and the
/// one-word table (GCRA), at 10,000 and 1,000,000 keys of capacity. Every key is live (a policy
/// of one request an hour), so each new key evicts one.
fn flood(c: &mut Criterion) {
    let mut g = c.benchmark_group("flood");
    g.warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    for (name, text) in [
        ("sliding_log", "sliding-log limit=10 window=1h"),
        ("gcra", "token-bucket capacity=1 rate=1/h"),
    ] {
        for capacity in [10_000u64, 1_000_000] {
            let limiter = KeyedLimiter::<u64>::new(&policy(text), capacity as usize);
            // Fill it: every slot live.
            for k in 0..2 * capacity {
                limiter.check(&k);
            }
            let mut next = 2 * capacity;
            g.bench_function(BenchmarkId::new(name, capacity), |b| {
                b.iter(|| {
                    next += 1;
                    black_box(limiter.check(&next))
                })
            });
        }
    }
    g.finish();
}

/// A layered limiter of `texts`, in order, with 1k keys present on every layer.
fn layered_limiter(texts: &[&str], n: u64) -> LayeredLimiter {
    let layers = texts
        .iter()
        .enumerate()
        .map(|(i, t)| Layer::new(format!("l{i}"), &policy(t)).capacity(8 * n as usize))
        .collect();
    let limiter = LayeredLimiter::new(layers).unwrap();
    for k in 0..n {
        let _ = limiter.check(&[&k], 1);
    }
    limiter
}

fn layered(c: &mut Criterion) {
    let mut g = c.benchmark_group("layered");
    g.warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3)).sample_size(30);
    let n = 1_000u64;
    let allowing = "token-bucket capacity=1000000000 rate=1000000000/s";
    let denying = "token-bucket capacity=1 rate=1/h";
    let keyed = KeyedLimiter::<u64>::new(&policy(allowing), 8 * n as usize);
    let keyed_denying = KeyedLimiter::<u64>::new(&policy(denying), 8 * n as usize);
    for k in 0..n {
        keyed.check(&k);
        keyed_denying.check(&k);
    }
    let mut keys = Keys { x: 1, n };
    g.bench_function("keyed_admitted", |b| b.iter(|| black_box(keyed.check(&keys.next()))));
    g.bench_function("keyed_admitted_allow", |b| b.iter(|| black_box(keyed.allow(&keys.next()))));
    g.bench_function("keyed_rejected", |b| b.iter(|| black_box(keyed_denying.check(&keys.next()))));
    g.bench_function("keyed_rejected_allow", |b| {
        b.iter(|| black_box(keyed_denying.allow(&keys.next())))
    });
    for (name, texts) in [
        ("one_layer_admitted", &[allowing][..]),
        ("two_layers_admitted", &[allowing, allowing][..]),
        ("one_layer_rejected", &[denying][..]),
        ("two_layers_first_rejects", &[denying, allowing][..]),
    ] {
        let limiter = layered_limiter(texts, n);
        // `check_into` a kept decision: `check` returns 328 bytes by copy (see benches/README.md).
        let mut decision = LayeredDecision::default();
        g.bench_function(name, |b| {
            b.iter(|| {
                let k = keys.next();
                let _ = limiter.check_into(&[&k as &dyn LayerKey], 1, &mut decision);
                black_box(decision.is_admitted())
            })
        });
        g.bench_function(format!("{name}_allow"), |b| {
            b.iter(|| {
                let k = keys.next();
                black_box(limiter.allow(&[&k as &dyn LayerKey], 1).unwrap())
            })
        });
    }
    let quota = Quota::per_second(NonZeroU32::new(1_000_000_000).unwrap());
    let (a, b2) = (RateLimiter::keyed(quota), RateLimiter::keyed(quota));
    for k in 0..n {
        let _ = (a.check_key(&k), b2.check_key(&k));
    }
    g.bench_function("governor_two_checks", |b| {
        b.iter(|| {
            let k = keys.next();
            black_box(a.check_key(&k).is_ok() && b2.check_key(&k).is_ok())
        })
    });
    g.finish();
}

/// Decisions on a table of 1M keys, alone and while another thread writes snapshots of it
/// back to back (each shard's insert lock held while it is read; decisions on present keys take
/// no lock).
fn snapshot(c: &mut Criterion) {
    let mut g = c.benchmark_group("snapshot");
    g.warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3)).sample_size(30);
    let n = 1_000_000u64;
    let limiter = Arc::new(KeyedLimiter::<u64>::new(
        &policy("token-bucket capacity=1000000000 rate=1/s"),
        4 * n as usize,
    ));
    for k in 0..n {
        limiter.check(&k);
    }
    let mut keys = Keys { x: 1, n };
    g.bench_function("check_1M", |b| b.iter(|| black_box(limiter.check(&keys.next()))));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let snapshots = Arc::new(AtomicU64::new(0));
    let writer = {
        let (limiter, stop, snapshots) = (limiter.clone(), stop.clone(), snapshots.clone());
        thread::spawn(move || {
            let mut bytes = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                bytes.clear();
                limiter.snapshot(&mut bytes).expect("a snapshot into memory");
                snapshots.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    g.bench_function("check_1M_during_snapshots", |b| {
        b.iter(|| black_box(limiter.check(&keys.next())))
    });
    stop.store(true, Ordering::Relaxed);
    writer.join().expect("the snapshot thread");
    eprintln!(
        "snapshot: {} snapshots of 1M keys written during the run",
        snapshots.load(Ordering::Relaxed)
    );
    g.finish();
}

/// A warm keyed hit on a shared table (`KeyedLimiter::open_shared`, a file in /dev/shm) beside
/// the same on a heap table, at 1,000 and 1,000,000 keys in a table 4 times as large: the shared
/// table's hot path is the heap table's, but it reads the region's clock and counts in the
/// region's cells.
#[cfg(target_os = "linux")]
fn shared(c: &mut Criterion) {
    let mut g = c.benchmark_group("shared");
    g.warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3)).sample_size(30);
    let text = policy("token-bucket capacity=1000000000 rate=1/s");
    let dir = if std::path::Path::new("/dev/shm").is_dir() {
        "/dev/shm".into()
    } else {
        std::env::temp_dir()
    };
    for n in [1_000u64, 1_000_000] {
        let path = dir.join(format!("ratewell-bench-shared-{n}-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let heap = KeyedLimiter::<u64>::new(&text, 4 * n as usize);
        let shared = KeyedLimiter::<u64>::open_shared(&path, &text, 4 * n as usize).unwrap();
        for k in 0..n {
            heap.check(&k);
            shared.check(&k);
        }
        let mut keys = Keys { x: 1, n };
        g.bench_function(BenchmarkId::new("heap", n), |b| {
            b.iter(|| black_box(heap.check(&keys.next())))
        });
        g.bench_function(BenchmarkId::new("shared", n), |b| {
            b.iter(|| black_box(shared.check(&keys.next())))
        });
        g.bench_function(BenchmarkId::new("heap_allow", n), |b| {
            b.iter(|| black_box(heap.allow(&keys.next())))
        });
        g.bench_function(BenchmarkId::new("shared_allow", n), |b| {
            b.iter(|| black_box(shared.allow(&keys.next())))
        });
        drop(shared);
        let _ = std::fs::remove_file(&path);
    }
    g.finish();
}

#[cfg(not(target_os = "linux"))]
fn shared(_: &mut Criterion) {}

criterion_group!(benches, baseline, direct, keyed, contention, flood, layered, snapshot, shared);
criterion_main!(benches);
