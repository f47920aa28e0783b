//! envoyproxy/ratelimit's `test/config/config_test.go`, ported case for case: the same fixtures
//! (`tests/fixtures/config/`, copied from that repository), the same lookups, the same expected
//! limits, statistics keys and error messages. The Go suite reads a rule's counters by its
//! statistics key (`stats.NewCounter(KEY + ".total_hits")`); here the key itself is compared
//! (`full_key`, which is the key the Go service's stats are created under). Where a Go case
//! builds its configuration as Go structs, the port writes the same configuration as YAML.
//! The crate README's table lists every case.

use ratewell_rls::config::{ConfigError, ConfigFile, RateLimit, RateLimitConfig};
use ratewell_rls::proto::{Entry, RateLimitDescriptor, RateLimitOverride, Unit};

fn fixture(name: &str) -> ConfigFile {
    let path = format!("{}/tests/fixtures/config/{name}", env!("CARGO_MANIFEST_DIR"));
    let content = std::fs::read_to_string(&path).unwrap();
    ConfigFile::parse(name, &content).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn fixture_error(name: &str) -> Option<ConfigError> {
    let path = format!("{}/tests/fixtures/config/{name}", env!("CARGO_MANIFEST_DIR"));
    let content = std::fs::read_to_string(&path).unwrap();
    ConfigFile::parse(name, &content).err()
}

fn load(files: &[ConfigFile], merge: bool) -> Result<RateLimitConfig, ConfigError> {
    RateLimitConfig::new(files, merge)
}

fn inline(yaml: &str) -> RateLimitConfig {
    load(&[ConfigFile::parse("inline", yaml).unwrap()], false).unwrap()
}

fn desc(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|&(key, value)| Entry { key: key.into(), value: value.into() })
            .collect(),
        ..Default::default()
    }
}

fn get(config: &RateLimitConfig, domain: &str, entries: &[(&str, &str)]) -> Option<RateLimit> {
    config.get_limit(domain, &desc(entries))
}

/// The limit of `entries`, which must have one.
fn limit(config: &RateLimitConfig, domain: &str, entries: &[(&str, &str)]) -> RateLimit {
    get(config, domain, entries).unwrap_or_else(|| panic!("no limit for {entries:?}"))
}

/// The error of loading `files`; a file that does not parse fails at parsing, as the Go
/// suite's `loadFile` does (both are the same panic there).
fn error(files: &[&str], merge: bool) -> String {
    let mut parsed = Vec::new();
    for name in files {
        if let Some(e) = fixture_error(name) {
            return e.to_string();
        }
        parsed.push(fixture(name));
    }
    load(&parsed, merge).expect_err("the configuration loads").to_string()
}

