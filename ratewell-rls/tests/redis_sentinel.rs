//! `REDIS_TYPE=sentinel` against live processes on loopback: a primary and a replica that ask
//! for a password (`REDIS_AUTH`), and two `redis-sentinel`s (quorum 1) that ask for another
//! (`REDIS_SENTINEL_AUTH`), `REDIS_URL` being the master's name, then the sentinels. The setup
//! fails over on `SENTINEL FAILOVER` with its data on the promoted replica (checked without
//! the service). Through a failover the service's decisions continue the count exactly: the
//! answered requests get what the memory store answers the same requests, a request answered
//! UNAVAILABLE (`REDIS_FAILOVER` unset) charges nothing and comes only for a bounded time while
//! the service finds the new primary, and the keys are on the new primary. A wrong or missing
//! sentinel password, or a wrong primary password, stops the start with the server's refusal;
//! a master name without sentinels is refused with the Go service's message.

mod common;
#[path = "common/redis_servers.rs"]
mod redis_servers;

use std::time::{Duration, Instant};

use common::*;
use ratewell_rls::proto::Code;
use redis_servers::*;

const CONFIG: &str = "
domain: d
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 10}
";

/// The primary's and replica's password, and the sentinels'.
const PW: &str = "redis-pw";
const SPW: &str = "sentinel-pw";
const MASTER: &str = "mymaster";

/// How long a failover may take on a busy machine: the old primary turns replica only some
/// seconds after the promotion (Sentinel waits before it converts it).
const FAILOVER: Duration = Duration::from_secs(90);

/// How long requests may be answered UNAVAILABLE after the failover, while the service finds
/// the new primary.
const FINDING: Duration = Duration::from_secs(10);

/// A primary, its replica, and sentinels monitoring them.
struct Setup {
    primary: Process,
    replica: Process,
    sentinels: Vec<Process>,
}

/// `redis-cli`'s flat answer to a command that returns a map (`SENTINEL replicas`, ...): the
/// key and value pairs of each entry, the entries starting at `name`.
fn entries(flat: &str) -> Vec<std::collections::HashMap<String, String>> {
    let lines: Vec<&str> = flat.lines().map(str::trim).collect();
    let mut out = Vec::new();
    for pair in lines.chunks(2) {
        if let [k, v] = pair {
            if *k == "name" {
                out.push(std::collections::HashMap::new());
            }
            if let Some(last) = out.last_mut() {
                last.insert(k.to_string(), v.to_string());
            }
        }
    }
    out
}

impl Setup {
    /// The primary, its replica, and `sentinels` sentinels that know both and each other.
    fn start(sentinels: usize) -> Setup {
        let primary = redis_server(&["--requirepass", PW, "--masterauth", PW], PW);
        let p = primary.port.to_string();
        let replica = redis_server(
            &["--requirepass", PW, "--masterauth", PW, "--replicaof", "127.0.0.1", &p],
            PW,
        );
        poll("the replica's link to the primary", WAIT, || {
            replica.info("master_link_status").as_deref() == Some("up")
        });
        let sentinels: Vec<Process> =
            (0..sentinels).map(|_| sentinel(MASTER, primary.port, PW, SPW)).collect();
        let setup = Setup { primary, replica, sentinels };
        for s in &setup.sentinels {
            assert_eq!(setup.master_port(s), Some(setup.primary.port));
            poll("each sentinel knows the replica, linked", WAIT, || {
                entries(&s.cli(&["SENTINEL", "replicas", MASTER])).iter().any(|r| {
                    r.get("port") == Some(&setup.replica.port.to_string())
                        && r.get("master-link-status").map(String::as_str) == Some("ok")
                        && !r.get("flags").is_some_and(|f| f.contains("down"))
                })
            });
            let others = setup.sentinels.len() - 1;
            poll("each sentinel knows the others", WAIT, || {
                entries(&s.cli(&["SENTINEL", "sentinels", MASTER])).len() == others
            });
        }
        setup
    }

