//! `LOG_FORMAT=json`, against the binary: every line it writes is one JSON object with the Go
//! service's logrus field names (`@message`, `@timestamp`, `level`), the startup lines among
//! them.

mod common;

use common::*;

#[tokio::test]
async fn json_lines_with_the_go_field_names() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), &[("d.yaml", "domain: d\ndescriptors: []\n")]);
    let root = dir.path().display().to_string();
    let mut bin = Binary::spawn(&[
        ("RUNTIME_ROOT", &root),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("LOG_FORMAT", "json"),
        ("USE_STATSD", "false"),
    ]);
    // A configuration loaded is logged at info.
    bin.wait_logged("loaded 1 configuration files").await;
    assert_eq!(bin.terminate().code(), Some(0));
    // Every line, the last ones written on the way out included.
    let lines = bin.lines_to_end();
    assert!(lines.len() >= 3, "{lines:?}");
    let mut messages = Vec::new();
    for line in &lines {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
        let object = v.as_object().unwrap();
        let keys: Vec<&str> = object.keys().map(String::as_str).collect();
        assert_eq!(keys, ["@message", "@timestamp", "level"], "{line}");
        let stamp = v["@timestamp"].as_str().unwrap();
        assert!(
            stamp.len() >= 20 && stamp.ends_with('Z') && stamp.as_bytes()[10] == b'T',
            "{stamp}"
        );
        assert!(["debug", "info", "warn", "error"].contains(&v["level"].as_str().unwrap()));
        messages.push(v["@message"].as_str().unwrap().to_owned());
    }
    assert!(messages.iter().any(|m| m.starts_with("deciding in process")), "{messages:?}");
    assert!(messages.iter().any(|m| m.starts_with("ratewell-rls listening: grpc=")));
}
