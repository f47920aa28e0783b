//! The module in Debian's real nginx, two workers, under concurrent clients: decisions exact
//! across the workers, the fields the engine's decision gives, zones that are all or nothing,
//! full zones that keep limited keys, reloads that keep state, and configurations refused by
//! `nginx -t` with the reason.

mod common;

use std::collections::HashSet;

use common::{Nginx, load, test_config, with_status};
use ratewell::{Limiter, ManualClock, Policy};

/// A location that serves a file under `ratewell` of every zone named.
fn location(path: &str, zones: &[&str], extra: &str) -> String {
    let limits: String = zones.iter().map(|z| format!("ratewell zone={z}; ")).collect();
    format!("location {path} {{ {limits}{extra} try_files /index.html =404; }}")
}

/// The workers that answered.
fn workers_seen(responses: &[common::Response]) -> HashSet<String> {
    responses.iter().filter_map(|r| r.header("x-worker").map(str::to_string)).collect()
}

#[test]
fn one_key_admits_exactly_its_limit_across_the_workers() {
    // The engine's token bucket, and limit_req's `rate=1r/m burst=99` written as the engine's
    // nginx-compatible leaky bucket: 100 each, from 5,000 requests on 16 connections.
    for policy in ["token-bucket capacity=100 rate=1/h", "leaky-bucket rate=1r/m burst=99 nodelay"]
    {
        let nginx = Nginx::start(
            2,
            &format!(r#"ratewell_zone $arg_k zone=one:1m policy="{policy}";"#),
            &location("/", &["one"], ""),
        );
        let responses = load(nginx.port, 16, 5_000, |_| "/?k=hot".to_string());
        assert_eq!(with_status(&responses, 200), 100, "{policy}");
        assert_eq!(with_status(&responses, 429), 4_900, "{policy}");
        assert_eq!(workers_seen(&responses).len(), 2, "both workers decided");
    }
}

#[test]
fn every_key_is_exact_under_load() {
    // 300 keys, each asked 30 times, spread over 32 connections and both workers: 20 each.
    let nginx = Nginx::start(
        2,
        r#"ratewell_zone $arg_k zone=many:4m policy="fixed-window limit=20 window=1h";"#,
        &location("/", &["many"], ""),
    );
    let responses = load(nginx.port, 32, 9_000, |i| format!("/?k=key{}", i % 300));
    let mut admitted = vec![0; 300];
    for (i, r) in responses.iter().enumerate() {
        if r.status == 200 {
            admitted[i % 300] += 1;
        }
    }
    assert!(admitted.iter().all(|&n| n == 20), "{admitted:?}");
}

#[test]
fn the_fields_are_the_engines_decisions() {
    let spec = "token-bucket capacity=2 rate=1/h";
    let nginx = Nginx::start(
        2,
        &format!(r#"ratewell_zone $arg_k zone=api:1m policy="{spec}";"#),
        &[
            location("/", &["api"], ""),
            location("/quiet", &["api"], "ratewell_headers off; ratewell_status 503;"),
        ]
        .join("\n"),
    );
    // The same three decisions by the engine itself, at one instant: what the fields say
    // (their seconds are rounded up, so the milliseconds between requests do not show).
    let policy: Policy = spec.parse().unwrap();
    let engine = Limiter::with_clock(&policy, ManualClock::new(0));
    let mut client = nginx.client();
    for _ in 0..3 {
        let decision = engine.check();
        let r = client.get("/?k=a");
        assert_eq!(r.status, if decision.is_admitted() { 200 } else { 429 });
        assert_eq!(r.header("ratelimit-policy"), Some(&*policy.ratelimit_policy_field("api")));
        assert_eq!(r.header("ratelimit"), Some(&*decision.ratelimit_field("api")));
        assert_eq!((r.count("ratelimit"), r.count("ratelimit-policy")), (1, 1));
        let retry = decision.retry_after_ns().map(|ns| ns.div_ceil(1_000_000_000).to_string());
        assert_eq!(r.header("retry-after").map(str::to_string), retry);
    }
    let quiet = client.get("/quiet?k=a");
    assert_eq!(quiet.status, 503);
    assert!(quiet.header("retry-after").is_none() && quiet.header("ratelimit").is_none());
    // A request without the key is not limited (as limit_req): no fields either.
    let keyless = client.get("/");
    assert_eq!(keyless.status, 200);
    assert!(keyless.header("ratelimit").is_none());
}

#[test]
fn two_zones_in_one_location_are_all_or_nothing() {
    let nginx = Nginx::start(
        2,
        concat!(
            r#"ratewell_zone $arg_a zone=wide:1m policy="token-bucket capacity=100 rate=1/h";"#,
            "\n",
            r#"ratewell_zone $arg_b zone=narrow:1m policy="token-bucket capacity=60 rate=1/h";"#,
        ),
        &location("/", &["wide", "narrow"], ""),
    );
    // One pair of keys, 2,000 requests on 64 connections: the narrow zone admits 60; the
    // requests it rejects charge the wide zone nothing.
    let responses = load(nginx.port, 64, 2_000, |_| "/?a=x&b=y".to_string());
    assert_eq!(with_status(&responses, 200), 60);
    // So the wide zone's key has 40 left, for requests whose narrow key is new each time.
    let responses = load(nginx.port, 64, 2_000, |i| format!("/?a=x&b=fresh{i}"));
    assert_eq!(with_status(&responses, 200), 40);
    let rejected = responses.iter().find(|r| r.status == 429).unwrap();
    // The wide zone's: its key is out of tokens, one an hour (t).
    assert_eq!(rejected.header("ratelimit"), Some(r#""wide";r=0;t=3600"#));
}

#[test]
fn a_full_zone_keeps_a_limited_key_limited() {
    // The zone holds about a thousand keys; 3,000 others go through it after the victim's
    // one request a minute is spent. limit_req deletes the victim's state to make room and
    // admits it again (../shared/NGINX.md). Here every key holds a minute's limit, so none
    // can be reclaimed without loss: the zone refuses the new keys it has no room for.
    let spec = "leaky-bucket rate=1r/m nodelay";
    let nginx = Nginx::start(
        2,
        &format!(r#"ratewell_zone $arg_k zone=small:160k policy="{spec}";"#),
        &location("/", &["small"], ""),
    );
    let mut client = nginx.client();
    assert_eq!(client.get("/?k=victim").status, 200);
    assert_eq!(client.get("/?k=victim").status, 429);
    let others = load(nginx.port, 8, 3_000, |i| format!("/?k=other{i}"));
    let admitted = with_status(&others, 200);
    let (keys, _) = ratewell_nginx::capacity_for(&spec.parse().unwrap(), 160 << 10).unwrap();
    assert!((keys / 2..keys).contains(&admitted), "{admitted} of a zone of {keys} keys");
    assert_eq!(with_status(&others, 429), 3_000 - admitted);
    assert_eq!(client.get("/?k=victim").status, 429, "the victim is still limited");
    let refused = others.iter().find(|r| r.status == 429).unwrap();
    assert!(refused.header("retry-after").is_some_and(|s| s.parse::<u64>().unwrap() <= 60));
    assert!(nginx.error_log().contains(r#"ratewell zone "small" is full: a new key is refused"#));

    // With on_full=evict, the new keys pass, and the zone forgets the key whose loss grants
    // least: here, the one that would be free soonest, the victim.
    let nginx = Nginx::start(
        2,
        &format!(r#"ratewell_zone $arg_k zone=small:160k policy="{spec}" on_full=evict;"#),
        &location("/", &["small"], ""),
    );
    let mut client = nginx.client();
    assert_eq!(client.get("/?k=victim").status, 200);
    let others = load(nginx.port, 8, 3_000, |i| format!("/?k=other{i}"));
    assert_eq!(with_status(&others, 200), 3_000);
    assert_eq!(client.get("/?k=victim").status, 200);
}

#[test]
fn a_reload_keeps_the_zone_and_a_changed_policy_or_key_is_refused() {
    let zone = |policy: &str| format!(r#"ratewell_zone $arg_k zone=keep:1m policy="{policy}";"#);
    let server = location("/", &["keep"], "");
    let nginx = Nginx::start(2, &zone("token-bucket capacity=5 rate=1/h"), &server);
    let before = load(nginx.port, 4, 8, |_| "/?k=a".to_string());
    assert_eq!(with_status(&before, 200), 5);
    assert!(nginx.reload(2, &zone("token-bucket capacity=5 rate=1/h"), &server));
    let mut client = nginx.client();
    assert_eq!(client.get("/?k=a").status, 429, "limited before the reload, and after");
    assert_eq!(client.get("/?k=b").status, 200);
    // Another policy on the same zone: nginx keeps the old configuration, and says why.
    assert!(!nginx.reload(2, &zone("token-bucket capacity=9 rate=1/h"), &server));
    let log = nginx.error_log();
    assert!(
        log.contains(r#"ratewell_zone "keep": the shared table was made with policy"#),
        "{log}"
    );
    assert_eq!(nginx.client().get("/?k=a").status, 429);
    // Another key on the same zone: refused too (its keys would mean something else).
    let other_key =
        r#"ratewell_zone $arg_j zone=keep:1m policy="token-bucket capacity=5 rate=1/h";"#;
    assert!(!nginx.reload(2, other_key, &server));
    let log = nginx.error_log();
    assert!(log.contains(r#"uses the "$arg_j" key while previously it used the "$arg_k" key"#));
    assert_eq!(nginx.client().get("/?k=a").status, 429);
}

#[test]
fn any_key_bytes_are_decided() {
    let nginx = Nginx::start(
        2,
        r#"ratewell_zone $http_x_key zone=bytes:1m policy="token-bucket capacity=1 rate=1/h";"#,
        &location("/", &["bytes"], ""),
    );
    let mut client = nginx.client();
    // Long, and of bytes a header may carry (obs-text above 0x7f included).
    for key in ["k".repeat(4_000), "\u{e9}t\u{e9} \t\u{1f600}!".to_string()] {
        let line = format!("X-Key: {key}\r\n");
        assert_eq!(client.get_with("/", &line).status, 200);
        assert_eq!(client.get_with("/", &line).status, 429);
    }
    assert!(!nginx.error_log().contains("[alert]"), "{}", nginx.error_log());
}

#[test]
fn bad_configurations_fail_nginx_t_with_the_reason() {
    let ok = location("/", &["z"], "");
    let cases: &[(&str, &str, &str)] = &[
        (
            r#"ratewell_zone $arg_k zone=z:1m policy="token-bucket capacity=0 rate=1/s";"#,
            &ok,
            r#"invalid policy "token-bucket capacity=0 rate=1/s" of zone "z": "#,
        ),
        (
            r#"ratewell_zone $arg_k zone=z:1m policy="gcra burst=3";"#,
            &ok,
            r#"invalid policy "gcra burst=3" of zone "z""#,
        ),
        (
            r#"ratewell_zone $arg_k zone=z:1m;"#,
            &ok,
            r#""ratewell_zone" must have "policy" parameter"#,
        ),
        (
            r#"ratewell_zone $arg_k policy="token-bucket capacity=1 rate=1/s";"#,
            &ok,
            r#""ratewell_zone" must have "zone" parameter"#,
        ),
        (r#"ratewell_zone $arg_k zone=z:1m rate=10r/s;"#, &ok, "takes its limit as policy="),
        (
            r#"ratewell_zone $arg_k zone=z:1m policy="token-bucket capacity=1 rate=1/s" colour=red;"#,
            &ok,
            r#"invalid parameter "colour=red""#,
        ),
        (
            r#"ratewell_zone $arg_k zone=z:32k policy="token-bucket capacity=1 rate=1/s";"#,
            &ok,
            r#"zone "z" is too small"#,
        ),
        (
            r#"ratewell_zone $arg_k zone=z:140k policy="sliding-log limit=60000 window=1s";"#,
            &ok,
            r#"ratewell_zone "z" is too small for its policy"#,
        ),
        (
            r#"ratewell_zone $arg_k zone=z:1m policy="token-bucket capacity=1 rate=1/s";"#,
            &location("/", &["z"], "ratewell zone=z;"),
            "is duplicate",
        ),
        (
            r#"ratewell_zone $arg_k zone=z:1m policy="token-bucket capacity=1 rate=1/s";"#,
            "location / { ratewell zone=z burst=5; }",
            "burst and delay are its policy's",
        ),
        (
            r#"ratewell_zone $arg_k zone=z:1m policy="token-bucket capacity=1 rate=1/s";"#,
            "location / { ratewell zone=z; ratewell_status 200; }",
            "value must be between 400 and 599",
        ),
        ("", "location / { ratewell zone=nowhere; }", r#"zero size shared memory zone "nowhere""#),
    ];
    for (http, server, message) in cases {
        let (ok, said) = test_config(http, server);
        assert!(!ok, "nginx -t passed: {http} {server}");
        assert!(said.contains(message), "{http} {server}: {said}");
    }
    // And a good one passes, its policy quoted whole or as the value.
    for http in [
        r#"ratewell_zone $arg_k zone=z:1m policy="gcra rate=10/s burst=5" on_full=refuse;"#,
        r#"ratewell_zone $arg_k zone=z:1m "policy=gcra rate=10/s burst=5";"#,
    ] {
        let (ok, said) = test_config(http, &ok);
        assert!(ok, "{http}: {said}");
    }
}
