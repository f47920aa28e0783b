//! `ratewell take` and `ratewell inspect` on shared table files: exit statuses, mismatches, and
//! one limit shared exactly by shell loops running at once.
#![cfg(target_os = "linux")]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{Run, ratewell};

/// A table file of its own for each test (in /dev/shm where there is one), removed when dropped.
struct TableFile(PathBuf);

impl TableFile {
    fn new(name: &str) -> Self {
        let shm = Path::new("/dev/shm");
        let dir = if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() };
        let path = dir.join(format!("ratewell-cli-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        TableFile(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().expect("a UTF-8 path")
    }
}

impl Drop for TableFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn take(file: &TableFile, policy: &str, key: &str) -> Run {
    ratewell(&["take", "--shared", file.path(), "--policy", policy, key], "")
}

/// The value of `inspect`'s line `name: value`.
fn field<'a>(report: &'a str, name: &str) -> &'a str {
    report
        .lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(':').map(str::trim))
        .unwrap_or_else(|| panic!("no `{name}:` line in\n{report}"))
}

#[test]
fn take_exits_0_when_admitted_1_when_rejected_and_2_on_errors() {
    let file = TableFile::new("exits");
    let policy = "token-bucket capacity=3 rate=1/h";
    for remaining in [2, 1, 0] {
        let run = take(&file, policy, "job");
        assert_eq!(run.code, Some(0), "{}", run.err);
        assert_eq!(run.out, format!("admitted: {remaining} of 3 remaining\n"));
    }
    let run = take(&file, policy, "job");
    assert_eq!(run.code, Some(1), "{}", run.err);
    // One token an hour: the next in just under 3600 s, printed to the millisecond.
    let wait = run.out.strip_prefix("rejected: retry after ").and_then(|w| w.strip_suffix(" s\n"));
    let wait = wait.unwrap_or_else(|| panic!("{:?}", run.out));
    assert_eq!(wait.split_once('.').map(|(_, ms)| ms.len()), Some(3), "{}", run.out);
    let wait: f64 = wait.parse().unwrap();
    assert!(wait > 3500.0 && wait <= 3600.0, "{}", run.out);
    // Another key has its own tokens.
    assert_eq!(take(&file, policy, "other").code, Some(0));

    // A table made with another policy is refused, naming both.
    let run = take(&file, "token-bucket capacity=4 rate=1/h", "job");
    assert_eq!(run.code, Some(2));
    assert!(run.out.is_empty(), "{}", run.out);
    assert!(run.err.contains("token-bucket capacity=3 rate=1/h"), "{}", run.err);
    assert!(run.err.contains("token-bucket capacity=4 rate=1/h"), "{}", run.err);
    // So is one made with another capacity.
    let run = ratewell(
        &["take", "--shared", file.path(), "--policy", policy, "--capacity", "1000000", "job"],
        "",
    );
    assert_eq!(run.code, Some(2));
    assert!(run.err.contains("capacity"), "{}", run.err);

    // A bad policy and a cost of 0 are errors.
    let run = take(&file, "token-bucket capacity=3", "job");
    assert_eq!(run.code, Some(2));
    assert!(run.err.contains("--policy"), "{}", run.err);
    // A sliding log is shared as any policy: two calls of a limit of 2 pass, the third waits.
    let log = TableFile::new("exits-log");
    for code in [0, 0, 1] {
        assert_eq!(take(&log, "sliding-log limit=2 window=1h", "job").code, Some(code));
    }
    let run =
        ratewell(&["take", "--shared", file.path(), "--policy", policy, "--cost", "0", "k"], "");
    assert_eq!(run.code, Some(2));

    // A cost above the capacity can never pass: a rejection with no wait.
    let run =
        ratewell(&["take", "--shared", file.path(), "--policy", policy, "--cost", "4", "new"], "");
    assert_eq!(run.code, Some(1), "{}", run.err);
    assert!(run.out.starts_with("rejected: never"), "{}", run.out);

    // A path that cannot be created is an I/O error, named with the path.
    let run = take(&TableFile(PathBuf::from("/nonexistent-dir/table")), policy, "job");
    assert_eq!(run.code, Some(2));
    assert!(run.err.contains("/nonexistent-dir/table"), "{}", run.err);
}

