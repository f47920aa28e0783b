//! The command line under pressure and at its edges: reproducible output when live keys are
//! evicted (and a note that says so), standard input and pipes, usage errors, absurd capacities.

mod common;

use common::{ratewell, scratch};

/// A trace of `lines` requests over `keys` keys, each asked twice in a row, in one second.
fn trace(lines: u64, keys: u64) -> String {
    (0..lines).map(|i| format!("{},k{}\n", i * 100, (i / 2 * 7919) % keys)).collect()
}

#[test]
fn replay_under_table_pressure_is_reproducible_and_says_so() {
    let input = trace(40_000, 9_000);
    let policy = "token-bucket capacity=1 rate=1/h";
    // Without --find-capacity: the note counts the evictions and names the flag, and the trace
    // is read once.
    let plain = ratewell(&["replay", "--policy", policy, "--capacity", "1000"], &input);
    assert_eq!(plain.code, Some(0), "{}", plain.err);
    assert!(plain.err.contains("times from a table of 1000 keys"), "{}", plain.err);
    assert!(plain.err.contains("--find-capacity"), "{}", plain.err);
    assert!(!plain.err.contains("avoids it (--capacity"), "{}", plain.err);
    let args = ["replay", "--policy", policy, "--capacity", "1000", "--find-capacity"];
    let first = ratewell(&args, &input);
    assert_eq!(first.code, Some(0), "{}", first.err);
    assert_eq!(first.out, plain.out, "the search changes no decision");
    // Live keys were evicted: stderr says how many and which capacity avoids it.
    assert!(first.err.contains("live keys were evicted"), "{}", first.err);
    assert!(first.err.contains("times from a table of 1000 keys"), "{}", first.err);
    let advice = first.err.split("--capacity ").nth(1).expect("a capacity to use");
    let capacity: u64 = advice.split_whitespace().next().unwrap().parse().unwrap();
    assert!(capacity > 1000);
    for _ in 0..3 {
        let again = ratewell(&args, &input);
        assert_eq!(again.out, first.out, "the same input, the same decisions");
        assert_eq!(again.err, first.err);
    }
    // With that capacity: no eviction, and the decisions of a table that never runs short.
    let capacity = capacity.to_string();
    let enough = ratewell(&["replay", "--policy", policy, "--capacity", &capacity], &input);
    assert_eq!(enough.err, "", "no eviction at the capacity advised");
    let unbounded = ratewell(&["replay", "--policy", policy, "--capacity", "4000000"], &input);
    assert_eq!(enough.out, unbounded.out);
    assert_ne!(first.out, unbounded.out, "the evictions changed decisions, as stderr said");

    // The same from a file, and from `-`.
    let dir = scratch("pressure");
    let file = dir.join("t.csv");
    std::fs::write(&file, &input).unwrap();
    let from_file = ratewell(&[&args[..], &[file.to_str().unwrap()]].concat(), "");
    assert_eq!((from_file.out, from_file.err), (first.out.clone(), first.err.clone()));
    let dash = ratewell(&[&args[..], &["-"]].concat(), &input);
    assert_eq!((dash.out, dash.err), (first.out, first.err));
    // A layered replay has no search: the flag is refused, not ignored.
    let layered = ratewell(&[&args[..], &["--policy", policy]].concat(), &input);
    assert_eq!(layered.code, Some(2), "{}", layered.err);
    assert!(layered.err.contains("--find-capacity"), "{}", layered.err);
}

#[test]
fn compare_reads_a_pipe_and_is_reproducible_under_pressure() {
    let input = trace(20_000, 9_000);
    let plain = ratewell(&["compare", "-", "--limit", "1/h", "--capacity", "1000"], &input);
    assert_eq!(plain.code, Some(0), "{}", plain.err);
    assert!(plain.err.contains("live keys were evicted"), "{}", plain.err);
    assert!(plain.err.contains("--find-capacity"), "{}", plain.err);
    let args = ["compare", "-", "--limit", "1/h", "--capacity", "1000", "--find-capacity"];
    let first = ratewell(&args, &input);
    assert_eq!(first.code, Some(0), "{}", first.err);
    assert_eq!(first.out, plain.out);
    assert!(first.out.contains("20000 requests from 9000 keys"), "{}", first.out);
    let advice = first.err.split("--capacity ").nth(1).expect("a capacity to use");
    let capacity: u64 = advice.split_whitespace().next().unwrap().parse().unwrap();
    assert!(capacity > 1000, "{}", first.err);
    let again = ratewell(&args, &input);
    assert_eq!((again.out, again.err), (first.out, first.err));
}

#[test]
fn usage_errors_name_what_is_missing() {
    let run = ratewell(&["compare", "-"], "1,a\n");
    assert_eq!(run.code, Some(2));
    assert!(run.err.contains("--limit") && run.err.contains("--policy"), "{}", run.err);
    // A summary with the default format is fine; with the full CSV it is not.
    let run = ratewell(
        &[
            "replay",
            "--policy",
            "fixed-window limit=1 window=1s",
            "--summary",
            "--format",
            "contract",
        ],
        "1,a\n2,a\n",
    );
    assert_eq!(
        (run.code, run.out.as_str()),
        (Some(0), "key,admitted,rejected\na,1,1\n*,1,1\n"),
        "{}",
        run.err
    );
    let run = ratewell(
        &["replay", "--policy", "fixed-window limit=1 window=1s", "--summary", "--format", "full"],
        "1,a\n",
    );
    assert_eq!(run.code, Some(2));
    assert!(run.err.contains("--summary") && run.err.contains("--format full"), "{}", run.err);
}

#[test]
fn bench_tells_policies_of_one_algorithm_apart() {
    let run = ratewell(
        &[
            "bench",
            "--seconds",
            "0.01",
            "--keys",
            "100",
            "--policy",
            "token-bucket capacity=1 rate=1/s",
            "--policy",
            "token-bucket capacity=100 rate=1/s",
        ],
        "",
    );
    assert_eq!(run.code, Some(0), "{}", run.err);
    for name in ["token bucket (GCRA) #1", "token bucket (GCRA) #2"] {
        assert_eq!(
            run.out.lines().filter(|l| l.starts_with(name)).count(),
            2,
            "{name}:\n{}",
            run.out
        );
    }
}

#[test]
fn absurd_capacities_are_clean_errors() {
    for capacity in ["18446744073709551615", "1152921504606846976"] {
        let run = ratewell(
            &["replay", "--policy", "token-bucket capacity=1 rate=1/s", "--capacity", capacity],
            "1,a\n",
        );
        assert_eq!(run.code, Some(2), "{}", run.err);
        assert!(run.err.contains("--capacity") && run.err.contains("maximum"), "{}", run.err);
    }
    // 2^32 keys (64 GiB) under a 4 GiB address-space limit: refused, not an abort.
    let bin = env!("CARGO_BIN_EXE_ratewell");
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -v 4194304 && echo 1,a | '{bin}' replay --policy 'token-bucket capacity=1 rate=1/s' --capacity 4294967296"
        ))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("could not be allocated"), "{err}");
}
