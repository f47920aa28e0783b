//! `compare --log` on access logs: the same table as on the same requests written as a trace,
//! from a file, gzipped, from standard input and from several files; and its handling of lines
//! it cannot read.

mod common;

use std::fs;
use std::io::Write;
use std::path::Path;

use common::{ratewell, scratch};

/// `n` requests of a few clients over a few minutes: (seconds since the epoch with
/// milliseconds, client, bytes sent).
fn requests(n: u64) -> Vec<(u64, String, u64)> {
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    let mut t_ms = 1_712_311_872_000u64;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            t_ms += [0, 1, 40, 250, 900][(x % 5) as usize];
            (t_ms, format!("10.0.0.{}", x % 7), x % 3000)
        })
        .collect()
}

/// `05/Apr/2024:10:11:12 +0000` of a time in ms.
fn time_local(t_ms: u64) -> String {
    let s = t_ms / 1000;
    let (days, rest) = (s / 86_400, s % 86_400);
    // Days since the epoch to a date (Howard Hinnant's civil_from_days).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let month =
        ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
            [m as usize - 1];
    format!("{d:02}/{month}/{y}:{:02}:{:02}:{:02} +0000", rest / 3600, rest / 60 % 60, rest % 60)
}

fn combined(r: &[(u64, String, u64)]) -> String {
    r.iter()
        .map(|(t, ip, bytes)| {
            format!(
                "{ip} - - [{}] \"GET /a?b={t} HTTP/1.1\" 200 {bytes} \"-\" \"curl/8.0 (x; y)\"\n",
                time_local(*t)
            )
        })
        .collect()
}

/// The same requests as a trace, at the time the log gives them (whole seconds for
/// `$time_local`), from the first.
fn trace(r: &[(u64, String, u64)], unit_ms: u64, cost: bool) -> String {
    let first = r[0].0 / unit_ms * unit_ms;
    r.iter()
        .map(|(t, ip, bytes)| {
            let t = (t / unit_ms * unit_ms - first) * 1_000_000;
            if cost { format!("{t},{ip},{}\n", (*bytes).max(1)) } else { format!("{t},{ip}\n") }
        })
        .collect()
}

fn gzip(path: &Path, text: &str) {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(text.as_bytes()).unwrap();
    fs::write(path, e.finish().unwrap()).unwrap();
}

/// The table without its first line (which names the input).
fn table(out: &str) -> String {
    out.lines().skip(1).collect::<Vec<_>>().join("\n")
}

