//! At what load a keyed table first evicts a live key: random keys, each admitted once under a
//! policy that keeps it live for an hour, into tables of several capacities (and several seeds).
//! `cargo run --release --example first_eviction` (the figure `README.md` quotes).

use ratewell::{KeyedLimiter, ManualClock, Policy};

fn main() -> Result<(), ratewell::PolicyError> {
    let policy: Policy = "token-bucket capacity=1 rate=1/h".parse()?;
    println!("capacity,seed,keys_at_first_eviction,load");
    for capacity in [100_000usize, 1_000_000, 4_000_000] {
        for seed in 1..=3u64 {
            let limiter = KeyedLimiter::<u64>::builder(&policy, capacity)
                .clock(ManualClock::new(0))
                .seed(seed)
                .build()
                .expect("a table of this capacity");
            let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            let mut keys = 0u64;
            while limiter.metrics().evictions == 0 {
                // xorshift64: distinct random keys.
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                limiter.check(&x);
                keys += 1;
            }
            let load = (keys - 1) as f64 / limiter.metrics().capacity as f64;
            println!("{},{seed},{},{load:.3}", limiter.metrics().capacity, keys - 1);
        }
    }
    Ok(())
}
