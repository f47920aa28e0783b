//! Hostile and absurd input to the running service: each gets its documented answer, and
//! nothing panics (the crate README's *Bad input* table).

mod common;

use std::sync::atomic::Ordering;

use common::*;
use ratewell_rls::proto::{Code, Entry, RateLimitDescriptor, Unit};

const CONFIG: &str = "
domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: detailed
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5}
";

fn errors(h: &Harness) -> u64 {
    h.running.service.stats().config_load_error.load(Ordering::Relaxed)
}

/// Malformed YAML, an unknown key, 100 levels of nesting, and more distinct windows than a
/// configuration may use: each refused and counted, the configuration in force kept.
#[tokio::test]
async fn bad_configurations_keep_the_one_in_force() {
    let mut h = Harness::start(&[("d.yaml", CONFIG)], &[], 600).await;
    let mut nested = String::from("domain: d\ndescriptors:\n");
    for level in 0..100 {
        let indent = "  ".repeat(2 * level);
        nested.push_str(&format!("{indent}- key: k{level}\n{indent}  descriptors:\n"));
    }
    let mut distinct = String::from("domain: d\ndescriptors:\n");
    for i in 1..=200 {
        distinct.push_str(&format!(
            "  - {{key: k, value: v{i}, rate_limit: {{unit: second, requests_per_unit: 5, unit_multiplier: {i}}}}}\n"
        ));
    }
    for (n, bad) in ["domain: d\ndescriptors: [", "domain: d\nratelimit: {}\n", &nested, &distinct]
        .into_iter()
        .enumerate()
    {
        h.reconfigure(&[("d.yaml", bad)]).await;
        assert_eq!(errors(&h), n as u64 + 1);
        let r = h.call(request("d", &[&[("k", "v")]], 1)).await.unwrap();
        assert_eq!(
            r.statuses[0].current_limit.as_ref().unwrap().requests_per_unit,
            5,
            "case {n}: the old configuration decides"
        );
    }
}

/// 10,000 rules with 10,000 distinct limits (`requests_per_unit` 2 to 10,001) load, and every
/// one decides exactly at its own limit: all charged to one short of it, then a cost of 2 over
/// on each (denied, nothing charged), then the last unit on each.
#[tokio::test]
async fn ten_thousand_distinct_limits() {
    const RULES: u64 = 10_000;
    let rpu = |i: u64| i + 2;
    let mut yaml = String::from("domain: big\ndescriptors:\n");
    for i in 0..RULES {
        yaml.push_str(&format!(
            "  - {{key: k, value: v{i}, rate_limit: {{unit: hour, requests_per_unit: {}}}}}\n",
            rpu(i)
        ));
    }
    let rss = || {
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
        statm.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()).unwrap_or(0) * 4096
    };
    // Started on one rule, then reloaded to the 10,000: the reload's time and memory are the
    // configuration's (printed with --nocapture; benches/results/ keeps them).
    let one =
        "domain: big\ndescriptors:\n  - {key: k, rate_limit: {unit: hour, requests_per_unit: 1}}\n";
    // Room for every key: a table at its capacity evicts (the engine's bounded table).
    let mut h = Harness::start(&[("big.yaml", one)], &[("MEMORY_CAPACITY", "100000")], 600).await;
    let (before, started) = (rss(), std::time::Instant::now());
    h.reconfigure(&[("big.yaml", &yaml)]).await;
    eprintln!(
        "{RULES} distinct limits: read, checked and put in force in {:?}; resident memory {:+.1} MiB",
        started.elapsed(),
        (rss() as f64 - before as f64) / (1 << 20) as f64
    );
    assert_eq!(h.running.service.stats().config_load_success.load(Ordering::Relaxed), 2);
    assert_eq!(errors(&h), 0);
    let batch = |from: u64, cost: &dyn Fn(u64) -> u64| {
        let mut r = request("big", &[], 1);
        r.descriptors = (from..from + 1_000)
            .map(|i| RateLimitDescriptor {
                entries: vec![Entry { key: "k".into(), value: format!("v{i}") }],
                hits_addend: Some(cost(i)),
                ..Default::default()
            })
            .collect();
        r
    };
    for from in (0..RULES).step_by(1_000) {
        let r = h.call(batch(from, &|i| rpu(i) - 1)).await.unwrap();
        assert_eq!(r.overall_code, Code::Ok as i32);
        for (i, s) in (from..).zip(&r.statuses) {
            assert_eq!(s.current_limit.as_ref().unwrap().requests_per_unit as u64, rpu(i));
            assert_eq!(s.limit_remaining, 1, "rule {i}");
        }
        let r = h.call(batch(from, &|_| 2)).await.unwrap();
        assert_eq!(r.overall_code, Code::OverLimit as i32);
        assert!(
            r.statuses.iter().all(|s| s.code == Code::OverLimit as i32 && s.limit_remaining == 1)
        );
        let r = h.call(batch(from, &|_| 1)).await.unwrap();
        assert_eq!(r.overall_code, Code::Ok as i32);
        assert!(r.statuses.iter().all(|s| s.limit_remaining == 0));
    }
}