#[test]
fn basic_config() {
    let config = load(&[fixture("basic_config.yaml")], false).unwrap();
    assert!(!config.dump().is_empty());
    assert!(!config.is_empty());
    // Go counts `foo_domain.domain_not_found` here; the lookup says the domain is unknown.
    assert!(!config.has_domain("foo_domain"));
    assert_eq!(config.get_limit("foo_domain", &RateLimitDescriptor::default()), None);
    assert!(config.has_domain("test-domain"));
    assert_eq!(config.get_limit("test-domain", &RateLimitDescriptor::default()), None);

    assert_eq!(get(&config, "test-domain", &[("key1", "something")]), None);
    assert_eq!(get(&config, "test-domain", &[("key1", "value1")]), None);
    assert_eq!(get(&config, "test-domain", &[("key2", "value2"), ("subkey", "subvalue")]), None);
    assert_eq!(get(&config, "test-domain", &[("key5", "value5"), ("subkey5", "subvalue")]), None);

    let rl = limit(&config, "test-domain", &[("key1", "value1"), ("subkey1", "something")]);
    assert_eq!((rl.requests_per_unit, rl.unit), (5, Unit::Second));
    assert_eq!(rl.full_key, "test-domain.key1_value1.subkey1");

    let rl = limit(&config, "test-domain", &[("key1", "value1"), ("subkey1", "subvalue1")]);
    assert_eq!((rl.requests_per_unit, rl.unit), (10, Unit::Second));
    assert_eq!(rl.full_key, "test-domain.key1_value1.subkey1_subvalue1");

    let rl = limit(&config, "test-domain", &[("key2", "something")]);
    assert_eq!((rl.requests_per_unit, rl.unit), (20, Unit::Minute));
    assert_eq!(rl.full_key, "test-domain.key2");

    let rl = limit(&config, "test-domain", &[("key2", "value2")]);
    assert_eq!((rl.requests_per_unit, rl.unit), (30, Unit::Minute));
    assert_eq!(rl.full_key, "test-domain.key2_value2");

    assert_eq!(get(&config, "test-domain", &[("key2", "value3")]), None);

    let rl = limit(&config, "test-domain", &[("key3", "foo")]);
    assert_eq!((rl.requests_per_unit, rl.unit), (1, Unit::Hour));
    assert_eq!(rl.name, "", "no name provided in config");
    assert_eq!(rl.full_key, "test-domain.key3");

    let rl = limit(&config, "test-domain", &[("key4", "foo")]);
    assert_eq!((rl.requests_per_unit, rl.unit), (1, Unit::Day));
    assert_eq!(rl.name, "key4_rate_limit", "name provided in config");
    assert_eq!(rl.full_key, "test-domain.key4");

    let rl = limit(&config, "test-domain", &[("key6", "foo")]);
    assert!(rl.unlimited);
    assert_eq!(rl.full_key, "test-domain.key6");

    // detailed_metric: the statistics key holds the request's value.
    let rl = limit(&config, "test-domain", &[("key7", "unspecified_value")]);
    assert_eq!((rl.requests_per_unit, rl.unit), (70, Unit::Minute));
    assert_eq!(rl.full_key, "test-domain.key7_unspecified_value");
    let rl = limit(&config, "test-domain", &[("key7", "another_value")]);
    assert_eq!((rl.requests_per_unit, rl.unit), (70, Unit::Minute));
    assert_eq!(rl.full_key, "test-domain.key7_another_value");
}

#[test]
fn domain_merge() {
    let files = [fixture("merge_domain_key1.yaml"), fixture("merge_domain_key2.yaml")];
    let config = load(&files, true).unwrap();
    assert_eq!(config.get_limit("foo_domain", &RateLimitDescriptor::default()), None);
    assert_eq!(config.get_limit("test-domain", &RateLimitDescriptor::default()), None);
    assert_eq!(limit(&config, "test-domain", &[("key1", "value1")]).requests_per_unit, 10);
    assert_eq!(limit(&config, "test-domain", &[("key2", "value2")]).requests_per_unit, 20);
}

#[test]
fn config_limit_override() {
    let config = load(&[fixture("basic_config.yaml")], false).unwrap();
    let with_override = |entries: &[(&str, &str)], requests_per_unit, unit: Unit| {
        let mut d = desc(entries);
        d.limit = Some(RateLimitOverride { requests_per_unit, unit: unit as i32 });
        d
    };
    // No matching domain.
    let d = with_override(&[], 10, Unit::Day);
    assert_eq!(config.get_limit("foo_domain", &d), None);

    let d = with_override(&[("key1", "value1"), ("subkey1", "something")], 10, Unit::Day);
    let rl = config.get_limit("test-domain", &d).unwrap();
    assert_eq!(rl.full_key, "test-domain.key1_value1.subkey1_something");
    assert_eq!((rl.requests_per_unit, rl.unit, rl.name.as_str()), (10, Unit::Day, ""));

    // A change of the override's value keeps the statistics key.
    let d = with_override(&[("key1", "value1"), ("subkey1", "something")], 42, Unit::Hour);
    let rl = config.get_limit("test-domain", &d).unwrap();
    assert_eq!(rl.full_key, "test-domain.key1_value1.subkey1_something");
    assert_eq!((rl.requests_per_unit, rl.unit), (42, Unit::Hour));

    // Another value is another key.
    let d = with_override(&[("key1", "value1"), ("subkey1", "something_else")], 42, Unit::Hour);
    let rl = config.get_limit("test-domain", &d).unwrap();
    assert_eq!(rl.full_key, "test-domain.key1_value1.subkey1_something_else");
    assert_eq!((rl.requests_per_unit, rl.unit), (42, Unit::Hour));
    // An override never sets shadow or quota mode.
    assert!(!rl.shadow_mode && !rl.quota_mode && !rl.unlimited);
}

