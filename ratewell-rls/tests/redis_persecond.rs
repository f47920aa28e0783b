//! `REDIS_PERSECOND=true` against live servers on loopback: limits whose unit is `second` are
//! decided on the per-second server (`REDIS_PERSECOND_URL`, `REDIS_PERSECOND_AUTH`), all others
//! on the main one (`REDIS_URL`, `REDIS_AUTH`), each server seeing only its own keys, and the
//! decisions of a request holding a per-second rule (3/second) and a per-hour rule (5/hour) on
//! two descriptors are the memory store's on the same requests (a burst inside one wall-clock
//! second). All or nothing holds across the two servers: a request over its hour limit charges
//! nothing on the per-second server, and one over its per-second limit charges nothing on the
//! hour. `REDIS_PERSECOND_TLS` reaches a per-second server over TLS with the `REDIS_TLS_*` files,
//! the main one staying plain, as in Go. A per-second server that is down fails the requests
//! that need it as `REDIS_FAILOVER` says (error, open, closed), while requests with only hour
//! descriptors still decide on the main server.

mod common;
#[path = "common/redis_servers.rs"]
mod redis_servers;

use common::*;
use ratewell_rls::proto::{Code, RateLimitRequest};
use redis_servers::*;

const CONFIG: &str = "
domain: ps
descriptors:
  - key: sec
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: hour
    rate_limit: {unit: hour, requests_per_unit: 5}
";

const MAIN_PW: &str = "main-pw";
const SECOND_PW: &str = "second-pw";

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

/// How many times a burst meant for one second is tried again (fresh keys) when a second's
/// boundary fell inside it.
const ATTEMPTS: usize = 10;

/// The main server and the per-second server, each asking for its own password.
fn servers() -> (Process, Process) {
    let main = redis_server(&["--requirepass", MAIN_PW], MAIN_PW);
    let second = redis_server(&["--requirepass", SECOND_PW], SECOND_PW);
    (main, second)
}

