//! The matching rules the Go suite leaves untested: several wildcards at one level (the first in
//! configuration order wins), no backtracking, and depth (a limit applies only at the node of
//! the request's last entry).

use ratewell_rls::config::{ConfigFile, RateLimitConfig};
use ratewell_rls::proto::{Entry, RateLimitDescriptor};

fn config(yaml: &str) -> RateLimitConfig {
    RateLimitConfig::new(&[ConfigFile::parse("test.yaml", yaml).unwrap()], false).unwrap()
}

fn rpu(config: &RateLimitConfig, entries: &[(&str, &str)]) -> Option<u32> {
    let descriptor = RateLimitDescriptor {
        entries: entries.iter().map(|&(k, v)| Entry { key: k.into(), value: v.into() }).collect(),
        ..Default::default()
    };
    config.get_limit("d", &descriptor).map(|l| l.requests_per_unit)
}

#[test]
fn wildcards_in_configuration_order() {
    let first_general = config(
        "
domain: d
descriptors:
  - {key: path, value: 'a*', rate_limit: {unit: second, requests_per_unit: 1}}
  - {key: path, value: 'ab*', rate_limit: {unit: second, requests_per_unit: 2}}
  - {key: path, value: 'abc', rate_limit: {unit: second, requests_per_unit: 3}}
",
    );
    assert_eq!(rpu(&first_general, &[("path", "abd")]), Some(1), "the first wildcard that matches");
    assert_eq!(
        rpu(&first_general, &[("path", "abc")]),
        Some(3),
        "an exact value before any wildcard"
    );
    let first_specific = config(
        "
domain: d
descriptors:
  - {key: path, value: 'ab*', rate_limit: {unit: second, requests_per_unit: 2}}
  - {key: path, value: 'a*', rate_limit: {unit: second, requests_per_unit: 1}}
",
    );
    assert_eq!(rpu(&first_specific, &[("path", "abd")]), Some(2));
    assert_eq!(rpu(&first_specific, &[("path", "axe")]), Some(1));
}

#[test]
fn no_backtracking_and_depth() {
    let config = config(
        "
domain: d
descriptors:
  - key: k1
    value: v1
    descriptors:
      - {key: k2, value: x, rate_limit: {unit: minute, requests_per_unit: 10}}
  - key: k1
    descriptors:
      - {key: k2, rate_limit: {unit: minute, requests_per_unit: 20}}
    rate_limit: {unit: minute, requests_per_unit: 30}
",
    );
    // `k1_v1` matched, and its children do not match `k2_y`: the `k1` branch is not tried.
    assert_eq!(rpu(&config, &[("k1", "v1"), ("k2", "y")]), None);
    assert_eq!(rpu(&config, &[("k1", "v1"), ("k2", "x")]), Some(10));
    assert_eq!(rpu(&config, &[("k1", "other"), ("k2", "y")]), Some(20));
    // The node of the last entry decides: a shorter request gets its own node's limit, a
    // longer one none.
    assert_eq!(rpu(&config, &[("k1", "other")]), Some(30));
    assert_eq!(rpu(&config, &[("k1", "v1")]), None);
    assert_eq!(rpu(&config, &[("k1", "other"), ("k2", "y"), ("k3", "z")]), None);
}
