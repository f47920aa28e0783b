//! Bad input: every malformed policy and trace line exits with status 2 and a message naming the
//! offending token or line; nothing panics, and stdout holds only whole lines written before the
//! error.

mod common;

fn replay(args: &[&str], trace: &str) -> (Option<i32>, String, String) {
    let run = common::ratewell(&[&["replay"], args].concat(), trace);
    (run.code, run.out, run.err)
}

fn assert_clean_failure(code: Option<i32>, err: &str, context: &str) {
    assert_eq!(code, Some(2), "{context}: exit status; stderr: {err}");
    assert!(!err.contains("panicked"), "{context}: panicked: {err}");
    assert_eq!(err.lines().count(), 1, "{context}: one line of error: {err}");
}

#[test]
fn malformed_policies() {
    // (policy, the token the message must name)
    let table: &[(&str, &str)] = &[
        ("", "empty policy"),
        ("   ", "empty policy"),
        ("bucket capacity=1 rate=1/s", "`bucket`"),
        ("token-bucket capacity=10 rate=0/s", "`rate=0/s`"),
        ("token-bucket capacity=0 rate=1/s", "`capacity=0`"),
        ("fixed-window limit=10 window=0s", "`window=0s`"),
        ("sliding-window limit=10 window=0ms", "`window=0ms`"),
        ("leaky-bucket rate=0r/s", "`rate=0r/s`"),
        ("token-bucket capacity=10 rate=1/s color=red", "`color=red`"),
        ("token-bucket capacity=10 capacity=11 rate=1/s", "`capacity=11`"),
        ("token-bucket capacity= rate=1/s", "`capacity=`"),
        ("token-bucket capacity=99999999999999999999 rate=1/s", "`capacity=99999999999999999999`"),
        ("token-bucket capacity=4294967296 rate=1/s", "`capacity=4294967296`"),
        ("leaky-bucket rate=10r/s nodelay delay=2", "`delay=2`"),
        ("token-bucket rate=1/s", "capacity="),
        ("fixed-window limit=10", "window="),
        ("sliding-log window=1s", "limit="),
        ("token-bucket capacity=10 rate=1/s refill=1 every=1s", "`refill=1`"),
        ("token-bucket capacity=10 refill=1", "every="),
        ("token-bucket capacity=10 refill=0 every=1s", "`refill=0`"),
        ("fixed-window limit=10 window=10", "`window=10`"),
        ("fixed-window limit=10 window=1y", "`window=1y`"),
        ("fixed-window limit=10 window=1s align=middle", "`align=middle`"),
        ("leaky-bucket rate=10r/h", "`rate=10r/h`"),
        ("leaky-bucket rate=10r/s compat=apache", "`compat=apache`"),
        ("sliding-log limit=65537 window=1s", "`limit=65537`"),
        ("sliding-window limit=-5 window=1s", "`limit=-5`"),
        ("fixed-window limit=+5 window=1s", "`limit=+5`"),
        ("fixed-window limit=10 window=99999999999d", "`window=99999999999d`"),
        ("fixed-window limit=10 window=9223372036854775808ns", "`window=9223372036854775808ns`"),
        ("token-bucket capacity=10 rate=10", "`rate=10`"),
        ("token-bucket capacity=10 rate=/s", "`rate=/s`"),
        ("token-bucket capacity=10 rate=5/0ms", "`rate=5/0ms`"),
        ("token-bucket capacity=10 rate=1.5/s", "`rate=1.5/s`"),
        ("token-bucket capacity=10 rate=5/s/s", "`rate=5/s/s`"),
        ("gcra burst=5 rate=1/s nodelay", "`nodelay`"),
        ("token-bucket capacity=10 =5 rate=1/s", "`=5`"),
        ("fixed-window limit=10 window=1s nodelay", "`nodelay`"),
        ("leaky-bucket rate=10r/s nodelay nodelay", "`nodelay`"),
        ("leaky-bucket rate=10r/s burst=3 burst=4", "`burst=4`"),
        // Absurd parameters the packed state cannot hold exactly: named, not overflowed.
        ("token-bucket capacity=4294967295 rate=1/d", "`capacity=4294967295`"),
        ("token-bucket capacity=10 rate=4294967291/s", "`rate=4294967291/s`"),
        ("leaky-bucket rate=1/d burst=3 compat=nginx", "`rate=1/d`"),
        ("leaky-bucket rate=10r/s burst=1000000 compat=nginx", "`burst=1000000`"),
        ("sliding-window limit=4294967295 window=1s", "`limit=4294967295`"),
        ("fixed-window limit=200000 window=1s align=first", "`limit=200000`"),
        ("token-bucket capacity=4294967295 refill=1 every=1us", "`every=1us`"),
    ];
    assert!(table.len() >= 30);
    for &(policy, token) in table {
        let (code, out, err) = replay(&["--policy", policy], "0,a\n");
        assert_clean_failure(code, &err, policy);
        assert!(err.contains(token), "policy {policy:?}: message should name {token}: {err}");
        assert!(
            err.contains("expected"),
            "policy {policy:?}: message should say what was expected: {err}"
        );
        assert_eq!(out, "", "policy {policy:?}: no output");
    }
}

