//! Running the `ratewell` binary from the tests.

#![allow(dead_code)] // Each test file uses its own part.

use std::io::Write;
use std::process::{Command, Stdio};

/// What a run of the binary gave.
pub(crate) struct Run {
    /// The exit status; `None` if a signal ended it.
    pub(crate) code: Option<i32>,
    pub(crate) out: String,
    pub(crate) err: String,
}

/// Run `ratewell ARGS` with `stdin` as its standard input.
pub(crate) fn ratewell(args: &[&str], stdin: &str) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ratewell"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ratewell");
    // The process may exit before reading (a bad policy): ignore a broken pipe.
    let _ = child.stdin.take().expect("piped").write_all(stdin.as_bytes());
    let out = child.wait_with_output().expect("wait for ratewell");
    Run {
        code: out.status.code(),
        out: String::from_utf8_lossy(&out.stdout).into_owned(),
        err: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A fresh directory for one test's files.
pub(crate) fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("ratewell-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create a scratch directory");
    dir
}