/// A request of 10,000 descriptors is refused; 1,000 are decided.
#[tokio::test]
async fn too_many_descriptors() {
    let mut h = Harness::start(&[("d.yaml", CONFIG)], &[], 600).await;
    let one: &[(&str, &str)] = &[("k", "v")];
    let e = h.call(request("d", &vec![one; 10_000], 1)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert_eq!(e.message(), "at most 1000 descriptors in a request, not 10000");
    let other: &[(&str, &str)] = &[("unknown", "v")];
    let r = h.call(request("d", &vec![other; 1_000], 1)).await.unwrap();
    assert_eq!(r.statuses.len(), 1_000);
}

/// A 1 MB value is decided like any other; its statistics key (detailed, so holding the value)
/// is counted under the overflow key rather than kept. A message over tonic's 4 MiB is refused
/// by the transport.
#[tokio::test]
async fn huge_values() {
    let mut h = Harness::start(&[("d.yaml", CONFIG)], &[], 600).await;
    let big = "x".repeat(1 << 20);
    let r = h.call(request("d", &[&[("detailed", &big)]], 1)).await.unwrap();
    assert_eq!(r, response(Code::Ok, vec![status(Code::Ok, 5, Unit::Minute, 4, 60)]));
    let stats = h.running.service.stats();
    assert_eq!(stats.overflowed(), 1);
    assert!(stats.get("d._overflow").is_some());
    let huge = "x".repeat(5 << 20);
    let e = h.call(request("d", &[&[("k", &huge)]], 1)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::OutOfRange, "{e:?}");
}

/// A per-descriptor `hits_addend` above 2^32 - 1 can never fit: OVER_LIMIT, nothing charged.
/// The request-level `hits_addend` is a u32, and a cost above the limit is over too.
#[tokio::test]
async fn impossible_costs() {
    let mut h = Harness::start(&[("d.yaml", CONFIG)], &[], 600).await;
    let mut req = request("d", &[&[("k", "v")]], 1);
    req.descriptors[0].hits_addend = Some(u64::from(u32::MAX) + 1);
    let r = h.call(req.clone()).await.unwrap();
    assert_eq!(r, response(Code::OverLimit, vec![status(Code::OverLimit, 5, Unit::Minute, 5, 60)]));
    req.descriptors[0].hits_addend = Some(u64::MAX);
    assert_eq!(h.call(req).await.unwrap().overall_code, Code::OverLimit as i32);
    let r = h.call(request("d", &[&[("k", "v")]], u32::MAX)).await.unwrap();
    assert_eq!(r, response(Code::OverLimit, vec![status(Code::OverLimit, 5, Unit::Minute, 5, 60)]));
    let r = h.call(request("d", &[&[("k", "v")]], 1)).await.unwrap();
    assert_eq!(r.statuses[0].limit_remaining, 4, "none of them charged anything");
}

/// An empty key matches no rule: OK, without a limit (Envoy's own validation refuses it before
/// it is sent). An empty value is a key-only match; no entries at all match nothing.
#[tokio::test]
async fn empty_keys_and_entries() {
    let mut h = Harness::start(&[("d.yaml", CONFIG)], &[], 600).await;
    let r = h.call(request("d", &[&[("", "v")]], 1)).await.unwrap();
    assert_eq!(r, response(Code::Ok, vec![no_limit(0)]));
    let r = h.call(request("d", &[&[("k", "")]], 1)).await.unwrap();
    assert_eq!(r, response(Code::Ok, vec![status(Code::Ok, 5, Unit::Minute, 4, 60)]));
    let mut req = request("d", &[&[("k", "v")]], 1);
    req.descriptors =
        vec![RateLimitDescriptor { entries: Vec::<Entry>::new(), ..Default::default() }];
    assert_eq!(h.call(req).await.unwrap(), response(Code::Ok, vec![no_limit(0)]));
}

/// A limit override with an unknown unit (or one Envoy does not define) is refused.
#[tokio::test]
async fn override_without_a_unit() {
    let mut h = Harness::start(&[("d.yaml", CONFIG)], &[], 600).await;
    for unit in [0, 42] {
        let mut req = request("d", &[&[("k", "v")]], 1);
        req.descriptors[0].limit =
            Some(ratewell_rls::proto::RateLimitOverride { requests_per_unit: 3, unit });
        let e = h.call(req).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "unit {unit}: {e:?}");
    }
}