    /// `REDIS_URL`: the master's name, then the sentinels.
    fn url(&self) -> String {
        let mut url = MASTER.to_owned();
        for s in &self.sentinels {
            url.push_str(&format!(",127.0.0.1:{}", s.port));
        }
        url
    }

    /// The primary's port as `sentinel` names it.
    fn master_port(&self, sentinel: &Process) -> Option<u16> {
        let out = sentinel.cli(&["SENTINEL", "get-master-addr-by-name", MASTER]);
        let lines: Vec<&str> = out.lines().map(str::trim).collect();
        match lines.as_slice() {
            ["127.0.0.1", port] => port.parse().ok(),
            _ => None,
        }
    }

    /// `SENTINEL FAILOVER` on the first sentinel (again while it has no good replica yet), then
    /// wait until every sentinel names the replica, the replica is the primary, and the old
    /// primary is its replica (so that it refuses writes).
    fn fail_over(&self) {
        poll("SENTINEL FAILOVER accepted", FAILOVER, || {
            self.sentinels[0].cli_any(&["SENTINEL", "FAILOVER", MASTER]).trim() == "OK"
        });
        poll("the sentinels name the replica", FAILOVER, || {
            self.sentinels.iter().all(|s| self.master_port(s) == Some(self.replica.port))
        });
        poll("the replica is the primary", FAILOVER, || {
            self.replica.info("role").as_deref() == Some("master")
        });
        poll("the old primary is the new primary's replica", FAILOVER, || {
            self.primary.info("role").as_deref() == Some("slave")
                && self.primary.info("master_port") == Some(self.replica.port.to_string())
                && self.primary.info("master_link_status").as_deref() == Some("up")
        });
    }
}

