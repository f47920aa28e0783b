//! `ratewell-rls check`, envoyproxy/ratelimit's `config_check`, against the binary on the Go
//! suite's configuration fixtures (`tests/fixtures/config/`): every good one exits 0 with
//! `all rate limit configs ok`, every bad one exits 1 with the Go service's message after the
//! file's path, as `config_check` prints it.

use std::path::Path;
use std::process::Command;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/config");

/// `check -config_dir` on a new directory holding copies of `files`: the exit status and
/// standard output.
fn check(files: &[&str], extra: &[&str]) -> (Option<i32>, String, String) {
    let dir = tempfile::tempdir().unwrap();
    for name in files {
        std::fs::copy(Path::new(FIXTURES).join(name), dir.path().join(name)).unwrap();
    }
    let dir_s = dir.path().display().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_ratewell-rls"))
        .args(["check", "-config_dir", &dir_s])
        .args(extra)
        .output()
        .unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned(), dir_s)
}

#[test]
fn good_configurations_exit_0() {
    for name in [
        "basic_config.yaml",
        "metadata.yaml",
        "shadowmode_config.yaml",
        "share_threshold.yaml",
        "wildcard.yaml",
    ] {
        let (code, out, dir) = check(&[name], &[]);
        assert_eq!(code, Some(0), "{name}: {out}");
        assert_eq!(
            out,
            format!(
                "checking rate limit configs...\nloading config directory: {dir}\nopening config file: {dir}/{name}\nall rate limit configs ok\n"
            )
        );
    }
    let both = ["merge_domain_key1.yaml", "merge_domain_key2.yaml"];
    let (code, out, _) = check(&both, &["-merge_domain_configs"]);
    assert_eq!(code, Some(0), "{out}");
}

#[test]
fn bad_configurations_exit_1_with_the_go_message() {
    for (files, merge, message) in [
        (
            &["empty_domain.yaml"][..],
            false,
            "empty_domain.yaml: config file cannot have empty domain",
        ),
        (
            &["basic_config.yaml", "duplicate_domain.yaml"],
            false,
            "duplicate_domain.yaml: duplicate domain 'test-domain' in config file",
        ),
        (&["empty_key.yaml"], false, "empty_key.yaml: descriptor has empty key"),
        (
            &["duplicate_key.yaml"],
            false,
            "duplicate_key.yaml: duplicate descriptor composite key 'test-domain.key1_value1'",
        ),
        (
            &["merge_domain_key1.yaml", "merge_domain_key2.yaml"],
            false,
            "merge_domain_key2.yaml: duplicate domain 'test-domain' in config file",
        ),
        (&["bad_limit_unit.yaml"], false, "bad_limit_unit.yaml: invalid rate limit unit 'foo'"),
        (
            &["replaces_self.yaml"],
            false,
            "replaces_self.yaml: replaces should not contain name of same descriptor",
        ),
        (
            &["replaces_empty.yaml"],
            false,
            "replaces_empty.yaml: should not have an empty replaces entry",
        ),
        (
            &["misspelled_key.yaml"],
            false,
            "misspelled_key.yaml: config error, unknown key 'ratelimit'",
        ),
        (
            &["misspelled_key2.yaml"],
            false,
            "misspelled_key2.yaml: config error, unknown key 'requestsperunit'",
        ),
        (
            &["non_string_key.yaml"],
            false,
            "non_string_key.yaml: config error, key is not of type string: 0.25",
        ),
        (
            &["non_map_list.yaml"],
            false,
            "non_map_list.yaml: config error, yaml file contains list of type other than map: a",
        ),
        (
            &["unlimited_with_unit.yaml"],
            false,
            "unlimited_with_unit.yaml: should not specify rate limit unit when unlimited",
        ),
        (&["bad_yaml.yaml"], false, "bad_yaml.yaml: error loading config file: "),
    ] {
        let extra: &[&str] = if merge { &["-merge_domain_configs"] } else { &[] };
        let (code, out, dir) = check(files, extra);
        assert_eq!(code, Some(1), "{files:?}: {out}");
        let last = out.lines().last().unwrap();
        let want = format!("error loading rate limit configs: {dir}/{message}");
        assert!(last.starts_with(&want), "{files:?}:\n{last}\nshould start with\n{want}");
        assert!(!out.contains("all rate limit configs ok"));
    }
}

#[test]
fn bad_directories_and_flags() {
    let out = Command::new(env!("CARGO_BIN_EXE_ratewell-rls"))
        .args(["check", "-config_dir", "/nonexistent/ratewell-check"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("error opening directory /nonexistent/ratewell-check: "), "{stdout}");
    let out = Command::new(env!("CARGO_BIN_EXE_ratewell-rls"))
        .args(["check", "-dir", "x"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("flag provided but not defined: -dir")
    );
    // A directory inside is read as a file, and refused, as config_check refuses it.
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let d = dir.path().display().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_ratewell-rls"))
        .args(["check", &format!("-config_dir={d}")])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains(&format!("error reading file {d}/sub: ")), "{stdout}");
}
