//! A direct limiter in front of one resource: a token bucket of 5 at 10 per second, on a manual
//! clock so that the run is the same every time (a service uses `Limiter::new`, on the TSC).
//!
//! Run with `cargo run --example direct`.

use ratewell::{Limiter, ManualClock, Policy};

fn main() -> Result<(), ratewell::PolicyError> {
    let policy: Policy = "token-bucket capacity=5 rate=10/s".parse()?;
    let clock = ManualClock::new(0);
    let limiter = Limiter::with_clock(&policy, clock.clone());
    println!("{policy}: RateLimit-Policy: {}", policy.ratelimit_policy_field("api"));
    // A burst of 8 requests at once, then one every 50 ms.
    for i in 0..14u64 {
        if i >= 8 {
            clock.advance(50_000_000);
        }
        let d = limiter.check();
        match d.retry_after_header() {
            None => println!("request {i:2}: admitted   RateLimit: {}", d.ratelimit_field("api")),
            Some(s) => println!(
                "request {i:2}: 429, Retry-After: {s}   RateLimit: {}",
                d.ratelimit_field("api")
            ),
        }
    }
    // The bucket takes what it was given: 5 at once, then 10 per second.
    assert!(limiter.peek_n(1).remaining() <= 5);
    Ok(())
}
