//! Failure on a real server: SIGKILL mid-run, SIGSTOP, `DEBUG SLEEP`, `SCRIPT FLUSH`. Every
//! decision returns within the timeout (plus 1 ms) with the configured failover's outcome, none
//! waits behind another, decisions return to the server within the backoff after a restart, and
//! nothing panics or leaks a task.
//!
//! The timing promises are checked on the test's own clock, where a busy machine can delay any
//! wake-up (the timer's, the test's) by milliseconds. A scenario is therefore run in up to
//! [`TRIES`] tries, each on a new server, and passes when one try keeps every timing promise;
//! every other check (the outcomes, the sources, the counts) holds in every try. A limiter that
//! does not keep a promise breaks it in every try, and the test fails with each try's account.

mod common;

use std::time::{Duration, Instant};

use common::{PATHS, Path, Server};
use ratewell::Outcome;
use ratewell_redis::{Failover, FailoverReason, RedisLimiter, Source};

const TIMEOUT: Duration = Duration::from_millis(20);
const BACKOFF_MAX: Duration = Duration::from_millis(100);
/// What the test allows above the timeout for a decision to come back: the 1 ms.
const SLACK: Duration = Duration::from_millis(1);
/// "Does not wait at all": under 2 ms (this bound is the longest time that is).
const AT_ONCE: Duration = Duration::from_nanos(1_999_999);
/// Tries of a scenario before a broken timing promise fails the test (see the module's text).
const TRIES: usize = 5;
/// A decision not back within this has hung; a wait for something the test expects ends
/// within it, however busy the machine.
const HANG: Duration = Duration::from_secs(20);

/// The timing promises one try broke (empty: it kept them all).
#[derive(Debug, Default)]
struct Late(Vec<String>);

impl Late {
    /// Note that `took` went past `bound`.
    fn check(&mut self, took: Duration, bound: Duration, what: impl FnOnce() -> String) {
        if took > bound {
            self.0.push(format!("{}: {took:?} > {bound:?}", what()));
        }
    }
}

/// Run `scenario` until a try keeps every timing promise; panics, with each try's account,
/// when none of [`TRIES`] does.
async fn in_tries<F: Future<Output = Late>>(what: &str, mut scenario: impl FnMut() -> F) {
    let mut broken = Vec::new();
    for _ in 0..TRIES {
        let late = scenario().await;
        if late.0.is_empty() {
            return;
        }
        eprintln!("{what}: a try broke a timing promise: {late:?}");
        broken.push(late);
    }
    panic!("{what}: every try broke a timing promise: {broken:#?}");
}

async fn limiter(server: &Server, failover: Failover, policy: &str) -> RedisLimiter {
    RedisLimiter::builder(&server.url())
        .layer("l", &policy.parse().unwrap())
        .timeout(TIMEOUT)
        .backoff(Duration::from_millis(5), BACKOFF_MAX)
        .failover(failover)
        .build()
        .await
        .expect("a limiter")
}

/// Decide once, timed.
async fn timed(l: &RedisLimiter, key: &str) -> (ratewell_redis::Verdict, Duration) {
    let start = Instant::now();
    let v = tokio::time::timeout(HANG, l.check(key, 1))
        .await
        .unwrap_or_else(|_| panic!("a decision not back within {HANG:?}"));
    (v, start.elapsed())
}

/// The timing tests run one at a time: on a two-core machine, tests running beside them (each
/// with its runtime's threads) delay the timer's wake-ups by milliseconds.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().await
}

