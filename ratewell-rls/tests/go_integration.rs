//! envoyproxy/ratelimit's `test/integration/integration_test.go`, ported case for case against
//! the `ratewell-rls` binary: started with the Go suite's configuration files (written into a
//! runtime directory of the test's own), asked over gRPC on loopback, on the real clock as the
//! Go suite is (a case that must not straddle a window's boundary waits for the next one when
//! it is close).
//!
//! The Go suite runs each case against Redis (single, per-second, cluster, sentinel, with and
//! without TLS, auth and the local cache) and memcache. This build decides in process
//! (`BACKEND_TYPE=memory`), so each case runs once, on the memory store; the variants that only
//! change the backend's connection are not ported (see the crate README).

mod common;

use std::time::Duration;

use common::*;
use ratewell_rls::proto::{Code, Unit};

const BASIC: &str = "
domain: basic
descriptors:
  - key: key1
    rate_limit:
      unit: second
      requests_per_unit: 50

  - key: key1_local
    rate_limit:
      unit: second
      requests_per_unit: 50

  - key: one_per_minute
    rate_limit:
      unit: minute
      requests_per_unit: 1
";

const ANOTHER: &str = "
domain: another
descriptors:
  - key: key2
    rate_limit:
      unit: minute
      requests_per_unit: 20

  - key: key3
    rate_limit:
      unit: hour
      requests_per_unit: 10

  - key: key2_local
    rate_limit:
      unit: minute
      requests_per_unit: 20

  - key: key3_local
    rate_limit:
      unit: hour
      requests_per_unit: 10

  - key: key4
    rate_limit:
      unit: day
      requests_per_unit: 20

  - key: key4_local
    rate_limit:
      unit: day
      requests_per_unit: 20
";