/// `POST /json`: 200 and 429 with the JSON response, 400 on a body that does not parse or a
/// request the service refuses; `/healthcheck` and `/rlconfig`.
#[tokio::test]
async fn http_endpoints() {
    let h = Harness::start(&[("d.yaml", CONFIG)], &[], 600).await;
    let http_addr = h.running.http;
    let body =
        br#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}],"hitsAddend":5}"#;
    let (code, text) = http(http_addr, "POST", "/json", body).await;
    assert_eq!(code, 200, "{text}");
    assert_eq!(
        text,
        r#"{"overallCode":"OK","statuses":[{"code":"OK","currentLimit":{"requestsPerUnit":5,"unit":"MINUTE"},"durationUntilReset":"60s"}]}"#
    );
    let (code, text) = http(http_addr, "POST", "/json", body).await;
    assert_eq!(code, 429, "{text}");
    assert!(text.contains(r#""overallCode":"OVER_LIMIT""#), "{text}");
    for bad in [&b"{"[..], b"not json", br#"{"domain": 7}"#, br#"{"domain":"","descriptors":[]}"#] {
        let (code, _) = http(http_addr, "POST", "/json", bad).await;
        assert_eq!(code, 400, "{}", String::from_utf8_lossy(bad));
    }
    assert_eq!(http(http_addr, "GET", "/healthcheck", b"").await, (200, "OK".to_string()));
    let (code, dump) = http(h.running.debug, "GET", "/rlconfig", b"").await;
    assert_eq!(code, 200);
    assert!(
        dump.contains(
            "d.k: unit=MINUTE requests_per_unit=5, shadow_mode: false, quota_mode: false"
        ),
        "{dump}"
    );
}

/// Limit overrides are bounded by memory only: 10 requests of 1,000 descriptors, each with an
/// override of its own (10,000 distinct `requests_per_unit` values), each decided at its own
/// limit; the same again, each charged once more.
#[tokio::test]
async fn ten_thousand_distinct_overrides() {
    // Room for every key: a table at its capacity evicts (the engine's bounded table).
    let mut h = Harness::start(&[("d.yaml", CONFIG)], &[("MEMORY_CAPACITY", "100000")], 600).await;
    let batch = |from: u32| {
        let mut r = request("d", &[], 1);
        r.descriptors = (from..from + 1_000)
            .map(|i| RateLimitDescriptor {
                entries: vec![Entry { key: "k".into(), value: format!("v{i}") }],
                limit: Some(ratewell_rls::proto::RateLimitOverride {
                    requests_per_unit: 2 + i,
                    unit: Unit::Day as i32,
                }),
                ..Default::default()
            })
            .collect();
        r
    };
    for round in [1, 2] {
        for from in (0..10_000).step_by(1_000) {
            let r = h.call(batch(from)).await.unwrap();
            assert_eq!(r.overall_code, Code::Ok as i32);
            for (i, s) in (from..).zip(&r.statuses) {
                assert_eq!(s.current_limit.as_ref().unwrap().requests_per_unit, 2 + i);
                assert_eq!(s.limit_remaining, 2 + i - round, "override {i}, round {round}");
            }
        }
    }
}