#[test]
fn a_combined_log_gives_the_tables_of_its_trace() {
    let dir = scratch("combined");
    let r = requests(3_000);
    let (log, csv, gz) = (dir.join("access.log"), dir.join("trace.csv"), dir.join("access.log.gz"));
    fs::write(&log, combined(&r)).unwrap();
    fs::write(&csv, trace(&r, 1000, false)).unwrap();
    gzip(&gz, &combined(&r));
    let path = |p: &Path| p.to_str().unwrap().to_string();
    let want = ratewell(&["compare", &path(&csv), "--limit", "20/10s"], "");
    assert_eq!(want.code, Some(0), "{}", want.err);
    for (args, stdin) in [
        (vec!["compare", &path(&log), "--log", "combined", "--limit", "20/10s"], String::new()),
        (vec!["compare", &path(&gz), "--log", "nginx", "--limit", "20/10s"], String::new()),
        (vec!["compare", "-", "--log", "combined", "--limit", "20/10s"], combined(&r)),
    ] {
        let got = ratewell(&args, &stdin);
        assert_eq!(got.code, Some(0), "{args:?}: {}", got.err);
        assert_eq!(table(&got.out), table(&want.out), "{args:?}");
        assert!(got.err.contains("3000 lines read, 3000 requests"), "{}", got.err);
        assert!(got.err.contains("times in whole seconds"), "{}", got.err);
    }
    // Rotated: the older half, then the newer (gzipped), as one log.
    let (old, new) = (dir.join("access.log.1"), dir.join("access.log.2.gz"));
    fs::write(&old, combined(&r[..1500])).unwrap();
    gzip(&new, &combined(&r[1500..]));
    let got = ratewell(
        &["compare", &path(&old), &path(&new), "--log", "combined", "--limit", "20/10s"],
        "",
    );
    assert_eq!(got.code, Some(0), "{}", got.err);
    assert_eq!(table(&got.out), table(&want.out));
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_custom_format_with_msec_a_key_of_two_fields_and_a_cost() {
    let dir = scratch("custom");
    let r = requests(2_000);
    let format = r#"$remote_addr [$msec] "$request" $status $body_bytes_sent key=$http_x_api_key"#;
    let log: String = r
        .iter()
        .map(|(t, ip, bytes)| {
            format!(
                "{ip} [{}.{:03}] \"GET / HTTP/1.1\" 200 {bytes} key=k{}\n",
                t / 1000,
                t % 1000,
                bytes % 3
            )
        })
        .collect();
    let csv: String = {
        let first = r[0].0;
        r.iter()
            .map(|(t, ip, bytes)| {
                format!("{},{ip}_k{},{}\n", (t - first) * 1_000_000, bytes % 3, (*bytes).max(1))
            })
            .collect()
    };
    let (log_path, csv_path) = (dir.join("custom.log"), dir.join("trace.csv"));
    fs::write(&log_path, log).unwrap();
    fs::write(&csv_path, csv).unwrap();
    let want = ratewell(&["compare", csv_path.to_str().unwrap(), "--limit", "50000/m"], "");
    assert_eq!(want.code, Some(0), "{}", want.err);
    let got = ratewell(
        &[
            "compare",
            log_path.to_str().unwrap(),
            "--log",
            "nginx",
            "--log-format",
            format,
            "--key",
            "${remote_addr}_$http_x_api_key",
            "--cost",
            "$body_bytes_sent",
            "--limit",
            "50000/m",
        ],
        "",
    );
    assert_eq!(got.code, Some(0), "{}", got.err);
    assert_eq!(table(&got.out), table(&want.out));
    assert!(got.err.contains("times in milliseconds"), "{}", got.err);
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn lines_it_cannot_read_are_counted_and_shown_or_stop_it() {
    let dir = scratch("bad-logs");
    let r = requests(100);
    let good = combined(&r);
    let path = |name: &str, bytes: &[u8]| {
        let p = dir.join(name);
        fs::write(&p, bytes).unwrap();
        p.to_str().unwrap().to_string()
    };
    let run = |file: &str, extra: &[&str]| {
        let mut args = vec!["compare", file, "--log", "combined", "--limit", "5/s"];
        args.extend(extra);
        ratewell(&args, "")
    };
    // A trace given as a log: nothing read, exit 2, the first lines shown with their numbers.
    let csv = path("trace.csv", trace(&r, 1000, false).as_bytes());
    let got = run(&csv, &[]);
    assert_eq!(got.code, Some(2), "{}", got.out);
    assert!(got.err.contains("100 lines skipped"), "{}", got.err);
    assert!(got.err.contains("trace.csv:1: not the format"), "{}", got.err);
    assert!(got.err.contains("no line of the log could be read as a request"), "{}", got.err);
    // Binary garbage.
    let noise: Vec<u8> =
        (0..20_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let got = run(&path("noise.bin", &noise), &[]);
    assert_eq!(got.code, Some(2));
    assert!(got.err.contains("no line of the log could be read"), "{}", got.err);
    // A truncated gzip file: an error naming the file and how far it got.
    let gz = dir.join("whole.gz");
    gzip(&gz, &good.repeat(50));
    let bytes = fs::read(&gz).unwrap();
    let cut = path("cut.gz", &bytes[..bytes.len() / 2]);
    let got = run(&cut, &[]);
    assert_eq!(got.code, Some(2));
    assert!(got.err.contains("cut.gz after line"), "{}", got.err);
    // Good lines among bad ones: the bad ones counted; --strict stops at the first.
    let mixed = format!("{}not a log line\n{}", combined(&r[..50]), combined(&r[50..]));
    let mixed = path("mixed.log", mixed.as_bytes());
    let got = run(&mixed, &[]);
    assert_eq!(got.code, Some(0), "{}", got.err);
    assert!(got.err.contains("101 lines read, 100 requests, 1 lines skipped"), "{}", got.err);
    assert!(got.err.contains("mixed.log:51: not the format"), "{}", got.err);
    let got = run(&mixed, &["--strict"]);
    assert_eq!(got.code, Some(2));
    assert!(
        got.err.contains("mixed.log:51: not the format") && got.err.contains("--strict"),
        "{}",
        got.err
    );
    // A time an hour back is skipped, with the reason; one a few seconds back is decided at
    // the latest time before it.
    let back = |secs: u64| {
        let (t, ip, b) = &r[60];
        combined(&[(t - secs * 1000, ip.clone(), *b)])
    };
    let log = format!("{}{}{}{}", combined(&r[..61]), back(3600), back(5), combined(&r[61..]));
    let got = run(&path("back.log", log.as_bytes()), &[]);
    assert_eq!(got.code, Some(0), "{}", got.err);
    assert!(got.err.contains("back.log:62: 3600 s earlier than a line before it"), "{}", got.err);
    assert!(got.err.contains("1 requests earlier than one before them"), "{}", got.err);
    // A format with a variable nginx does not have.
    let got = ratewell(
        &[
            "compare",
            &mixed,
            "--log",
            "nginx",
            "--log-format",
            "$remote_addr $bogus [$time_local]",
            "--limit",
            "5/s",
        ],
        "",
    );
    assert_eq!(got.code, Some(2));
    assert!(got.err.contains("--log-format: unknown variable $bogus"), "{}", got.err);
    fs::remove_dir_all(dir).unwrap();
}

/// `2024-04-05T10:11:12.310Z` of a time in ms (from `time_local`'s date).
fn rfc3339(t_ms: u64) -> String {
    let local = time_local(t_ms);
    let months =
        ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let month = months.iter().position(|m| *m == &local[3..6]).unwrap() + 1;
    format!("{}-{month:02}-{}T{}.{:03}Z", &local[7..11], &local[..2], &local[12..20], t_ms % 1000)
}

#[test]
fn envoy_and_json_logs_give_the_tables_of_their_trace() {
    let dir = scratch("envoy-json");
    let r = requests(2_500);
    let csv = dir.join("trace.csv");
    fs::write(&csv, trace(&r, 1, false)).unwrap();
    let want = ratewell(&["compare", csv.to_str().unwrap(), "--limit", "30/10s"], "");
    assert_eq!(want.code, Some(0), "{}", want.err);
    let envoy: String = r
        .iter()
        .map(|(t, ip, bytes)| {
            format!(
                "[{}] \"GET /api?x=1 HTTP/1.1\" 200 - 0 {bytes} 3 2 \"{ip}\" \"curl/8.0 (a; b)\" \
                 \"4d1e-{t}\" \"example.com\" \"10.1.0.4:8080\"\n",
                rfc3339(*t)
            )
        })
        .collect();
    let json: String = r
        .iter()
        .enumerate()
        .map(|(i, (t, ip, bytes))| {
            // Every other line with its fields in another order, and a string with escapes.
            if i % 2 == 0 {
                format!("{{\"ts\":{t},\"client\":{{\"ip\":\"{ip}\"}},\"ua\":\"a \\\"b\\\"\",\"bytes\":{bytes}}}\n")
            } else {
                format!("{{\"bytes\":{bytes},\"client\":{{\"ip\":\"{ip}\"}},\"ts\":{t}}}\n")
            }
        })
        .collect();
    let (envoy_path, json_path) = (dir.join("envoy.log"), dir.join("json.log"));
    fs::write(&envoy_path, envoy).unwrap();
    fs::write(&json_path, json).unwrap();
    let envoy_run = ratewell(
        &["compare", envoy_path.to_str().unwrap(), "--log", "envoy", "--limit", "30/10s"],
        "",
    );
    assert_eq!(envoy_run.code, Some(0), "{}", envoy_run.err);
    assert_eq!(table(&envoy_run.out), table(&want.out));
    assert!(envoy_run.err.contains("times in milliseconds"), "{}", envoy_run.err);
    let json_run = ratewell(
        &[
            "compare",
            json_path.to_str().unwrap(),
            "--log",
            "json",
            "--time-field",
            "ts",
            "--time-unit",
            "ms",
            "--key",
            "$client.ip",
            "--limit",
            "30/10s",
        ],
        "",
    );
    assert_eq!(json_run.code, Some(0), "{}", json_run.err);
    assert_eq!(table(&json_run.out), table(&want.out));
    assert!(json_run.err.contains("2500 lines read, 2500 requests"), "{}", json_run.err);
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn replay_reads_a_log_as_it_reads_the_same_requests_as_a_trace() {
    let dir = scratch("replay");
    let r = requests(2_000);
    let (log, csv, gz) = (dir.join("access.log"), dir.join("trace.csv"), dir.join("access.log.gz"));
    fs::write(&log, combined(&r)).unwrap();
    fs::write(&csv, trace(&r, 1000, false)).unwrap();
    gzip(&gz, &combined(&r));
    let (old, new) = (dir.join("access.log.1"), dir.join("access.log.2.gz"));
    fs::write(&old, combined(&r[..900])).unwrap();
    gzip(&new, &combined(&r[900..]));
    let path = |p: &Path| p.to_str().unwrap().to_string();
    let (log, csv, gz, old, new) = (path(&log), path(&csv), path(&gz), path(&old), path(&new));
    for output in [&[][..], &["--format", "full"], &["--summary"]] {
        let policy = ["--policy", "token-bucket capacity=4 rate=1/s"];
        let want = ratewell(&[&["replay", &csv][..], &policy, output].concat(), "");
        assert_eq!(want.code, Some(0), "{}", want.err);
        assert!(want.out.contains('0') && want.out.contains('1'), "both decisions occur");
        for (files, stdin) in [
            (vec![&log[..]], String::new()),
            (vec![&gz], String::new()),
            (vec!["-"], combined(&r)),
            (vec![], combined(&r)),
            (vec![&old, &new], String::new()),
        ] {
            let args = [&["replay"][..], &files, &["--log", "combined"], &policy, output].concat();
            let got = ratewell(&args, &stdin);
            assert_eq!(got.code, Some(0), "{args:?}: {}", got.err);
            assert_eq!(got.out, want.out, "{args:?}");
            assert!(got.err.contains("2000 lines read, 2000 requests"), "{}", got.err);
        }
    }
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn replay_with_one_key_per_layer_from_a_log() {
    let dir = scratch("replay-layers");
    let r = requests(1_500);
    // An API key with a `|` in it: part of the key, not a separator of layers.
    let format = r#"$remote_addr [$msec] "$request" $status key=$http_x_api_key"#;
    let log: String = r
        .iter()
        .map(|(t, ip, bytes)| {
            format!(
                "{ip} [{}.{:03}] \"GET / HTTP/1.1\" 200 key=k|{}\n",
                t / 1000,
                t % 1000,
                bytes % 4
            )
        })
        .collect();
    let first = r[0].0;
    let lists: String = r
        .iter()
        .map(|(t, ip, bytes)| format!("{},{ip}|k_{},1\n", (t - first) * 1_000_000, bytes % 4))
        .collect();
    let (log_path, csv_path) = (dir.join("layers.log"), dir.join("layers.csv"));
    fs::write(&log_path, log).unwrap();
    fs::write(&csv_path, lists).unwrap();
    let policies = [
        "--policy",
        "token-bucket capacity=3 rate=1/s",
        "--policy",
        "sliding-window limit=20 window=10s",
    ];
    let want = ratewell(
        &[&["replay", csv_path.to_str().unwrap(), "--format", "full"][..], &policies].concat(),
        "",
    );
    assert_eq!(want.code, Some(0), "{}", want.err);
    // Both layers decide some of the rejections: the keys really are per layer.
    assert!(want.out.contains(",1,") && want.out.contains(",2,"), "{}", &want.out[..400]);
    let log_args = [
        "replay",
        log_path.to_str().unwrap(),
        "--log",
        "nginx",
        "--log-format",
        format,
        "--format",
        "full",
        "--key",
        "$remote_addr",
        "--key",
        "$http_x_api_key",
    ];
    let got = ratewell(&[&log_args[..], &policies].concat(), "");
    assert_eq!(got.code, Some(0), "{}", got.err);
    assert_eq!(got.out, want.out);
    // One key for every layer: the address alone, as a trace of addresses decides.
    let one: String =
        r.iter().map(|(t, ip, _)| format!("{},{ip}\n", (t - first) * 1_000_000)).collect();
    let want = ratewell(&[&["replay", "-", "--format", "full"][..], &policies].concat(), &one);
    let got = ratewell(&[&log_args[..10], &policies].concat(), "");
    assert_eq!(got.code, Some(0), "{}", got.err);
    assert_eq!(got.out, want.out);
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn replay_refuses_what_a_log_cannot_give() {
    let dir = scratch("replay-refuses");
    let log = dir.join("access.log");
    fs::write(&log, combined(&requests(50))).unwrap();
    let log = log.to_str().unwrap();
    let policy = "fixed-window limit=2 window=1s";
    let cases: &[(&[&str], &str)] = &[
        (&["--key", "$remote_addr", "--key", "$status"], "a request has one key"),
        (
            &["--key", "$remote_addr", "--key", "$status", "--key", "$status", "--policy", policy],
            "--key given 3 times for 2 policies",
        ),
        (&["--load-state", "/nonexistent"], "not with --log"),
        (&["--save-state", "x.snap"], "not with --log"),
        (&["--key", "$http_x_nothing"], "$http_x_nothing is not in the log's format"),
    ];
    for (extra, message) in cases {
        let args = [&["replay", log, "--log", "combined", "--policy", policy][..], extra].concat();
        let got = ratewell(&args, "");
        assert_eq!(got.code, Some(2), "{args:?}: {}", got.err);
        assert!(got.err.contains(message), "{args:?}: {}", got.err);
        assert!(got.out.is_empty());
    }
    // Nothing readable: every line skipped, and the run fails.
    let got =
        ratewell(&["replay", "-", "--log", "combined", "--policy", policy], "noise\n\x01\x02\n");
    assert_eq!(got.code, Some(2), "{}", got.err);
    assert!(got.err.contains("2 lines skipped") && got.err.contains("stdin:1"), "{}", got.err);
    assert!(got.err.contains("no line of the log could be read"), "{}", got.err);
    // --strict stops at the bad line, after the lines before it are printed.
    let mut text = combined(&requests(3));
    text.push_str("noise\n");
    text.push_str(&combined(&requests(2)));
    let got =
        ratewell(&["replay", "-", "--log", "combined", "--strict", "--policy", policy], &text);
    assert_eq!(got.code, Some(2), "{}", got.err);
    assert!(got.err.contains("stdin:4") && got.err.contains("--strict"), "{}", got.err);
    assert_eq!(got.out.lines().count(), 3);
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn find_capacity_reads_the_logs_again() {
    let dir = scratch("find-capacity");
    // 400 clients, each twice a second: a table of 64 keys evicts live ones.
    let lines: String = (0..4_000u64)
        .map(|i| {
            let t_ms = 1_712_311_872_000 + i * 5;
            format!(
                "10.1.{}.{} - - [{}] \"GET / HTTP/1.1\" 200 1 \"-\" \"-\"\n",
                i % 400 / 200,
                i % 200,
                time_local(t_ms)
            )
        })
        .collect();
    let log = dir.join("access.log");
    fs::write(&log, &lines).unwrap();
    let log = log.to_str().unwrap();
    let base = ["--log", "combined", "--capacity", "64", "--find-capacity"];
    let replay = ratewell(
        &[&["replay", log][..], &base, &["--policy", "sliding-log limit=5 window=10s"]].concat(),
        "",
    );
    let compare = ratewell(&[&["compare", log][..], &base, &["--limit", "5/10s"]].concat(), "");
    for run in [&replay, &compare] {
        assert_eq!(run.code, Some(0), "{}", run.err);
        assert!(run.err.contains("live keys were evicted"), "{}", run.err);
        let found = run
            .err
            .split("--capacity ")
            .filter_map(|s| s.split_whitespace().next()?.parse::<usize>().ok())
            .find(|&c| c > 64)
            .unwrap_or_else(|| panic!("no capacity named: {}", run.err));
        assert!(run.err.contains(&format!("--capacity {found} avoids it")), "{}", run.err);
        assert!((512..=2048).contains(&found), "{found}");
    }
    // The capacity named evicts none; standard input cannot be read again.
    let got = ratewell(
        &[
            "replay",
            log,
            "--log",
            "combined",
            "--capacity",
            "1024",
            "--policy",
            "sliding-log limit=5 window=10s",
        ],
        "",
    );
    assert_eq!(got.code, Some(0), "{}", got.err);
    assert!(!got.err.contains("evicted"), "{}", got.err);
    let piped = ratewell(
        &[&["replay", "-"][..], &base, &["--policy", "sliding-log limit=5 window=10s"]].concat(),
        &lines,
    );
    assert!(piped.err.contains("could not be read again"), "{}", piped.err);
    fs::remove_dir_all(dir).unwrap();
}
