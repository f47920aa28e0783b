//! The `/metrics` page passes Prometheus's own parser and linter: `promtool check metrics`
//! (Debian's package `prometheus` provides `/usr/bin/promtool`; `scripts/test` installs it)
//! exits 0 and reports nothing, on a page built from counts and on the page a running service
//! serves after deciding requests (an IPv4 `remote_address` with `detailed_metric` among them).

mod common;

use common::*;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use ratewell_rls::stats::{PROMETHEUS_CONTENT_TYPE, Stats};

fn promtool() -> String {
    let path = std::env::var("PROMTOOL").unwrap_or_else(|_| "promtool".to_owned());
    match Command::new(&path).arg("--version").output() {
        Ok(out) if out.status.success() => path,
        _ => panic!(
            "`{path}` is missing: install Debian's `prometheus` package (apt-get install -y \
             prometheus), which provides /usr/bin/promtool, or set PROMTOOL"
        ),
    }
}

fn check(page: &str) -> (Option<i32>, String) {
    let mut child = Command::new(promtool())
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool runs");
    child.stdin.take().unwrap().write_all(page.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code(), text)
}

#[test]
fn promtool_accepts_the_metrics_page() {
    let stats = Stats::new(100);
    stats.rule("edge.remote_address_10.0.0.1").count(8, 0, 5, 4, true, false);
    stats.rule("edge.k1_v1.k2_v2.k3").count(3, 0, 10, 8, false, false);
    stats.rule("quoted.path_/a\"b\\c:d|e").count(1, 0, 10, 8, false, true);
    stats.config_load_success.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    stats.service_error.fetch_add(2, std::sync::atomic::Ordering::Relaxed);
    stats.total_requests.fetch_add(5, std::sync::atomic::Ordering::Relaxed);
    for us in [50, 300, 2_000, 40_000, 3_000_000] {
        stats.response_time.record(Duration::from_micros(us));
    }
    let page = stats.prometheus_text();
    assert!(PROMETHEUS_CONTENT_TYPE.starts_with("text/plain; version=0.0.4"));
    assert!(
        page.contains(
            "ratelimit_service_rate_limit_total_hits{domain=\"edge\",key1=\"remote_address_10_0_0_1\"} 8\n"
        ),
        "{page}"
    );
    assert!(page.contains("# TYPE ratelimit_service_response_time_seconds histogram\n"));
    assert!(!page.contains(" unknown\n") && !page.contains("# EOF"));

    passes(&page);
}

/// promtool exits 0 on `page` and says nothing about it.
fn passes(page: &str) {
    let (code, out) = check(page);
    assert_eq!(code, Some(0), "promtool:\n{out}\n{page}");
    assert!(out.trim().is_empty(), "promtool:\n{out}\n{page}");
}

const DETAILED: &str = "
domain: edge
descriptors:
  - key: remote_address
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5}
";

/// The page a running service serves: what it decided, under the sanitised keys.
#[tokio::test]
async fn promtool_accepts_the_served_page() {
    let env = [("USE_PROMETHEUS", "true"), ("PROMETHEUS_ADDR", "127.0.0.1:0")];
    let mut h = Harness::start(&[("edge.yaml", DETAILED)], &env, 600).await;
    for _ in 0..8 {
        h.call(request("edge", &[&[("remote_address", "10.0.0.1")]], 1)).await.unwrap();
    }
    // An error too, so that its family has a sample: an empty descriptor list.
    h.call(request("edge", &[], 1)).await.unwrap_err();
    let addr = h.running.prometheus.expect("the Prometheus listener");
    let (code, page) = http(addr, "GET", "/metrics", b"").await;
    assert_eq!(code, 200);
    let series = |name: &str| format!("{name}{{domain=\"edge\",key1=\"remote_address_10_0_0_1\"}}");
    for (name, value) in [("total_hits", 8), ("over_limit", 3), ("within_limit", 5)] {
        let line = format!("{} {value}\n", series(&format!("ratelimit_service_rate_limit_{name}")));
        assert!(page.contains(&line), "{line}\n{page}");
    }
    passes(&page);
}

/// The check is not vacuous: promtool refuses the OpenMetrics type this page used to declare.
#[test]
fn promtool_refuses_unknown_in_the_0_0_4_format() {
    let (code, out) = check("# TYPE x unknown\nx 1\n");
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("unknown metric type"), "{out}");
}