fn alive_tasks() -> usize {
    tokio::runtime::Handle::current().metrics().num_alive_tasks()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_fails_over_at_once_and_restart_comes_back_within_the_backoff() {
    for path in PATHS {
        in_tries(&format!("{path:?}"), || {
            sigkill_fails_over_at_once_and_restart_comes_back_within_the_backoff_on(path)
        })
        .await;
    }
}

async fn sigkill_fails_over_at_once_and_restart_comes_back_within_the_backoff_on(
    path: Path,
) -> Late {
    let _serial = serial().await;
    let mut late = Late::default();
    let mut server = Server::start_on(path, &[]);
    for (failover, expect) in [
        (Failover::Closed, Outcome::Rejected),
        (Failover::Open, Outcome::Admitted),
        (Failover::Local { instances: 4 }, Outcome::Admitted),
    ] {
        let l = limiter(&server, failover, "fixed-window limit=1000 window=1h align=first").await;
        for _ in 0..20 {
            let (v, _) = timed(&l, "k").await;
            assert_eq!(v.source(), Source::Server);
        }
        server.kill();
        let mut slowest = Duration::ZERO;
        for i in 0..200 {
            let (v, took) = timed(&l, "k").await;
            slowest = slowest.max(took);
            assert!(matches!(v.source(), Source::Failover(_)), "{failover:?}, decision {i}");
            assert_eq!(v.decision().outcome(), expect, "{failover:?}");
            if failover == Failover::Closed {
                // Rejected with the reconnect backoff as the retry time.
                let retry = v.decision().retry_after().unwrap();
                assert!(retry > Duration::ZERO && retry <= BACKOFF_MAX, "{retry:?}");
            }
        }
        late.check(slowest, TIMEOUT + SLACK, || format!("{failover:?}: the slowest decision"));
        let m = l.metrics();
        assert!(m.failover_down + m.failover_timeout >= 200, "{m:?}");
        // Local failover: 1000 / 4 instances in process, so after 250 the local limiter rejects.
        if let Failover::Local { .. } = failover {
            let mut n = 0;
            for _ in 0..300 {
                if l.check("fresh-key", 1).await.is_admitted() {
                    n += 1;
                }
            }
            assert_eq!(n, 250, "the local failover decides at the limit divided by 4");
        }
        server.restart();
        // From the moment the new server answers PING (restart waits for it).
        let restarted = Instant::now();
        let back = loop {
            let (v, took) = timed(&l, "k").await;
            late.check(took, TIMEOUT + SLACK, || format!("{failover:?}: while reconnecting"));
            if v.source() == Source::Server {
                break restarted.elapsed();
            }
            assert!(restarted.elapsed() < HANG, "{failover:?}: not back on the server");
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        // The next probe comes at most one backoff (at most BACKOFF_MAX) later; the slack is
        // the probe's round trip and the decision after it.
        late.check(back, BACKOFF_MAX + TIMEOUT, || format!("{failover:?}: back on the server"));
        assert!(l.metrics().reconnects >= 1);
    }
    late
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_caught_in_a_sigstop_returns_within_the_timeout_for_each_decision() {
    for path in PATHS {
        in_tries(&format!("{path:?}"), || {
            a_batch_caught_in_a_sigstop_returns_within_the_timeout_for_each_decision_on(path)
        })
        .await;
    }
}

async fn a_batch_caught_in_a_sigstop_returns_within_the_timeout_for_each_decision_on(
    path: Path,
) -> Late {
    let _serial = serial().await;
    let mut late = Late::default();
    let server = Server::start_on(path, &[]);
    let l = limiter(&server, Failover::Open, "token-bucket capacity=100 rate=100/s").await;
    assert_eq!(timed(&l, "k").await.0.source(), Source::Server);
    let calls = l.metrics().calls;
    // `stop` returns once the process is stopped.
    server.stop();
    // 64 decisions at once: the first is sent alone, the other 63 queue behind it for one batch.
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let l = l.clone();
            tokio::spawn(async move { timed(&l, &format!("k{i}")).await })
        })
        .collect();
    for t in tasks {
        let (v, took) = t.await.expect("no panic");
        late.check(took, TIMEOUT + SLACK, || "a decision".into());
        assert!(matches!(v.source(), Source::Failover(_)), "{:?}", v.source());
        assert!(v.is_admitted(), "fail-open");
    }
    // Only the first call reached the stopped server: the queued decisions were not sent to a
    // connection already down.
    assert_eq!(l.metrics().calls, calls + 1);
    server.resume();
    late
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_times_out_once_and_nothing_piles_up() {
    for path in PATHS {
        in_tries(&format!("{path:?}"), || {
            a_stopped_server_times_out_once_and_nothing_piles_up_on(path)
        })
        .await;
    }
}

async fn a_stopped_server_times_out_once_and_nothing_piles_up_on(path: Path) -> Late {
    let _serial = serial().await;
    let mut late = Late::default();
    let server = Server::start_on(path, &[]);
    let baseline = alive_tasks();
    let l = limiter(&server, Failover::Closed, "token-bucket capacity=100 rate=100/s").await;
    assert_eq!(timed(&l, "k").await.0.source(), Source::Server);
    // `stop` returns once the process is stopped.
    server.stop();
    // A thousand decisions arriving over 100 ms, ten a millisecond: each returns within the
    // timeout; those sent before the first timeout wait for it, the rest see the connection
    // down and do not wait at all.
    let mut tasks = Vec::new();
    for ms in 0..100 {
        for i in 0..10 {
            let l = l.clone();
            tasks.push(tokio::spawn(async move { timed(&l, &format!("k{ms}-{i}")).await }));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let mut reasons = (0, 0);
    for t in tasks {
        let (v, took) = t.await.expect("no panic");
        late.check(took, TIMEOUT + SLACK, || "a decision".into());
        match v.source() {
            Source::Failover(FailoverReason::Timeout) => reasons.0 += 1,
            Source::Failover(FailoverReason::Down) => reasons.1 += 1,
            other => panic!("{other:?} from a stopped server"),
        }
    }
    // Only the decisions sent within the first timeout waited for it: ten a millisecond of the
    // decisions' sending, so on the test's clock, a timing promise.
    assert!(reasons.0 >= 1, "{reasons:?}");
    if reasons.0 > 10 * (TIMEOUT.as_millis() as usize + 2) {
        late.0.push(format!("more decisions waited for the first timeout: {reasons:?}"));
    }
    assert_eq!(reasons.0 + reasons.1, 1000);
    // While it stays stopped, a decision does not wait at all.
    let (v, took) = timed(&l, "k").await;
    assert_eq!(v.source(), Source::Failover(FailoverReason::Down));
    late.check(took, AT_ONCE, || "a decision on a connection down".into());
    server.resume();
    let resumed = Instant::now();
    while timed(&l, "k").await.0.source() != Source::Server {
        assert!(resumed.elapsed() < HANG, "not back on the server after SIGCONT");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    late.check(resumed.elapsed(), BACKOFF_MAX * 3, || "back on the server after SIGCONT".into());
    drop(l);
    // The reconnect task ends with its limiter.
    let deadline = Instant::now() + HANG;
    while alive_tasks() > baseline {
        assert!(Instant::now() < deadline, "{} tasks alive, {baseline} before", alive_tasks());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    late
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_sleep_times_out_then_decisions_return_to_the_server() {
    for path in PATHS {
        in_tries(&format!("{path:?}"), || {
            debug_sleep_times_out_then_decisions_return_to_the_server_on(path)
        })
        .await;
    }
}

async fn debug_sleep_times_out_then_decisions_return_to_the_server_on(path: Path) -> Late {
    let _serial = serial().await;
    let mut late = Late::default();
    let server = Server::start_on(path, &[]);
    let l = limiter(&server, Failover::Open, "sliding-window limit=10 window=1s").await;
    assert_eq!(timed(&l, "k").await.0.source(), Source::Server);
    let port = server.port.to_string();
    let sleeper = std::thread::spawn(move || {
        std::process::Command::new("redis-cli")
            .args(["-p", &port, "DEBUG", "SLEEP", "0.3"])
            .output()
            .expect("redis-cli")
    });
    // Decisions from now on, until one has timed out on the sleeping server (`redis-cli` starts
    // the sleep in its own time), then 49 more: each on a key of its own, so that those the
    // server decides before its sleep stay under the limit.
    let timed_out = Source::Failover(FailoverReason::Timeout);
    let mut sources = Vec::new();
    let mut after = None;
    while after.is_none_or(|first| sources.len() < first + 50) {
        let (v, took) = timed(&l, &format!("k{}", sources.len())).await;
        late.check(took, TIMEOUT + SLACK, || "a decision".into());
        assert!(v.is_admitted(), "fail-open admits");
        sources.push(v.source());
        if after.is_none() && v.source() == timed_out {
            after = Some(sources.len() - 1);
        }
        if after.is_none() && sleeper.is_finished() {
            // The sleep came and went between two decisions (the test was not running then).
            late.0
                .push(format!("the server's sleep ended before a decision timed out: {sources:?}"));
            break;
        }
    }
    sleeper.join().unwrap();
    let woke = Instant::now();
    while timed(&l, "k").await.0.source() != Source::Server {
        assert!(woke.elapsed() < HANG, "not back on the server after DEBUG SLEEP");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    late.check(woke.elapsed(), BACKOFF_MAX * 3, || "back on the server after DEBUG SLEEP".into());
    late
}

/// How many times the server ran `cmd` (`INFO commandstats`; 0 if never).
fn calls_of(server: &Server, cmd: &str) -> u64 {
    let info = server.cli(&["INFO", "commandstats"]).unwrap_or_default();
    let prefix = format!("cmdstat_{cmd}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// Three admitted, the code flushed by `flush`, then the fourth and fifth decided by the server
/// (the code loaded again on its first call), and the sixth rejected: the state survived.
async fn reloads_after(server: &Server, flush: &[&str]) -> RedisLimiter {
    let l = limiter(server, Failover::Open, "fixed-window limit=5 window=1h align=first").await;
    assert_eq!(l.metrics().script_loads, 1);
    for _ in 0..3 {
        assert!(l.check("k", 1).await.is_admitted());
    }
    assert_eq!(server.cli(flush).unwrap().trim(), "OK");
    let v = l.check("k", 1).await;
    assert_eq!(v.source(), Source::Server);
    assert_eq!(v.decision().remaining(), 1);
    assert_eq!(l.metrics().script_loads, 2);
    assert!(l.check("k", 1).await.is_admitted());
    let v = l.check("k", 1).await;
    assert_eq!((v.source(), v.is_admitted()), (Source::Server, false));
    l
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_library_is_reloaded_transparently() {
    let _serial = serial().await;
    let server = Server::start();
    reloads_after(&server, &["FUNCTION", "FLUSH"]).await;
    // Every decision went as FCALL (7, one of them refused for the missing library); none as a
    // script.
    assert_eq!(calls_of(&server, "fcall"), 7);
    assert_eq!(calls_of(&server, "evalsha"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_function_the_script_is_called_and_reloaded() {
    let _serial = serial().await;
    // A server that renames FUNCTION away (as Redis 6 lacks it): the same decisions, by EVALSHA.
    let server = Server::start_with(&["--rename-command", "FUNCTION", ""]);
    reloads_after(&server, &["SCRIPT", "FLUSH"]).await;
    assert_eq!(calls_of(&server, "evalsha"), 7);
    assert_eq!(calls_of(&server, "fcall"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_down_at_start_is_a_limiter_that_fails_over_until_it_comes_up() {
    for path in PATHS {
        in_tries(&format!("{path:?}"), || {
            a_server_down_at_start_is_a_limiter_that_fails_over_until_it_comes_up_on(path)
        })
        .await;
    }
}

async fn a_server_down_at_start_is_a_limiter_that_fails_over_until_it_comes_up_on(
    path: Path,
) -> Late {
    let _serial = serial().await;
    let mut late = Late::default();
    let mut server = Server::start_on(path, &[]);
    server.kill();
    let l = limiter(&server, Failover::Closed, "fixed-window limit=5 window=1h").await;
    assert!(l.is_down());
    let (v, took) = timed(&l, "k").await;
    assert_eq!(v.source(), Source::Failover(FailoverReason::Down));
    late.check(took, AT_ONCE, || "a decision on a server down".into());
    server.restart();
    let restarted = Instant::now();
    while timed(&l, "k").await.0.source() != Source::Server {
        assert!(restarted.elapsed() < HANG, "never reached the server");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let bound = BACKOFF_MAX * 3 + Duration::from_millis(200);
    late.check(restarted.elapsed(), bound, || "reached the server after the restart".into());
    late
}
