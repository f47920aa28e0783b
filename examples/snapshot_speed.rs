//! How long a snapshot of a million keys takes to write and to restore, and its size.
//!
//! `cargo run --release --example snapshot_speed [keys] [rounds]`: fills a table (capacity
//! keys / 0.9) with `keys` distinct keys, then alternates, `rounds` times, a snapshot into memory,
//! a save to a file (synced, renamed) and a restore, and prints each one's median.

use std::time::{Duration, Instant, SystemTime};

use ratewell::{KeyedLimiter, ManualClock, Policy, Resume};

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let keys: u64 = args.next().map_or(Ok(1_000_000), |a| a.parse())?;
    let rounds: usize = args.next().map_or(Ok(5), |a| a.parse())?;
    let policy: Policy = "token-bucket capacity=100 rate=100/h".parse()?;
    let capacity = (keys as f64 / 0.9) as usize;
    let clock = ManualClock::new(1_000_000_000);
    let limiter = KeyedLimiter::<u64, _>::with_clock(&policy, capacity, clock.clone());
    for k in 0..keys {
        limiter.check(&k);
    }
    let live = limiter.metrics().keys;
    let path =
        std::env::temp_dir().join(format!("ratewell-snapshot-speed-{}.bin", std::process::id()));
    let mut restored = KeyedLimiter::<u64, _>::with_clock(&policy, capacity, clock.clone());
    let (mut write, mut save, mut restore) = (Vec::new(), Vec::new(), Vec::new());
    let mut bytes = Vec::new();
    for _ in 0..rounds {
        bytes.clear();
        let t = Instant::now();
        let info = limiter.snapshot(&mut bytes)?;
        write.push(t.elapsed());
        assert_eq!(info.keys, live);

        let t = Instant::now();
        limiter.save(&path)?;
        save.push(t.elapsed());

        let t = Instant::now();
        let r = restored.restore(&bytes[..], Resume::At(SystemTime::now()))?;
        restore.push(t.elapsed());
        assert_eq!(r.keys, live);
    }
    std::fs::remove_file(&path)?;
    println!("keys: {live} (capacity {})", limiter.metrics().capacity);
    println!("bytes: {} ({:.2} a key)", bytes.len(), bytes.len() as f64 / live as f64);
    println!("snapshot into memory: median {:?} of {rounds}", median(write));
    println!("save to a file (synced, renamed): median {:?} of {rounds}", median(save));
    println!("restore from memory: median {:?} of {rounds}", median(restore));
    Ok(())
}
