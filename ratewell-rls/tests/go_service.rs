//! envoyproxy/ratelimit's `test/service/ratelimit_test.go`, ported case for case.
//!
//! The Go suite drives its service with a mocked configuration and a mocked cache that return
//! canned limits and statuses. Here each case is the same situation made real: a configuration
//! file that yields those limits, requests that bring the descriptors to those states (a
//! descriptor the mock answers OVER_LIMIT is spent first), and the answer read over gRPC on
//! loopback from the service running in process, its clock at the Go suite's 2222 s. Each
//! expected response is the Go case's, with what a real cache adds to the mock's statuses (the
//! limit on every status that has one, `duration_until_reset`); where this service answers
//! otherwise on purpose, the case says so and the crate README's table lists it.

mod common;

use std::sync::atomic::Ordering;

use common::*;
use ratewell_rls::proto::{Code, HeaderValue, Unit};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const NOW: u64 = 2222;
/// A minute window at 2222 s ends in 58 s.
const RESET: i64 = 58;

const DIFFERENT_DOMAIN: &str = "
domain: different-domain
descriptors:
  - key: foo
    value: bar
    rate_limit: {unit: minute, requests_per_unit: 10, name: key_name}
";

async fn spend(h: &mut Harness, domain: &str, entries: &[(&str, &str)], n: usize) {
    for i in 0..n {
        let r = h.call(request(domain, &[entries], 1)).await.unwrap();
        assert_eq!(r.overall_code, Code::Ok as i32, "spending {entries:?}: request {i} of {n}");
    }
}

fn counter(
    h: &Harness,
    pick: impl Fn(&ratewell_rls::stats::Stats) -> &std::sync::atomic::AtomicU64,
) -> u64 {
    pick(h.running.service.stats()).load(Ordering::Relaxed)
}

/// TestService: an unknown domain, a reload, a request over the limit, a refused reload that
/// keeps the configuration, and the same request in the other order.
#[tokio::test]
async fn service() {
    let mut h = Harness::start(&[("different.yaml", DIFFERENT_DOMAIN)], &[], NOW).await;
    let r = h.call(request("test-domain", &[&[("hello", "world")]], 1)).await.unwrap();
    assert_eq!(r, response(Code::Ok, vec![no_limit(0)]));

    h.reconfigure(&[("different.yaml", &format!("{DIFFERENT_DOMAIN}# reloaded\n"))]).await;
    spend(&mut h, "different-domain", &[("foo", "bar")], 10).await;
    let req = request("different-domain", &[&[("foo", "bar")], &[("hello", "world")]], 1);
    let over = named(Code::OverLimit, "key_name", 10, Unit::Minute, 0, RESET);
    assert_eq!(
        h.call(req).await.unwrap(),
        response(Code::OverLimit, vec![over.clone(), no_limit(0)])
    );

    h.reconfigure(&[("different.yaml", "domain: different-domain\nratelimit: {}\n")]).await;
    let req = request("different-domain", &[&[("hello", "world")], &[("foo", "bar")]], 1);
    assert_eq!(h.call(req).await.unwrap(), response(Code::OverLimit, vec![no_limit(0), over]));

    assert_eq!(counter(&h, |s| &s.config_load_success), 2);
    assert_eq!(counter(&h, |s| &s.config_load_error), 1);
    assert_eq!(counter(&h, |s| &s.global_shadow_mode), 0);
}

/// TestServiceGlobalShadowMode: statuses keep OVER_LIMIT, the overall code is OK.
#[tokio::test]
async fn service_global_shadow_mode() {
    let mut h =
        Harness::start(&[("different.yaml", DIFFERENT_DOMAIN)], &[("SHADOW_MODE", "true")], NOW)
            .await;
    h.reconfigure(&[("different.yaml", &format!("{DIFFERENT_DOMAIN}# reloaded\n"))]).await;
    spend(&mut h, "different-domain", &[("foo", "bar")], 10).await;
    let req = request("different-domain", &[&[("foo", "bar")], &[("hello", "world")]], 1);
    let over = named(Code::OverLimit, "key_name", 10, Unit::Minute, 0, RESET);
    assert_eq!(h.call(req).await.unwrap(), response(Code::Ok, vec![over, no_limit(0)]));
    assert_eq!(counter(&h, |s| &s.global_shadow_mode), 1);
    assert_eq!(counter(&h, |s| &s.config_load_success), 2);
    assert_eq!(counter(&h, |s| &s.config_load_error), 0);
}

