//! `ratewell replay` on hand-worked traces, one per algorithm: each expected line is derived in the
//! comment beside it from docs/SEMANTICS.md, not read off the implementation.

mod common;

fn replay(policy: &str, extra: &[&str], trace: &str) -> (i32, String, String) {
    let args = [&["replay", "--policy", policy], extra].concat();
    let run = common::ratewell(&args, trace);
    (run.code.unwrap_or(-1), run.out, run.err)
}

/// Replay `trace` (lines `t,key[,cost]  # expected`) and compare with the expected column.
fn check(policy: &str, annotated: &str) {
    let mut trace = String::new();
    let mut want = String::new();
    for line in annotated.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let (request, expected) = line.split_once('#').expect("annotated line");
        trace.push_str(request.trim());
        trace.push('\n');
        let expected = expected.split_whitespace().next().unwrap();
        want.push_str(expected);
        want.push('\n');
    }
    let (code, out, err) = replay(policy, &[], &trace);
    assert_eq!(code, 0, "{policy}: {err}");
    assert_eq!(out, want, "policy `{policy}`");
}

#[test]
fn token_bucket_continuous() {
    // B = 2, T = 1 s. TAT after each admission in the comment.
    let trace = "
        0,a            # 1  TAT 1s
        0,a            # 1  TAT 2s
        0,a            # 0  2s + 1s - 0 > 2s
        0,b            # 1  another key is independent
        999999999,a    # 0  1 ns before a token is back: 3s - 0.999999999s > 2s
        1000000000,a   # 1  exactly on time: TAT 3s
        1000000000,a   # 0
        3000000000,a,2 # 1  full again at TAT: both tokens
        3000000000,a,3 # 0  impossible: above the capacity
    ";
    check("token-bucket capacity=2 rate=1/s", trace);
    check("gcra burst=2 rate=1/s", trace);
}

#[test]
fn token_bucket_continuous_exact_fractions() {
    // T = 10^9/3 ns = 333333333.33 ns; three tokens at 0 put TAT at exactly 1 s.
    check(
        "token-bucket capacity=3 rate=3/s",
        "
        0,a,3         # 1  TAT = 10^9
        333333333,a   # 0  a token is back at 333333333.33 ns, not before
        333333334,a   # 1
        999999999,a,3 # 0
        1333333333,a,3 # 0 TAT = 10^9 + T = 1333333333.33
        1333333334,a,3 # 1
        ",
    );
}

#[test]
fn token_bucket_discrete_envoy() {
    // max_tokens 2, tokens_per_fill 1, fill_interval 1 s: fills at 1 s, 2 s, 3 s...
    check(
        "token-bucket capacity=2 refill=1 every=1s",
        "
        0,a,2          # 1  starts full
        999999999,a    # 0  1 ns before the fill
        1000000000,a   # 1  the fill due at 1 s applies before a request at 1 s
        1000000000,a   # 0
        1000000001,a   # 0  1 ns after: no new fill until 2 s
        3000000000,a,2 # 1  fills at 2 s and 3 s
        ",
    );
}

#[test]
fn leaky_bucket_burst_plus_one_from_idle() {
    // 10r/s, burst 3: from idle B+1 = 4 pass at once (excess 0,1,2,3), then one per 100 ms.
    check(
        "leaky-bucket rate=10r/s burst=3 nodelay",
        "
        0,a          # 1
        0,a          # 1
        0,a          # 1
        0,a          # 1
        0,a          # 0  excess would be 4 > 3
        99999999,a   # 0  1 ns before one request has leaked
        100000000,a  # 1
        100000000,a  # 0
        200000000,a,2 # 0 excess 3 - 1 + 1 + 1 = 4 > 3
        300000000,a,2 # 1 excess 3 - 2 + 1 + 1 = 3
        300000000,b,5 # 0 impossible: above burst + 1
        ",
    );
}

#[test]
fn leaky_bucket_delays() {
    // delay=1: requests beyond the first unit of excess wait (excess - 1) / rate.
    check(
        "leaky-bucket rate=10r/s burst=3 delay=1",
        "
        0,a  # 1,0
        0,a  # 1,0
        0,a  # 1,100000000
        0,a  # 1,200000000
        0,a  # 0
        ",
    );
    // The default delay is 0, as in nginx: every unit of excess waits.
    check(
        "leaky-bucket rate=10r/s burst=3",
        "
        0,a           # 1,0
        0,a           # 1,100000000
        50000000,a    # 1,150000000  excess 1 - 0.5 + 1 = 1.5 requests
        ",
    );
}