const SHARE_THRESHOLD: &str = "
domain: share-threshold-test
descriptors:
  # Test case 1: share_threshold: true - files/* should share threshold
  - key: files
    value: files/*
    share_threshold: true
    rate_limit:
      unit: hour
      requests_per_unit: 10

  - key: files_no_share
    value: files_no_share/*
    rate_limit:
      unit: hour
      requests_per_unit: 10
";

const RELOAD: &str = "
domain: reload
descriptors:
  - key: key1
    rate_limit:
      unit: second
      requests_per_unit: 50

  - key: block
    rate_limit:
      unit: second
      requests_per_unit: 0

  - key: one_per_minute
    rate_limit:
      unit: minute
      requests_per_unit: 1
";

/// The Go suite's runtime directory: `runtime/current/ratelimit/config/` holds basic, another
/// and share_threshold; `reload.yaml` waits beside it.
fn runtime() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    write_config(
        root.path(),
        &[
            ("basic.yaml", BASIC),
            ("another.yaml", ANOTHER),
            ("share_threshold.yaml", SHARE_THRESHOLD),
        ],
    );
    std::fs::write(root.path().join("ratelimit").join("reload.yaml"), RELOAD).unwrap();
    root
}

fn start(root: &tempfile::TempDir, extra: &[(&str, &str)]) -> Binary {
    let root_path = root.path().display().to_string();
    let mut env = vec![
        ("RUNTIME_ROOT", root_path.as_str()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_ADDR", "127.0.0.1:0"),
    ];
    env.extend_from_slice(extra);
    Binary::spawn(&env)
}

fn reset_of(r: &ratewell_rls::proto::RateLimitResponse, i: usize) -> i64 {
    r.statuses[i].duration_until_reset.as_ref().expect("a reset").seconds
}

async fn metric(b: &Binary, line_start: &str) -> u64 {
    let (code, text) = http(b.prometheus.unwrap(), "GET", "/metrics", b"").await;
    assert_eq!(code, 200);
    text.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .map_or(0, |v| v.parse().unwrap())
}

/// TestBasicConfig (testBasicBaseConfig): an unknown domain, a second limit, a minute limit
/// run over, two limits in one request, and the reset counting down. The Go case checks its
/// statistics after each request; the same counts are read from `/metrics`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_config() {
    let root = runtime();
    let b = start(&root, &[]);
    let c = b.client().await;
    let call = |r| {
        let mut c = c.clone();
        async move { c.should_rate_limit(r).await.unwrap().into_inner() }
    };

    let r = call(request("foo", &[&[("hello", "world")]], 1)).await;
    assert_eq!(r, response(Code::Ok, vec![no_limit(0)]));

    clear_of_boundary(1, 0).await;
    let r = call(request("basic", &[&[("key1", "foo")]], 1)).await;
    let reset = reset_of(&r, 0);
    assert_eq!(r, response(Code::Ok, vec![status(Code::Ok, 50, Unit::Second, 49, reset)]));
    assert_eq!(
        metric(&b, "ratelimit_service_rate_limit_total_hits{domain=\"basic\",key1=\"key1\"}").await,
        1
    );

    // Over a minute limit with a random key (the loop must not straddle a minute).
    clear_of_boundary(60, 10).await;
    let value = format!("{}", std::process::id() as u64 * 1_000_003 + 17);
    for i in 0..25u32 {
        let r = call(request("another", &[&[("key2", &value)]], 1)).await;
        let (code, remaining) =
            if i >= 20 { (Code::OverLimit, 0) } else { (Code::Ok, 20 - (i + 1)) };
        let reset = reset_of(&r, 0);
        assert!((1..=60).contains(&reset), "{reset}");
        assert_eq!(
            r,
            response(code, vec![status(code, 20, Unit::Minute, remaining, reset)]),
            "request {i}"
        );
        let key2 = "{domain=\"another\",key1=\"key2\"}";
        assert_eq!(
            metric(&b, &format!("ratelimit_service_rate_limit_total_hits{key2}")).await,
            u64::from(i) + 1
        );
        let over = metric(&b, &format!("ratelimit_service_rate_limit_over_limit{key2}")).await;
        assert_eq!(over, if i >= 20 { u64::from(i) - 19 } else { 0 });
    }

    // Two limits in one request: the hour limit runs out first. From then on the request is
    // denied and charges neither (the Go service goes on charging key2, unless
    // STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, whose expectations these are).
    clear_of_boundary(60, 10).await;
    clear_of_boundary(3600, 10).await;
    let value = format!("{}", std::process::id() as u64 * 7_000_013 + 3);
    for i in 0..15u32 {
        let r = call(request("another", &[&[("key2", &value)], &[("key3", &value)]], 1)).await;
        let (code, first, second) =
            if i >= 10 { (Code::OverLimit, 10, 0) } else { (Code::Ok, 20 - (i + 1), 10 - (i + 1)) };
        let statuses = vec![
            status(Code::Ok, 20, Unit::Minute, first, reset_of(&r, 0)),
            status(code, 10, Unit::Hour, second, reset_of(&r, 1)),
        ];
        assert_eq!(r, response(code, statuses), "request {i}");
        let key2 = "{domain=\"another\",key1=\"key2\"}";
        let key3 = "{domain=\"another\",key1=\"key3\"}";
        assert_eq!(
            metric(&b, &format!("ratelimit_service_rate_limit_total_hits{key2}")).await,
            u64::from(i) + 26
        );
        assert_eq!(metric(&b, &format!("ratelimit_service_rate_limit_over_limit{key2}")).await, 5);
        assert_eq!(
            metric(&b, &format!("ratelimit_service_rate_limit_total_hits{key3}")).await,
            u64::from(i) + 1
        );
        let over = metric(&b, &format!("ratelimit_service_rate_limit_over_limit{key3}")).await;
        assert_eq!(over, if i >= 10 { u64::from(i) - 9 } else { 0 });
    }

    // The reset counts down.
    let first = call(request("another", &[&[("key4", "durTest")]], 1)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let second = call(request("another", &[&[("key4", "durTest")]], 1)).await;
    assert!(reset_of(&second, 0) < reset_of(&first, 0));
}

async fn config_reload(watch_root: bool) {
    let root = tempfile::tempdir().unwrap();
    // With RUNTIME_WATCH_ROOT, RUNTIME_ROOT is a symlink swapped to a new directory.
    let v1 = root.path().join("v1");
    write_config(&v1, &[("basic.yaml", BASIC), ("another.yaml", ANOTHER)]);
    let current = root.path().join("current");
    std::os::unix::fs::symlink(&v1, &current).unwrap();
    let current_s = current.display().to_string();
    let watch = if watch_root { "true" } else { "false" };
    let b = Binary::spawn(&[
        ("RUNTIME_ROOT", &current_s),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_WATCH_ROOT", watch),
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_ADDR", "127.0.0.1:0"),
    ]);
    let mut c = b.client().await;
    let r = c
        .should_rate_limit(request("reload", &[&[("block", "foo")]], 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r, response(Code::Ok, vec![no_limit(0)]));
    let loads = || metric(&b, "ratelimit_service_config_load_success ");
    let before = loads().await;
    // RELOAD_INTERVAL is 50 ms (`Binary::spawn`): a change takes effect within 100 intervals,
    // a bound that a busy machine's scheduling stays far below and that a service not reading
    // the directory at its interval goes past.
    let promised = Duration::from_secs(5);

    let started = std::time::Instant::now();
    if watch_root {
        let v2 = root.path().join("v2");
        write_config(
            &v2,
            &[("basic.yaml", BASIC), ("another.yaml", ANOTHER), ("reload.yaml", RELOAD)],
        );
        let next = root.path().join("next");
        std::os::unix::fs::symlink(&v2, &next).unwrap();
        std::fs::rename(&next, &current).unwrap();
    } else {
        write_config(&v1, &[("reload.yaml", RELOAD)]);
    }
    while loads().await <= before {
        assert!(started.elapsed() < promised, "reloaded within {promised:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    clear_of_boundary(1, 0).await;
    let r = c
        .should_rate_limit(request("reload", &[&[("key1", "foo")]], 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r,
        response(Code::Ok, vec![status(Code::Ok, 50, Unit::Second, 49, reset_of(&r, 0))])
    );
    let r = c
        .should_rate_limit(request("reload", &[&[("block", "foo")]], 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, Code::OverLimit as i32, "a limit of 0 rejects");

    let before = loads().await;
    if watch_root {
        std::os::unix::fs::symlink(&v1, root.path().join("back")).unwrap();
        std::fs::rename(root.path().join("back"), &current).unwrap();
    } else {
        std::fs::remove_file(config_dir(&v1).join("reload.yaml")).unwrap();
    }
    let started = std::time::Instant::now();
    while loads().await <= before {
        assert!(started.elapsed() < promised, "restored within {promised:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let r = c
        .should_rate_limit(request("reload", &[&[("block", "foo")]], 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r, response(Code::Ok, vec![no_limit(0)]), "the domain is gone again");

    // Beyond the Go case: a bad file is refused within the bound, counted and logged, and the
    // configuration in force stays.
    let errors = || metric(&b, "ratelimit_service_config_load_error ");
    let before = errors().await;
    // Both modes' root points at v1 again by now.
    let dir = config_dir(&v1);
    std::fs::write(dir.join("bad.yaml"), "domain: bad\nratelimit: {}\n").unwrap();
    let started = std::time::Instant::now();
    while errors().await <= before {
        assert!(started.elapsed() < promised, "refused within {promised:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The counter moves before the line is written, and the line is read from the process's
    // standard error by a thread of the test's: waited for on its own.
    b.wait_logged("error loading new configuration").await;
    let r =
        c.should_rate_limit(request("basic", &[&[("key1", "foo")]], 1)).await.unwrap().into_inner();
    assert_eq!(r.statuses[0].current_limit.as_ref().map(|l| l.requests_per_unit), Some(50));
}

/// TestBasicReloadConfig with `RUNTIME_WATCH_ROOT=true`: the root symlink swapped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_reload_config_watch_root() {
    config_reload(true).await;
}

/// TestBasicReloadConfig with `RUNTIME_WATCH_ROOT=false` (testBasicConfigWithoutWatchRoot's
/// reload): a file written into the directory, then removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_reload_config_without_watch_root() {
    config_reload(false).await;
}

/// TestShareThreshold: every value `files/*` matches shares one count; values of a rule
/// without `share_threshold` count apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_threshold() {
    let root = runtime();
    let b = start(&root, &[]);
    let mut c = b.client().await;
    clear_of_boundary(3600, 5).await;
    let domain = "share-threshold-test";
    for i in 0..10 {
        let r = c
            .should_rate_limit(request(domain, &[&[("files", "files/a.pdf")]], 1))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.overall_code, Code::Ok as i32, "request {i}");
    }
    let r = c
        .should_rate_limit(request(domain, &[&[("files", "files/b.csv")]], 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r,
        response(
            Code::OverLimit,
            vec![status(Code::OverLimit, 10, Unit::Hour, 0, reset_of(&r, 0))]
        )
    );
    for i in 0..10 {
        let value = format!("files_no_share/{}-{i}", std::process::id());
        let r = c
            .should_rate_limit(request(domain, &[&[("files_no_share", &value)]], 1))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            r,
            response(Code::Ok, vec![status(Code::Ok, 10, Unit::Hour, 9, reset_of(&r, 0))])
        );
    }
}
