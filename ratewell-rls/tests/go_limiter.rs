//! envoyproxy/ratelimit's `test/limiter/base_limiter_test.go`, ported case for case.
//!
//! The Go cases call the limiter's pieces directly: the cache key of a descriptor, the local
//! over-limit cache, and the status and statistics of a decision from the counts before and
//! after it. Here the key is [`MemoryStore::key`] (a hash of the same parts, not a string: it
//! has no window in it, since the engine's fixed window keeps its own), the statuses come from
//! the service deciding real requests, and the statistics from [`RuleStats::count`] fed the Go
//! case's numbers.

mod common;

use std::sync::atomic::Ordering;

use common::*;
use ratewell::ManualClock;
use ratewell_rls::config::{ConfigFile, RateLimitConfig};
use ratewell_rls::memory::{MemoryStore, Quota};
use ratewell_rls::proto::{Code, Entry, Unit};
use ratewell_rls::stats::{RuleStats, near_threshold};

fn entries(pairs: &[(&str, &str)]) -> Vec<Entry> {
    pairs.iter().map(|(k, v)| Entry { key: k.to_string(), value: v.to_string() }).collect()
}

fn second_10() -> Quota {
    Quota::fixed(10, Unit::Second)
}

/// TestGenerateCacheKeys: one key per descriptor, from its domain and entries; the hits are
/// counted in the rule's `total_hits`.
#[tokio::test]
async fn generate_cache_keys() {
    let store = MemoryStore::new(100, ManualClock::new(0)).unwrap();
    let key =
        |pairs: &[(&str, &str)]| store.key("domain", &entries(pairs), None, &second_10(), false);
    assert_eq!(key(&[("key", "value")]), key(&[("key", "value")]));
    assert_ne!(key(&[("key", "value")]), key(&[("key", "other")]));
    // Unambiguous where the Go key (`domain_key_value_`) is not.
    assert_ne!(key(&[("a_b", "c")]), key(&[("a", "b_c")]));
    assert_ne!(
        store.key("domain", &entries(&[("key", "value")]), None, &second_10(), false),
        store.key("domain_key", &entries(&[("value", "")]), None, &second_10(), false)
    );

    let config = "domain: domain\ndescriptors:\n  - key: key\n    value: value\n    rate_limit: {unit: second, requests_per_unit: 10}\n";
    let mut h = Harness::start(&[("d.yaml", config)], &[], 1234).await;
    assert!(h.running.service.stats().get("domain.key_value").is_none());
    h.call(request("domain", &[&[("key", "value")]], 1)).await.unwrap();
    assert_eq!(h_rule(&h.running, "domain.key_value").total_hits.load(Ordering::Relaxed), 1);
}

fn h_rule(
    running: &ratewell_rls::server::Running<ManualClock>,
    key: &str,
) -> std::sync::Arc<RuleStats> {
    running.service.stats().get(key).expect("the rule was counted")
}

// TestGenerateCacheKeysPrefix is not ported: `CACHE_KEY_PREFIX` names keys in a store shared
// by several services (Redis); the memory store's keys are the process's own, and the variable
// is named as ignored at startup.

