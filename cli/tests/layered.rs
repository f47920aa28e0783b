//! `ratewell replay` with several `--policy`: the layered limiter of docs/SEMANTICS.md, *Layered
//! limits*, on hand-worked traces (each expected line derived beside it from the contract).

mod common;

fn layered(policies: &[&str], extra: &[&str], trace: &str) -> (i32, String, String) {
    let mut args = vec!["replay"];
    for p in policies {
        args.extend(["--policy", p]);
    }
    args.extend(extra);
    let run = common::ratewell(&args, trace);
    (run.code.unwrap_or(-1), run.out, run.err)
}

/// Replay the requests of `annotated` (`t,key[,cost]  # expected`) and compare.
fn check(policies: &[&str], annotated: &str) {
    let (mut trace, mut want) = (String::new(), String::new());
    for line in annotated.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let (request, expected) = line.split_once('#').expect("annotated line");
        trace.push_str(request.trim());
        trace.push('\n');
        want.push_str(expected.split_whitespace().next().unwrap());
        want.push('\n');
    }
    let (code, out, err) = layered(policies, &[], &trace);
    assert_eq!(code, 0, "{policies:?}: {err}");
    assert_eq!(out, want, "{policies:?}");
}

#[test]
fn a_route_layer_rejecting_charges_no_ip_layer() {
    // Layer 1: per IP, 3 per minute. Layer 2: per route, 1 per minute.
    check(
        &["fixed-window limit=3 window=1m", "fixed-window limit=1 window=1m"],
        "
        0,ip1|search        # 1  ip1 1/3, search 1/1
        1,ip1|search        # 0  search full: rejected, ip1 not charged (still 1/3)
        2,ip1|search        # 0  the same
        3,ip1|home          # 1  ip1 2/3, home 1/1
        4,ip1|about         # 1  ip1 3/3: the two rejections took nothing from it
        5,ip1|contact       # 0  ip1 full: contact is not charged
        6,ip2|contact       # 1  contact was left untouched by the rejection above
        60000000000,ip1|search # 1  a new minute on both
        ",
    );
}

#[test]
fn one_key_is_every_layer_s_key_bands_on_one_key() {
    // Two bands: 2 per second and 3 per 10 s, both on key `a`.
    check(
        &["fixed-window limit=2 window=1s", "fixed-window limit=3 window=10s"],
        "
        0,a              # 1  1/2, 1/3
        1,a              # 1  2/2, 2/3
        2,a              # 0  the 1 s band is full; the 10 s band is not charged (2/3)
        1000000000,a     # 1  1/2, 3/3
        1000000001,a     # 0  the 10 s band is full; the 1 s band stays at 1/2
        1000000002,b     # 1  b is its own key on both bands
        10000000000,a    # 1  both windows new
        ",
    );
}

#[test]
fn costs_are_all_or_nothing() {
    // A token bucket of 5 refilled 1/s, and a fixed window of 4 per minute.
    check(
        &["token-bucket capacity=5 rate=1/s", "fixed-window limit=4 window=1m"],
        "
        0,k,3            # 1  bucket 2 left, window 3/4
        0,k,2            # 0  the window would reach 5/4: rejected, the bucket keeps its 2
        0,k,2            # 0  the same: the bucket was never charged
        0,k,1            # 1  bucket 1, window 4/4
        0,k,6            # 0  impossible on the bucket (6 > 5): nothing charged
        ",
    );
}

#[test]
fn delays_are_the_largest_of_the_layers() {
    // Two delaying leaky buckets on the same key: 1 r/s and 2 r/s, burst 2 each (delay=0: every
    // request beyond the first waits excess/R).
    check(
        &["leaky-bucket rate=1r/s burst=2", "leaky-bucket rate=2r/s burst=2"],
        "
        0,k    # 1,0           excess 0 on both
        0,k    # 1,1000000000  excess 1: 1 s at 1 r/s, 0.5 s at 2 r/s: the largest
        0,k    # 1,2000000000  excess 2: 2 s and 1 s
        0,k    # 0             excess 3 > burst on both
        ",
    );
}