#[test]
fn eight_shell_loops_share_one_limit_exactly() {
    const LOOPS: usize = 8;
    const CALLS: usize = 300;
    const LIMIT: usize = 1000;
    let file = TableFile::new("loops");
    let policy = format!("token-bucket capacity={LIMIT} rate=1/h");
    // Each loop prints the exit status of each of its calls, one a line.
    let script = format!(
        r#"i=0; while [ $i -lt {CALLS} ]; do "$0" take --shared "$1" --policy "$2" key >/dev/null; echo $?; i=$((i+1)); done"#
    );
    let loops: Vec<_> = (0..LOOPS)
        .map(|_| {
            Command::new("sh")
                .args(["-c", &script, env!("CARGO_BIN_EXE_ratewell"), file.path(), &policy])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("run sh")
        })
        .collect();
    // Every call's status, counted; any other than 0 and 1 is an error, shown with stderr.
    let (mut admitted, mut rejected, mut other, mut stderr) = (0, 0, Vec::new(), String::new());
    for child in loops {
        let out = child.wait_with_output().expect("wait for sh");
        assert!(out.status.success(), "{:?}", out.status);
        stderr += &String::from_utf8_lossy(&out.stderr);
        let statuses = String::from_utf8(out.stdout).unwrap();
        assert_eq!(statuses.lines().count(), CALLS);
        for status in statuses.lines() {
            match status {
                "0" => admitted += 1,
                "1" => rejected += 1,
                status => other.push(status.to_string()),
            }
        }
    }
    assert!(
        (admitted, rejected) == (LIMIT, LOOPS * CALLS - LIMIT)
            && other.is_empty()
            && stderr.is_empty(),
        "{admitted} admitted, {rejected} rejected, other statuses {other:?}, stderr:\n{stderr}"
    );

    let run = ratewell(&["inspect", file.path()], "");
    assert_eq!(run.code, Some(0), "{}", run.err);
    let report = &run.out;
    assert_eq!(field(report, "policy"), policy);
    assert_eq!(field(report, "layout version"), "1");
    assert!(field(report, "keys").starts_with("1 of "), "{report}");
    assert_eq!(field(report, "admitted"), LIMIT.to_string());
    assert_eq!(field(report, "rejected"), (LOOPS * CALLS - LIMIT).to_string());
    assert_eq!(field(report, "evictions"), "0");
    assert_eq!(field(report, "on_full"), "evict");
    assert_eq!(field(report, "locks held"), "none");
    // Every call has exited: the processes that hold counter blocks are all gone.
    let processes = field(report, "processes");
    assert!(!processes.is_empty() && !processes.contains("alive"), "{report}");
    let bytes = std::fs::metadata(&file.0).unwrap().len();
    assert!(field(report, "bytes").starts_with(&format!("{bytes} (")), "{report}");
}

#[test]
fn inspect_refuses_what_is_not_a_table() {
    let file = TableFile::new("not-a-table");
    // Bytes of something else, large enough to hold a table's header; and an empty file.
    let junk: Vec<u8> = (0..20_000u32).map(|i| (i * 7 + 3) as u8).collect();
    std::fs::write(&file.0, &junk).unwrap();
    let run = ratewell(&["inspect", file.path()], "");
    assert_eq!(run.code, Some(2));
    assert!(run.out.is_empty(), "{}", run.out);
    assert!(run.err.contains(file.path()) && run.err.contains("not a ratewell"), "{}", run.err);
    // `take` refuses it too, and leaves it as it was.
    let run = take(&file, "token-bucket capacity=3 rate=1/h", "job");
    assert_eq!(run.code, Some(2));
    assert!(run.err.contains("not a ratewell"), "{}", run.err);
    assert_eq!(std::fs::read(&file.0).unwrap(), junk);

    std::fs::write(&file.0, b"").unwrap();
    assert_eq!(ratewell(&["inspect", file.path()], "").code, Some(2));
    // `inspect` creates nothing.
    let missing = TableFile::new("missing");
    let run = ratewell(&["inspect", missing.path()], "");
    assert_eq!(run.code, Some(2));
    assert!(!missing.0.exists());
}
