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
        &["bench", "--processes", "0"],
        &["bench", "--processes", "1025"],
        &["bench", "--processes", "2", "--threads", "2"],
        // A sliding log of a limit above the sliding log's largest.
        &["bench", "--processes", "2", "--policy", "sliding-log limit=70000 window=1s"],
    ] {
        let run = common::ratewell(args, "");
        assert_eq!(run.code, Some(2), "{args:?}: {}", run.err);
        assert!(!run.err.contains("panicked"), "{args:?}: {}", run.err);
    }
}

/// The shared tables' files of `bench --processes` now in /dev/shm.
#[cfg(target_os = "linux")]
fn bench_tables() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/dev/shm") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.starts_with("ratewell-bench-"))
        .collect()
}

#[cfg(target_os = "linux")]
#[test]
fn bench_processes_prints_processes_beside_threads_and_the_scaling() {
    let before = bench_tables();
    let run =
        common::ratewell(&["bench", "--processes", "2", "--seconds", "0.2", "--keys", "1000"], "");
    assert_eq!(run.code, Some(0), "{}", run.err);
    for name in [
        "1 process (shared table)",
        "2 processes (shared table)",
        "1 thread (heap table)",
        "2 threads (heap table)",
    ] {
        let rows: Vec<&str> =
            run.out.lines().filter(|l| l.starts_with(&format!("{name}  "))).collect();
        assert_eq!(rows.len(), 1, "{name}:\n{}", run.out);
        // decisions/s ("12.34 M"), ns/decision, admitted%.
        let cells: Vec<&str> = rows[0][name.len()..].split_whitespace().collect();
        assert_eq!(cells.len(), 4, "{}", rows[0]);
        let per_second: f64 = cells[0].parse().unwrap();
        let ns: f64 = cells[2].parse().unwrap();
        assert!(per_second > 0.0 && ns > 0.0, "{}", rows[0]);
        // The default policy admits everything: the CAS path.
        assert_eq!(cells[3], "100.0%", "{}", rows[0]);
    }
    // Ratios are printed, never asserted: timings vary with the machine's load.
    let scaling = run.out.lines().find(|l| l.starts_with("scaling: ")).expect(&run.out);
    let ratios: Vec<f64> =
        scaling.split('×').filter_map(|part| part.rsplit(' ').next()?.parse().ok()).collect();
    assert_eq!(ratios.len(), 2, "{scaling}");
    assert!(ratios.iter().all(|&r| r > 0.0), "{scaling}");
    assert!(scaling.starts_with("scaling: 2 processes make "), "{scaling}");
    assert!(scaling.contains("; 2 threads "), "{scaling}");
    let versus = run.out.lines().find(|l| l.starts_with("shared / heap at 2: ")).expect(&run.out);
    let ratio: f64 = versus.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(ratio > 0.0, "{versus}");
    // The shared table's files are removed.
    let left: Vec<String> = bench_tables().into_iter().filter(|n| !before.contains(n)).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}
