//! Hostile and absurd configuration files: each gets an error that names the file, or loads,
//! and nothing panics.

use ratewell_rls::config::{ConfigFile, RateLimitConfig};
use ratewell_rls::proto::{Entry, RateLimitDescriptor};

fn load(yaml: &str) -> Result<RateLimitConfig, String> {
    let file = ConfigFile::parse("bad.yaml", yaml).map_err(|e| e.to_string())?;
    RateLimitConfig::new(&[file], false).map_err(|e| e.to_string())
}

fn nested(levels: usize) -> String {
    let mut yaml = String::from("domain: d\ndescriptors:\n");
    for level in 0..levels {
        let indent = "  ".repeat(2 * level);
        yaml.push_str(&format!("{indent}- key: k{level}\n"));
        if level + 1 == levels {
            yaml.push_str(&format!(
                "{indent}  rate_limit: {{unit: second, requests_per_unit: 7}}\n"
            ));
        } else {
            yaml.push_str(&format!("{indent}  descriptors:\n"));
        }
    }
    yaml
}

#[test]
fn ten_thousand_descriptors() {
    let mut yaml = String::from("domain: d\ndescriptors:\n");
    for i in 0..10_000 {
        yaml.push_str(&format!(
            "  - {{key: k, value: v{i}, rate_limit: {{unit: second, requests_per_unit: {i}}}}}\n"
        ));
    }
    let config = load(&yaml).unwrap();
    let descriptor = RateLimitDescriptor {
        entries: vec![Entry { key: "k".into(), value: "v9999".into() }],
        ..Default::default()
    };
    assert_eq!(config.get_limit("d", &descriptor).unwrap().requests_per_unit, 9_999);
}

/// The YAML reader refuses documents nested deeper than 128: 63 levels of descriptors load
/// (each level a list and a map) and match at the deepest, 64 and more are an error.
#[test]
fn deep_nesting() {
    let config = load(&nested(63)).unwrap();
    let entries: Vec<Entry> =
        (0..63).map(|level| Entry { key: format!("k{level}"), value: "x".into() }).collect();
    let descriptor = RateLimitDescriptor { entries, ..Default::default() };
    assert_eq!(config.get_limit("d", &descriptor).unwrap().requests_per_unit, 7);

    for levels in [64, 100] {
        let error = load(&nested(levels)).unwrap_err();
        assert!(error.starts_with("bad.yaml: error loading config file: "), "{error}");
        assert!(error.contains("recursion limit exceeded"), "{error}");
    }
}

#[test]
fn malformed() {
    let cases = [
        ("domain: [unclosed", "error loading config file: "),
        ("- just\n- a list\n", "error loading config file: the file is a list, not a map"),
        ("plain scalar", "error loading config file: the file is a string, not a map"),
        ("domain: d\ndescriptors: {key: k}\n", "error loading config file: "),
        ("domain: d\nbogus: 1\n", "config error, unknown key 'bogus'"),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n",
            "error loading config file: ",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 4294967296}\n",
            "error loading config file: ",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1.5}\n",
            "error checking config",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: maybe\n",
            "error loading config file: ",
        ),
        ("domain: d\ndescriptors:\n  - key: ''\n", "descriptor has empty key"),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 1}\n",
            "invalid rate limit unit ''",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n",
            "share_threshold can only be used with wildcard values (containing '*'), but found key 'k_v'",
        ),
        ("domain: d\ndomain: e\n", "error loading config file: "),
        ("", "config file cannot have empty domain"),
    ];
    for (yaml, expected) in cases {
        let error = load(yaml).expect_err(yaml);
        assert!(error.starts_with("bad.yaml: "), "{yaml:?}: {error}");
        assert!(error.contains(expected), "{yaml:?}: {error} (expected {expected:?})");
    }
}

#[test]
fn scalars_read_as_strings() {
    // Go's yaml.v2 reads any scalar into a string field: `value: 443` is the value "443".
    let config = load("domain: d\ndescriptors:\n  - {key: port, value: 443, rate_limit: {unit: second, requests_per_unit: 3}}\n").unwrap();
    let descriptor = RateLimitDescriptor {
        entries: vec![Entry { key: "port".into(), value: "443".into() }],
        ..Default::default()
    };
    assert_eq!(config.get_limit("d", &descriptor).unwrap().full_key, "d.port_443");
}
