//! The `/metrics` page passes Prometheus's own parser: `promtool check metrics` (Debian's
//! package `prometheus` provides `/usr/bin/promtool`).
//!
//! The counters keep the Go service's names, without the `_total` suffix its exporter does not
//! add either; promtool lints exactly those (`counter metrics should have "_total" suffix`, exit
//! status 3) and nothing else is allowed: no parse error, no other lint.

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

    let (code, out) = check(&page);
    let counters: Vec<&str> =
        page.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter")).collect();
    let lints: Vec<&str> = out.lines().filter(|l| !l.trim().is_empty()).collect();
    for lint in &lints {
        let name = lint.strip_suffix(" counter metrics should have \"_total\" suffix");
        assert!(
            name.is_some_and(|n| counters.contains(&n)),
            "promtool refused or linted the page beyond the Go names' missing _total:\n{out}\n{page}"
        );
    }
    assert_eq!(lints.len(), counters.len(), "{out}");
    assert_eq!(code, Some(if lints.is_empty() { 0 } else { 3 }), "{out}");
}

/// The check is not vacuous: promtool refuses the OpenMetrics type this page used to declare.
#[test]
fn promtool_refuses_unknown_in_the_0_0_4_format() {
    let (code, out) = check("# TYPE x unknown\nx 1\n");
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("unknown metric type"), "{out}");
}
