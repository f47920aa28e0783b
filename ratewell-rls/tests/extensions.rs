//! The extensions the Go service does not read: `policy` (any ratewell policy decides a rule)
//! and `unit_multiplier` (a window of several units), in memory on a manual clock.

mod common;

use common::*;
use ratewell_rls::config::{ConfigFile, RateLimitConfig};
use ratewell_rls::proto::{Code, Unit};

const CONFIG: &str = r#"
domain: ext
descriptors:
  - key: bucket
    rate_limit: {unit: second, requests_per_unit: 1, policy: "token-bucket capacity=3 rate=1/s"}
  - key: five_minutes
    rate_limit: {unit: minute, requests_per_unit: 2, unit_multiplier: 5}
  - key: log
    rate_limit: {unit: minute, requests_per_unit: 2, policy: "sliding-log limit=2 window=1m"}
  - key: nginx
    rate_limit: {unit: second, requests_per_unit: 2, policy: "leaky-bucket rate=2r/s burst=1 nodelay"}
"#;

async fn codes(h: &mut Harness, key: &str, n: usize) -> Vec<i32> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(h.call(request("ext", &[&[(key, "x")]], 1)).await.unwrap().overall_code);
    }
    out
}

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

#[tokio::test]
async fn a_token_bucket_policy_decides_its_rule() {
    let mut h = Harness::start(&[("ext.yaml", CONFIG)], &[], 2222).await;
    assert_eq!(codes(&mut h, "bucket", 4).await, [OK, OK, OK, OVER]);
    h.clock.advance(S);
    let r = h.call(request("ext", &[&[("bucket", "x")]], 1)).await.unwrap();
    // The limit as written; what remains and when the bucket is full again, the policy's.
    assert_eq!(r, response(Code::Ok, vec![status(Code::Ok, 1, Unit::Second, 0, 3)]));
    assert_eq!(codes(&mut h, "bucket", 1).await, [OVER]);
}

#[tokio::test]
async fn a_unit_multiplier_makes_a_window_of_several_units() {
    // 2222 s is in the five-minute window [2100, 2400): it ends in 178 s.
    let mut h = Harness::start(&[("ext.yaml", CONFIG)], &[], 2222).await;
    let r = h.call(request("ext", &[&[("five_minutes", "x")]], 1)).await.unwrap();
    assert_eq!(r, response(Code::Ok, vec![status(Code::Ok, 2, Unit::Minute, 1, 178)]));
    assert_eq!(codes(&mut h, "five_minutes", 2).await, [OK, OVER]);
    h.clock.set(2399 * S);
    assert_eq!(codes(&mut h, "five_minutes", 1).await, [OVER]);
    h.clock.set(2400 * S);
    assert_eq!(codes(&mut h, "five_minutes", 3).await, [OK, OK, OVER]);
}

#[tokio::test]
async fn sliding_log_and_nginx_policies() {
    let mut h = Harness::start(&[("ext.yaml", CONFIG)], &[], 2222).await;
    assert_eq!(codes(&mut h, "log", 3).await, [OK, OK, OVER]);
    h.clock.advance(59 * S);
    assert_eq!(codes(&mut h, "log", 1).await, [OVER], "both entries are in the last minute");
    // The log holds at most 2 in any closed minute: at exactly 60 s the first two still count.
    h.clock.advance(S);
    assert_eq!(codes(&mut h, "log", 1).await, [OVER]);
    h.clock.advance(1);
    assert_eq!(codes(&mut h, "log", 3).await, [OK, OK, OVER]);
    // nginx's limit_req: burst 1 nodelay at 2r/s admits 2 at once, then one per 500 ms.
    assert_eq!(codes(&mut h, "nginx", 3).await, [OK, OK, OVER]);
    h.clock.advance(500_000_000);
    assert_eq!(codes(&mut h, "nginx", 2).await, [OK, OVER]);
}

#[test]
fn bad_extensions_are_load_errors() {
    let load = |yaml: &str| {
        let file = ConfigFile::parse("ext.yaml", yaml).map_err(|e| e.to_string())?;
        RateLimitConfig::new(&[file], false).map_err(|e| e.to_string())
    };
    let rule =
        |limit: &str| format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {limit}\n");
    let e =
        load(&rule(r#"{unit: second, requests_per_unit: 1, policy: "token-bucket capacity=0"}"#))
            .unwrap_err();
    assert!(
        e.starts_with("ext.yaml: invalid rate limit policy 'token-bucket capacity=0': "),
        "{e}"
    );
    let e =
        load(&rule(r#"{unlimited: true, policy: "fixed-window limit=1 window=1s"}"#)).unwrap_err();
    assert_eq!(e, "ext.yaml: an unlimited rate limit has no unit_multiplier or policy");
    let e = load(&rule("{unit: year, requests_per_unit: 1, unit_multiplier: 101}")).unwrap_err();
    assert_eq!(e, "ext.yaml: unit_multiplier 101: a window of at most 100 years");
    let config = load(&rule("{unit: minute, requests_per_unit: 1, unit_multiplier: 0}")).unwrap();
    assert_eq!(config.limits()[0].unit_multiplier, 1, "0 is the unit itself");
}
