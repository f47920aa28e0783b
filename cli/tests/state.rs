//! `replay --save-state` / `--load-state`: a trace replayed in two runs, the second continuing
//! from the first's snapshot, prints byte for byte what one run prints, for every algorithm and
//! for layered policies; a bad state file is an error naming it.

mod common;

/// A trace of `n` lines over a few keys, with costs, its times rising by up to 300 ms.
fn trace(n: usize, layered: bool) -> Vec<String> {
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
    let mut t = 1_000_000_000u64;
    (0..n)
        .map(|_| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            t += rng % 300_000_000;
            let key = if layered {
                format!("ip{}|user{}", rng % 5, (rng >> 8) % 3)
            } else {
                format!("k{}", rng % 9)
            };
            format!("{t},{key},{}", 1 + (rng >> 16) % 3)
        })
        .collect()
}

fn run(policies: &[&str], extra: &[&str], lines: &[String]) -> String {
    let mut args = vec!["replay"];
    for p in policies {
        args.extend(["--policy", p]);
    }
    args.extend(extra);
    let mut stdin = lines.join("\n");
    stdin.push('\n');
    let run = common::ratewell(&args, &stdin);
    assert_eq!(run.code, Some(0), "{args:?}: {}", run.err);
    run.out
}

fn split_equals_whole(name: &str, policies: &[&str], format: &str) {
    let lines = trace(2_000, policies.len() > 1);
    let state = common::scratch(&format!("state-{name}")).join("state.bin");
    let state = state.to_str().unwrap();
    let fmt = ["--format", format];
    let whole = run(policies, &fmt, &lines);
    for split in [0, 1, 999, 2_000] {
        let first = run(policies, &[&fmt[..], &["--save-state", state]].concat(), &lines[..split]);
        let second = run(policies, &[&fmt[..], &["--load-state", state]].concat(), &lines[split..]);
        // `--format full` prints its header once per run.
        let second = match format {
            "full" => second.split_once('\n').map_or("", |(_, rest)| rest).to_string(),
            _ => second,
        };
        assert_eq!(format!("{first}{second}"), whole, "{name}: split at {split}");
    }
    let _ = std::fs::remove_file(state);
}

#[test]
fn every_algorithm_split_in_two_runs_prints_one_runs_output() {
    let policies = [
        ("gcra", "token-bucket capacity=5 rate=2/s"),
        ("discrete", "token-bucket capacity=4 refill=2 every=700ms"),
        ("leaky", "leaky-bucket rate=3r/s burst=4 delay=2"),
        ("nginx", "leaky-bucket rate=3r/s burst=4 nodelay compat=nginx"),
        ("fixed", "fixed-window limit=6 window=1s"),
        ("sliding", "sliding-window limit=6 window=2s"),
        ("log", "sliding-log limit=5 window=1500ms"),
    ];
    for (name, policy) in policies {
        split_equals_whole(name, &[policy], "full");
        split_equals_whole(&format!("{name}-contract"), &[policy], "contract");
    }
}

#[test]
fn layered_policies_split_in_two_runs_print_one_runs_output() {
    split_equals_whole(
        "layered",
        &["token-bucket capacity=6 rate=3/s", "sliding-log limit=4 window=2s"],
        "full",
    );
}

#[test]
fn a_bad_state_file_is_an_error() {
    let lines = trace(10, false);
    let missing = common::scratch("state-missing.bin").join("state.bin");
    let _ = std::fs::remove_file(&missing);
    let garbage = common::scratch("state-garbage.bin").join("state.bin");
    std::fs::write(&garbage, b"not a snapshot").unwrap();
    let layered = common::scratch("state-layered.bin").join("state.bin");
    run(
        &["fixed-window limit=1 window=1s", "fixed-window limit=9 window=1m"],
        &["--save-state", layered.to_str().unwrap()],
        &trace(10, true),
    );
    let mut stdin = lines.join("\n");
    stdin.push('\n');
    for (file, says) in [
        (&missing, "No such file"),
        (&garbage, "not a ratewell snapshot"),
        (&layered, "a snapshot of a layered limiter, restored into a keyed limiter"),
    ] {
        let f = file.to_str().unwrap();
        let r = common::ratewell(
            &["replay", "--policy", "fixed-window limit=1 window=1s", "--load-state", f],
            &stdin,
        );
        assert_eq!(r.code, Some(2), "{f}: {}", r.err);
        assert!(r.err.contains("--load-state") && r.err.contains(says), "{f}: {}", r.err);
        assert!(r.out.is_empty(), "nothing decided: {}", r.out);
    }
    // Another capacity: the table's shape is named.
    let saved = common::scratch("state-capacity.bin").join("state.bin");
    run(&["fixed-window limit=1 window=1s"], &["--save-state", saved.to_str().unwrap()], &lines);
    let r = common::ratewell(
        &[
            "replay",
            "--policy",
            "fixed-window limit=1 window=1s",
            "--capacity",
            "100",
            "--load-state",
            saved.to_str().unwrap(),
        ],
        &stdin,
    );
    assert_eq!(r.code, Some(2));
    assert!(r.err.contains("shards"), "{}", r.err);
}