#[test]
fn empty_domain() {
    assert_eq!(
        error(&["empty_domain.yaml"], false),
        "empty_domain.yaml: config file cannot have empty domain"
    );
}

#[test]
fn duplicate_domain() {
    assert_eq!(
        error(&["basic_config.yaml", "duplicate_domain.yaml"], false),
        "duplicate_domain.yaml: duplicate domain 'test-domain' in config file"
    );
}

#[test]
fn empty_key() {
    assert_eq!(error(&["empty_key.yaml"], false), "empty_key.yaml: descriptor has empty key");
}

#[test]
fn duplicate_key() {
    assert_eq!(
        error(&["duplicate_key.yaml"], false),
        "duplicate_key.yaml: duplicate descriptor composite key 'test-domain.key1_value1'"
    );
}

#[test]
fn duplicate_key_domain_merge() {
    assert_eq!(
        error(&["merge_domain_key1.yaml", "merge_domain_key1.yaml"], true),
        "merge_domain_key1.yaml: duplicate descriptor composite key 'test-domain.key1_value1'"
    );
}

#[test]
fn bad_limit_unit() {
    assert_eq!(
        error(&["bad_limit_unit.yaml"], false),
        "bad_limit_unit.yaml: invalid rate limit unit 'foo'"
    );
}

#[test]
fn replaces_self() {
    assert_eq!(
        error(&["replaces_self.yaml"], false),
        "replaces_self.yaml: replaces should not contain name of same descriptor"
    );
}

#[test]
fn replaces_empty() {
    assert_eq!(
        error(&["replaces_empty.yaml"], false),
        "replaces_empty.yaml: should not have an empty replaces entry"
    );
}

/// Go: `bad_yaml.yaml: error loading config file: yaml: line 2: found unexpected end of
/// stream`. The same error, in this YAML library's words (a deliberate difference).
#[test]
fn bad_yaml() {
    let message = error(&["bad_yaml.yaml"], false);
    assert!(message.starts_with("bad_yaml.yaml: error loading config file: "), "{message}");
    assert!(message.contains("unexpected end of stream"), "{message}");
}

#[test]
fn misspelled_key() {
    assert_eq!(
        error(&["misspelled_key.yaml"], false),
        "misspelled_key.yaml: config error, unknown key 'ratelimit'"
    );
    assert_eq!(
        error(&["misspelled_key2.yaml"], false),
        "misspelled_key2.yaml: config error, unknown key 'requestsperunit'"
    );
}

#[test]
fn non_string_key() {
    assert_eq!(
        error(&["non_string_key.yaml"], false),
        "non_string_key.yaml: config error, key is not of type string: 0.25"
    );
}

#[test]
fn non_map_list() {
    assert_eq!(
        error(&["non_map_list.yaml"], false),
        "non_map_list.yaml: config error, yaml file contains list of type other than map: a"
    );
}

#[test]
fn unlimited_with_rate_limit_unit() {
    assert_eq!(
        error(&["unlimited_with_unit.yaml"], false),
        "unlimited_with_unit.yaml: should not specify rate limit unit when unlimited"
    );
}

#[test]
fn shadow_mode_config() {
    let config = load(&[fixture("shadowmode_config.yaml")], false).unwrap();
    let rl = limit(&config, "test-domain", &[("key1", "value1"), ("subkey1", "something")]);
    assert!(!rl.shadow_mode);
    assert_eq!((rl.requests_per_unit, rl.unit), (5, Unit::Second));
    assert_eq!(rl.full_key, "test-domain.key1_value1.subkey1");

    let rl = limit(&config, "test-domain", &[("key1", "value1"), ("subkey1", "subvalue1")]);
    assert!(rl.shadow_mode);
    assert_eq!((rl.requests_per_unit, rl.unit), (10, Unit::Second));
    assert_eq!(rl.full_key, "test-domain.key1_value1.subkey1_subvalue1");

    let rl = limit(&config, "test-domain", &[("key2", "something")]);
    assert!(rl.shadow_mode);
    assert_eq!((rl.requests_per_unit, rl.unit), (20, Unit::Minute));
    assert_eq!(rl.full_key, "test-domain.key2");

    let rl = limit(&config, "test-domain", &[("key2", "value2")]);
    assert!(!rl.shadow_mode);
    assert_eq!((rl.requests_per_unit, rl.unit), (30, Unit::Minute));
    assert_eq!(rl.full_key, "test-domain.key2_value2");
}

