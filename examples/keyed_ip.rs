//! A keyed limiter per client address, as an HTTP server would use it: IPv4 clients per
//! address, IPv6 clients per /64, the answer rendered as a status and the IETF fields, a premium
//! client with its own quota, and a table that refuses new clients when full (fail-closed) told
//! apart from an over-limit client.
//!
//! Run with `cargo run --example keyed_ip`.

use std::net::IpAddr;

use ratewell::{IpKey, KeyedLimiter, ManualClock, OnFull, Outcome, Policy};

/// The status and header lines a server would send for `addr`.
fn respond(limiter: &KeyedLimiter<IpKey, ManualClock>, addr: IpAddr) -> String {
    let key = IpKey::new(addr);
    let decision = limiter.check(&key);
    let policy = limiter.policy_of(&key).ratelimit_policy_field("per-ip");
    let fields =
        format!("RateLimit-Policy: {policy}; RateLimit: {}", decision.ratelimit_field("per-ip"));
    match decision.outcome() {
        Outcome::Admitted => format!("200 {fields}"),
        Outcome::TableFull => {
            "503 (no room for a new client: fail closed, or admit to fail open)".into()
        }
        _ => match decision.retry_after_header() {
            Some(s) => format!("429 Retry-After: {s}; {fields}"),
            None => format!("413 (the request can never fit); {fields}"),
        },
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let policy: Policy = "sliding-window limit=3 window=1m".parse()?;
    let limiter = KeyedLimiter::builder(&policy, 1_000)
        .clock(ManualClock::new(0))
        .on_full(OnFull::Refuse)
        .build()?;
    let premium: IpAddr = "192.0.2.7".parse()?;
    limiter
        .set_override(&IpKey::new(premium), Some(&"sliding-window limit=100 window=1m".parse()?))?;

    // Two IPv6 addresses of one /64 share a budget; a premium address has its own.
    let clients: [IpAddr; 3] = ["2001:db8::1".parse()?, "2001:db8::ffff".parse()?, premium];
    for round in 0..3 {
        for &addr in &clients {
            println!("round {round} {addr:>16}: {}", respond(&limiter, addr));
        }
    }
    let m = limiter.metrics();
    println!("keys {} of {}, admitted {}, rejected {}", m.keys, m.capacity, m.admitted, m.rejected);
    assert_eq!(m.keys, 2, "one /64 and the premium address");
    Ok(())
}
