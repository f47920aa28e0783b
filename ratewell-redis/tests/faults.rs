//! Failure on a real server: SIGKILL mid-run, SIGSTOP, `DEBUG SLEEP`, `SCRIPT FLUSH`. Every
//! decision returns within the timeout (plus 1 ms) with the configured failover's outcome, none
//! waits behind another, decisions return to the server within the backoff after a restart, and
//! nothing panics or leaks a task.
//!
//! The timing promises are those bounds on the test's own clock (how long a decision took, how
//! soon decisions are back on the server, how many waited for a timeout), and one more: that a
//! healthy server answers a decision within the timeout. A busy machine can delay any wake-up
//! (the timer's, the test's, the server's) by milliseconds, so a decision the test expects the
//! server to make may come back as `Failover(Timeout)`; that is a broken timing promise, where
//! any other source than the server's fails the test at once. Such a timeout marks the
//! connection down, and the server may still run the call, so the try is abandoned there (what
//! follows would check a state the timeout changed); in a wait for decisions to come back to the
//! server, the wait goes on.
//!
//! A scenario is therefore run in up to [`TRIES`] tries, each on a new server, and passes when
//! one try keeps every timing promise. Every other check (the outcomes, the sources, the counts)
//! holds in every try, as far as the try went; the counts a timed-out call can change (the calls
//! the server ran, the code loads) are checked in full in the try that kept every promise. A
//! limiter that does not keep a promise (one that never reaches the server, say) breaks it in
//! every try, and the test fails with each try's account.

mod common;

use std::time::{Duration, Instant};

use common::{PATHS, Path, Server};
use ratewell::Outcome;
use ratewell_redis::{Failover, FailoverReason, RedisLimiter, Source, Verdict};

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
async fn timed(l: &RedisLimiter, key: &str) -> (Verdict, Duration) {
    let start = Instant::now();
    let v = tokio::time::timeout(HANG, l.check(key, 1))
        .await
        .unwrap_or_else(|_| panic!("a decision not back within {HANG:?}"));
    (v, start.elapsed())
}

/// Whether the server made `v`, a decision on a healthy server, which it must. A timeout
/// instead breaks the promise that the server answers in time: noted in `late`, and `false`, for
/// the caller to abandon the try (the connection is down from then on, and the server may still
/// run the call). Any other source fails the test.
fn served(late: &mut Late, v: &Verdict, took: Duration, what: impl FnOnce() -> String) -> bool {
    match v.source() {
        Source::Server => true,
        Source::Failover(FailoverReason::Timeout) => {
            late.0.push(format!("{}: timed out on a healthy server after {took:?}", what()));
            false
        }
        other => panic!("{}: {other:?}, not the server's decision", what()),
    }
}