fn env<'a>(url: &'a str, auth: &'a str, sentinel_auth: Option<&'a str>) -> Vec<(&'a str, &'a str)> {
    let mut env = vec![
        ("BACKEND_TYPE", "redis"),
        ("REDIS_TYPE", "sentinel"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", url),
        ("REDIS_AUTH", auth),
        ("REDIS_TIMEOUT", "1s"),
    ];
    if let Some(s) = sentinel_auth {
        env.push(("REDIS_SENTINEL_AUTH", s));
    }
    env
}

/// The setup itself, without the service: a write on the primary reaches the replica, and after
/// the failover it is on the new primary and the old one refuses writes.
#[test]
fn the_setup_fails_over() {
    let setup = Setup::start(2);
    setup.primary.cli(&["SET", "written", "before"]);
    assert_eq!(setup.primary.cli(&["WAIT", "1", "5000"]).trim(), "1");
    setup.fail_over();
    assert_eq!(setup.replica.cli(&["GET", "written"]).trim(), "before");
    setup.replica.cli(&["SET", "written", "after"]);
    let refused = setup.primary.cli_any(&["SET", "written", "again"]);
    assert!(refused.contains("READONLY"), "the old primary refuses writes: {refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_continues_the_count() {
    let setup = Setup::start(2);
    let url = setup.url();
    clear_of_boundary(3600, 120).await;
    let mut service = Service::start(CONFIG, &env(&url, PW, Some(SPW)))
        .await
        .expect("the service starts through the sentinels");
    let req = request("d", &[&[("user", "u1")]], 1);
    let mut answered = Vec::new();
    for _ in 0..4 {
        answered.push(service.send(&req).await);
    }
    assert_eq!(codes(&answered), [Code::Ok as i32; 4], "{answered:?}");
    let keys = setup.primary.keys();
    assert!(keys.iter().any(|k| k.starts_with("d_user_u1_")), "on the primary: {keys:?}");
    assert_eq!(setup.primary.cli(&["WAIT", "1", "2000"]).trim(), "1", "the replica has them");
    assert_eq!(setup.replica.keys(), keys, "the replica holds the primary's keys");

    tokio::task::block_in_place(|| setup.fail_over());

    // Until the service has found the new primary, UNAVAILABLE; then answers only.
    let since = Instant::now();
    let mut unavailable = 0;
    let mut after = 0;
    while after < 8 {
        match service.send(&req).await {
            Err(code) => {
                assert_eq!(code, tonic::Code::Unavailable, "REDIS_FAILOVER unset: an error");
                assert_eq!(after, 0, "an error after the service had found the new primary");
                assert!(
                    since.elapsed() < FINDING,
                    "still UNAVAILABLE {FINDING:?} after the failover ({unavailable} errors)"
                );
                unavailable += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok(a) => {
                answered.push(Ok(a));
                after += 1;
            }
        }
    }
    // The answered requests, in memory: 10 admitted in all, so 6 after the failover; the
    // requests answered UNAVAILABLE charged nothing.
    let want = on_memory(CONFIG, &vec![req.clone(); answered.len()]).await;
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    assert_eq!(codes(&want), [[ok; 10].as_slice(), &[over; 2]].concat());
    assert_eq!(answered, want, "{unavailable} UNAVAILABLE on the way");
    eprintln!("{unavailable} UNAVAILABLE in {:?} after the failover", since.elapsed());

    assert!(setup.replica.dbsize() > 0, "the keys are on the new primary");
    let keys = setup.replica.keys();
    assert!(keys.iter().any(|k| k.starts_with("d_user_u1_")), "on the new primary: {keys:?}");
    assert_eq!(setup.replica.info("role").as_deref(), Some("master"));
    service.running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_passwords_are_checked() {
    let setup = Setup::start(1);
    let url = setup.url();
    clear_of_boundary(3600, 30).await;
    // The right passwords: the service decides on the primary.
    let mut service = Service::start(CONFIG, &env(&url, PW, Some(SPW)))
        .await
        .expect("the service starts through the sentinel");
    let req = request("d", &[&[("user", "u2")]], 1);
    let got = vec![service.send(&req).await, service.send(&req).await];
    assert_eq!(got, on_memory(CONFIG, &[req.clone(), req.clone()]).await);
    service.running.stop().await;
    assert!(setup.primary.keys().iter().any(|k| k.starts_with("d_user_u2_")));

    let wrong = Service::start(CONFIG, &env(&url, PW, Some("wrong"))).await.err();
    let e = wrong.expect("a wrong sentinel password does not start");
    eprintln!("refused: {e}");
    let lower = e.to_ascii_lowercase();
    assert!(
        lower.contains("wrongpass") || lower.contains("authentication failed"),
        "the sentinel's refusal: {e}"
    );
    assert!(
        e.contains("refused this client: ") && e.contains(": sentinel redis://***@127.0.0.1:"),
        "{e}"
    );
    let missing = Service::start(CONFIG, &env(&url, PW, None)).await.err();
    let e = missing.expect("no sentinel password does not start");
    eprintln!("refused: {e}");
    let lower = e.to_ascii_lowercase();
    assert!(
        lower.contains("noauth") || lower.contains("authentication required"),
        "the sentinel's refusal: {e}"
    );
    assert!(
        e.contains("refused this client: ") && e.contains(": sentinel redis://127.0.0.1:"),
        "{e}"
    );
    let wrong = Service::start(CONFIG, &env(&url, "wrong", Some(SPW))).await.err();
    let e = wrong.expect("a wrong primary password does not start");
    eprintln!("refused: {e}");
    let lower = e.to_ascii_lowercase();
    assert!(
        lower.contains("wrongpass") || lower.contains("authentication failed"),
        "the primary's refusal: {e}"
    );
    assert!(e.contains("refused this client: ") && e.contains(": the primary 127.0.0.1:"), "{e}");
}

#[tokio::test]
async fn a_master_name_without_sentinels_is_refused() {
    let e = Service::start(CONFIG, &env(MASTER, PW, Some(SPW)))
        .await
        .err()
        .expect("REDIS_URL without sentinels does not start");
    assert!(
        e.contains(
            "Expected master name and a list of urls for the sentinels, in the format: \
             <redis master name>,<sentinel1>,...,<sentineln>"
        ),
        "{e}"
    );
}
