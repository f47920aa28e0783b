//! The HTTP renderings, read back with a real Structured Fields parser (`sfv`): every algorithm,
//! at rates from 1/day to 10^6/s, states its real rate in `RateLimit-Policy`, and on a 429 never
//! gives a `Retry-After` earlier than the `RateLimit` field's `t`.

use proptest::prelude::*;
use ratewell::{Decision, Limiter, ManualClock, Policy};

const S: u128 = 1_000_000_000;

/// `(name, {param: integer})` of a one-item Structured Field List.
fn parse_item(field: &str) -> (String, Vec<(String, i64)>) {
    let list: sfv::List =
        sfv::Parser::new(field).parse().unwrap_or_else(|e| panic!("{field}: {e}"));
    assert_eq!(list.len(), 1, "{field}");
    let sfv::ListEntry::Item(item) = &list[0] else { panic!("{field}: an inner list") };
    let name = item.bare_item.as_string().expect("a string name").as_str().to_string();
    let params = item
        .params
        .iter()
        .map(|(k, v)| {
            let v = v.as_integer().unwrap_or_else(|| panic!("{field}: {k} is not an integer"));
            (k.as_str().to_string(), i64::from(v))
        })
        .collect();
    (name, params)
}

fn param(params: &[(String, i64)], key: &str) -> Option<i64> {
    params.iter().find(|(k, _)| k == key).map(|&(_, v)| v)
}

/// The policies of every algorithm at `count` per `period` (a grammar duration) and the long-run
/// rate each should state, `(count, period_ns)`, worked out here from the parameters.
fn policies(count: u32, period: &str, period_ns: u128) -> Vec<(String, (u128, u128))> {
    let rate = (u128::from(count), period_ns);
    let mut out = vec![
        (format!("token-bucket capacity={count} rate={count}/{period}"), rate),
        (format!("token-bucket capacity=1 rate={count}/{period}"), rate),
        (format!("token-bucket capacity={} rate={count}/{period}", count * 3 + 2), rate),
        (format!("token-bucket capacity={count} refill={count} every={period}"), rate),
        (format!("token-bucket capacity={} refill={count} every={period}", count + 5), rate),
        (format!("leaky-bucket rate={count}/{period} burst=4 nodelay"), rate),
        (format!("leaky-bucket rate={count}/{period} burst={count} delay=2"), rate),
        (format!("fixed-window limit={count} window={period}"), rate),
        (format!("fixed-window limit={count} window={period} align=first"), rate),
        (format!("sliding-window limit={count} window={period}"), rate),
    ];
    if count <= 65_536 {
        out.push((format!("sliding-log limit={count} window={period}"), rate));
    }
    // nginx's own arithmetic: N * 1000 * 10^9 / period milli-requests per second, rounded down.
    let milli = u128::from(count) * 1000 * S / period_ns;
    if milli > 0 {
        out.push((
            format!("leaky-bucket rate={count}/{period} burst=3 nodelay compat=nginx"),
            (milli, 1000 * S),
        ));
    }
    out
}

const RATES: &[(u32, &str, u128)] = &[
    (1, "1d", 86_400 * S),
    (1, "1h", 3_600 * S),
    (7, "3s", 3 * S),
    (5, "250ms", 250_000_000),
    (7, "1500ms", 1_500_000_000),
    (100, "1s", S),
    (3, "7ms", 7_000_000),
    (1_000, "1s", S),
    (1_000_000, "1s", S),
    (10, "1m", 60 * S),
];

#[test]
fn ratelimit_policy_states_the_real_rate() {
    for &(count, period, period_ns) in RATES {
        for (text, (n, p)) in policies(count, period, period_ns) {
            let Ok(policy) = text.parse::<Policy>() else { continue };
            let field = policy.ratelimit_policy_field("api");
            let (name, params) = parse_item(&field);
            assert_eq!(name, "api");
            let q = param(&params, "q").expect("q") as u128;
            let w = param(&params, "w").expect("w") as u128;
            assert!(w >= 1, "{text}: {field}");
            // q / w quota per second equals n per p ns: q * p == n * w * 10^9.
            assert_eq!(q * p, n * w * S, "{text}: {field} states {q}/{w}s, not {n} per {p} ns");
        }
    }
}

