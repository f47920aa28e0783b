use serde_yaml_ng::Value;

use super::limits::wildcard_match;
use super::yaml::go_format;

fn parts(pattern: &str) -> Vec<String> {
    pattern.split('*').map(str::to_owned).collect()
}

#[test]
fn wildcards() {
    let cases = [
        ("foo*", "foo", true),
        ("foo*", "foobar", true),
        ("foo*", "fo", false),
        ("bar*b", "barb", true),
        ("bar*b", "bar123b", true),
        ("bar*b", "bara", false),
        ("bar*b", "xbarb", false),
        ("a*a", "a", false),
        ("foo*bar*baz", "foobarbaz", true),
        ("foo*bar*baz", "foo123baz", false),
        ("*", "", true),
        ("*x*", "abc", false),
        ("*x*", "axc", true),
        ("plain", "plain", true),
        ("plain", "plainer", false),
    ];
    for (pattern, value, expected) in cases {
        assert_eq!(wildcard_match(&parts(pattern), value), expected, "{pattern} ~ {value}");
    }
}

#[test]
fn go_formats() {
    let v: Value = serde_yaml_ng::from_str("[0.25, 1, true, a, ~, 2.0, [x, y]]").unwrap();
    let Value::Sequence(items) = v else { panic!() };
    let printed: Vec<String> = items.iter().map(go_format).collect();
    assert_eq!(printed, ["0.25", "1", "true", "a", "<nil>", "2", "[x y]"]);
}