#[test]
fn a_dry_run_layer_decides_but_never_rejects() {
    check(
        &["fixed-window limit=1 window=1m dry-run", "fixed-window limit=2 window=1m"],
        "
        0,k    # 1  both admit: both charged (dry 1/1, enforcing 1/2)
        1,k    # 1  the dry run would reject (it is not charged); the enforcing layer 2/2
        2,k    # 0  the enforcing layer rejects
        ",
    );
    // Alone, a dry-run policy admits everything.
    check(&["fixed-window limit=1 window=1m dry-run"], "0,k # 1\n1,k # 1\n");
}

#[test]
fn full_format_names_the_deciding_layer() {
    let (code, out, err) = layered(
        &[
            "fixed-window limit=2 window=1m",
            "fixed-window limit=1 window=1m dry-run",
            "fixed-window limit=1 window=1m",
        ],
        &["--format", "full"],
        "0,a|x|r\n1,a|x|r\n2,b|y|r2\n",
    );
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0],
        "admitted,delay_ns,remaining,retry_after_ns,reset_after_ns,layer,would_reject"
    );
    // Admitted: layer 3 has the least remaining (0; ties go to the first, and layer 2 is a dry run).
    assert_eq!(lines[1], "1,0,0,,60000000000,3,");
    // Rejected by layer 3 (route r is full); the dry run of layer 2 would reject too.
    assert_eq!(lines[2], "0,0,0,59999999999,59999999999,3,2");
    // At 2 ns: the windows end 2 ns sooner.
    assert_eq!(lines[3], "1,0,0,,59999999998,3,");
}

#[test]
fn a_wrong_number_of_keys_is_a_bad_line() {
    let two = ["fixed-window limit=2 window=1m", "fixed-window limit=1 window=1m"];
    let (code, out, err) = layered(&two, &[], "0,a|b\n1,a|b|c\n");
    assert_eq!(code, 2, "{err}");
    assert_eq!(out, "1\n", "nothing after the error");
    assert!(err.contains("line 2") && err.contains("3 keys for 2 policies"), "{err}");
    // One policy: `a|b` is two keys for one.
    let (code, _, err) = layered(&two[..1], &[], "0,a\n\n5,a|b\n");
    assert_eq!(code, 2);
    assert!(err.contains("line 3") && err.contains("2 keys for 1 policy"), "{err}");
    // An empty key in a list.
    let (code, _, err) = layered(&two, &[], "0,a||b\n");
    assert_eq!(code, 2);
    assert!(err.contains("line 1") && err.contains("bad key"), "{err}");
}

#[test]
fn bad_policies_name_the_one_at_fault() {
    let (code, _, err) =
        layered(&["fixed-window limit=2 window=1m", "fixed-window limit=0 window=1m"], &[], "");
    assert_eq!(code, 2);
    assert!(err.contains("fixed-window limit=0 window=1m") && err.contains("limit=0"), "{err}");
    let (code, _, err) = layered(&["fixed-window limit=2 window=1m dry-run dry-run"], &[], "");
    assert_eq!(code, 2);
    assert!(err.contains("`dry-run` only once"), "{err}");
    let (code, _, err) = layered(&["fixed-window limit=2 window=1m dryrun"], &[], "");
    assert_eq!(code, 2);
    assert!(err.contains("dryrun"), "{err}");
    let nine = ["fixed-window limit=2 window=1m"; 9];
    let (code, _, err) = layered(&nine, &[], "");
    assert_eq!(code, 2);
    assert!(err.contains("at most 8"), "{err}");
    // No policy at all.
    let run = common::ratewell(&["replay"], "");
    assert_eq!(run.code, Some(2), "{}", run.err);
}
