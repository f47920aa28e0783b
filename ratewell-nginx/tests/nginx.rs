//! The module in Debian's real nginx, two workers, under concurrent clients: decisions exact
//! across the workers, the fields the engine's decision gives, zones that are all or nothing,
//! full zones that keep limited keys, reloads and restarts that keep state, a worker killed
//! mid-load, limit_req's grammar decided request for request as stock limit_req decides in the
//! same nginx, delays, dry runs, the variables, the counters (checked by promtool), and
//! configurations refused by `nginx -t` with the reason.

mod common;

use std::collections::HashSet;

use common::{Nginx, load, load_tolerant, test_config, with_status};
use ratewell::{Limiter, ManualClock, Policy};

/// A location that serves a file under `ratewell` of every zone named.
fn location(path: &str, zones: &[&str], extra: &str) -> String {
    let limits: String = zones.iter().map(|z| format!("ratewell zone={z}; ")).collect();
    format!("location {path} {{ {limits}{extra} try_files /index.html =404; }}")
}

/// The workers that answered.
fn workers_seen(responses: &[common::Response]) -> HashSet<String> {
    responses.iter().filter_map(|r| r.header("x-worker").map(str::to_string)).collect()
}

#[test]
fn one_key_admits_exactly_its_limit_across_the_workers() {
    // The engine's token bucket, and limit_req's `rate=1r/m burst=99` written as the engine's
    // nginx-compatible leaky bucket: 100 each, from 5,000 requests on 16 connections.
    for policy in ["token-bucket capacity=100 rate=1/h", "leaky-bucket rate=1r/m burst=99 nodelay"]
    {
        let nginx = Nginx::start(
            2,
            &format!(r#"ratewell_zone $arg_k zone=one:1m policy="{policy}";"#),
            &location("/", &["one"], ""),
        );
        let responses = load(nginx.port, 16, 5_000, |_| "/?k=hot".to_string());
        assert_eq!(with_status(&responses, 200), 100, "{policy}");
        assert_eq!(with_status(&responses, 429), 4_900, "{policy}");
        assert_eq!(workers_seen(&responses).len(), 2, "both workers decided");
    }
}

#[test]
fn every_key_is_exact_under_load() {
    // 300 keys, each asked 30 times, spread over 32 connections and both workers: 20 each.
    let nginx = Nginx::start(
        2,
        r#"ratewell_zone $arg_k zone=many:4m policy="fixed-window limit=20 window=1h";"#,
        &location("/", &["many"], ""),
    );
    let responses = load(nginx.port, 32, 9_000, |i| format!("/?k=key{}", i % 300));
    let mut admitted = vec![0; 300];
    for (i, r) in responses.iter().enumerate() {
        if r.status == 200 {
            admitted[i % 300] += 1;
        }
    }
    assert!(admitted.iter().all(|&n| n == 20), "{admitted:?}");
}

#[test]
fn the_fields_are_the_engines_decisions() {
    let spec = "token-bucket capacity=2 rate=1/h";
    let nginx = Nginx::start(
        2,
        &format!(r#"ratewell_zone $arg_k zone=api:1m policy="{spec}";"#),
        &[
            location("/", &["api"], ""),
            location("/quiet", &["api"], "ratewell_headers off; ratewell_status 503;"),
        ]
        .join("\n"),
    );
    // The same three decisions by the engine itself, at one instant: what the fields say
    // (their seconds are rounded up, so the milliseconds between requests do not show).
    let policy: Policy = spec.parse().unwrap();
    let engine = Limiter::with_clock(&policy, ManualClock::new(0));
    let mut client = nginx.client();
    for _ in 0..3 {
        let decision = engine.check();
        let r = client.get("/?k=a");
        assert_eq!(r.status, if decision.is_admitted() { 200 } else { 429 });
        assert_eq!(r.header("ratelimit-policy"), Some(&*policy.ratelimit_policy_field("api")));
        assert_eq!(r.header("ratelimit"), Some(&*decision.ratelimit_field("api")));
        assert_eq!((r.count("ratelimit"), r.count("ratelimit-policy")), (1, 1));
        let retry = decision.retry_after_ns().map(|ns| ns.div_ceil(1_000_000_000).to_string());
        assert_eq!(r.header("retry-after").map(str::to_string), retry);
    }
    let quiet = client.get("/quiet?k=a");
    assert_eq!(quiet.status, 503);
    assert!(quiet.header("retry-after").is_none() && quiet.header("ratelimit").is_none());
    // A request without the key is not limited (as limit_req): no fields either.
    let keyless = client.get("/");
    assert_eq!(keyless.status, 200);
    assert!(keyless.header("ratelimit").is_none());
}

#[test]
fn a_request_redirected_inside_nginx_is_decided_once() {
    // try_files sends the request on (with its arguments, so its key) to another location
    // after the limit's phase; that location names the same zone. An internal redirect clears
    // the modules' contexts, so the decision is found again on the request's pool: each request
    // is charged once, not twice.
    let nginx = Nginx::start(
        2,
        r#"ratewell_zone $arg_k zone=api:1m policy="token-bucket capacity=4 rate=1/h";"#,
        "location /r { ratewell zone=api; try_files /missing /next?$args; }
         location /next { ratewell zone=api; add_header x-left $ratewell_remaining always;
                          try_files /index.html =404; }",
    );
    let mut client = nginx.client();
    let seen: Vec<(u16, Option<String>)> = (0..6)
        .map(|_| {
            let r = client.get("/r?k=a");
            (r.status, r.header("x-left").map(str::to_string))
        })
        .collect();
    let left = |n: &str| Some(n.to_string());
    assert_eq!(
        seen,
        [
            (200, left("3")),
            (200, left("2")),
            (200, left("1")),
            (200, left("0")),
            (429, None),
            (429, None)
        ]
    );
}

#[test]
fn two_zones_in_one_location_are_all_or_nothing() {
    let nginx = Nginx::start(
        2,
        concat!(
            r#"ratewell_zone $arg_a zone=wide:1m policy="token-bucket capacity=100 rate=1/h";"#,
            "\n",
            r#"ratewell_zone $arg_b zone=narrow:1m policy="token-bucket capacity=60 rate=1/h";"#,
        ),
        &location("/", &["wide", "narrow"], ""),
    );
    // One pair of keys, 2,000 requests on 64 connections: the narrow zone admits 60; the
    // requests it rejects charge the wide zone nothing.
    let responses = load(nginx.port, 64, 2_000, |_| "/?a=x&b=y".to_string());
    assert_eq!(with_status(&responses, 200), 60);
    // So the wide zone's key has 40 left, for requests whose narrow key is new each time.
    let responses = load(nginx.port, 64, 2_000, |i| format!("/?a=x&b=fresh{i}"));
    assert_eq!(with_status(&responses, 200), 40);
    let rejected = responses.iter().find(|r| r.status == 429).unwrap();
    // The wide zone's: its key is out of tokens, one an hour (t).
    assert_eq!(rejected.header("ratelimit"), Some(r#""wide";r=0;t=3600"#));
}

#[test]
fn a_full_zone_keeps_a_limited_key_limited() {
    // The zone holds about a thousand keys; 3,000 others go through it after the victim's
    // one request a minute is spent. limit_req deletes the victim's state to make room and
    // admits it again (../shared/NGINX.md). Here every key holds a minute's limit, so none
    // can be reclaimed without loss: the zone refuses the new keys it has no room for.
    let spec = "leaky-bucket rate=1r/m nodelay";
    let nginx = Nginx::start(
        2,
        &format!(r#"ratewell_zone $arg_k zone=small:160k policy="{spec}";"#),
        &location("/", &["small"], ""),
    );
    let mut client = nginx.client();
    assert_eq!(client.get("/?k=victim").status, 200);
    assert_eq!(client.get("/?k=victim").status, 429);
    let others = load(nginx.port, 8, 3_000, |i| format!("/?k=other{i}"));
    let admitted = with_status(&others, 200);
    let (keys, _) = ratewell_nginx::capacity_for(&spec.parse().unwrap(), 160 << 10).unwrap();
    assert!((keys / 2..keys).contains(&admitted), "{admitted} of a zone of {keys} keys");
    assert_eq!(with_status(&others, 429), 3_000 - admitted);
    assert_eq!(client.get("/?k=victim").status, 429, "the victim is still limited");
    let refused = others.iter().find(|r| r.status == 429).unwrap();
    assert!(refused.header("retry-after").is_some_and(|s| s.parse::<u64>().unwrap() <= 60));
    assert!(nginx.error_log().contains(r#"ratewell zone "small" is full: a new key is refused"#));

    // With on_full=evict, the new keys pass, and the zone forgets the key whose loss grants
    // least: here, the one that would be free soonest, the victim.
    let nginx = Nginx::start(
        2,
        &format!(r#"ratewell_zone $arg_k zone=small:160k policy="{spec}" on_full=evict;"#),
        &location("/", &["small"], ""),
    );
    let mut client = nginx.client();
    assert_eq!(client.get("/?k=victim").status, 200);
    let others = load(nginx.port, 8, 3_000, |i| format!("/?k=other{i}"));
    assert_eq!(with_status(&others, 200), 3_000);
    assert_eq!(client.get("/?k=victim").status, 200);
}

#[test]
fn a_reload_keeps_the_zone_and_a_changed_policy_or_key_is_refused() {
    let zone = |policy: &str| format!(r#"ratewell_zone $arg_k zone=keep:1m policy="{policy}";"#);
    let server = location("/", &["keep"], "");
    let nginx = Nginx::start(2, &zone("token-bucket capacity=5 rate=1/h"), &server);
    let before = load(nginx.port, 4, 8, |_| "/?k=a".to_string());
    assert_eq!(with_status(&before, 200), 5);
    assert!(nginx.reload(2, &zone("token-bucket capacity=5 rate=1/h"), &server));
    let mut client = nginx.client();
    assert_eq!(client.get("/?k=a").status, 429, "limited before the reload, and after");
    assert_eq!(client.get("/?k=b").status, 200);
    // Another policy on the same zone: nginx keeps the old configuration, and says why.
    assert!(!nginx.reload(2, &zone("token-bucket capacity=9 rate=1/h"), &server));
    let log = nginx.error_log();
    assert!(
        log.contains(r#"ratewell_zone "keep": the shared table was made with policy"#),
        "{log}"
    );
    assert_eq!(nginx.client().get("/?k=a").status, 429);
    // Another key on the same zone: refused too (its keys would mean something else).
    let other_key =
        r#"ratewell_zone $arg_j zone=keep:1m policy="token-bucket capacity=5 rate=1/h";"#;
    assert!(!nginx.reload(2, other_key, &server));
    let log = nginx.error_log();
    assert!(log.contains(r#"uses the "$arg_j" key while previously it used the "$arg_k" key"#));
    assert_eq!(nginx.client().get("/?k=a").status, 429);
    // The refused reloads left the one table the running configuration decides on.
    assert_eq!(common::table_files(nginx.pid()), ["keep"]);
    // Another size: a new zone, empty, as nginx makes it; the old table is let go.
    let bigger = r#"ratewell_zone $arg_k zone=keep:2m policy="token-bucket capacity=5 rate=1/h";"#;
    assert!(nginx.reload(2, bigger, &server));
    assert_eq!(nginx.client().get("/?k=a").status, 200);
    assert_eq!(common::table_files(nginx.pid()), ["keep"]);
    // No zone: no table.
    assert!(nginx.reload(2, "", "location / { try_files /index.html =404; }"));
    assert!(common::table_files(nginx.pid()).is_empty());
}

#[test]
fn any_key_bytes_are_decided() {
    let nginx = Nginx::start(
        2,
        r#"ratewell_zone $http_x_key zone=bytes:1m policy="token-bucket capacity=1 rate=1/h";"#,
        &location("/", &["bytes"], ""),
    );
    let mut client = nginx.client();
    // Long, and of bytes a header may carry (obs-text above 0x7f included).
    for key in ["k".repeat(4_000), "\u{e9}t\u{e9} \t\u{1f600}!".to_string()] {
        let line = format!("X-Key: {key}\r\n");
        assert_eq!(client.get_with("/", &line).status, 200);
        assert_eq!(client.get_with("/", &line).status, 429);
    }
    assert!(!nginx.error_log().contains("[alert]"), "{}", nginx.error_log());
}

#[test]
fn keys_of_one_variable_and_of_several_are_decided_alike() {
    // A key of one variable is read directly; any other key through nginx's script engine.
    // Both give the same keys, and an empty key is not limited.
    let nginx = Nginx::start(
        2,
        concat!(
            r#"ratewell_zone $arg_k zone=one:1m policy="token-bucket capacity=1 rate=1/h";"#,
            "\n",
            r#"ratewell_zone ${arg_k} zone=braced:1m policy="token-bucket capacity=1 rate=1/h";"#,
            "\n",
            r#"ratewell_zone $arg_a:$arg_b zone=two:1m policy="token-bucket capacity=1 rate=1/h";"#,
        ),
        &[
            location("/one", &["one"], ""),
            location("/braced", &["braced"], ""),
            location("/two", &["two"], ""),
        ]
        .join("\n"),
    );
    let mut client = nginx.client();
    for path in ["/one", "/braced"] {
        let status = |c: &mut common::Client, q: &str| c.get(&format!("{path}{q}")).status;
        assert_eq!(
            [status(&mut client, "?k=x"), status(&mut client, "?k=x"), status(&mut client, "?k=y")],
            [200, 429, 200],
            "{path}"
        );
        assert_eq!([status(&mut client, ""), status(&mut client, "?k=")], [200, 200], "{path}");
    }
    let status = |c: &mut common::Client, q: &str| c.get(&format!("/two{q}")).status;
    let seen =
        ["?a=1&b=2", "?a=1&b=2", "?a=12", "?a=12", "?b=2", "?a=1"].map(|q| status(&mut client, q));
    assert_eq!(seen, [200, 429, 200, 429, 200, 200]);
}

#[test]
fn bad_configurations_fail_nginx_t_with_the_reason() {
    let ok = location("/", &["z"], "");
    let cases: &[(&str, &str, &str)] = &[
        (
            r#"ratewell_zone $arg_k zone=z:1m policy="token-bucket capacity=0 rate=1/s";"#,
            &ok,
            r#"invalid policy "token-bucket capacity=0 rate=1/s" of zone "z": "#,
        ),
        (
            r#"ratewell_zone $arg_k zone=z:1m policy="gcra burst=3";"#,
            &ok,
            r#"invalid policy "gcra burst=3" of zone "z""#,
        ),
        (
            r#"ratewell_zone $arg_k zone=z:1m;"#,
            &ok,
            r#""ratewell_zone" must have "policy" or "rate" parameter"#,
        ),
        (
            r#"ratewell_zone $arg_k policy="token-bucket capacity=1 rate=1/s";"#,
            &ok,
            r#""ratewell_zone" must have "zone" parameter"#,
        ),
        (
            r#"ratewell_zone $arg_k zone=z:1m rate=10/s;"#,
            &ok,
            r#"zone "z": invalid rate "10/s": expected N requests a second or a minute"#,
        ),
        (
            r#"ratewell_zone $arg_k zone=z:1m rate=10r/s policy="gcra rate=1/s burst=1";"#,
            &ok,
            r#"takes either "policy" or "rate", not both"#,
        ),
        (r#"ratewell_zone $arg_k zone=z:1m rate=10r/s sync;"#, &ok, "NGINX Plus's zone sync"),
        (r#"ratewell_zone $arg_k zone=z:1m rate=10r/s state=;"#, &ok, r#""state=" names no file"#),
        (
            r#"ratewell_zone $arg_k zone=z:1m rate=10r/s;"#,
            "location / { ratewell zone=z burst=5 nodelay delay=2; }",
            r#""nodelay" and "delay=" exclude each other"#,
        ),
        (
            r#"ratewell_zone $arg_k zone=z:1m rate=10r/s;"#,
            "location / { ratewell zone=z burst=many; }",
            r#"invalid burst value "burst=many""#,
        ),
        (
            r#"ratewell_zone $arg_k zone=z:1m rate=10r/s;"#,
            "location / { ratewell zone=z burst=300000; }",
            r#"burst=300000 is above the 268435 of ratewell zone "z""#,
        ),
        (
            r#"ratewell_zone $arg_k zone=z:1m policy="leaky-bucket rate=1r/s burst=3";"#,
            "location / { ratewell zone=z burst=5; }",
            r#"burst=5 is above the 3 of ratewell zone "z" (a location narrows"#,
        ),
        (
            r#"ratewell_zone $arg_k zone=z:1m policy="token-bucket capacity=1 rate=1/s" colour=red;"#,
            &ok,
            r#"invalid parameter "colour=red""#,
        ),
        (
            r#"ratewell_zone $arg_k zone=z:32k policy="token-bucket capacity=1 rate=1/s";"#,
            &ok,
            r#"zone "z" is too small"#,
        ),
        (
            r#"ratewell_zone $arg_k zone=z:140k policy="sliding-log limit=60000 window=1s";"#,
            &ok,
            r#"ratewell_zone "z" is too small for its policy"#,
        ),
        (
            r#"ratewell_zone $arg_k zone=z:1m policy="token-bucket capacity=1 rate=1/s";"#,
            &location("/", &["z"], "ratewell zone=z;"),
            "is duplicate",
        ),
        (
            r#"ratewell_zone $arg_k zone=z:1m policy="token-bucket capacity=1 rate=1/s";"#,
            "location / { ratewell zone=z burst=5; }",
            r#"burst, delay and nodelay apply to a leaky-bucket zone; ratewell zone "z" decides by "token-bucket capacity=1 rate=1/s""#,
        ),
        (
            r#"ratewell_zone $arg_k zone=z:1m policy="token-bucket capacity=1 rate=1/s";"#,
            "location / { ratewell zone=z; ratewell_status 200; }",
            "value must be between 400 and 599",
        ),
        ("", "location / { ratewell zone=nowhere; }", r#"unknown ratewell zone "nowhere" in "#),
    ];
    for (http, server, message) in cases {
        let (ok, said) = test_config(http, server);
        assert!(!ok, "nginx -t passed: {http} {server}");
        assert!(said.contains(message), "{http} {server}: {said}");
    }
    // And a good one passes, its policy quoted whole or as the value.
    for http in [
        r#"ratewell_zone $arg_k zone=z:1m policy="gcra rate=10/s burst=5" on_full=refuse;"#,
        r#"ratewell_zone $arg_k zone=z:1m "policy=gcra rate=10/s burst=5";"#,
        r#"ratewell_zone $arg_k zone=z:1m rate=30r/m state=ratewell-z.state;"#,
    ] {
        let (ok, said) = test_config(http, &ok);
        assert!(ok, "{http}: {said}");
    }
}

/// `add_header`s of the module's variables and of limit_req's `$limit_req_status`.
const VARIABLES: &str = "add_header X-Worker $pid always; add_header X-Status $limit_req_status always; \
    add_header X-Ratewell $ratewell_status always; \
    add_header X-Remaining $ratewell_remaining always; \
    add_header X-Retry $ratewell_retry_after always;";

#[test]
fn limit_req_grammar_converts_by_renaming() {
    // limit_req_zone / limit_req / limit_req_status / limit_req_log_level / limit_req_dry_run,
    // renamed: `rate=1r/m burst=99 nodelay`, 100 of 5,000.
    let nginx = Nginx::start(
        2,
        "ratewell_zone $arg_k zone=one:1m rate=1r/m;\n\
         ratewell_status 429; ratewell_log_level warn;",
        &[
            location("/", &[], &format!("ratewell zone=one burst=99 nodelay; {VARIABLES}")),
            location("/dry", &[], &format!("ratewell zone=one; ratewell_dry_run on; {VARIABLES}")),
        ]
        .join("\n"),
    );
    let responses = load(nginx.port, 16, 5_000, |_| "/?k=hot".to_string());
    assert_eq!(with_status(&responses, 200), 100);
    assert_eq!(with_status(&responses, 429), 4_900);
    assert_eq!(workers_seen(&responses).len(), 2, "both workers decided");
    let mut client = nginx.client();
    let fresh = client.get("/?k=fresh");
    let header = |r: &common::Response, n: &str| r.header(n).map(str::to_string);
    assert_eq!(fresh.header("x-status"), Some("PASSED"));
    assert_eq!(fresh.header("x-ratewell"), Some("PASSED"));
    assert_eq!(fresh.header("x-remaining"), Some("99"));
    assert_eq!(fresh.header("x-retry"), None, "not rejected: no wait");
    let rejected = client.get("/?k=hot");
    assert_eq!(rejected.status, 429);
    assert_eq!(rejected.header("x-status"), Some("REJECTED"));
    assert_eq!(rejected.header("x-ratewell"), Some("REJECTED"));
    assert_eq!(rejected.header("x-remaining"), Some("0"));
    // nginx's 1r/m is 16 milli-requests a second: a request leaks in 62.5 s.
    let retry: u64 = header(&rejected, "x-retry").unwrap().parse().unwrap();
    assert!((1..=63).contains(&retry), "{retry}");
    assert_eq!(header(&rejected, "retry-after"), header(&rejected, "x-retry"));
    // The dry run location (burst 0 on the same zone): passed, marked, counted, not charged.
    let dry = client.get("/dry?k=hot");
    assert_eq!(dry.status, 200);
    assert_eq!(dry.header("x-status"), Some("REJECTED_DRY_RUN"));
    assert_eq!(dry.header("x-ratewell"), Some("REJECTED_DRY_RUN"));
    assert!(dry.header("retry-after").is_none());
    assert!(nginx.error_log().contains(r#"limiting requests, dry run, by ratewell zone "one""#));
    assert_eq!(client.get("/?k=fresh").header("x-remaining"), Some("98"));
}

#[test]
fn delays_are_limit_reqs() {
    let nginx = Nginx::start(
        2,
        "ratewell_zone $arg_k zone=d:1m rate=10r/s;",
        &[
            location("/", &[], &format!("ratewell zone=d burst=5; {VARIABLES}")),
            location("/two", &[], "ratewell zone=d burst=5 delay=2;"),
            location("/dry", &[], "ratewell zone=d burst=5; ratewell_dry_run on;"),
            "location /metrics { ratewell_metrics; }".to_string(),
        ]
        .join("\n"),
    );
    // 6 requests at once, each on its own connection: the first passes, the 5 others wait
    // 100, 200, ... 500 ms (nginx's 10r/s: a request each 100 ms), none rejected.
    let timed = |target: &'static str| {
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..6)
                .map(|_| {
                    s.spawn(|| {
                        let start = std::time::Instant::now();
                        let r = nginx.client().get(target);
                        (r.status, r.header("x-ratewell").map(str::to_string), start.elapsed())
                    })
                })
                .collect();
            let mut out: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
            out.sort_by_key(|(_, _, t)| *t);
            out
        })
    };
    let out = timed("/?k=a");
    assert!(out.iter().all(|(status, _, _)| *status == 200), "{out:?}");
    let delayed = out.iter().filter(|(_, s, _)| s.as_deref() == Some("DELAYED")).count();
    assert_eq!(delayed, 5, "{out:?}");
    let slowest = out[5].2.as_millis();
    assert!((440..2_000).contains(&slowest), "the last waited {slowest} ms: {out:?}");
    // delay=2: 3 pass at once, 3 wait.
    let out = timed("/two?k=b");
    let quick = out.iter().filter(|(_, _, t)| t.as_millis() < 60).count();
    assert!(quick >= 3 && out[5].2.as_millis() >= 250, "{out:?}");
    // A dry run delays nothing.
    let out = timed("/dry?k=c");
    assert!(out[5].2.as_millis() < 90, "{out:?}");
    // A client that leaves while delayed is noticed: its request goes no further.
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", nginx.port)).unwrap();
    for _ in 0..5 {
        let _ = nginx.client().get("/?k=gone");
    }
    std::io::Write::write_all(&mut stream, b"GET /?k=gone HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(50));
    drop(stream);
    std::thread::sleep(std::time::Duration::from_millis(700));
    let log = nginx.error_log();
    assert!(log.contains("client prematurely closed connection"), "{log}");
    let metrics = String::from_utf8(nginx.client().get("/metrics").body).unwrap();
    let count = |outcome: &str| {
        let line = format!(r#"ratewell_requests_total{{zone="d",outcome="{outcome}"}} "#);
        metrics.lines().find_map(|l| l.strip_prefix(&line)).map(|n| n.parse::<u64>().unwrap())
    };
    // 5 + 3 + the leaving client's 5 then 1 (its 4 after the first waited on their own).
    assert_eq!(count("dry_run_delayed"), Some(5), "{metrics}");
    assert!(count("delayed").unwrap() >= 8 + 5, "{metrics}");
    assert_eq!(count("rejected"), Some(0), "{metrics}");
}

#[test]
fn compat_decides_request_for_request_as_stock_limit_req() {
    // The same zones, stock and ours, in one nginx; every request is sent to both, pipelined
    // on one connection so that nginx reads them at one instant. The gaps between requests
    // are a few milliseconds (a leak of at most a few tens of milli-requests) or long enough to
    // drain the bucket (300 ms and more, where 200 drain it): every decision is then hundreds
    // of milli-requests from its threshold or exactly on it (admitted either way), so the two
    // clocks (nginx's cached milliseconds, the engine's own) cannot fall on two sides of one.
    let nginx = Nginx::start(
        2,
        "limit_req_zone $arg_k zone=stock:1m rate=10r/s;\n\
         ratewell_zone $arg_k zone=ours:1m rate=10r/s;\n\
         limit_req_status 429; ratewell_status 429;",
        &[
            "location /stock/burst { limit_req zone=stock burst=2 nodelay; try_files /index.html =404; }",
            "location /ours/burst { ratewell zone=ours burst=2 nodelay; try_files /index.html =404; }",
            "location /stock/none { limit_req zone=stock; try_files /index.html =404; }",
            "location /ours/none { ratewell zone=ours; try_files /index.html =404; }",
        ]
        .join("\n"),
    );
    let mut client = nginx.client();
    let gaps_ms = [0u64, 0, 0, 0, 1, 2, 5, 300, 400, 0];
    let mut rng = 0x9e37_79b9_u64;
    for location in ["burst", "none"] {
        let (mut stock, mut ours) = (Vec::new(), Vec::new());
        for _ in 0..80 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let gap = gaps_ms[(rng % gaps_ms.len() as u64) as usize];
            std::thread::sleep(std::time::Duration::from_millis(gap));
            let targets = [
                format!("/stock/{location}?k=s{location}"),
                format!("/ours/{location}?k=o{location}"),
            ];
            let r = client.pipelined(&targets);
            stock.push(r[0].status);
            ours.push(r[1].status);
        }
        assert_eq!(ours, stock, "{location}");
        let admitted = stock.iter().filter(|&&s| s == 200).count();
        assert!((10..70).contains(&admitted), "{location}: a sequence that tells: {admitted}");
    }
}

#[test]
fn the_metrics_pass_promtool() {
    let nginx = Nginx::start(
        2,
        r#"ratewell_zone $arg_k zone=api:1m policy="token-bucket capacity=2 rate=1/h";
           ratewell_zone $arg_k zone=we\"ird:1m rate=1r/s;"#,
        &[location("/", &["api"], ""), "location /metrics { ratewell_metrics; }".to_string()]
            .join("\n"),
    );
    let responses = load(nginx.port, 4, 10, |i| format!("/?k=k{}", i % 2));
    assert_eq!(with_status(&responses, 200), 4);
    let metrics = nginx.client().get("/metrics");
    assert_eq!(metrics.header("content-type"), Some("text/plain; version=0.0.4"));
    let text = String::from_utf8(metrics.body).unwrap();
    for line in [
        r#"ratewell_requests_total{zone="api",outcome="admitted"} 4"#,
        r#"ratewell_requests_total{zone="api",outcome="rejected"} 6"#,
        r#"ratewell_zone_keys{zone="api"} 2"#,
        r#"ratewell_requests_total{zone="we\"ird",outcome="admitted"} 0"#,
    ] {
        assert!(text.lines().any(|l| l == line), "no {line} in\n{text}");
    }
    let promtool = std::env::var("PROMTOOL").unwrap_or_else(|_| "promtool".to_string());
    let mut child = std::process::Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("no promtool ({promtool}: {e}): apt-get install prometheus"));
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && said.trim().is_empty(), "promtool: {said}\n{text}");
}

#[test]
fn a_restart_with_state_keeps_a_limited_key_limited() {
    let dir = std::env::temp_dir().join(format!("ratewell-nginx-state-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let state = dir.join("api.state");
    let _ = std::fs::remove_file(&state);
    let http = format!(
        r#"ratewell_zone $arg_k zone=api:1m policy="token-bucket capacity=3 rate=1/h" state={};"#,
        state.display()
    );
    let server = location("/", &["api"], "");
    {
        let nginx = Nginx::start(2, &http, &server);
        let responses = load(nginx.port, 4, 10, |_| "/?k=a".to_string());
        assert_eq!(with_status(&responses, 200), 3);
        assert_eq!(nginx.client().get("/?k=b").status, 200);
        // Dropped: SIGQUIT, the workers finish, the master saves the zone and exits.
    }
    assert!(state.is_file(), "the master saved no state");
    let nginx = Nginx::start(2, &http, &server);
    let mut client = nginx.client();
    assert_eq!(client.get("/?k=a").status, 429, "limited before the restart, and after");
    let b: Vec<u16> = (0..3).map(|_| client.get("/?k=b").status).collect();
    assert_eq!(b, [200, 200, 429], "b had used one of its three");
    assert!(nginx.error_log().contains(r#"ratewell_zone "api": 2 keys restored from"#));
    drop(nginx);
    // A state that cannot be read starts the zone empty, and says so; nginx runs.
    std::fs::write(&state, b"not a snapshot").unwrap();
    let nginx = Nginx::start(2, &http, &server);
    assert_eq!(nginx.client().get("/?k=a").status, 200);
    assert!(nginx.error_log().contains(r#"ratewell_zone "api": not restored, it starts empty"#));
    drop(nginx);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_worker_killed_mid_load_leaves_every_count_exact() {
    // 300 keys at 20 an hour, each asked 40 times over 32 connections; a third of the way in,
    // one worker is killed with SIGKILL (perhaps inside a decision, holding a lock). The other
    // goes on deciding, the master starts a new one, and every key's count stays exact: a key
    // none of whose requests was lost admitted exactly 20; one with lost requests (their
    // connections broke, decided or not) at most 20 and at least 20 less the lost; and every
    // key is out of its 20 afterwards.
    let nginx = Nginx::start(
        2,
        r#"ratewell_zone $arg_k zone=many:4m policy="token-bucket capacity=20 rate=1/h";"#,
        &location("/", &["many"], ""),
    );
    let requests = 12_000;
    let victim = nginx.workers()[0];
    let responses = load_tolerant(
        nginx.port,
        32,
        requests,
        |i| format!("/?k=key{}", i % 300),
        |done| {
            while done.load(std::sync::atomic::Ordering::Relaxed) < requests / 3 {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            common::signal(victim, "KILL");
        },
    );
    let (mut admitted, mut lost) = (vec![0; 300], vec![0; 300]);
    for (i, r) in responses.iter().enumerate() {
        match r {
            Some(r) if r.status == 200 => admitted[i % 300] += 1,
            Some(r) => assert_eq!(r.status, 429),
            None => lost[i % 300] += 1,
        }
    }
    let lost_keys = lost.iter().filter(|&&n| n > 0).count();
    assert!(lost_keys < 300, "every key lost a request");
    for k in 0..300 {
        assert!(admitted[k] <= 20, "key{k}: {} admitted", admitted[k]);
        assert!(admitted[k] + lost[k] >= 20, "key{k}: {} admitted, {} lost", admitted[k], lost[k]);
    }
    assert!(nginx.error_log().contains("exited on signal 9"));
    assert!(!nginx.workers().contains(&victim));
    let after = load(nginx.port, 8, 300, |i| format!("/?k=key{i}"));
    assert_eq!(with_status(&after, 429), 300, "every key is out of its 20");
    println!("{lost_keys} keys lost requests");
}

#[test]
fn a_location_without_headers_decides_as_one_with_them() {
    // A location of one zone that sends no fields takes a shorter path in the module. Two
    // zones alike, one behind a location with the fields and one behind a location without,
    // given the same requests: the same statuses and variables, a dry run's too, a request
    // without the key unlimited, and a redirected request charged once.
    for (policy, extra) in [
        ("token-bucket capacity=3 rate=1/h", ""),
        ("fixed-window limit=2 window=1h", "ratewell_dry_run on;"),
    ] {
        let zones = format!(
            r#"ratewell_zone $arg_k zone=on:1m policy="{policy}";
               ratewell_zone $arg_k zone=off:1m policy="{policy}";"#
        );
        let server = [
            location("/on", &["on"], &format!("{extra} {VARIABLES}")),
            location("/off", &["off"], &format!("{extra} ratewell_headers off; {VARIABLES}")),
            format!(
                "location /r {{ ratewell zone=off; ratewell_headers off; {extra} \
                 try_files /missing /off?$args; }}"
            ),
        ]
        .join("\n");
        let nginx = Nginx::start(1, &zones, &server);
        let mut client = nginx.client();
        let seen = |r: &common::Response| {
            let header = |name| r.header(name).map(str::to_string);
            let variables = ["x-status", "x-ratewell", "x-remaining", "x-retry"].map(header);
            (r.status, variables)
        };
        for i in 0..7 {
            let k = if i == 4 { "" } else { "a" };
            let on = client.get(&format!("/on?k={k}"));
            let off = client.get(&format!("/off?k={k}"));
            assert_eq!(seen(&on), seen(&off), "{policy} {extra}: request {i}");
            assert!(off.header("ratelimit").is_none() && off.header("retry-after").is_none());
        }
        // A redirect to a location of the same zone: charged once, as a direct request.
        let direct = client.get("/on?k=b");
        let redirected = client.get("/r?k=b");
        assert_eq!(seen(&direct), seen(&redirected), "{policy} {extra}");
    }
}

#[test]
fn the_drop_in_build_takes_limit_reqs_own_configuration() {
    // A configuration written for limit_req, unchanged: only the drop-in build is loaded. If
    // nginx gave the directives to the built-in limit_req (the module order), the variables
    // below would be empty and the victim admitted again after the others.
    let http = "limit_req_zone $arg_k zone=small:160k rate=1r/m;\n\
                limit_req_zone $arg_k zone=wide:1m rate=1r/m;\n\
                limit_req_log_level warn; limit_req_dry_run off;";
    let server = format!(
        "location / {{ limit_req zone=small; {VARIABLES} try_files /index.html =404; }}\n\
         location /s {{ limit_req zone=wide burst=2 nodelay; limit_req_status 429; \
         try_files /index.html =404; }}"
    );
    let nginx = Nginx::start_loading(&common::drop_in(), 2, http, &server);
    let mut client = nginx.client();
    let first = client.get("/?k=victim");
    assert_eq!(first.status, 200);
    assert_eq!(first.header("x-ratewell"), Some("PASSED"), "ratewell decided it");
    assert_eq!(first.header("x-status"), Some("PASSED"));
    // limit_req's default status, and no fields, as limit_req answers.
    let second = client.get("/?k=victim");
    assert_eq!((second.status, second.header("x-ratewell")), (503, Some("REJECTED")));
    assert!(second.header("ratelimit").is_none() && second.header("retry-after").is_none());
    // The zone full of minute-long limits keeps the victim's (limit_req would forget it).
    let others = load(nginx.port, 8, 3_000, |i| format!("/?k=other{i}"));
    assert!(with_status(&others, 503) > 0, "the zone filled");
    assert_eq!(client.get("/?k=victim").status, 503, "the victim is still limited");
    assert!(nginx.error_log().contains(r#"ratewell zone "small" is full"#));
    // limit_req's burst and nodelay, and limit_req_status, on another location.
    let statuses: Vec<u16> = (0..4).map(|_| client.get("/s?k=burst").status).collect();
    assert_eq!(statuses, [200, 200, 200, 429]);

    // Both builds at once: refused, with the reason.
    let (ok, said) = common::test_config_loading(
        &[common::module(), &common::drop_in()],
        "limit_req_zone $arg_k zone=z:1m rate=1r/s;",
        "location / { limit_req zone=z; }",
    );
    assert!(!ok, "{said}");
    assert!(said.contains("ratewell_status"), "{said}");
}

#[test]
fn a_binary_upgrade_hands_the_tables_to_the_new_binary() {
    // nginx's documented upgrade: USR2 (the master starts the new binary, which inherits the
    // listening sockets and, here, the zones' tables), WINCH (the old workers finish), QUIT
    // (the old master saves and exits). One key at 100 an hour, asked 160 times across the
    // three phases: exactly 100 admitted, the two generations deciding on one table.
    let dir = std::env::temp_dir().join(format!("ratewell-nginx-upgrade-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let state = dir.join("kept.state");
    let _ = std::fs::remove_file(&state);
    let zones = |changed: &str, gone: bool| {
        let mut http = format!(
            "ratewell_zone $arg_k zone=kept:1m policy=\"token-bucket capacity=100 rate=1/h\" \
             state={};\n\
             ratewell_zone $arg_k zone=changed:1m policy=\"token-bucket capacity={changed} \
             rate=1/h\";\n",
            state.display()
        );
        if !gone {
            http +=
                "ratewell_zone $arg_k zone=gone:1m policy=\"token-bucket capacity=3 rate=1/h\";";
        }
        http
    };
    let server = |gone: bool| {
        let mut server = location("/kept", &["kept"], "") + &location("/changed", &["changed"], "");
        if !gone {
            server += &location("/gone", &["gone"], "");
        }
        server
    };
    let nginx = common::Daemon::start(2, &zones("3", false), &server(false));
    let old = nginx.master().unwrap();
    let old_workers = common::children(old);
    let admitted = |n: usize| {
        // On four connections, which either generation's workers may take.
        let responses = load(nginx.port, 4, n, |_| "/kept?k=a".to_string());
        (with_status(&responses, 200), workers_seen(&responses))
    };
    assert_eq!(admitted(60).0, 60);
    let mut client = nginx.client();
    assert_eq!(client.get("/changed?k=a").status, 200);
    assert_eq!(client.get("/gone?k=a").status, 200);
    drop(client);

    // The new binary reads a configuration where one zone's policy changed and one is gone.
    nginx.configure(2, &zones("5", true), &server(true));
    common::signal(old, "USR2");
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let new = loop {
        if let Some(new) = nginx.master().filter(|&m| m != old && common::children(m).len() == 2) {
            break new;
        }
        assert!(std::time::Instant::now() < until, "no new binary: {}", nginx.error_log());
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(nginx.old_master(), Some(old));
    let new_workers = common::children(new);
    // Both generations accept: 20 more admitted, whichever decides.
    let (n, seen) = admitted(20);
    assert_eq!(n, 20);
    eprintln!("during the overlap: {seen:?}; old {old_workers:?}, new {new_workers:?}");

    common::signal(old, "WINCH");
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    // The old master's children: its workers, and the new master.
    while common::children(old) != [new] {
        assert!(std::time::Instant::now() < until, "the old workers stay");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // Only the new binary's workers now: 30 more asked, 20 left to admit of the 100.
    let (n, seen) = admitted(30);
    assert_eq!(n, 20, "the new binary decides on the old one's table");
    assert!(seen.iter().all(|w| new_workers.iter().any(|p| p.to_string() == *w)), "{seen:?}");

    common::signal(old, "QUIT");
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while common::alive(old) || !nginx.error_log().contains(r#""kept": 1 keys saved"#) {
        assert!(std::time::Instant::now() < until, "the old master stays: {}", nginx.error_log());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(admitted(50).0, 0, "100 admitted of 160");
    let log = nginx.error_log();
    assert!(log.contains(r#"ratewell_zone "kept": the running nginx's table is taken over"#));
    assert!(log.contains(
        r#"ratewell_zone "changed": the running nginx's table is not taken over: its policy differs"#
    ));
    // The changed zone starts anew, at its new policy.
    let mut client = nginx.client();
    let changed: Vec<u16> = (0..6).map(|_| client.get("/changed?k=a").status).collect();
    assert_eq!(changed, [200, 200, 200, 200, 200, 429]);
    // The new master holds the tables of its two zones; the gone zone's was closed.
    assert_eq!(common::table_files(new), ["changed", "kept"]);
    drop(client);
    drop(nginx);
    let _ = std::fs::remove_dir_all(&dir);
}
