#![allow(missing_docs)] // the benchmark macros generate undocumented modules
//! Instructions per warm keyed hit on a shared table (`KeyedLimiter::open_shared`, a file in
//! /dev/shm, its `SharedClock`) beside the same on a heap table (`QuantaClock`), both on the TSC,
//! as `benches/instructions.rs` measures: `N` and `2N` decisions after the same setup, the
//! difference divided by `N` (`python3 benches/iai.py summary`). A bench of its own, not a group
//! of `instructions.rs`, so that it changes nothing of how that file's benchmarks compile. Linux
//! (shared tables are). Not gated: `.ci/run` builds it; `benches/README.md` quotes it.

use std::hint::black_box;

use iai_callgrind::{library_benchmark, library_benchmark_group, main};
use ratewell::{KeyedLimiter, Policy, QuantaClock, SharedClock};

const N: u64 = 1000;
const GCRA: &str = "token-bucket capacity=1000000000 rate=1000000000/s";

fn policy() -> Policy {
    GCRA.parse().unwrap()
}

fn each_key(n: u64, mut f: impl FnMut(&u64)) {
    let keys: Vec<u64> = (0..N).collect();
    for _ in 0..n / N {
        keys.iter().for_each(&mut f);
    }
}

fn heap() -> KeyedLimiter<u64, QuantaClock> {
    let l = KeyedLimiter::new(&policy(), 8 * N as usize);
    (0..N).for_each(|k| {
        l.check(&k);
    });
    l
}

fn shared() -> KeyedLimiter<u64, SharedClock> {
    let dir = if std::path::Path::new("/dev/shm").is_dir() {
        "/dev/shm".into()
    } else {
        std::env::temp_dir()
    };
    let path = dir.join(format!("ratewell-iai-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let l = KeyedLimiter::open_shared(&path, &policy(), 8 * N as usize).expect("a shared table");
    // The mapping stays; the name goes.
    let _ = std::fs::remove_file(&path);
    (0..N).for_each(|k| {
        l.check(&k);
    });
    l
}

#[library_benchmark]
#[bench::hit_1k_x1(heap(), N)]
#[bench::hit_1k_x2(heap(), 2 * N)]
fn heap_allow(limiter: KeyedLimiter<u64, QuantaClock>, n: u64) {
    each_key(n, |k| {
        black_box(limiter.allow(k));
    });
}

#[library_benchmark]
#[bench::hit_1k_x1(shared(), N)]
#[bench::hit_1k_x2(shared(), 2 * N)]
fn shared_allow(limiter: KeyedLimiter<u64, SharedClock>, n: u64) {
    each_key(n, |k| {
        black_box(limiter.allow(k));
    });
}

#[library_benchmark]
#[bench::hit_1k_x1(heap(), N)]
#[bench::hit_1k_x2(heap(), 2 * N)]
fn heap_check(limiter: KeyedLimiter<u64, QuantaClock>, n: u64) {
    each_key(n, |k| {
        black_box(limiter.check(k));
    });
}

#[library_benchmark]
#[bench::hit_1k_x1(shared(), N)]
#[bench::hit_1k_x2(shared(), 2 * N)]
fn shared_check(limiter: KeyedLimiter<u64, SharedClock>, n: u64) {
    each_key(n, |k| {
        black_box(limiter.check(k));
    });
}

library_benchmark_group!(
    name = shared_group;
    benchmarks = heap_allow, shared_allow, heap_check, shared_check
);

main!(library_benchmark_groups = shared_group);
