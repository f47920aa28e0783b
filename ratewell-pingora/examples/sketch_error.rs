//! What pingora-limits' count-min sketch does to keys that stay under their limit: a 10,000-key
//! trace, every key sending at most its limit in one second, through pingora-limits' `Rate`
//! (one second, its default sketch of 4 x 1024 counters shared by every key) and through
//! ratewell's keyed limiter (`fixed-window limit=N window=1s`, one exact count per key). Every
//! rejection is wrong: no key goes over its limit.
//!
//! `cargo run --release --example sketch_error [keys] [limit]` (10000 and 10 by default).

use std::time::{Duration, Instant};

use pingora_limits::rate::Rate;
use ratewell::{KeyedLimiter, ManualClock, Policy};

fn main() {
    let mut args = std::env::args().skip(1);
    let keys: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let limit: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(10);
    // Each key sends between 1 and `limit` requests, interleaved with the others'.
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let counts: Vec<u64> = (0..keys).map(|_| 1 + next() % limit).collect();
    let mut trace: Vec<u64> =
        (0..keys).flat_map(|k| std::iter::repeat_n(k, counts[k as usize] as usize)).collect();
    for i in (1..trace.len()).rev() {
        trace.swap(i, (next() % (i as u64 + 1)) as usize);
    }
    let requests = trace.len();

    // pingora-limits, as its rate-limiter example uses it: reject when the estimate of this
    // second's requests (this one included) is over the limit. Retried (up to 5 times) if the
    // run took long enough to straddle one of its one-second windows.
    let mut attempts = 0;
    let (sketch_rejected, sketch_keys) = loop {
        attempts += 1;
        let rate = Rate::new(Duration::from_secs(1));
        let started = Instant::now();
        let mut rejected = 0u64;
        let mut keys_hit = std::collections::HashSet::new();
        for &k in &trace {
            if rate.observe(&k, 1) > limit as isize {
                rejected += 1;
                keys_hit.insert(k);
            }
        }
        if started.elapsed() < Duration::from_millis(500) || attempts == 5 {
            break (rejected, keys_hit.len());
        }
    };

    let policy: Policy = format!("fixed-window limit={limit} window=1s").parse().expect("a policy");
    let limiter =
        KeyedLimiter::<u64, _>::with_clock(&policy, 4 * keys as usize, ManualClock::new(0));
    let ratewell_rejected = trace.iter().filter(|&&k| !limiter.check(&k).is_admitted()).count();

    println!(
        "keys: {keys}, limit {limit} per second, requests: {requests} (no key over its limit)"
    );
    println!(
        "pingora-limits Rate (count-min sketch, 4 x 1024): {sketch_rejected} requests rejected \
         ({:.1}%), of {sketch_keys} keys ({:.1}%)",
        100.0 * sketch_rejected as f64 / requests as f64,
        100.0 * sketch_keys as f64 / keys as f64
    );
    println!("ratewell fixed-window (one count per key): {ratewell_rejected} rejected");
}
