//! `ratewell bench`: a row per algorithm and mode, with figures that parse.

mod common;

#[test]
fn bench_prints_a_row_per_algorithm_and_mode() {
    let run =
        common::ratewell(&["bench", "--seconds", "0.02", "--keys", "1000", "--threads", "2"], "");
    assert_eq!(run.code, Some(0), "{}", run.err);
    // The clock's resolution: the counter's frequency, measured.
    let clock = run.out.lines().find(|l| l.starts_with("clock: ")).expect(&run.out);
    let mhz: f64 = clock.split(" MHz").next().unwrap().rsplit(' ').next().unwrap().parse().unwrap();
    assert!(mhz > 0.0, "{clock}");
    for algorithm in [
        "token bucket (GCRA)",
        "token bucket (discrete fill)",
        "leaky bucket",
        "leaky bucket (compat=nginx)",
        "fixed window",
        "sliding-window counter",
        "sliding log",
    ] {
        for mode in ["direct", "keyed"] {
            let rows: Vec<&str> = run
                .out
                .lines()
                .filter(|l| {
                    l.starts_with(&format!("{algorithm}  "))
                        || l.starts_with(&format!("{algorithm} "))
                })
                .filter(|l| l[algorithm.len()..].split_whitespace().next() == Some(mode))
                .collect();
            assert_eq!(rows.len(), 1, "{algorithm} {mode}:\n{}", run.out);
            let cells: Vec<&str> = rows[0][algorithm.len()..].split_whitespace().collect();
            // mode, decisions/s ("12.34 M"), ns/decision, admitted%, policy...
            let per_second: f64 = cells[1].parse().unwrap();
            let ns: f64 = cells[3].parse().unwrap();
            assert!(per_second > 0.0 && ns > 0.0, "{}", rows[0]);
            assert!(cells[4].ends_with('%'), "{}", rows[0]);
        }
    }
}

#[test]
fn bench_refuses_absurd_arguments() {
    for args in [
        &["bench", "--seconds", "0"][..],
        &["bench", "--seconds", "-1"],
        &["bench", "--seconds", "1e9"],
        &["bench", "--threads", "0"],
        &["bench", "--keys", "0"],
        &["bench", "--policy", "sliding-log limit=0 window=1s"],
    ] {
        let run = common::ratewell(args, "");
        assert_eq!(run.code, Some(2), "{args:?}: {}", run.err);
        assert!(!run.err.contains("panicked"), "{args:?}: {}", run.err);
    }
}