#[test]
fn wildcard_config() {
    let config = load(&[fixture("wildcard.yaml")], false).unwrap();

    // A key without a value matches every value, under one statistics key.
    let without1 = limit(&config, "test-domain", &[("noVal", "foo1")]);
    let without2 = limit(&config, "test-domain", &[("noVal", "foo2")]);
    assert_eq!(without1, without2);
    assert_eq!(without1.full_key, "test-domain.noVal");

    let wildcard1 = limit(&config, "test-domain", &[("wild", "foo1")]);
    let wildcard2 = limit(&config, "test-domain", &[("wild", "foo2")]);
    let wildcard3 = limit(&config, "test-domain", &[("nestedWild", "val1"), ("wild", "goo2")]);
    assert_eq!(wildcard1, wildcard2);
    assert_eq!(wildcard1.full_key, "test-domain.wild_foo*");
    assert_eq!(wildcard3.full_key, "test-domain.nestedWild_val1.wild_goo*");

    assert_eq!(get(&config, "test-domain", &[("wild", "bar")]), None, "no match");
    assert_eq!(get(&config, "test-domain", &[("noWild", "foo1")]), None, "no eager match");

    // A `*` in the middle.
    let mid1 = limit(&config, "test-domain", &[("midWild", "barab")]);
    let mid2 = limit(&config, "test-domain", &[("midWild", "bar123b")]);
    assert_eq!(mid1, mid2);
    assert_eq!(mid1.full_key, "test-domain.midWild_bar*b");
    assert!(get(&config, "test-domain", &[("midWild", "barb")]).is_some(), "* matches nothing");
    assert_eq!(get(&config, "test-domain", &[("midWild", "bara")]), None, "no suffix");
    assert_eq!(get(&config, "test-domain", &[("midWild", "xbarb")]), None, "no prefix");

    // Several `*`.
    let multi1 = limit(&config, "test-domain", &[("multiWild", "foo123bar456baz")]);
    let multi2 = limit(&config, "test-domain", &[("multiWild", "foobarbaz")]);
    assert_eq!(multi1, multi2);
    assert_eq!(multi1.full_key, "test-domain.multiWild_foo*bar*baz");
    assert_eq!(get(&config, "test-domain", &[("multiWild", "foo123baz")]), None, "no 'bar'");
    assert_eq!(get(&config, "test-domain", &[("multiWild", "bar456baz")]), None, "no 'foo'");
}

/// The Go suite's `realisticExampleConfig`.
const REALISTIC: &str = "
domain: nested
descriptors:
  - key: key_1
    rate_limit: {requests_per_unit: 500, unit: minute}
    detailed_metric: true
  - key: key_1
    value: some-value-for-key-1
    rate_limit: {requests_per_unit: 500, unit: minute}
  - key: key_2
    rate_limit: {requests_per_unit: 5000, unit: minute}
    detailed_metric: true
    descriptors:
      - key: key_3
        detailed_metric: true
      - key: key_3
        value: requested-key3-value
        rate_limit: {requests_per_unit: 5, unit: minute}
        detailed_metric: true
  - key: key_2
    value: specific-id
    rate_limit: {requests_per_unit: 50000, unit: minute}
    detailed_metric: true
    descriptors:
      - key: key_3
        detailed_metric: true
      - key: key_3
        value: requested-key3-value
        rate_limit: {requests_per_unit: 100, unit: minute}
        detailed_metric: true
";

fn nested(outer_detailed: bool, inner_detailed: bool) -> String {
    format!(
        "
domain: nested
descriptors:
  - key: key-1
    rate_limit: {{requests_per_unit: 100, unit: minute}}
    detailed_metric: {outer_detailed}
    descriptors:
      - key: key-2
        rate_limit: {{requests_per_unit: 5, unit: minute}}
        detailed_metric: {inner_detailed}
"
    )
}