/// TestGenerateCacheKeysWithShareThreshold: every value a `share_threshold` wildcard matches
/// shares one key, at the first level, nested, and at two levels at once.
#[tokio::test]
async fn generate_cache_keys_with_share_threshold() {
    let config = ConfigFile::parse(
        "share.yaml",
        "
domain: domain
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 10}
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: parent
    value: value1
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: files
    value: top/*
    share_threshold: true
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit: {unit: second, requests_per_unit: 10}
",
    )
    .unwrap();
    let config = RateLimitConfig::new(&[config], false).unwrap();
    let store = MemoryStore::new(100, ManualClock::new(0)).unwrap();
    let key = |pairs: &[(&str, &str)]| {
        let d = ratewell_rls::proto::RateLimitDescriptor {
            entries: entries(pairs),
            ..Default::default()
        };
        let limit = config.get_limit("domain", &d).expect("a limit");
        store.key(
            "domain",
            &d.entries,
            limit.share_threshold_key_pattern.as_deref(),
            &second_10(),
            false,
        )
    };
    // Test 1 and 2: one level.
    let first = key(&[("files", "files/a.pdf")]);
    for value in ["files/b.csv", "files/c.txt", "files/d.json", "files/e.xml", "files/subdir/f.txt"]
    {
        assert_eq!(key(&[("files", value)]), first, "{value}");
    }
    // Test 3: the second level shares, the first keeps its value.
    let nested = key(&[("parent", "value1"), ("files", "nested/file1.txt")]);
    assert_eq!(key(&[("parent", "value1"), ("files", "nested/file2.csv")]), nested);
    assert_ne!(nested, first);
    // Test 4: both levels share.
    let multi = key(&[("files", "top/file1.txt"), ("files", "nested/sub1.txt")]);
    assert_eq!(key(&[("files", "top/file2.pdf"), ("files", "nested/sub2.csv")]), multi);
    assert_ne!(multi, nested);
}

// TestOverLimitWithLocalCache, TestNoOverLimitWithLocalCache,
// TestGetResponseStatusOverLimitWithLocalCache and
// TestGetResponseStatusOverLimitWithLocalCacheShadowMode are not ported: the local cache
// (`LOCAL_CACHE_SIZE_IN_BYTES`) saves a round trip to Redis for keys known to be over; the
// memory store decides in process, with no round trip to save. The statistics those cases
// check for a local-cache hit (over limit, shadow) are the ones an over-limit decision counts,
// checked below.

/// TestGetResponseStatusEmptyKey: a descriptor without a limit is OK with nothing remaining.
#[tokio::test]
async fn get_response_status_empty_key() {
    let config = "domain: domain\ndescriptors:\n  - key: key\n    rate_limit: {unit: second, requests_per_unit: 5}\n";
    let mut h = Harness::start(&[("d.yaml", config)], &[], 1234).await;
    let r = h.call(request("domain", &[&[("other", "value")]], 1)).await.unwrap();
    assert_eq!(r, response(Code::Ok, vec![no_limit(0)]));
}

fn counts(r: &RuleStats) -> [u64; 5] {
    [&r.total_hits, &r.over_limit, &r.near_limit, &r.within_limit, &r.shadow_mode]
        .map(|c| c.load(Ordering::Relaxed))
}

async fn over_limit_case(shadow: bool) {
    // The Go case: limit 5, 2 before, 7 after (near threshold 4): 2 hits over, 1 near.
    let r = RuleStats::default();
    r.count(5, 2, 5, near_threshold(5, 0.8), true, shadow);
    assert_eq!(counts(&r), [5, 2, 1, 0, if shadow { 2 } else { 0 }]);

    // The same decision made by the service: 2 spent, then 5 more do not fit.
    let config = format!(
        "domain: domain\ndescriptors:\n  - key: key\n    value: value\n    shadow_mode: {shadow}\n    rate_limit: {{unit: second, requests_per_unit: 5}}\n"
    );
    let mut h = Harness::start(&[("d.yaml", &config)], &[], 1234).await;
    h.call(request("domain", &[&[("key", "value")]], 2)).await.unwrap();
    let r = h.call(request("domain", &[&[("key", "value")]], 5)).await.unwrap();
    let code = if shadow { Code::Ok } else { Code::OverLimit };
    // 3 remain (the Go service reports 0 after counting the 5 it refused: see the README).
    assert_eq!(r, response(code, vec![status(code, 5, Unit::Second, 3, 1)]));
    let rule = h_rule(&h.running, "domain.key_value");
    assert_eq!(counts(&rule), [7, 2, 1, 2, if shadow { 2 } else { 0 }]);
}

/// TestGetResponseStatusOverLimit.
#[tokio::test]
async fn get_response_status_over_limit() {
    over_limit_case(false).await;
}

/// TestGetResponseStatusOverLimitShadowMode: OK, and counted as shadow.
#[tokio::test]
async fn get_response_status_over_limit_shadow_mode() {
    over_limit_case(true).await;
}

async fn below_limit_case(shadow: bool) {
    // The Go case: limit 10, 2 before, 6 after, near threshold 9: within, not near.
    let r = RuleStats::default();
    r.count(4, 2, 10, 9, false, shadow);
    assert_eq!(counts(&r), [4, 0, 0, 4, 0]);

    let config = format!(
        "domain: domain\ndescriptors:\n  - key: key\n    value: value\n    shadow_mode: {shadow}\n    rate_limit: {{unit: second, requests_per_unit: 10}}\n"
    );
    let mut h = Harness::start(&[("d.yaml", &config)], &[], 1234).await;
    h.call(request("domain", &[&[("key", "value")]], 2)).await.unwrap();
    let r = h.call(request("domain", &[&[("key", "value")]], 4)).await.unwrap();
    assert_eq!(r, response(Code::Ok, vec![status(Code::Ok, 10, Unit::Second, 4, 1)]));
    let rule = h_rule(&h.running, "domain.key_value");
    assert_eq!(counts(&rule), [6, 0, 0, 6, 0]);
}

/// TestGetResponseStatusBelowLimit.
#[tokio::test]
async fn get_response_status_below_limit() {
    below_limit_case(false).await;
}

/// TestGetResponseStatusBelowLimitShadowMode.
#[tokio::test]
async fn get_response_status_below_limit_shadow_mode() {
    below_limit_case(true).await;
}