/// The environment for a main server at `main` and a per-second server at `second`, `extra`
/// on top.
fn env<'a>(
    main: &'a str,
    second: &'a str,
    extra: &[(&'a str, &'a str)],
) -> Vec<(&'a str, &'a str)> {
    let mut env = vec![
        ("BACKEND_TYPE", "redis"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", main),
        ("REDIS_AUTH", MAIN_PW),
        ("REDIS_TIMEOUT", "1s"),
        ("REDIS_PERSECOND", "true"),
        ("REDIS_PERSECOND_SOCKET_TYPE", "tcp"),
        ("REDIS_PERSECOND_URL", second),
        ("REDIS_PERSECOND_AUTH", SECOND_PW),
        ("REDIS_PERSECOND_TIMEOUT", "1s"),
    ];
    env.extend_from_slice(extra);
    env
}

/// The service on the two servers and the memory store's, sent the same requests.
struct Pair {
    memory: Service,
    redis: Service,
}

impl Pair {
    async fn start(env: &[(&str, &str)]) -> Pair {
        let redis = Service::start(CONFIG, env).await.expect("the service starts on two servers");
        Pair { memory: Service::memory(CONFIG).await, redis }
    }

    /// One request to both: the memory store's answer and the Redis one.
    async fn send(&mut self, request: &RateLimitRequest) -> (Answer, Answer) {
        (self.memory.send(request).await, self.redis.send(request).await)
    }

    /// `request` to both, which answer alike: the answer.
    async fn same(&mut self, request: &RateLimitRequest) -> Answer {
        let (m, r) = self.send(request).await;
        assert_eq!(r, m, "as the memory store: {request:?}");
        r
    }

    /// `requests` to both inside one wall-clock second (from just after its start): the
    /// answers, alike; `None` if a second's boundary fell inside after all (a busy machine).
    async fn in_one_second(&mut self, requests: &[RateLimitRequest]) -> Option<Vec<Answer>> {
        clear_of_boundary(1, 1).await;
        let second = epoch_second();
        let mut pairs = Vec::new();
        for r in requests {
            pairs.push(self.send(r).await);
        }
        if epoch_second() != second {
            return None;
        }
        let mut out = Vec::new();
        for (i, (m, r)) in pairs.into_iter().enumerate() {
            assert_eq!(r, m, "request {i} as the memory store: {:?}", requests[i]);
            out.push(r);
        }
        Some(out)
    }
}

fn both(v: &str) -> RateLimitRequest {
    request("ps", &[&[("sec", v)], &[("hour", v)]], 1)
}

fn sec(v: &str) -> RateLimitRequest {
    request("ps", &[&[("sec", v)]], 1)
}

fn hour(v: &str) -> RateLimitRequest {
    request("ps", &[&[("hour", v)]], 1)
}

/// The remaining of status `i` of an answer.
fn remaining(a: &Answer, i: usize) -> u32 {
    a.as_ref().expect("an answer").1[i].remaining
}

/// Every line of a `MONITOR` output that runs a script or touches a key of the domain.
fn lines_with<'a>(monitor: &'a str, text: &str) -> Vec<&'a str> {
    monitor.lines().filter(|l| l.contains(text)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_second_limits_decide_on_their_own_server() {
    let (main, second) = servers();
    let (m, s) = (format!("127.0.0.1:{}", main.port), format!("127.0.0.1:{}", second.port));
    let mut pair = Pair::start(&env(&m, &s, &[])).await;
    clear_of_boundary(3600, 30).await;
    let (on_main, on_second) = (main.monitor(), second.monitor());
    let mut done = None;
    for attempt in 0..ATTEMPTS {
        let v = format!("a{attempt}");
        let burst = [both(&v), both(&v), both(&v), both(&v), hour(&v), hour(&v), sec(&v)];
        if let Some(answers) = pair.in_one_second(&burst).await {
            done = Some((v, answers));
            break;
        }
    }
    let (v, answers) = done.expect("a burst inside one second");
    assert_eq!(codes(&answers), [OK, OK, OK, OVER, OK, OK, OVER]);
    // Over its per-second limit, the fourth charged nothing on the hour: 2 left, then 1, 0.
    assert_eq!(remaining(&answers[3], 1), 2);
    assert_eq!(remaining(&answers[4], 0), 1);

    // Which server saw which keys.
    let (sec_key, hour_key) = (format!("\"ps_sec_{v}_"), format!("\"ps_hour_{v}_"));
    poll("the per-second server ran the per-second keys", WAIT, || {
        on_second.text().contains(&sec_key)
    });
    poll("the main server ran the hour keys", WAIT, || on_main.text().contains(&hour_key));
    let (on_main, on_second) = (on_main.stop(), on_second.stop());
    assert!(lines_with(&on_main, "ps_sec_").is_empty(), "{on_main}");
    assert!(lines_with(&on_second, "ps_hour_").is_empty(), "{on_second}");
    let hour_keys = main.keys();
    assert!(hour_keys.iter().any(|k| k.starts_with(&hour_key[1..])), "{hour_keys:?}");
    assert!(hour_keys.iter().all(|k| k.starts_with("ps_hour_")), "{hour_keys:?}");
    assert!(second.keys().iter().all(|k| k.starts_with("ps_sec_")), "{:?}", second.keys());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_or_nothing_across_the_two_servers() {
    let (main, second) = servers();
    let (m, s) = (format!("127.0.0.1:{}", main.port), format!("127.0.0.1:{}", second.port));
    let mut pair = Pair::start(&env(&m, &s, &[])).await;
    clear_of_boundary(3600, 60).await;

    // Over its hour limit: nothing charged on the per-second server, whose 3 remain.
    let mut done = None;
    for attempt in 0..ATTEMPTS {
        let v = format!("h{attempt}");
        for _ in 0..5 {
            assert_eq!(code(&pair.same(&hour(&v)).await), OK);
        }
        let burst = [both(&v), sec(&v), sec(&v), sec(&v), sec(&v)];
        if let Some(answers) = pair.in_one_second(&burst).await {
            done = Some(answers);
            break;
        }
    }
    let answers = done.expect("a burst inside one second");
    assert_eq!(codes(&answers), [OVER, OK, OK, OK, OVER]);

    // Over its per-second limit: nothing charged on the hour, whose 5 - 3 remain.
    let mut done = None;
    for attempt in 0..ATTEMPTS {
        let v = format!("s{attempt}");
        let burst = [both(&v), both(&v), both(&v), both(&v)];
        if let Some(answers) = pair.in_one_second(&burst).await {
            done = Some((v, answers));
            break;
        }
    }
    let (v, answers) = done.expect("a burst inside one second");
    assert_eq!(codes(&answers), [OK, OK, OK, OVER]);
    let after = pair.same(&hour(&v)).await;
    assert_eq!(code(&after), OK);
    assert_eq!(remaining(&after, 0), 1, "5 - 3 admitted - this one: {after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_second_server_over_tls() {
    let pki = Pki::new();
    let main = redis_server(&["--requirepass", MAIN_PW], MAIN_PW);
    let second = pki.tls_server(&pki.server, true, &["--requirepass", SECOND_PW], SECOND_PW);
    let (m, s) = (format!("127.0.0.1:{}", main.port), format!("localhost:{}", second.port));
    let tls = pki.env(true, false);
    let mut extra: Vec<(&str, &str)> = tls.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    extra.push(("REDIS_PERSECOND_TLS", "true"));
    // The main server stays plain: REDIS_TLS is unset.
    let mut pair = Pair::start(&env(&m, &s, &extra)).await;
    clear_of_boundary(3600, 30).await;
    let on_second = second.monitor();
    let mut done = None;
    for attempt in 0..ATTEMPTS {
        let v = format!("t{attempt}");
        let burst = [both(&v), both(&v), both(&v), both(&v)];
        if let Some(answers) = pair.in_one_second(&burst).await {
            done = Some((v, answers));
            break;
        }
    }
    let (v, answers) = done.expect("a burst inside one second");
    assert_eq!(codes(&answers), [OK, OK, OK, OVER]);
    let sec_key = format!("\"ps_sec_{v}_");
    poll("the per-second server ran the per-second keys over TLS", WAIT, || {
        on_second.text().contains(&sec_key)
    });
    assert!(lines_with(&on_second.stop(), "ps_hour_").is_empty());
    let hour_keys = main.keys();
    assert!(hour_keys.iter().any(|k| k.starts_with(&format!("ps_hour_{v}_"))), "{hour_keys:?}");
    assert!(hour_keys.iter().all(|k| k.starts_with("ps_hour_")), "{hour_keys:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_second_server_that_is_down() {
    let (main, mut second) = servers();
    let (m, s) = (format!("127.0.0.1:{}", main.port), format!("127.0.0.1:{}", second.port));
    let mut error = Service::start(CONFIG, &env(&m, &s, &[])).await.expect("starts");
    let mut open =
        Service::start(CONFIG, &env(&m, &s, &[("REDIS_FAILOVER", "open")])).await.expect("starts");
    let mut closed = Service::start(CONFIG, &env(&m, &s, &[("REDIS_FAILOVER", "closed")]))
        .await
        .expect("starts");
    clear_of_boundary(3600, 30).await;
    // While it is up, each decides there.
    for (i, service) in [&mut error, &mut open, &mut closed].into_iter().enumerate() {
        assert_eq!(code(&service.send(&sec(&format!("up{i}"))).await), OK);
    }
    second.kill();

    for req in [sec("d1"), both("d2")] {
        assert_eq!(error.send(&req).await, Err(tonic::Code::Unavailable), "{req:?}");
        assert_eq!(code(&open.send(&req).await), OK, "{req:?}");
        assert_eq!(code(&closed.send(&req).await), OVER, "{req:?}");
    }
    // Only hour descriptors: decided on the main server, as the memory store decides them.
    let requests: Vec<RateLimitRequest> = (0..6).map(|_| hour("only")).collect();
    let mut got = Vec::new();
    for r in &requests {
        got.push(error.send(r).await);
    }
    let want = on_memory(CONFIG, &requests).await;
    assert_eq!(codes(&want), [OK, OK, OK, OK, OK, OVER]);
    assert_eq!(got, want);
    assert!(main.keys().iter().any(|k| k.starts_with("ps_hour_only_")), "{:?}", main.keys());
}