const SHADOW_BOTH: &str = "
domain: different-domain
descriptors:
  - key: foo
    value: bar
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: hello
    value: world
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 10}
";

/// TestRuleShadowMode: every descriptor over its limit is a shadow one, so all are OK. (The
/// Go mock answers the second status without its limit; a real cache reports it.)
#[tokio::test]
async fn rule_shadow_mode() {
    let mut h = Harness::start(&[("shadow.yaml", SHADOW_BOTH)], &[], NOW).await;
    spend(&mut h, "different-domain", &[("foo", "bar")], 10).await;
    spend(&mut h, "different-domain", &[("hello", "world")], 10).await;
    let req = request("different-domain", &[&[("foo", "bar")], &[("hello", "world")]], 1);
    let ok = status(Code::Ok, 10, Unit::Minute, 0, RESET);
    assert_eq!(h.call(req).await.unwrap(), response(Code::Ok, vec![ok.clone(), ok]));
    assert_eq!(counter(&h, |s| &s.global_shadow_mode), 0);
    let shadow = h.running.service.stats().get("different-domain.foo_bar").unwrap();
    assert_eq!(shadow.shadow_mode.load(Ordering::Relaxed), 1, "the shadow hit is counted");
}

/// TestMixedRuleShadowMode: the shadow descriptor is OK, the other one rejects.
#[tokio::test]
async fn mixed_rule_shadow_mode() {
    let config = SHADOW_BOTH.replacen("shadow_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 10}\n  - key: hello\n    value: world\n    shadow_mode: true", "shadow_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 10}\n  - key: hello\n    value: world\n    shadow_mode: false", 1);
    let mut h = Harness::start(&[("shadow.yaml", &config)], &[], NOW).await;
    spend(&mut h, "different-domain", &[("foo", "bar")], 10).await;
    spend(&mut h, "different-domain", &[("hello", "world")], 10).await;
    let req = request("different-domain", &[&[("foo", "bar")], &[("hello", "world")]], 1);
    let statuses = vec![
        status(Code::Ok, 10, Unit::Minute, 0, RESET),
        status(Code::OverLimit, 10, Unit::Minute, 0, RESET),
    ];
    assert_eq!(h.call(req).await.unwrap(), response(Code::OverLimit, statuses));
    assert_eq!(counter(&h, |s| &s.global_shadow_mode), 0);
}

const DIFFERENT_UNNAMED: &str = "
domain: different-domain
descriptors:
  - key: foo
    value: bar
    rate_limit: {unit: minute, requests_per_unit: 10}
";

async fn headers_case(env: &[(&str, &str)], names: [&str; 3]) {
    let mut h = Harness::start(&[("different.yaml", DIFFERENT_UNNAMED)], env, NOW).await;
    h.reconfigure(&[("different.yaml", &format!("{DIFFERENT_UNNAMED}# reloaded\n"))]).await;
    spend(&mut h, "different-domain", &[("foo", "bar")], 10).await;
    let req = request("different-domain", &[&[("foo", "bar")], &[("hello", "world")]], 1);
    let mut want = response(
        Code::OverLimit,
        vec![status(Code::OverLimit, 10, Unit::Minute, 0, RESET), no_limit(0)],
    );
    want.response_headers_to_add = [(names[0], "10"), (names[1], "0"), (names[2], "58")]
        .iter()
        .map(|(k, v)| HeaderValue { key: k.to_string(), value: v.to_string(), raw_value: vec![] })
        .collect();
    assert_eq!(h.call(req).await.unwrap(), want);
}

