//! The extensions the Go service does not read: `policy` (any ratewell policy decides a rule),
//! `unit_multiplier` (a window of several units) and `rate_limits` (several limits on one
//! descriptor, all or nothing), in memory on a manual clock.

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
  - key: bands
    rate_limits:
      - {unit: second, requests_per_unit: 2}
      - {unit: minute, requests_per_unit: 3, name: per_minute}
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

/// Several limits on one descriptor: each counts, the request is admitted only if all have
/// room, a denied request charges none, and the status is the first limit over, else the one
/// with the least remaining.
#[tokio::test]
async fn several_limits_on_one_descriptor() {
    let mut h = Harness::start(&[("ext.yaml", CONFIG)], &[], 2222).await;
    let call = |h: &mut Harness| {
        let req = request("ext", &[&[("bands", "x")]], 1);
        let mut c = h.client.clone();
        async move { c.should_rate_limit(req).await.unwrap().into_inner() }
    };
    let per_second = |code, remaining| status(code, 2, Unit::Second, remaining, 1);
    let per_minute = |code, remaining| named(code, "per_minute", 3, Unit::Minute, remaining, 57);
    assert_eq!(call(&mut h).await, response(Code::Ok, vec![per_second(Code::Ok, 1)]));
    assert_eq!(call(&mut h).await, response(Code::Ok, vec![per_second(Code::Ok, 0)]));
    assert_eq!(call(&mut h).await, response(Code::OverLimit, vec![per_second(Code::OverLimit, 0)]));
    h.clock.advance(S);
    // The minute band has 1 left, the second band 2: the least remaining is reported.
    assert_eq!(call(&mut h).await, response(Code::Ok, vec![per_minute(Code::Ok, 0)]));
    let over = response(Code::OverLimit, vec![per_minute(Code::OverLimit, 0)]);
    assert_eq!(call(&mut h).await, over);
    // The denied requests charged the second band nothing: it still has 1 of its 2.
    let mut peek = request("ext", &[&[("bands", "x")]], 1);
    peek.descriptors[0].hits_addend = Some(0);
    let r = h.call(peek).await.unwrap();
    assert_eq!(r, response(Code::Ok, vec![per_minute(Code::Ok, 0)]));
    h.clock.advance(57 * S);
    assert_eq!(call(&mut h).await, response(Code::Ok, vec![per_second(Code::Ok, 1)]));
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
    let both = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n    rate_limits: [{unit: second, requests_per_unit: 1}]\n";
    assert_eq!(load(both).unwrap_err(), "ext.yaml: use rate_limit or rate_limits, not both");
    let quota = "domain: d\ndescriptors:\n  - key: k\n    quota_mode: true\n    rate_limits: [{unit: second, requests_per_unit: 1}, {unit: day, requests_per_unit: 9}]\n";
    assert_eq!(load(quota).unwrap_err(), "ext.yaml: a quota_mode descriptor takes one rate limit");
    let bad_unit = "domain: d\ndescriptors:\n  - key: k\n    rate_limits: [{unit: second, requests_per_unit: 1}, {unit: fortnight, requests_per_unit: 9}]\n";
    assert_eq!(load(bad_unit).unwrap_err(), "ext.yaml: invalid rate limit unit 'fortnight'");
}
