//! `ratewell compare`: the table's figures on a trace built to expose a fixed window's boundary
//! burst, the charts it writes, and its handling of bad input.

mod common;

use std::fs;
use std::path::Path;

use common::{ratewell, scratch};

/// N = 10 per W = 1 s. Ten requests 1 ms before the boundary at 1 s, ten 1 ms after it.
fn boundary_trace(dir: &Path) -> String {
    let mut trace = String::new();
    for t in [999_000_000u64, 1_001_000_000] {
        for _ in 0..10 {
            trace += &format!("{t},k\n");
        }
    }
    let path = dir.join("boundary.csv");
    fs::write(&path, trace).unwrap();
    path.to_str().unwrap().to_string()
}

/// `(policy, admitted, peak)` per row of the table.
fn rows(table: &str) -> Vec<(String, u64, u64)> {
    let mut rows = Vec::new();
    for line in table.lines().skip(2) {
        let cells: Vec<&str> = line.split("  ").map(str::trim).filter(|c| !c.is_empty()).collect();
        if cells.len() < 5 {
            continue;
        }
        let number = |cell: &str| cell.split_whitespace().next().unwrap().parse::<u64>().unwrap();
        rows.push((cells[0].to_string(), number(cells[1]), number(cells[3])));
    }
    rows
}

fn row(rows: &[(String, u64, u64)], pick: impl Fn(&str) -> bool) -> &(String, u64, u64) {
    let found: Vec<_> = rows.iter().filter(|(p, ..)| pick(p)).collect();
    assert_eq!(found.len(), 1, "one row expected among {rows:?}");
    found[0]
}