#[test]
fn leaky_bucket_nginx_arithmetic() {
    // compat=nginx: 2r/s = 2000 milli-requests/s; excess in milli-requests; time in whole ms.
    check(
        "leaky-bucket rate=2r/s burst=1 nodelay compat=nginx",
        "
        0,a          # 1  new key: excess 0
        0,a          # 1  0 - 0 + 1000 = 1000 <= 1000
        0,a          # 0  2000 > 1000
        499999999,a  # 0  ms 499: 1000 - 998 + 1000 = 1002
        500000000,a  # 1  ms 500: 1000 - 1000 + 1000 = 1000; last = 500
        500999999,a  # 0  same ms: 2000
        1000999999,a # 1  ms 500 again since last: 1000
        ",
    );
    // 1r/m is 16 milli-requests/s in nginx: an excess of 1000 takes 62.5 s to leak, not 60 s.
    check(
        "leaky-bucket rate=1r/m nodelay",
        "
        0,a            # 1
        60000000000,a  # 1  exact: one request leaks in exactly 60 s
        62500000000,a  # 0  the previous one was 2.5 s ago
        ",
    );
    check(
        "leaky-bucket rate=1r/m nodelay compat=nginx",
        "
        0,a            # 1
        60000000000,a  # 0  0 - 16*60000/1000 + 1000 = 40 > 0
        62500000000,a  # 1  0 - 1000 + 1000 = 0
        ",
    );
}

#[test]
fn fixed_window_boundaries() {
    check(
        "fixed-window limit=2 window=1s",
        "
        999999999,a,2   # 1  1 ns before the boundary
        999999999,a     # 0
        1000000000,a,2  # 1  exactly at the boundary: a new window (4 within 1 ns)
        1000000001,a    # 0  1 ns after
        2000000000,a,3  # 0  impossible
        ",
    );
    check(
        "fixed-window limit=2 window=1s align=first",
        "
        999999999,a,2   # 1  the window opens here: [999999999, 1999999999)
        1000000000,a    # 0  the clock boundary means nothing here
        1999999998,a    # 0  1 ns before this key's window ends
        1999999999,a,2  # 1  exactly at its end: a new window opens
        ",
    );
}

#[test]
fn sliding_window_counter() {
    // N = 10, W = 1 s: estimate = floor((prev*(W - r) + cur*W) / W).
    check(
        "sliding-window limit=10 window=1s",
        "
        0,a,10        # 1
        999999999,a   # 0  same window: 10 + 1 > 10
        1000000000,a  # 0  r = 0: the previous window counts fully
        1000000001,a  # 1  floor(10*(10^9 - 1)/10^9) = 9
        1000000001,a  # 0  9 + 1 + 1 > 10
        1100000000,a  # 0  floor(10*0.9) + 1 = 10
        1100000001,a  # 1  floor(8.99999999) + 1 = 9
        ",
    );
}

#[test]
fn sliding_log_closed_interval() {
    check(
        "sliding-log limit=2 window=1s",
        "
        0,a           # 1
        500000000,a   # 1
        1000000000,a  # 0  the request at 0 is in [0, 1 s]
        1000000001,a  # 1  now it is not
        1500000000,a  # 0  500 ms is in [500 ms, 1.5 s]
        1500000001,a  # 1
        ",
    );
}

#[test]
fn trace_format_details() {
    // Blank lines skipped, `\r` ignored, `t,key,` is cost 1, keys with every allowed character.
    let (code, out, err) =
        replay("fixed-window limit=1 window=1s", &[], "0,a\r\n\n0,a,\r\n\r\n0,Az09_.:-,1\n");
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "1\n0\n1\n");
    // No trailing newline on the last line.
    let (code, out, _) = replay("fixed-window limit=1 window=1s", &[], "5,a");
    assert_eq!((code, out.as_str()), (0, "1\n"));
}

#[test]
fn summary_counts_per_key_and_total() {
    let (code, out, err) =
        replay("fixed-window limit=1 window=1s", &["--summary"], "0,a\n0,a\n0,b\n1000000000,a\n");
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "key,admitted,rejected\na,2,1\nb,1,0\n*,3,1\n");
}

