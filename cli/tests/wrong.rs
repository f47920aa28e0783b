//! `compare`'s wrong-decision columns against a naive reference: the model crate replays the
//! same trace, key by key, through the exact sliding log and through each policy of `--limit`,
//! and counts where they differ, request by request.

mod common;

use std::collections::HashMap;
use std::fs;

use common::{ratewell, scratch};
use proptest::prelude::*;
use ratewell_model::{
    AnyModel, Discrete, Fixed, Gcra, Leaky, Log, Model, Sliding, Verdict, duration_text,
};

/// The models of `--limit n/w --burst b`'s policies, by the first words of each row's policy.
fn models(n: u128, w: u128, b: u128) -> Vec<(&'static str, AnyModel)> {
    let leaky = |delay| Leaky { burst: b - 1, count: n, period: w, delay, state: None };
    vec![
        ("token-bucket rate", AnyModel::Gcra(Gcra { capacity: b, count: n, period: w, tat: None })),
        (
            "token-bucket refill",
            AnyModel::Discrete(Discrete { capacity: b, refill: n, every: w, state: None }),
        ),
        ("leaky-bucket nodelay", AnyModel::Leaky(leaky(None))),
        ("leaky-bucket delay", AnyModel::Leaky(leaky(Some(0)))),
        ("fixed-window", AnyModel::Fixed(Fixed { limit: n, window: w, first: false, state: None })),
        ("sliding-window", AnyModel::Sliding(Sliding { limit: n, window: w, state: (0, 0, 0) })),
        ("sliding-log", AnyModel::Log(Log { limit: n, window: w, entries: vec![] })),
    ]
}

/// Which model a row of the table is.
fn model_of(policy: &str) -> &'static str {
    match policy.split_whitespace().next().unwrap() {
        "token-bucket" if policy.contains("refill=") => "token-bucket refill",
        "token-bucket" => "token-bucket rate",
        "leaky-bucket" if policy.contains("nodelay") => "leaky-bucket nodelay",
        "leaky-bucket" => "leaky-bucket delay",
        other => ["fixed-window", "sliding-window", "sliding-log"]
            .into_iter()
            .find(|m| *m == other)
            .unwrap_or_else(|| panic!("an unknown row {policy}")),
    }
}

fn admitted(verdict: Verdict) -> bool {
    matches!(verdict, Verdict::Admitted { .. })
}

/// Per row: (requests admitted that the reference rejected, rejected that it admitted, keys).
fn table(out: &str) -> HashMap<&'static str, (u64, u64, u64)> {
    let mut rows = HashMap::new();
    for line in out.lines().skip(2).take_while(|l| !l.starts_with("peak:")) {
        let cells: Vec<&str> = line.split("  ").map(str::trim).filter(|c| !c.is_empty()).collect();
        assert_eq!(cells.len(), 11, "{line}");
        let first = |cell: &str| cell.split_whitespace().next().unwrap().parse::<u64>().unwrap();
        rows.insert(model_of(cells[0]), (first(cells[8]), first(cells[9]), first(cells[10])));
    }
    rows
}

/// A trace: (gap after the previous request in ns, key, cost).
fn trace() -> impl Strategy<Value = Vec<(u64, u8, u32)>> {
    let gap = prop_oneof![
        Just(0u64),
        0u64..2_000_000,
        0u64..400_000_000,
        1_000_000_000u64..3_000_000_000,
    ];
    prop::collection::vec((gap, 0u8..4, prop_oneof![3 => Just(1u32), 1 => 1u32..4]), 1..300)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn the_wrong_decisions_are_the_models(
        requests in trace(),
        n in 1u32..6,
        w in prop::sample::select(vec![250_000_000u64, 1_000_000_000, 10_000_000_000]),
        extra in prop::option::of(0u32..3),
    ) {
        let b = n + extra.unwrap_or(0);
        let dir = scratch("wrong");
        let (mut csv, mut t) = (String::new(), 0u64);
        for &(gap, key, cost) in &requests {
            t += gap;
            csv += &format!("{t},k{key},{cost}\n");
        }
        let path = dir.join("trace.csv");
        fs::write(&path, &csv).unwrap();
        let limit = format!("{n}/{}", duration_text(w));
        let mut args = vec!["compare", path.to_str().unwrap(), "--limit", &limit];
        let burst = b.to_string();
        if extra.is_some() {
            args.extend(["--burst", &burst]);
        }
        let run = ratewell(&args, "");
        prop_assert_eq!(run.code, Some(0), "{}", run.err);
        let got = table(&run.out);

        // The reference model, per key, and each policy's model, per key.
        let (n, w, b) = (u128::from(n), u128::from(w), u128::from(b));
        let fresh = models(n, w, b);
        let reference = fresh.last().unwrap().1.clone();
        let mut want = HashMap::new();
        for (name, model) in &fresh {
            let (mut refs, mut mine) = (HashMap::new(), HashMap::new());
            let (mut wrong, mut keys) = ([0u64, 0], std::collections::HashSet::new());
            let mut t = 0u128;
            for &(gap, key, cost) in &requests {
                t += u128::from(gap);
                let r = refs.entry(key).or_insert_with(|| reference.clone()).step(t, cost.into());
                let m = mine.entry(key).or_insert_with(|| model.clone()).step(t, cost.into());
                if admitted(m) != admitted(r) {
                    wrong[usize::from(admitted(r))] += 1;
                    keys.insert(key);
                }
            }
            want.insert(*name, (wrong[0], wrong[1], keys.len() as u64));
        }
        prop_assert_eq!(got, want, "{}\n{}", run.out, csv);
        let _ = fs::remove_dir_all(&dir);
    }
}

#[test]
fn against_names_the_reference_and_a_bad_one_is_refused() {
    // Ten requests 1 ms before a window boundary and ten 1 ms after it: the fixed window admits
    // all twenty, the sliding log (here only the reference, not a row) the first ten.
    let dir = scratch("against");
    let mut csv = String::new();
    for t in [999_000_000u64, 1_001_000_000] {
        csv += &format!("{t},k\n").repeat(10);
    }
    let path = dir.join("boundary.csv");
    fs::write(&path, csv).unwrap();
    let trace = path.to_str().unwrap();
    let fixed = "fixed-window limit=10 window=1s";
    let run = ratewell(
        &["compare", trace, "--policy", fixed, "--against", "sliding-log limit=10 window=1s"],
        "",
    );
    assert_eq!(run.code, Some(0), "{}", run.err);
    assert_eq!(table(&run.out).into_iter().collect::<Vec<_>>(), [("fixed-window", (10, 0, 1))]);
    assert!(run.out.contains("10 (50.0000%)"), "{}", run.out);
    assert!(run.out.contains("the reference (sliding-log limit=10 window=1s)"), "{}", run.out);
    // Without a reference, no such columns.
    let plain = ratewell(&["compare", trace, "--policy", fixed], "");
    assert!(!plain.out.contains("wrong"), "{}", plain.out);
    let bad = ratewell(&["compare", trace, "--policy", fixed, "--against", "sliding-log"], "");
    assert_eq!(bad.code, Some(2));
    assert!(bad.err.starts_with("ratewell: --against sliding-log: "), "{}", bad.err);
    fs::remove_dir_all(dir).unwrap();
}
