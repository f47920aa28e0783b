//! The proxy examples' test harnesses share this file: ratewell-tower's `tests/proxy.rs` and
//! ratewell-pingora's `tests/example.rs` include it with `#[path]` (the two examples share their
//! command line, `ratewell_http::proxy`; their tests share how they build them). No test target
//! of ratewell-http's own: cargo compiles only `tests/*.rs` as tests, and the package leaves
//! `tests/` out.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// The `proxy` example's binary, built by `cargo build --example proxy` with `cargo_args` (a
/// package, features) once per test binary, in the test binary's own profile (`--release` when it
/// runs from `target/release`) and next to its directory, so that a binary left by an earlier
/// build is never used stale. Every call of one test binary passes the same `cargo_args`.
pub(crate) fn proxy_example(cargo_args: &[&str]) -> PathBuf {
    static BUILT: OnceLock<(Vec<String>, PathBuf)> = OnceLock::new();
    let (built_with, binary) = BUILT.get_or_init(|| {
        let exe = std::env::current_exe().unwrap();
        let dir = exe.parent().and_then(|deps| deps.parent()).unwrap();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut build = Command::new(cargo);
        build.args(["build", "-q", "--example", "proxy"]).args(cargo_args);
        if dir.file_name().is_some_and(|d| d == "release") {
            build.arg("--release");
        }
        assert!(build.status().unwrap().success(), "building the proxy example");
        let binary = dir.join("examples").join(format!("proxy{}", std::env::consts::EXE_SUFFIX));
        (cargo_args.iter().map(|a| a.to_string()).collect(), binary)
    });
    assert_eq!(built_with, cargo_args, "the proxy example was built with other arguments");
    binary.clone()
}