#[test]
fn reads_a_file_argument() {
    let dir = std::env::temp_dir().join(format!("ratewell-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("trace.csv");
    std::fs::write(&path, "0,a\n0,a\n").unwrap();
    let (code, out, _) = replay("fixed-window limit=1 window=1s", &[path.to_str().unwrap()], "");
    assert_eq!((code, out.as_str()), (0, "1\n0\n"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Keys active briefly, then idle long enough to be back to fresh: far more distinct keys than
/// the table holds, yet every decision equals the unbounded run's (reclaims are lossless).
#[test]
fn small_capacity_is_lossless_when_keys_go_idle() {
    let mut trace = String::new();
    for k in 0..3000u64 {
        let start = k * 50_000_000; // a new key every 50 ms
        for j in 0..6u64 {
            let cost = if j == 5 { ",2" } else { "" };
            trace.push_str(&format!("{},key{k}{cost}\n", start + j * 1_000_000));
        }
    }
    for policy in [
        "token-bucket capacity=3 rate=100/s",
        "token-bucket capacity=3 refill=1 every=10ms",
        "leaky-bucket rate=100r/s burst=2",
        "leaky-bucket rate=100r/s burst=2 nodelay compat=nginx",
        "fixed-window limit=3 window=20ms",
        "fixed-window limit=3 window=20ms align=first",
        "sliding-window limit=3 window=10ms",
        "sliding-log limit=3 window=20ms",
    ] {
        let (code, small, err) = replay(policy, &["--capacity", "16"], &trace);
        assert_eq!(code, 0, "{policy}: {err}");
        let (_, unbounded, _) = replay(policy, &["--capacity", "100000"], &trace);
        assert_eq!(small.lines().count(), 18_000);
        let limited = small.lines().any(|l| l == "0") && small.lines().any(|l| l.starts_with('1'));
        assert!(limited, "{policy}: a trace that limits");
        assert!(small == unbounded, "{policy}: capacity 16 changed decisions");
    }
}

/// `--format full`: a header, then every field of each decision (worked out by hand).
#[test]
fn full_format_has_every_field() {
    // Token bucket of 2 at 1/s (T = 1 s), all at t = 0 but the last:
    let trace = "0,a\n0,a\n0,a\n500000000,a,3\n";
    let want = "admitted,delay_ns,remaining,retry_after_ns,reset_after_ns\n\
                1,0,1,,1000000000\n\
                1,0,0,,2000000000\n\
                0,0,0,1000000000,2000000000\n\
                0,0,0,,1500000000\n";
    // 1: 2 tokens -> 1 left, full again 1 s later. 2: 0 left, full in 2 s.
    // 3: refused: one token back in 1 s; full still in 2 s.
    // 4: cost 3 > capacity 2: impossible, no retry time; 0.5 s later it is full in 1.5 s.
    let (code, out, err) = replay("token-bucket capacity=2 rate=1/s", &["--format", "full"], trace);
    assert_eq!((code, out.as_str()), (0, want), "{err}");

    // nginx leaky bucket at 10r/s (T = 100 ms), burst 2, delaying: excess 0, 1, 2 are admitted
    // and delayed 0, 100, 200 ms; the fourth (excess 3 > 2) is refused.
    let (code, out, err) =
        replay("leaky-bucket rate=10r/s burst=2", &["--format", "full"], "0,a\n0,a\n0,a\n0,a\n");
    assert_eq!(code, 0, "{err}");
    let columns: Vec<(&str, &str)> = out
        .lines()
        .skip(1)
        .map(|l| {
            let cells: Vec<&str> = l.split(',').collect();
            assert_eq!(cells.len(), 5, "{l}");
            (cells[0], cells[1])
        })
        .collect();
    assert_eq!(columns, [("1", "0"), ("1", "100000000"), ("1", "200000000"), ("0", "0")]);

    // The contract output is unchanged, and --summary excludes --format.
    let (_, out, _) = replay("leaky-bucket rate=10r/s burst=2", &[], "0,a\n0,a\n");
    assert_eq!(out, "1,0\n1,100000000\n");
    let (code, _, err) =
        replay("fixed-window limit=1 window=1s", &["--summary", "--format", "full"], "0,a\n");
    assert_eq!(code, 2, "{err}");
}