/// A case of `TestDetailedMetric`: its name, configuration, request and statistics key.
type Case = (&'static str, String, &'static [(&'static str, &'static str)], &'static str);

#[test]
fn detailed_metric() {
    let cases: [Case; 7] = [
        (
            "nested with no values but request only top-level key",
            nested(true, false),
            &[("key-1", "value-1")],
            "nested.key-1_value-1",
        ),
        (
            "nested with no values but request only top-level key with no detailed metric",
            nested(false, false),
            &[("key-1", "value-1")],
            "nested.key-1",
        ),
        (
            "nested with no values and request fully nested descriptors",
            nested(true, true),
            &[("key-1", "value-1"), ("key-2", "value-2")],
            "nested.key-1_value-1.key-2_value-2",
        ),
        (
            "nested with no values and request fully nested descriptors with no detailed metric",
            nested(false, false),
            &[("key-1", "value-1"), ("key-2", "value-2")],
            "nested.key-1.key-2",
        ),
        (
            "test nested descriptors with simple request",
            REALISTIC.to_owned(),
            &[("key_1", "value-for-key-1")],
            "nested.key_1_value-for-key-1",
        ),
        (
            "test nested only second descriptor request not nested",
            REALISTIC.to_owned(),
            &[("key_2", "key-2-value")],
            "nested.key_2_key-2-value",
        ),
        (
            "test nested descriptors with nested request",
            REALISTIC.to_owned(),
            &[("key_2", "key-2-value"), ("key_3", "requested-key3-value")],
            "nested.key_2_key-2-value.key_3_requested-key3-value",
        ),
    ];
    for (name, yaml, entries, expected) in cases {
        let config = load(&[ConfigFile::parse("inline", &yaml).unwrap()], true).unwrap();
        assert_eq!(limit(&config, "nested", entries).full_key, expected, "{name}");
    }
}

const ROUTE_METHOD_SUBJECT: &str = "
domain: domain
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {requests_per_unit: 60, unit: minute}
";

#[test]
fn value_to_metric_uses_runtime_values_in_stats() {
    let config = inline(ROUTE_METHOD_SUBJECT);
    let rl = limit(
        &config,
        "domain",
        &[("route", "draw"), ("http_method", "GET"), ("subject_id", "123")],
    );
    assert_eq!(rl.full_key, "domain.route_draw.http_method_GET.subject_id");
}

#[test]
fn value_to_metric_default_key_includes_value_at_that_level() {
    let config = inline(
        "
domain: d
descriptors:
  - key: k1
    value_to_metric: true
    descriptors:
      - key: k2
        rate_limit: {requests_per_unit: 1, unit: second}
",
    );
    assert_eq!(limit(&config, "d", &[("k1", "A"), ("k2", "foo")]).full_key, "d.k1_A.k2");
}

#[test]
fn value_to_metric_mid_level_only() {
    let config = inline(
        "
domain: d
descriptors:
  - key: k1
    descriptors:
      - key: k2
        value_to_metric: true
        descriptors:
          - key: k3
            rate_limit: {requests_per_unit: 1, unit: second}
",
    );
    let rl = limit(&config, "d", &[("k1", "X"), ("k2", "Y"), ("k3", "Z")]);
    assert_eq!(rl.full_key, "d.k1.k2_Y.k3");
}

#[test]
fn value_to_metric_no_flag_unchanged() {
    let config = inline(
        "
domain: d
descriptors:
  - key: k1
    descriptors:
      - key: k2
        rate_limit: {requests_per_unit: 1, unit: second}
",
    );
    assert_eq!(limit(&config, "d", &[("k1", "X"), ("k2", "Y")]).full_key, "d.k1.k2");
}

#[test]
fn value_to_metric_does_not_override_detailed_metric() {
    let config = inline(
        "
domain: domain
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            detailed_metric: true
            rate_limit: {requests_per_unit: 60, unit: minute}
",
    );
    let rl = limit(
        &config,
        "domain",
        &[("route", "draw"), ("http_method", "GET"), ("subject_id", "123")],
    );
    assert_eq!(rl.full_key, "domain.route_draw.http_method_GET.subject_id_123");
}

#[test]
fn value_to_metric_with_configured_values() {
    let config = inline(
        "
domain: test-domain
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value: GET
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {requests_per_unit: 60, unit: minute}
      - key: http_method
        value: POST
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {requests_per_unit: 30, unit: minute}
",
    );
    let rl = limit(
        &config,
        "test-domain",
        &[("route", "api"), ("http_method", "GET"), ("subject_id", "user123")],
    );
    assert_eq!(rl.requests_per_unit, 60);
    assert_eq!(rl.full_key, "test-domain.route_api.http_method_GET.subject_id");
    let rl = limit(
        &config,
        "test-domain",
        &[("route", "api"), ("http_method", "POST"), ("subject_id", "user456")],
    );
    assert_eq!(rl.requests_per_unit, 30);
    assert_eq!(rl.full_key, "test-domain.route_api.http_method_POST.subject_id");
}

#[test]
fn value_to_metric_with_wildcard() {
    let config = inline(
        "
domain: domain
descriptors:
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit: {requests_per_unit: 100, unit: minute}
",
    );
    let rl = limit(
        &config,
        "domain",
        &[("user", "alice"), ("action", "readfile"), ("resource", "documents")],
    );
    assert_eq!(rl.requests_per_unit, 100);
    assert_eq!(rl.full_key, "domain.user_alice.action_readfile.resource");
    let rl = limit(
        &config,
        "domain",
        &[("user", "bob"), ("action", "readdata"), ("resource", "database")],
    );
    assert_eq!(rl.full_key, "domain.user_bob.action_readdata.resource");
}

#[test]
fn value_to_metric_with_empty_value() {
    let config = inline(ROUTE_METHOD_SUBJECT);
    let rl =
        limit(&config, "domain", &[("route", ""), ("http_method", "GET"), ("subject_id", "123")]);
    assert_eq!(rl.full_key, "domain.route.http_method_GET.subject_id");
    let rl =
        limit(&config, "domain", &[("route", "draw"), ("http_method", ""), ("subject_id", "123")]);
    assert_eq!(rl.full_key, "domain.route_draw.http_method.subject_id");
    let rl = limit(&config, "domain", &[("route", ""), ("http_method", ""), ("subject_id", "123")]);
    assert_eq!(rl.full_key, "domain.route.http_method.subject_id");
}

/// Go compares `FullKey` with `Stats.Key`; here they are one field, so the case checks the
/// keys themselves under each flag.
#[test]
fn value_to_metric_full_key_matches_stats_key() {
    let config = inline(&ROUTE_METHOD_SUBJECT.replace("domain: domain", "domain: test-domain"));
    let entries = [("route", "api"), ("http_method", "GET"), ("subject_id", "user123")];
    assert_eq!(
        limit(&config, "test-domain", &entries).full_key,
        "test-domain.route_api.http_method_GET.subject_id"
    );

    let plain = "
domain: test-domain-2
descriptors:
  - key: route
    descriptors:
      - key: http_method
        descriptors:
          - key: subject_id
            rate_limit: {requests_per_unit: 60, unit: minute}
";
    let config = inline(plain);
    assert_eq!(
        limit(&config, "test-domain-2", &entries).full_key,
        "test-domain-2.route.http_method.subject_id"
    );

    let detailed = plain.replace("test-domain-2", "test-domain-3").replace(
        "          - key: subject_id\n",
        "          - key: subject_id\n            detailed_metric: true\n",
    );
    let config = inline(&detailed);
    assert_eq!(
        limit(&config, "test-domain-3", &entries).full_key,
        "test-domain-3.route_api.http_method_GET.subject_id_user123"
    );
}

#[test]
fn share_threshold() {
    let config = load(&[fixture("share_threshold.yaml")], false).unwrap();
    let patterns = |rl: &RateLimit| rl.share_threshold_key_pattern.clone().unwrap_or_default();

    // Basic share_threshold.
    for value in ["files/a.pdf", "files/b.csv", "files/c.txt"] {
        let rl = limit(&config, "test-domain", &[("files", value)]);
        assert_eq!(patterns(&rl)[0], "files/*");
        assert_eq!(rl.requests_per_unit, 100);
        assert_eq!(rl.full_key, "test-domain.files_files/*");
    }

    // share_threshold with metrics: it takes priority over value_to_metric and detailed_metric.
    let rl = limit(&config, "test-domain", &[("route", "api/v1"), ("method", "GET")]);
    assert_eq!(patterns(&rl)[0], "api/*");
    assert_eq!(rl.full_key, "test-domain.route_api/*.method");
    let rl = limit(&config, "test-domain", &[("service", "svc/user"), ("endpoint", "get")]);
    assert_eq!(patterns(&rl)[0], "svc/*");
    assert!(rl.detailed_metric);
    assert_eq!(rl.full_key, "test-domain.service_svc/*.endpoint_get");

    // Nested wildcards.
    let rl = limit(&config, "test-domain", &[("nested", "parent"), ("files", "nested/file1.txt")]);
    assert_eq!(patterns(&rl)[1], "nested/*");
    assert_eq!(rl.requests_per_unit, 200);
    assert_eq!(rl.full_key, "test-domain.nested_parent.files_nested/*");
    let rl =
        limit(&config, "test-domain", &[("files", "top/file1.txt"), ("files", "nested/file1.txt")]);
    assert_eq!(patterns(&rl)[..2], ["top/*", "nested/*"]);
    assert_eq!(rl.full_key, "test-domain.files_top/*.files_nested/*");
    let rl = limit(
        &config,
        "test-domain",
        &[("path", "path/foo"), ("file", "file/doc1"), ("type", "pdf")],
    );
    assert_eq!(patterns(&rl)[..2], ["path/*", ""]);
    assert_eq!(rl.full_key, "test-domain.path_path/*.file_file/*.type");
    let rl = limit(
        &config,
        "test-domain",
        &[("user", "user/alice"), ("resource", "res/file1"), ("action", "read")],
    );
    assert_eq!(patterns(&rl)[..2], ["user/*", "res/*"]);
    assert_eq!(rl.full_key, "test-domain.user_user/*.resource_res/*.action");

    // An explicit value takes precedence over a wildcard.
    let rl = limit(&config, "test-domain", &[("file", "test1")]);
    assert_eq!(rl.requests_per_unit, 50);
    assert_eq!(rl.share_threshold_key_pattern, None);
    assert_eq!(rl.full_key, "test-domain.file_test1");
    for value in ["test2", "test23", "test123"] {
        let rl = limit(&config, "test-domain", &[("file", value)]);
        assert_eq!(patterns(&rl), ["test*"]);
        assert_eq!(rl.requests_per_unit, 100);
        assert_eq!(rl.full_key, "test-domain.file_test*");
    }

    // A `*` in the middle.
    for value in ["/api/v1", "/api-beta-v1", "/apiXYZv1"] {
        let rl = limit(&config, "test-domain", &[("midpath", value)]);
        assert_eq!(patterns(&rl)[0], "/api*v1");
        assert_eq!(rl.requests_per_unit, 100);
        assert_eq!(rl.full_key, "test-domain.midpath_/api*v1");
    }
    assert_eq!(get(&config, "test-domain", &[("midpath", "/api/v2")]), None);

    // Several `*`.
    for value in ["svcAepBrpc", "svcXXXepYYYrpc", "svceprpc"] {
        let rl = limit(&config, "test-domain", &[("multiroute", value)]);
        assert_eq!(patterns(&rl)[0], "svc*ep*rpc");
        assert_eq!(rl.requests_per_unit, 50);
        assert_eq!(rl.full_key, "test-domain.multiroute_svc*ep*rpc");
    }
    assert_eq!(get(&config, "test-domain", &[("multiroute", "svcABCrpc")]), None);

    // Priority over value_to_metric with a middle wildcard.
    let rl1 = limit(&config, "test-domain", &[("midroute", "/api/v2")]);
    let rl2 = limit(&config, "test-domain", &[("midroute", "/api-beta-v2")]);
    assert_eq!(patterns(&rl1)[0], "/api*v2");
    assert_eq!(rl1.full_key, "test-domain.midroute_/api*v2");
    assert_eq!(rl1.full_key, rl2.full_key);

    // Nested middle wildcards.
    let rl = limit(&config, "test-domain", &[("tenant", "t1prod"), ("resource", "resAv2")]);
    assert_eq!(patterns(&rl)[..2], ["t*prod", "res*v2"]);
    assert_eq!(rl.full_key, "test-domain.tenant_t*prod.resource_res*v2");
    let rl2 = limit(&config, "test-domain", &[("tenant", "t99prod"), ("resource", "resBBBv2")]);
    assert_eq!(rl.full_key, rl2.full_key);
}

#[test]
fn wildcard_stats_behavior() {
    let one = |flags: &str| {
        inline(&format!(
            "
domain: test-domain
descriptors:
  - key: wild
    value: foo*
    {flags}
    rate_limit: {{requests_per_unit: 20, unit: minute}}
"
        ))
    };
    let key =
        |config: &RateLimitConfig, value| limit(config, "test-domain", &[("wild", value)]).full_key;

    assert_eq!(key(&one(""), "foo1"), "test-domain.wild_foo*", "no flags");
    assert_eq!(key(&one("value_to_metric: true"), "foo1"), "test-domain.wild_foo1");
    assert_eq!(key(&one("share_threshold: true"), "foo1"), "test-domain.wild_foo*");
    assert_eq!(
        key(&one("share_threshold: true\n    value_to_metric: true"), "foo1"),
        "test-domain.wild_foo*",
        "share_threshold takes priority"
    );

    let other = inline(
        "
domain: test-domain
descriptors:
  - key: wild
    value: foo*
    descriptors:
      - key: other
        value_to_metric: true
        descriptors:
          - key: limit
            rate_limit: {requests_per_unit: 20, unit: minute}
",
    );
    let rl = limit(&other, "test-domain", &[("wild", "foo1"), ("other", "bar"), ("limit", "X")]);
    assert_eq!(rl.full_key, "test-domain.wild_foo*.other_bar.limit");

    let trailing = |flags: &str| {
        inline(&format!(
            "
domain: test-domain
descriptors:
  - key: wild
    value: foo*bar*
    {flags}
    rate_limit: {{requests_per_unit: 20, unit: minute}}
"
        ))
    };
    let config = trailing("");
    assert_eq!(key(&config, "foo123bar456"), "test-domain.wild_foo*bar*");
    assert_eq!(key(&config, "fooXbarY"), "test-domain.wild_foo*bar*");
    assert_eq!(
        key(&trailing("value_to_metric: true"), "foo123bar456"),
        "test-domain.wild_foo123bar456"
    );
}

#[test]
fn metadata() {
    let config = load(&[fixture("metadata.yaml")], false).unwrap();
    assert!(!config.is_empty());
    assert_eq!(config.get_limit("test-domain", &RateLimitDescriptor::default()), None);

    let rl = limit(&config, "test-domain", &[("key1", "value1"), ("subkey1", "something")]);
    assert_eq!((rl.requests_per_unit, rl.unit), (5, Unit::Second));
    assert_eq!(rl.full_key, "test-domain.key1_value1.subkey1");
    let metadata = rl.metadata.expect("metadata");
    let name = metadata.fields.get("name").and_then(|v| v.kind.clone());
    assert_eq!(name, Some(prost_types::value::Kind::StringValue("service_1".into())));

    let rl = limit(&config, "test-domain", &[("key2", "something")]);
    assert_eq!((rl.requests_per_unit, rl.unit), (20, Unit::Minute));
    assert_eq!(rl.full_key, "test-domain.key2");
    let metadata = rl.metadata.expect("metadata");
    let Some(prost_types::value::Kind::StructValue(service)) =
        metadata.fields.get("service_with_quota").and_then(|v| v.kind.clone())
    else {
        panic!("service_with_quota is a map: {metadata:?}");
    };
    let name = service.fields.get("name").and_then(|v| v.kind.clone());
    assert_eq!(name, Some(prost_types::value::Kind::StringValue("service_2".into())));
}