#[test]
fn malformed_trace_lines() {
    // (trace, the line number named, a fragment of the message, the output before the error)
    let table: &[(&str, usize, &str, &str)] = &[
        ("abc,a\n", 1, "bad timestamp `abc`", ""),
        ("-1,a\n", 1, "bad timestamp", ""),
        (" 5,a\n", 1, "bad timestamp", ""),
        ("1.5,a\n", 1, "bad timestamp", ""),
        ("99999999999999999999,a\n", 1, "bad timestamp", ""),
        ("9223372036854775808,a\n", 1, "bad timestamp", ""),
        ("5,,1\n", 1, "empty key", ""),
        ("5\n", 1, "found 1 field:", ""),
        ("5,a b\n", 1, "bad key", ""),
        ("5,é\n", 1, "bad key", ""),
        ("5,a,0\n", 1, "bad cost `0`", ""),
        ("5,a,-1\n", 1, "bad cost", ""),
        ("5,a,1.5\n", 1, "bad cost", ""),
        ("5,a,4294967296\n", 1, "bad cost", ""),
        ("5,a,1 \n", 1, "bad cost", ""),
        ("5,a,1,x\n", 1, "found 4 fields", ""),
        ("5,a,1,\n", 1, "found 4 fields", ""),
        ("10,a\n5,a\n", 2, "earlier than the previous", "1\n"),
        ("1,a\n2,b\n\nx\n", 4, "found 1 field", "1\n1\n"),
        ("1,a\n2,b\n\nx,a\n", 4, "bad timestamp `x`", "1\n1\n"),
        ("1,a\r\n2,a,\r\n3,a;b\r\n", 3, "bad key", "1\n1\n"),
    ];
    for &(trace, line, fragment, before) in table {
        let (code, out, err) = replay(&["--policy", "fixed-window limit=5 window=1s"], trace);
        assert_clean_failure(code, &err, trace);
        assert!(
            err.contains(&format!("line {line}:")),
            "{trace:?}: should name line {line}: {err}"
        );
        assert!(err.contains(fragment), "{trace:?}: should say {fragment:?}: {err}");
        assert_eq!(out, before, "{trace:?}: only whole lines before the error");
    }
}

#[test]
fn unreadable_inputs_and_bad_usage() {
    let (code, _, err) =
        replay(&["--policy", "fixed-window limit=5 window=1s", "/nonexistent/trace"], "");
    assert_clean_failure(code, &err, "missing file");
    assert!(err.contains("/nonexistent/trace"));
    let (code, _, err) = replay(&["--policy", "fixed-window limit=5 window=1s", "/"], "");
    assert_eq!(code, Some(2), "a directory: {err}");
    let (code, _, _) = replay(&[], "");
    assert_eq!(code, Some(2), "missing --policy");
}