/// Whether the server made `v`, a decision while waiting for decisions to come back to it.
/// `Down` is the wait (the connection is not back yet); a timeout breaks the promise that the
/// server, back, answers in time: noted in `late`, and the wait goes on (the connection is down
/// again until the next probe). Any other source fails the test.
fn served_again(
    late: &mut Late,
    v: &Verdict,
    took: Duration,
    what: impl FnOnce() -> String,
) -> bool {
    match v.source() {
        Source::Server => true,
        Source::Failover(FailoverReason::Down) => false,
        Source::Failover(FailoverReason::Timeout) => {
            late.0.push(format!("{}: timed out on the server back after {took:?}", what()));
            false
        }
        other => panic!("{}: {other:?} while waiting for the server", what()),
    }
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
        for i in 0..20 {
            let (v, took) = timed(&l, "k").await;
            if !served(&mut late, &v, took, || {
                format!("{failover:?}: decision {i} before the kill")
            }) {
                return late;
            }
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
            if served_again(&mut late, &v, took, || format!("{failover:?}: after the restart")) {
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
    let (v, took) = timed(&l, "k").await;
    if !served(&mut late, &v, took, || "the decision before SIGSTOP".into()) {
        return late;
    }
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
    let (v, took) = timed(&l, "k").await;
    if !served(&mut late, &v, took, || "the decision before SIGSTOP".into()) {
        return late;
    }
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
    loop {
        let (v, took) = timed(&l, "k").await;
        if served_again(&mut late, &v, took, || "after SIGCONT".into()) {
            break;
        }
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
    let (v, took) = timed(&l, "k").await;
    if !served(&mut late, &v, took, || "the decision before DEBUG SLEEP".into()) {
        return late;
    }
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
    loop {
        let (v, took) = timed(&l, "k").await;
        if served_again(&mut late, &v, took, || "after DEBUG SLEEP".into()) {
            break;
        }
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

/// Decision `n` on `server` of [`reloads_after`]'s six, which the server must make: `None` when
/// it timed out instead (noted in `late`, see [`served`]).
async fn by_server(l: &RedisLimiter, late: &mut Late, n: usize) -> Option<Verdict> {
    let (v, took) = timed(l, "k").await;
    served(late, &v, took, || format!("decision {n}")).then_some(v)
}

/// Three admitted, the code flushed by `flush`, then the fourth and fifth decided by the server
/// (the code loaded again on its first call), and the sixth rejected: the state survived. A
/// decision that timed out ends the try there: the server may still run it, so neither the
/// state nor the counts tell anything after it.
async fn reloads_after(server: &Server, flush: &[&str]) -> Late {
    let mut late = Late::default();
    let l = limiter(server, Failover::Open, "fixed-window limit=5 window=1h align=first").await;
    assert_eq!(l.metrics().script_loads, 1);
    for n in 1..=3 {
        let Some(v) = by_server(&l, &mut late, n).await else { return late };
        assert!(v.is_admitted(), "decision {n}");
    }
    assert_eq!(server.cli(flush).unwrap().trim(), "OK");
    let Some(v) = by_server(&l, &mut late, 4).await else { return late };
    assert_eq!(v.decision().remaining(), 1);
    assert_eq!(l.metrics().script_loads, 2);
    let Some(v) = by_server(&l, &mut late, 5).await else { return late };
    assert!(v.is_admitted(), "decision 5");
    let Some(v) = by_server(&l, &mut late, 6).await else { return late };
    assert!(!v.is_admitted(), "decision 6");
    late
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_library_is_reloaded_transparently() {
    in_tries("FUNCTION FLUSH", || async {
        let _serial = serial().await;
        let server = Server::start();
        let late = reloads_after(&server, &["FUNCTION", "FLUSH"]).await;
        // None as a script, in every try (a timeout does not make one).
        assert_eq!(calls_of(&server, "evalsha"), 0);
        if late.0.is_empty() {
            // Every decision went as FCALL (7, one of them refused for the missing library).
            assert_eq!(calls_of(&server, "fcall"), 7);
        }
        late
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_function_the_script_is_called_and_reloaded() {
    in_tries("SCRIPT FLUSH", || async {
        let _serial = serial().await;
        // A server that renames FUNCTION away (as Redis 6 lacks it): the same decisions, by
        // EVALSHA.
        let server = Server::start_with(&["--rename-command", "FUNCTION", ""]);
        let late = reloads_after(&server, &["SCRIPT", "FLUSH"]).await;
        // None as FCALL, in every try (a timeout does not make one).
        assert_eq!(calls_of(&server, "fcall"), 0);
        if late.0.is_empty() {
            assert_eq!(calls_of(&server, "evalsha"), 7);
        }
        late
    })
    .await;
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
    loop {
        let (v, took) = timed(&l, "k").await;
        if served_again(&mut late, &v, took, || "after the restart".into()) {
            break;
        }
        assert!(restarted.elapsed() < HANG, "never reached the server");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let bound = BACKOFF_MAX * 3 + Duration::from_millis(200);
    late.check(restarted.elapsed(), bound, || "reached the server after the restart".into());
    late
}