/// TestServiceWithCustomRatelimitHeaders.
#[tokio::test]
async fn service_with_custom_ratelimit_headers() {
    let env = [
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
        ("LIMIT_LIMIT_HEADER", "A-Ratelimit-Limit"),
        ("LIMIT_REMAINING_HEADER", "A-Ratelimit-Remaining"),
        ("LIMIT_RESET_HEADER", "A-Ratelimit-Reset"),
    ];
    headers_case(&env, ["A-Ratelimit-Limit", "A-Ratelimit-Remaining", "A-Ratelimit-Reset"]).await;
}

/// TestServiceWithDefaultRatelimitHeaders.
#[tokio::test]
async fn service_with_default_ratelimit_headers() {
    let env = [("LIMIT_RESPONSE_HEADERS_ENABLED", "true")];
    headers_case(&env, ["RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"]).await;
}

/// TestEmptyDomain.
#[tokio::test]
async fn empty_domain() {
    let mut h = Harness::start(&[("different.yaml", DIFFERENT_DOMAIN)], &[], NOW).await;
    let e = h.call(request("", &[&[("hello", "world")]], 1)).await.unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (tonic::Code::Unknown, "rate limit domain must not be empty")
    );
    assert_eq!(counter(&h, |s| &s.service_error), 1);
}

/// TestEmptyDescriptors.
#[tokio::test]
async fn empty_descriptors() {
    let mut h = Harness::start(&[("different.yaml", DIFFERENT_DOMAIN)], &[], NOW).await;
    let e = h.call(request("test-domain", &[], 1)).await.unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (tonic::Code::Unknown, "rate limit descriptor list must not be empty")
    );
    assert_eq!(counter(&h, |s| &s.service_error), 1);
}

/// TestCacheError: the store cannot decide. The Go case's cache fails on Redis; here the Redis
/// store's server is down (a loopback port nobody listens on). The answer is an error
/// (`UNAVAILABLE`, as `REDIS_FAILOVER=error` answers), counted as the store's (`redis_error`).
#[tokio::test]
async fn cache_error() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("127.0.0.1:{port}");
    let env = [
        ("BACKEND_TYPE", "redis"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", url.as_str()),
        ("REDIS_TIMEOUT", "200ms"),
    ];
    let mut h = Harness::start(&[("different.yaml", DIFFERENT_DOMAIN)], &env, NOW).await;
    let e = h.call(request("different-domain", &[&[("foo", "bar")]], 1)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert_eq!(counter(&h, |s| &s.redis_error), 1);
    assert_eq!(counter(&h, |s| &s.service_error), 0);
}

/// TestInitialLoadError: a configuration refused at start leaves none loaded.
#[tokio::test]
async fn initial_load_error() {
    let mut h =
        Harness::start(&[("bad.yaml", "domain: test-domain\nratelimit: {}\n")], &[], NOW).await;
    let e = h.call(request("test-domain", &[&[("hello", "world")]], 1)).await.unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (tonic::Code::Unknown, "no rate limit configuration loaded")
    );
    assert_eq!(counter(&h, |s| &s.service_error), 1);
    assert_eq!(counter(&h, |s| &s.config_load_error), 1);
}

/// TestUnlimited: an unlimited descriptor is OK with 2^32 - 1 remaining and counted nowhere.
#[tokio::test]
async fn unlimited() {
    let config = "
domain: some-domain
descriptors:
  - key: foo
    value: bar
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: baz
    value: qux
    rate_limit: {unlimited: true}
";
    let mut h = Harness::start(&[("some.yaml", config)], &[], NOW).await;
    let req =
        request("some-domain", &[&[("foo", "bar")], &[("hello", "world")], &[("baz", "qux")]], 1);
    let statuses =
        vec![status(Code::Ok, 10, Unit::Minute, 9, RESET), no_limit(0), no_limit(u32::MAX)];
    assert_eq!(h.call(req).await.unwrap(), response(Code::Ok, statuses));
    assert!(h.running.service.stats().get("some-domain.baz_qux").is_none());
}

// TestServiceTracer is not ported: this service has no tracing (`TRACING_ENABLED` is refused at
// startup).