#[test]
fn ratelimit_policy_regressions() {
    let field = |t: &str| t.parse::<Policy>().unwrap().ratelimit_policy_field("p");
    // Faster than one per second: the quota scales with the window rounded to a second.
    assert_eq!(field("token-bucket capacity=1 rate=100/s"), r#""p";q=100;w=1"#);
    assert_eq!(field("fixed-window limit=5 window=250ms"), r#""p";q=20;w=1"#);
    // Policies already in whole seconds keep their own figures.
    assert_eq!(field("token-bucket capacity=100 rate=10/s"), r#""p";q=100;w=10"#);
    assert_eq!(field("fixed-window limit=1000 window=1h"), r#""p";q=1000;w=3600"#);
}

/// Every field of `d` parses, and on a 429 `Retry-After` is not earlier than `t`.
fn check_fields(text: &str, d: &Decision) {
    let field = d.ratelimit_field("api");
    let (_, params) = parse_item(&field);
    let r = param(&params, "r").expect("r");
    assert_eq!(r as u64, d.remaining().min(999_999_999_999_999), "{text}: {field}");
    let t = param(&params, "t");
    assert_eq!(t.is_none(), d.replenish_after_ns().is_none(), "{text}: {field}");
    if let Some(retry) = d.retry_after_header() {
        let retry: i64 = retry.parse().expect("Retry-After is delay-seconds");
        assert!(retry >= 1, "{text}: a real wait is at least 1 s");
        let t = t.unwrap_or_else(|| panic!("{text}: a 429 says when more quota comes"));
        assert!(retry >= t, "{text}: Retry-After {retry} earlier than t={t} ({field})");
    }
}

#[test]
fn retry_after_is_never_earlier_than_t() {
    // The reported case: the next token comes in 0.1 s, the bucket is full in 2 s.
    let limiter = Limiter::with_clock(
        &"token-bucket capacity=20 rate=10/s".parse::<Policy>().unwrap(),
        ManualClock::new(0),
    );
    assert!(limiter.check_n(20).is_admitted());
    let d = limiter.check();
    assert_eq!(d.retry_after_header().as_deref(), Some("1"));
    assert_eq!(d.ratelimit_field("api"), r#""api";r=0;t=1"#);

    for &(count, period, period_ns) in RATES {
        for (text, _) in policies(count, period, period_ns) {
            let Ok(policy) = text.parse::<Policy>() else { continue };
            let clock = ManualClock::new(12_345);
            let limiter = Limiter::with_clock(&policy, clock.clone());
            // Drain, then ask with costs of 1 and more, at a few instants.
            for cost in [policy.limit().min(u64::from(u32::MAX)) as u32, 1, 1, 2, 3] {
                let d = limiter.check_n(cost);
                check_fields(&text, &d);
            }
            for step in [1u64, 999, 1_000_000, 999_999_999, 1_000_000_001] {
                clock.advance(step);
                for cost in [1, 2, 5] {
                    check_fields(&text, &limiter.check_n(cost));
                    check_fields(&text, &limiter.peek_n(cost));
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn fields_parse_and_agree_at_any_instant(rate in 0..RATES.len(), which in 0..12usize,
                                             steps in prop::collection::vec((0..3_000_000_000u64, 1..=5u32), 1..40)) {
        let (count, period, period_ns) = RATES[rate];
        let list = policies(count, period, period_ns);
        let (text, _) = &list[which % list.len()];
        let Ok(policy) = text.parse::<Policy>() else { return Ok(()) };
        let clock = ManualClock::new(0);
        let limiter = Limiter::with_clock(&policy, clock.clone());
        for (gap, cost) in steps {
            clock.advance(gap);
            check_fields(text, &limiter.check_n(cost));
        }
    }
}

/// A layered decision renders one item per layer that decided, named by the layer, in order: a
/// List a real parser reads back, each item the layer's own decision rendered alone; and the
/// combined `Retry-After` is the largest wait, never earlier than the `t` of a layer that
/// rejected (a layer that admitted may well get more quota only later: it is not what the
/// client waits for).
#[test]
fn layered_fields_are_lists_of_one_item_per_layer() {
    use ratewell::{Absent, Layer, LayeredLimiter};
    let layers = vec![
        Layer::new("per \"ip\"", &"token-bucket capacity=3 rate=1/s".parse::<Policy>().unwrap()),
        Layer::new("key", &"fixed-window limit=2 window=1m".parse::<Policy>().unwrap()),
        Layer::new("route", &"sliding-log limit=1 window=10s".parse::<Policy>().unwrap()),
    ];
    let limiter = LayeredLimiter::with_clock(layers, ManualClock::new(0)).unwrap();
    let names = ["per \"ip\"", "key", "route"];
    let read = |field: &str| -> Vec<(String, Vec<(String, i64)>)> {
        let list: sfv::List =
            sfv::Parser::new(field).parse().unwrap_or_else(|e| panic!("{field}: {e}"));
        list.iter()
            .map(|entry| {
                let sfv::ListEntry::Item(item) = entry else { panic!("{field}: an inner list") };
                let name = item.bare_item.as_string().expect("a name").as_str().to_string();
                let params = item
                    .params
                    .iter()
                    .map(|(k, v)| (k.as_str().to_string(), i64::from(v.as_integer().unwrap())))
                    .collect();
                (name, params)
            })
            .collect()
    };
    let policy = read(&limiter.ratelimit_policy_field());
    assert_eq!(policy.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), names);
    for (i, (_, params)) in policy.iter().enumerate() {
        let alone = parse_item(&limiter.policy(i).unwrap().ratelimit_policy_field("x")).1;
        assert_eq!(params, &alone);
    }
    let mut rejected = 0;
    for step in 0..4 {
        let route: &dyn ratewell::LayerKey = if step == 3 { &Absent } else { &"/search" };
        let d = limiter.check(&[&"1.2.3.4", &"k", route], 1).unwrap();
        rejected += usize::from(!d.is_admitted());
        let items = read(&limiter.ratelimit_field(&d));
        let decided: Vec<usize> = (0..3).filter(|&i| d.layer(i).is_some()).collect();
        assert_eq!(items.len(), decided.len());
        for ((name, params), &i) in items.iter().zip(&decided) {
            assert_eq!(name, names[i]);
            assert_eq!(params, &parse_item(&d.layer(i).unwrap().ratelimit_field("x")).1);
            let rejecting = !d.layer(i).unwrap().is_admitted();
            if let (true, Some(retry), Some(t)) =
                (rejecting, d.retry_after_header(), param(params, "t"))
            {
                assert!(retry.parse::<i64>().unwrap() >= t, "Retry-After {retry} < t={t}");
            }
        }
    }
    assert_eq!(rejected, 2, "the route's second and third searches");
}
