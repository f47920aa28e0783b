//! rate=10000r/s in Debian's real nginx, two workers, under wrk: the engine's own policy admits
//! nearly 10,000 a second, its `compat=nginx` what stock `limit_req` admits, side by side.
//! A test binary of its own, so that no other test's nginx shares the cores while wrk measures.

mod common;

use common::{Nginx, Wrk, wrk};

/// A location that serves a file under the zone `zone`.
fn location(path: &str, zone: &str) -> String {
    format!("location {path} {{ ratewell zone={zone}; try_files /index.html =404; }}")
}

#[test]
fn ten_thousand_a_second_beside_limit_req() {
    // rate=10000r/s without a burst. limit_req's whole milliseconds admit at most one request
    // in each (about 1,000 a second here, and fewer under load: nginx's time is cached once per
    // event loop); compat=nginx decides as it. The engine's own arithmetic admits a request as
    // soon as 100 us have passed since the last one's due time: 10,000 a second, less the time
    // from each due time to the next request decided, 1/λ on average for λ requests a second
    // decided (Poisson): 10,000 / (1 + 10,000/λ), 9,500 at λ = 190,000.
    //
    // So that the workers' time goes to deciding, wrk pipelines 64 requests a write on 8
    // connections, below the workers' priority, and rejections are not written to the error
    // log (an error log at `notice`, the zones' messages at `info`). Five rounds of the three
    // locations in turn, 2 s each: every round of the engine's policy is within the rate, and
    // the medians admit 0.97 of the bound for the λ each round got and, on 4 cores or more, at
    // least 9,500 a second. A stretch in which the machine's other work takes the cores lowers
    // every figure for tens of seconds: medians short are measured once more, which a limiter
    // admitting fewer fails as well.
    let nginx = Nginx::start(
        2,
        r#"ratewell_zone $arg_k zone=exact:1m policy="leaky-bucket rate=10000r/s burst=0 nodelay";
           ratewell_zone $arg_k zone=compat:1m rate=10000r/s;
           limit_req_zone $arg_k zone=stock:1m rate=10000r/s;
           limit_req_status 429; limit_req_log_level info; ratewell_log_level info;
           error_log error.log notice; keepalive_requests 1000000;"#,
        &[
            location("/exact", "exact"),
            location("/compat", "compat"),
            "location /stock { limit_req zone=stock; try_files /index.html =404; }".to_string(),
        ]
        .join("\n"),
    );
    let run = |path: &str| {
        let url = format!("http://127.0.0.1:{}{path}?k=hot", nginx.port);
        wrk(&url, 64, &["-t2", "-c8", "-d2s"])
    };
    let median = |runs: &[Wrk], f: fn(&Wrk) -> f64| {
        let mut v: Vec<f64> = runs.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let measure = || {
        let (mut exact, mut compat, mut stock) = (vec![], vec![], vec![]);
        for _ in 0..5 {
            exact.push(run("/exact"));
            compat.push(run("/compat"));
            stock.push(run("/stock"));
        }
        println!("exact {exact:?}\ncompat {compat:?}\nstock {stock:?}");
        for w in &exact {
            let admitted = w.admitted_per_second();
            assert!(admitted <= 10_000.0 * 1.01, "{admitted:.0} a second is over the rate");
        }
        // What each round admitted of what the model gives for the λ it got.
        let of_bound = median(&exact, |w| {
            w.admitted_per_second() / (10_000.0 / (1.0 + 10_000.0 / w.offered_per_second()))
        });
        let offered = median(&exact, Wrk::offered_per_second);
        assert!(offered > 20_000.0, "wrk offered only {offered:.0} a second");
        let compat = median(&compat, Wrk::admitted_per_second);
        let stock = median(&stock, Wrk::admitted_per_second);
        for (name, a) in [("compat", compat), ("stock", stock)] {
            assert!((300.0..=1_010.0).contains(&a), "{name}: {a:.0} a second");
        }
        let ratio = compat / stock;
        assert!((0.7..1.4).contains(&ratio), "compat / stock {ratio:.2}");
        let admitted = median(&exact, Wrk::admitted_per_second);
        println!(
            "median: {admitted:.0} a second admitted of {offered:.0} decided, {of_bound:.3} of the bound"
        );
        (admitted, offered, of_bound)
    };
    // The figure of 9,500 needs a core for each of nginx's two workers and wrk's two threads:
    // where they share fewer, the medians move with the machine's other work (9,496 to 9,624
    // on 2 cores, benches/results/nginx-10000rps-2026-12-08.txt), and only the bound is
    // asserted.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let short = |(admitted, _, of_bound): (f64, f64, f64)| {
        of_bound < 0.97 || (cores >= 4 && admitted < 9_500.0)
    };
    let mut medians = measure();
    if short(medians) {
        medians = measure();
    }
    let (admitted, offered, of_bound) = medians;
    assert!(of_bound >= 0.97, "{of_bound:.3} of 10,000 / (1 + 10,000/λ) admitted");
    if cores >= 4 {
        assert!(admitted >= 9_500.0, "{admitted:.0} a second admitted of {offered:.0} decided");
    } else {
        println!("{cores} cores: {admitted:.0} a second admitted, 9,500 asserted on 4 or more");
    }
}