#[test]
fn fixed_window_boundary_burst_shows_in_the_peak() {
    let dir = scratch("boundary");
    let trace = boundary_trace(&dir);
    let run = ratewell(&["compare", &trace, "--limit", "10/s"], "");
    assert_eq!(run.code, Some(0), "{}", run.err);
    let rows = rows(&run.out);
    assert_eq!(rows.len(), 7, "one row per algorithm:\n{}", run.out);
    let peak = |pick: &dyn Fn(&str) -> bool| row(&rows, pick).2;
    let admitted = |pick: &dyn Fn(&str) -> bool| row(&rows, pick).1;
    // Fixed window: [0, 1s) and [1s, 2s) each admit 10; all 20 within 2 ms: twice the limit.
    assert_eq!(peak(&|p| p.starts_with("fixed-window")), 20);
    // Envoy-style fill: the bucket (10) is emptied, then refilled by 10 at 1 s: 20 within 2 ms,
    // the limit plus the burst its fill allows.
    assert_eq!(peak(&|p| p.contains("refill=")), 20);
    // Continuous token bucket of 10 at 10/s: 10 at once, then 2 ms refill only 0.02 tokens.
    assert_eq!(peak(&|p| p.starts_with("token-bucket") && p.contains("rate=")), 10);
    // nginx's leaky bucket with burst 9: 10 from idle, then 2 ms leak 0.02 requests.
    assert_eq!(peak(&|p| p.ends_with("nodelay")), 10);
    // Delayed: the 10 admitted are released 100 ms apart (0 .. 900 ms), all within 1 s.
    assert_eq!(peak(&|p| p.starts_with("leaky-bucket") && !p.contains("nodelay")), 10);
    assert_eq!(admitted(&|p| p.starts_with("leaky-bucket") && !p.contains("nodelay")), 10);
    // Sliding-window counter at 1 ms into the new window: floor(10 * 999/1000) + 0 = 9, so one
    // more request passes (the counter's approximation), then floor(9.99) + 1 = 10 is full.
    assert_eq!(peak(&|p| p.starts_with("sliding-window")), 11);
    // Sliding log: exactly 10 within any closed 1 s.
    assert_eq!(peak(&|p| p.starts_with("sliding-log")), 10);
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn delays_are_reported_as_percentiles() {
    let dir = scratch("delays");
    let trace = boundary_trace(&dir);
    let run = ratewell(&["compare", &trace, "--policy", "leaky-bucket rate=10r/s burst=9"], "");
    assert_eq!(run.code, Some(0), "{}", run.err);
    // Ten admitted, delayed 0, 100, ..., 900 ms: p50 (5th of 10) = 400 ms, p99 = max = 900 ms.
    let line = run.out.lines().find(|l| l.starts_with("leaky-bucket")).unwrap();
    let cells: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(&cells[cells.len() - 3..], ["400ms", "900ms", "900ms"], "{line}");
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn charts_have_one_panel_per_policy_and_the_png_decodes() {
    let dir = scratch("charts");
    let svg = dir.join("chart.svg");
    let png = dir.join("chart.png");
    let run = ratewell(
        &[
            "compare",
            "../examples/sample.csv",
            "--limit",
            "20/10s",
            "--policy",
            "sliding-log limit=5 window=1s",
            "--svg",
            svg.to_str().unwrap(),
            "--png",
            png.to_str().unwrap(),
        ],
        "",
    );
    assert_eq!(run.code, Some(0), "{}", run.err);
    let policies: Vec<String> = rows(&run.out).into_iter().map(|(p, ..)| p).collect();
    assert_eq!(policies.len(), 8, "{}", run.out);

    let text = fs::read_to_string(&svg).unwrap();
    let doc = roxmltree::Document::parse(&text).expect("the SVG is well-formed XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let texts: Vec<&str> = doc
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text())
        .map(str::trim)
        .collect();
    for policy in &policies {
        let panels = texts.iter().filter(|t| *t == policy).count();
        assert_eq!(panels, 1, "one panel titled {policy:?}");
    }
    // The bars: at least one admitted (green) and one rejected (red) rectangle.
    let fills: Vec<&str> = doc.descendants().filter_map(|n| n.attribute("fill")).collect();
    assert!(fills.contains(&"#2E7D32") && fills.contains(&"#EF9A9A"), "bars of both colours");

    let decoder = png::Decoder::new(std::io::BufReader::new(fs::File::open(&png).unwrap()));
    let mut reader = decoder.read_info().expect("a PNG header");
    let mut pixels = vec![0; reader.output_buffer_size().unwrap()];
    let frame = reader.next_frame(&mut pixels).expect("PNG pixels");
    assert_eq!((frame.width, frame.height), (1200, 64 + 8 * 130 + 46));
    // Drawn, not blank: white, green bars and dark text are all there.
    let distinct: std::collections::HashSet<&[u8]> =
        pixels[..frame.buffer_size()].chunks(4).collect();
    assert!(distinct.len() > 20, "{} colours", distinct.len());
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn the_chart_shows_the_busiest_key_unless_told() {
    let dir = scratch("key");
    let svg = dir.join("c.svg");
    let svg = svg.to_str().unwrap();
    let run = ratewell(&["compare", "../examples/sample.csv", "--limit", "2/s", "--svg", svg], "");
    assert_eq!(run.code, Some(0), "{}", run.err);
    let sample = fs::read_to_string("../examples/sample.csv").unwrap();
    let count = |key: &str| sample.lines().filter(|l| l.split(',').nth(1) == Some(key)).count();
    let busiest = ["alice", "bob", "carol", "dave"].into_iter().max_by_key(|k| count(k)).unwrap();
    let title = format!("key {busiest} ({} requests)", count(busiest));
    assert!(fs::read_to_string(svg).unwrap().contains(&title), "{title}");
    let run = ratewell(
        &[
            "compare",
            "../examples/sample.csv",
            "--limit",
            "2/s",
            "--svg",
            svg,
            "--chart-key",
            "dave",
        ],
        "",
    );
    assert_eq!(run.code, Some(0), "{}", run.err);
    let title = format!("key dave ({} requests)", count("dave"));
    assert!(fs::read_to_string(svg).unwrap().contains(&title), "{title}");
    fs::remove_dir_all(dir).unwrap();
}

/// Exit 2, one line on stderr, no panic, and nothing left in `dir` but `keep`.
fn assert_failed(run: &common::Run, dir: &Path, keep: &[&str], context: &str) {
    assert_eq!(run.code, Some(2), "{context}: {}", run.err);
    assert!(!run.err.contains("panicked"), "{context}: {}", run.err);
    assert!(run.err.starts_with("ratewell: ") || run.err.starts_with("error: "), "{}", run.err);
    let mut left: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, keep, "{context}: files left behind");
}

#[test]
fn bad_input_exits_2_and_leaves_nothing_half_written() {
    let dir = scratch("bad");
    let good = dir.join("good.csv");
    fs::write(&good, "1,a\n2,a\n").unwrap();
    let bad = dir.join("bad.csv");
    fs::write(&bad, "1,a\n2,a\n1,a\n").unwrap();
    let (good, bad) = (good.to_str().unwrap(), bad.to_str().unwrap());
    let out = dir.join("out.svg");
    let out = out.to_str().unwrap();
    let png = dir.join("out.png");
    let png = png.to_str().unwrap();
    let keep = ["bad.csv", "good.csv"];
    let cases: [(&[&str], &str); 13] = [
        (&["compare", "no-such-trace.csv", "--limit", "1/s"], "cannot read"),
        (&["compare", dir.to_str().unwrap(), "--limit", "1/s"], "not a regular file"),
        (
            &["compare", good, "--limit", "1/s", "--policy", "token-bucket capacity=0 rate=1/s"],
            "capacity",
        ),
        (&["compare", good, "--limit", "ten/s"], "--limit"),
        (&["compare", good, "--limit", "10"], "--limit"),
        (&["compare", good, "--limit", "10/0s"], "--limit"),
        (&["compare", good, "--limit", "10/1s align=first"], "--limit"),
        (&["compare", good, "--limit", "10/s", "--burst", "0"], "--burst"),
        (&["compare", good], "--limit"),
        (&["compare", bad, "--limit", "1/s", "--svg", out, "--png", png], "line 3"),
        (&["compare", good, "--limit", "1/s", "--svg", "/no/such/dir/c.svg"], "--svg"),
        (&["compare", good, "--limit", "1/s", "--png", dir.to_str().unwrap()], "--png"),
        (&["compare", good, "--limit", "1/s", "--svg", out, "--chart-key", "zed"], "--chart-key"),
    ];
    for (args, needle) in cases {
        let run = ratewell(args, "");
        assert_failed(&run, &dir, &keep, &format!("{args:?}"));
        assert!(run.err.contains(needle), "{args:?}: {:?} lacks {needle:?}", run.err);
    }
    // An existing chart is left as it was when a run fails.
    fs::write(out, "previous").unwrap();
    let run = ratewell(&["compare", bad, "--limit", "1/s", "--svg", out], "");
    assert_failed(&run, &dir, &["bad.csv", "good.csv", "out.svg"], "existing output");
    assert_eq!(fs::read_to_string(out).unwrap(), "previous");
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn an_algorithm_that_cannot_hold_the_limit_is_skipped_with_a_note() {
    let dir = scratch("skip");
    let trace = boundary_trace(&dir);
    // A sliding log keeps at most 65,536 entries a key: 100,000 per second is compared without it.
    let run = ratewell(&["compare", &trace, "--limit", "100000/s"], "");
    assert_eq!(run.code, Some(0), "{}", run.err);
    assert!(run.err.contains("skipping sliding-log limit=100000"), "{}", run.err);
    let rows = rows(&run.out);
    assert_eq!(rows.len(), 6, "{}", run.out);
    assert!(rows.iter().all(|(p, admitted, _)| !p.starts_with("sliding-log") && *admitted == 20));
    fs::remove_dir_all(dir).unwrap();
}

/// A deterministic trace of `lines` requests over a few keys with costs 1 to 3, in bursts and
/// lulls, longer than the batches (16,384 requests) `compare` decides at once.
fn random_trace(dir: &Path, lines: usize) -> String {
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let (mut t, mut text) = (0u64, String::new());
    for _ in 0..lines {
        // Mostly 0-2 ms apart, sometimes a lull of up to 3 s, in whole ms: admissions exactly
        // one span apart are common, so the span's ends are put to the test.
        t += 1_000_000 * if next() % 50 == 0 { next() % 3_000 } else { next() % 3 };
        let key = ["a", "b", "c", "d", "e"][(next() % 5) as usize];
        let cost = 1 + next() % 3;
        text += &format!("{t},{key},{cost}\n");
    }
    let path = dir.join("random.csv");
    fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

/// What `compare` reports for one policy, recomputed naively from `replay --format full`.
fn reference(trace: &str, policy: &str, span: u64) -> (u64, u64, u64, usize, Option<[u64; 3]>) {
    let run = ratewell(&["replay", "--policy", policy, "--format", "full", trace], "");
    assert_eq!(run.code, Some(0), "{policy}: {}", run.err);
    let requests = fs::read_to_string(trace).unwrap();
    let mut releases: std::collections::BTreeMap<&str, Vec<(u64, u64)>> = Default::default();
    let mut rejected_keys = std::collections::BTreeSet::new();
    let (mut admitted, mut rejected, mut delays) = (0, 0, Vec::new());
    for (request, decision) in requests.lines().zip(run.out.lines().skip(1)) {
        let fields: Vec<&str> = request.split(',').collect();
        let (t, key, cost): (u64, &str, u64) =
            (fields[0].parse().unwrap(), fields[1], fields[2].parse().unwrap());
        let decision: Vec<&str> = decision.split(',').collect();
        if decision[0] == "1" {
            admitted += 1;
            let delay: u64 = decision[1].parse().unwrap();
            delays.push(delay);
            releases.entry(key).or_default().push((t + delay, cost));
        } else {
            rejected += 1;
            rejected_keys.insert(key);
        }
    }
    // The peak: for every admission, the cost of the same key's admissions released within the
    // span of length `span` that ends at it.
    let mut peak = 0;
    for events in releases.values_mut() {
        events.sort();
        for &(end, _) in events.iter() {
            let within: u64 =
                events.iter().filter(|&&(t, _)| t <= end && end - t < span).map(|&(_, c)| c).sum();
            peak = peak.max(within);
        }
    }
    let percentiles = policy.starts_with("leaky-bucket") && !policy.contains("nodelay");
    let percentiles = percentiles.then(|| {
        delays.sort();
        let rank = |q: f64| delays[((q * delays.len() as f64).ceil() as usize).max(1) - 1];
        [rank(0.5), rank(0.99), rank(1.0)]
    });
    (admitted, rejected, peak, rejected_keys.len(), percentiles)
}

/// `compare` decides in batches, in parallel across policies, and keeps its peaks incrementally:
/// every figure of its table must equal what `replay` of each policy alone, summed up naively,
/// gives.
#[test]
fn compare_agrees_with_replay_of_each_policy() {
    let dir = scratch("agree");
    let trace = random_trace(&dir, 20_000);
    let run = ratewell(&["compare", &trace, "--limit", "40/1s", "--burst", "25"], "");
    assert_eq!(run.code, Some(0), "{}", run.err);
    let lines: Vec<&str> = run.out.lines().skip(2).take(7).collect();
    assert_eq!(lines.len(), 7, "{}", run.out);
    let number = |cell: &str| cell.split_whitespace().next().unwrap().parse::<u64>().unwrap();
    let ms = |cell: &str| -> u64 {
        // The table's durations: `0`, `NNNms`, `N.NNs`, ...
        let (value, scale) = if let Some(v) = cell.strip_suffix("ms") {
            (v, 1e6)
        } else if let Some(v) = cell.strip_suffix("us") {
            (v, 1e3)
        } else if let Some(v) = cell.strip_suffix("ns") {
            (v, 1.0)
        } else if let Some(v) = cell.strip_suffix('s') {
            (v, 1e9)
        } else {
            (cell, 1.0)
        };
        (value.parse::<f64>().unwrap() * scale) as u64
    };
    for line in lines {
        let cells: Vec<&str> = line.split("  ").map(str::trim).filter(|c| !c.is_empty()).collect();
        let policy = cells[0];
        let (admitted, rejected, peak, keys, percentiles) =
            reference(&trace, policy, 1_000_000_000);
        assert_eq!(number(cells[1]), admitted, "{policy}: admitted");
        assert_eq!(number(cells[2]), rejected, "{policy}: rejected");
        assert_eq!(number(cells[3]), peak, "{policy}: peak");
        assert_eq!(cells[4], format!("{keys} of 5"), "{policy}: keys rejected");
        match percentiles {
            None => assert_eq!(&cells[5..8], ["-", "-", "-"], "{policy}"),
            Some(want) => {
                // Shown to three or four significant digits: within 1% (or 1 us).
                for (cell, want) in cells[5..8].iter().zip(want) {
                    let got = ms(cell);
                    assert!(
                        got.abs_diff(want) <= (want / 100).max(1_000),
                        "{policy}: {cell} vs {want}"
                    );
                }
            }
        }
    }
    fs::remove_dir_all(dir).unwrap();
}

/// A span of length W holds times t with `end - W < t <= end`: two groups exactly W apart are
/// never in one span (and a fixed window admits both, a sliding log's closed interval only one).
#[test]
fn peaks_are_over_half_open_spans() {
    let dir = scratch("half-open");
    let path = dir.join("exact.csv");
    let trace: String =
        (0..20).map(|i| format!("{},k\n", if i < 10 { 0 } else { 1_000_000_000 })).collect();
    fs::write(&path, trace).unwrap();
    let run = ratewell(
        &[
            "compare",
            path.to_str().unwrap(),
            "--policy",
            "fixed-window limit=10 window=1s",
            "--policy",
            "sliding-log limit=10 window=1s",
        ],
        "",
    );
    assert_eq!(run.code, Some(0), "{}", run.err);
    let rows = rows(&run.out);
    assert_eq!(rows[0], ("fixed-window limit=10 window=1s".into(), 20, 10));
    assert_eq!(rows[1], ("sliding-log limit=10 window=1s".into(), 10, 10));
    fs::remove_dir_all(dir).unwrap();
}
