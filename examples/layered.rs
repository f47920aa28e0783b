//! Layered limits as an API gateway would use them: every request limited per client address,
//! authenticated ones also per API key, and an expensive route on a budget of its own, all or
//! nothing; a dry-run layer trying out a tighter limit; and a reservation taken before the work
//! and given back when the work never ran.
//!
//! Run with `cargo run --example layered`.

use std::net::IpAddr;

use ratewell::{Absent, IpKey, Layer, LayerKey, LayeredLimiter, ManualClock, Policy};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let p = |s: &str| s.parse::<Policy>();
    let layers = vec![
        Layer::new("ip", &p("token-bucket capacity=5 rate=1/s")?).capacity(100_000),
        Layer::new("key", &p("fixed-window limit=100 window=1h")?).capacity(10_000),
        Layer::new("search", &p("sliding-log limit=2 window=10s")?).capacity(1_000),
        Layer::new("ip-strict", &p("token-bucket capacity=2 rate=1/s dry-run")?),
    ];
    let clock = ManualClock::new(0);
    let limiter = LayeredLimiter::with_clock(layers, clock.clone())?;
    println!("RateLimit-Policy: {}", limiter.ratelimit_policy_field());

    let client = IpKey::new("198.51.100.4".parse::<IpAddr>()?);
    let api_key = "k-7f3a";
    let request = |route: &str, authenticated: bool| -> Result<String, ratewell::KeyCountError> {
        // The route layer applies to /search only; the API-key layer to authenticated requests.
        let key: &dyn LayerKey = if authenticated { &api_key } else { &Absent };
        let route_key: &dyn LayerKey = if route == "/search" { &"search" } else { &Absent };
        let d = limiter.check(&[&client, key, route_key, &client], 1)?;
        let fields = limiter.ratelimit_field(&d);
        let would: Vec<_> = d.would_reject().filter_map(|i| limiter.name(i)).collect();
        Ok(match d.retry_after_header() {
            None if d.is_admitted() => {
                format!("200 RateLimit: {fields}; dry run would reject: {would:?}")
            }
            Some(s) => format!(
                "429 by {:?} Retry-After: {s}; RateLimit: {fields}",
                d.decided_by().and_then(|i| limiter.name(i))
            ),
            None => "413".into(),
        })
    };
    for (t, route, auth) in [
        (0, "/search", true),
        (1, "/search", true),
        (2, "/search", true),
        (3, "/", false),
        (4, "/", true),
    ] {
        clock.set(t * 100_000_000);
        println!("{route:8} auth={auth:5}: {}", request(route, auth)?);
    }
    // The third search was rejected by the route's budget and charged nothing elsewhere: the
    // address has had 4 requests admitted, not 5.
    let d = limiter.peek(&[&client, &api_key, &Absent, &client], 1)?;
    assert_eq!(d.layer(0).map(|d| d.remaining()), Some(1));

    // A reservation for work that may not run: dropped uncommitted, its charge comes back.
    clock.set(3_000_000_000);
    let before =
        limiter.peek(&[&client, &api_key, &Absent, &client], 1)?.layer(0).map(|d| d.remaining());
    let reservation = limiter.reserve(&[&client, &api_key, &Absent, &client], 1)?;
    assert!(reservation.decision().is_admitted());
    drop(reservation); // the upstream failed before doing anything
    let after =
        limiter.peek(&[&client, &api_key, &Absent, &client], 1)?.layer(0).map(|d| d.remaining());
    assert_eq!(before, after);
    println!("reserved and cancelled: the address still has {after:?} remaining");
    for i in 0..limiter.len() {
        let m = limiter.metrics(i).expect("a layer");
        println!(
            "layer {:9}: admitted {:2}, rejected {:2}, refunds {}",
            limiter.name(i).unwrap_or(""),
            m.admitted,
            m.rejected,
            m.refunds
        );
    }
    Ok(())
}