async fn health(h: &Harness) -> i32 {
    let channel = tonic::transport::Endpoint::try_from(format!("http://{}", h.running.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = HealthClient::new(channel);
    let request = HealthCheckRequest { service: ratewell_rls::server::SERVICE_NAME.into() };
    client.check(request).await.unwrap().into_inner().status
}

/// Poll health until it reads `want`: the status follows a load on the service's own task. The
/// deadline is for a hang only.
async fn wait_health(h: &Harness, want: ServingStatus) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while health(h).await != want as i32 {
        assert!(std::time::Instant::now() < deadline, "health never became {want:?}");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// TestServiceHealthStatus: healthy at start, before any configuration is in force (without
/// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`, the configuration is no component of health):
/// with an empty directory, and with a file refused at start.
#[tokio::test]
async fn service_health_status() {
    let h = Harness::start(&[], &[("FORCE_START_WITHOUT_INITIAL_CONFIG", "true")], NOW).await;
    assert_eq!(health(&h).await, ServingStatus::Serving as i32);
    let bad = Harness::start(&[("bad.yaml", "nonsense: [")], &[], NOW).await;
    assert!(!bad.running.service.config_state().0, "the file is refused");
    assert_eq!(health(&bad).await, ServingStatus::Serving as i32);
}

/// TestServiceHealthStatusAtLeastOneConfigLoaded: not serving until a configuration with a
/// domain is loaded, and again once one without any is.
#[tokio::test]
async fn service_health_status_at_least_one_config_loaded() {
    let env = [
        ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true"),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
    ];
    let h = Harness::start(&[], &env, NOW).await;
    assert_eq!(health(&h).await, ServingStatus::NotServing as i32);
    h.reconfigure(&[("different.yaml", DIFFERENT_DOMAIN)]).await;
    wait_health(&h, ServingStatus::Serving).await;
    h.reconfigure(&[]).await;
    wait_health(&h, ServingStatus::NotServing).await;
}

const QUOTA_DOMAIN: &str = "
domain: quota-domain
descriptors:
  - key: foo
    value: bar
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: hello
    value: world
    rate_limit: {unit: minute, requests_per_unit: 5}
";

/// TestServiceGlobalQuotaMode: every descriptor over its limit, all in quota mode: OVER_LIMIT.
#[tokio::test]
async fn service_global_quota_mode() {
    let mut h =
        Harness::start(&[("quota.yaml", QUOTA_DOMAIN)], &[("QUOTA_MODE", "true")], NOW).await;
    spend(&mut h, "quota-domain", &[("foo", "bar")], 10).await;
    spend(&mut h, "quota-domain", &[("hello", "world")], 5).await;
    let req = request("quota-domain", &[&[("foo", "bar")], &[("hello", "world")]], 1);
    let statuses = vec![
        status(Code::OverLimit, 10, Unit::Minute, 0, RESET),
        status(Code::OverLimit, 5, Unit::Minute, 0, RESET),
    ];
    assert_eq!(h.call(req).await.unwrap(), response(Code::OverLimit, statuses));
}

fn metadata_domain(first: &str, second: &str, first_quota: bool) -> String {
    format!(
        "
domain: quota-domain
descriptors:
  - key: regular
    value: limit
    quota_mode: {first_quota}
    rate_limit: {{unit: minute, requests_per_unit: 10}}
    metadata: {{{first}: service_1}}
  - key: quota
    value: limit
    quota_mode: true
    rate_limit: {{unit: minute, requests_per_unit: 5}}
    metadata: {{{second}: service_2}}
"
    )
}

fn passed_metadata(
    r: &ratewell_rls::proto::RateLimitResponse,
) -> std::collections::BTreeMap<String, String> {
    use prost_types::value::Kind;
    let m = r.dynamic_metadata.as_ref().expect("dynamic metadata");
    let Some(Kind::StructValue(passed)) = m.fields.get("metadata").and_then(|v| v.kind.clone())
    else {
        panic!("no metadata of passed descriptors in {m:?}");
    };
    passed
        .fields
        .into_iter()
        .map(|(k, v)| match v.kind {
            Some(Kind::StringValue(s)) => (k, s),
            other => panic!("{k}: {other:?}"),
        })
        .collect()
}

const METADATA_ENV: [(&str, &str); 2] =
    [("QUOTA_MODE", "true"), ("RESPONSE_DYNAMIC_METADATA", "true")];

/// TestMetadataReturnedForPassedDescriptors: only the passed descriptor's metadata.
#[tokio::test]
async fn metadata_returned_for_passed_descriptors() {
    let mut h = Harness::start(
        &[("quota.yaml", &metadata_domain("name", "name", false))],
        &METADATA_ENV,
        NOW,
    )
    .await;
    spend(&mut h, "quota-domain", &[("quota", "limit")], 5).await;
    let r = h
        .call(request("quota-domain", &[&[("regular", "limit")], &[("quota", "limit")]], 1))
        .await
        .unwrap();
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses[1].code, Code::OverLimit as i32);
    assert_eq!(passed_metadata(&r), [("name".to_string(), "service_1".to_string())].into());
}

/// TestMetadataReturnedForAllPassedDescriptors.
#[tokio::test]
async fn metadata_returned_for_all_passed_descriptors() {
    let mut h = Harness::start(
        &[("quota.yaml", &metadata_domain("name", "some_other_name", true))],
        &METADATA_ENV,
        NOW,
    )
    .await;
    let r = h
        .call(request("quota-domain", &[&[("regular", "limit")], &[("quota", "limit")]], 1))
        .await
        .unwrap();
    assert_eq!(r.overall_code, Code::Ok as i32);
    let want = [("name", "service_1"), ("some_other_name", "service_2")]
        .map(|(k, v)| (k.to_string(), v.to_string()));
    assert_eq!(passed_metadata(&r), want.into());
    // The request itself is described too.
    let m = r.dynamic_metadata.unwrap();
    assert_eq!(
        m.fields["domain"].kind,
        Some(prost_types::value::Kind::StringValue("quota-domain".into()))
    );
}

/// TestOverlappingMetadataReturnsTheFirstValue.
#[tokio::test]
async fn overlapping_metadata_returns_the_first_value() {
    let mut h = Harness::start(
        &[("quota.yaml", &metadata_domain("name", "name", true))],
        &METADATA_ENV,
        NOW,
    )
    .await;
    let r = h
        .call(request("quota-domain", &[&[("regular", "limit")], &[("quota", "limit")]], 1))
        .await
        .unwrap();
    assert_eq!(passed_metadata(&r), [("name".to_string(), "service_1".to_string())].into());
}

const MODES: &str = "
domain: quota-domain
descriptors:
  - key: regular
    value: limit
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: quota
    value: limit
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: quota1
    value: limit
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: quota2
    value: limit
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 3}
";

/// TestServicePerDescriptorQuotaMode: the regular descriptor over rejects. (The quota
/// descriptor was not charged, so it reports the 3 it had; the Go service charges it.)
#[tokio::test]
async fn service_per_descriptor_quota_mode() {
    let mut h = Harness::start(&[("modes.yaml", MODES)], &[], NOW).await;
    spend(&mut h, "quota-domain", &[("regular", "limit")], 5).await;
    let req = request("quota-domain", &[&[("regular", "limit")], &[("quota", "limit")]], 1);
    let statuses = vec![
        status(Code::OverLimit, 5, Unit::Minute, 0, RESET),
        status(Code::Ok, 3, Unit::Minute, 3, RESET),
    ];
    assert_eq!(h.call(req).await.unwrap(), response(Code::OverLimit, statuses));
}

/// TestServiceMixedPerDescriptorModes: every quota descriptor over rejects. (The regular
/// descriptor was not charged: it reports the 5 it had.)
#[tokio::test]
async fn service_mixed_per_descriptor_modes() {
    let mut h = Harness::start(&[("modes.yaml", MODES)], &[], NOW).await;
    spend(&mut h, "quota-domain", &[("quota", "limit")], 3).await;
    let req = request("quota-domain", &[&[("regular", "limit")], &[("quota", "limit")]], 1);
    let statuses = vec![
        status(Code::Ok, 5, Unit::Minute, 5, RESET),
        status(Code::OverLimit, 3, Unit::Minute, 0, RESET),
    ];
    assert_eq!(h.call(req).await.unwrap(), response(Code::OverLimit, statuses));
}

/// TestServiceMixedPerDescriptorModesUnderLimit.
#[tokio::test]
async fn service_mixed_per_descriptor_modes_under_limit() {
    let mut h = Harness::start(&[("modes.yaml", MODES)], &[], NOW).await;
    let req = request("quota-domain", &[&[("regular", "limit")], &[("quota", "limit")]], 1);
    let statuses = vec![
        status(Code::Ok, 5, Unit::Minute, 4, RESET),
        status(Code::Ok, 3, Unit::Minute, 2, RESET),
    ];
    assert_eq!(h.call(req).await.unwrap(), response(Code::Ok, statuses));
}

/// TestServiceQuotaModeOnlyAllOverTheLimit.
#[tokio::test]
async fn service_quota_mode_only_all_over_the_limit() {
    let mut h = Harness::start(&[("modes.yaml", MODES)], &[], NOW).await;
    spend(&mut h, "quota-domain", &[("quota1", "limit")], 5).await;
    spend(&mut h, "quota-domain", &[("quota2", "limit")], 3).await;
    let req = request("quota-domain", &[&[("quota1", "limit")], &[("quota2", "limit")]], 1);
    let statuses = vec![
        status(Code::OverLimit, 5, Unit::Minute, 0, RESET),
        status(Code::OverLimit, 3, Unit::Minute, 0, RESET),
    ];
    assert_eq!(h.call(req).await.unwrap(), response(Code::OverLimit, statuses));
}

/// TestServiceQuotaModeOnlySomeOverTheLimit: admitted, and the quota descriptor with room is
/// charged.
#[tokio::test]
async fn service_quota_mode_only_some_over_the_limit() {
    let mut h = Harness::start(&[("modes.yaml", MODES)], &[], NOW).await;
    spend(&mut h, "quota-domain", &[("quota1", "limit")], 5).await;
    let req = request("quota-domain", &[&[("quota1", "limit")], &[("quota2", "limit")]], 1);
    let statuses = vec![
        status(Code::OverLimit, 5, Unit::Minute, 0, RESET),
        status(Code::Ok, 3, Unit::Minute, 2, RESET),
    ];
    assert_eq!(h.call(req).await.unwrap(), response(Code::Ok, statuses));
}

/// TestServiceQuotaModeWithShadowMode: the global shadow mode answers OK.
#[tokio::test]
async fn service_quota_mode_with_shadow_mode() {
    let mut h = Harness::start(&[("modes.yaml", MODES)], &[("SHADOW_MODE", "true")], NOW).await;
    spend(&mut h, "quota-domain", &[("quota1", "limit")], 5).await;
    spend(&mut h, "quota-domain", &[("quota2", "limit")], 3).await;
    let req = request("quota-domain", &[&[("quota1", "limit")], &[("quota2", "limit")]], 1);
    let statuses = vec![
        status(Code::OverLimit, 5, Unit::Minute, 0, RESET),
        status(Code::OverLimit, 3, Unit::Minute, 0, RESET),
    ];
    assert_eq!(h.call(req).await.unwrap(), response(Code::Ok, statuses));
    assert_eq!(counter(&h, |s| &s.global_shadow_mode), 1);
}

/// TestServiceMixedModeWithShadowMode.
#[tokio::test]
async fn service_mixed_mode_with_shadow_mode() {
    let mut h = Harness::start(&[("modes.yaml", MODES)], &[("SHADOW_MODE", "true")], NOW).await;
    spend(&mut h, "quota-domain", &[("regular", "limit")], 5).await;
    spend(&mut h, "quota-domain", &[("quota", "limit")], 3).await;
    let req = request("quota-domain", &[&[("regular", "limit")], &[("quota", "limit")]], 1);
    let statuses = vec![
        status(Code::OverLimit, 5, Unit::Minute, 0, RESET),
        status(Code::OverLimit, 3, Unit::Minute, 0, RESET),
    ];
    assert_eq!(h.call(req).await.unwrap(), response(Code::Ok, statuses));
    assert_eq!(counter(&h, |s| &s.global_shadow_mode), 1);
}
