//! Bad input gets a clear error or a documented outcome: a URL that does not parse, a server
//! that is not Redis (garbage, silence, a liar), keys Redis allows but the trace grammar does
//! not, absurd costs and layers. Nothing panics or hangs.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::{Duration, Instant};

use common::Server;
use ratewell::Nanos;
use ratewell_redis::{Error, Failover, FailoverReason, RedisLimiter, Source};

fn policy(s: &str) -> ratewell::Policy {
    s.parse().unwrap()
}

/// A TCP listener that answers with `reply`, in a thread: once per command when `per_command`
/// (a RESP array starts a line: `*`), else once per read.
fn fake_server(reply: &'static [u8], per_command: bool) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 65536];
                let mut at_line_start = true;
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 {
                        return;
                    }
                    let mut answers = usize::from(!per_command);
                    if per_command {
                        for &b in &buf[..n] {
                            if at_line_start && b == b'*' {
                                answers += 1;
                            }
                            at_line_start = b == b'\n';
                        }
                    }
                    for _ in 0..answers {
                        if !reply.is_empty() && s.write_all(reply).is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    port
}

async fn build(url: &str, failover: Failover) -> Result<RedisLimiter, Error> {
    RedisLimiter::builder(url)
        .layer("l", &policy("fixed-window limit=3 window=1m"))
        .timeout(Duration::from_millis(50))
        .failover(failover)
        .build()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn urls_that_do_not_parse_are_errors() {
    for url in ["", "http://127.0.0.1:6379", "redis://[::1", "not a url"] {
        match build(url, Failover::Closed).await {
            Err(Error::Url(msg)) => assert!(!msg.is_empty()),
            other => panic!("{url:?}: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_answers_garbage_is_not_redis() {
    let port = fake_server(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n", false);
    let start = Instant::now();
    let r = build(&format!("redis://127.0.0.1:{port}"), Failover::Closed).await;
    assert!(start.elapsed() < Duration::from_secs(2), "took {:?}", start.elapsed());
    match r {
        Err(Error::NotRedis(msg)) => assert!(!msg.is_empty()),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_server_is_a_limiter_that_fails_over() {
    // Accepts, reads, never answers.
    let port = fake_server(b"", false);
    let start = Instant::now();
    let l = build(&format!("redis://127.0.0.1:{port}"), Failover::Open).await.unwrap();
    assert!(start.elapsed() < Duration::from_secs(2), "took {:?}", start.elapsed());
    assert!(l.is_down());
    let v = l.check("k", 1).await;
    assert_eq!(v.source(), Source::Failover(FailoverReason::Down));
    assert!(v.is_admitted());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_lies_is_not_redis_or_a_bad_reply() {
    // Speaks RESP, but answers every command with +OK: not even FUNCTION LOAD's library name.
    let port = fake_server(b"+OK\r\n", true);
    let r = build(&format!("redis://127.0.0.1:{port}"), Failover::Closed).await;
    assert!(matches!(r, Err(Error::NotRedis(_))), "{r:?}");
    // Answers every command with the library's name (the script's SHA1 after `ratewell_`): it
    // loads, but no decision is the code's.
    let script = format!("{}\nreturn batch(KEYS, ARGV)\n", include_str!("../src/decide.lua"));
    let sha = redis::Script::new(&script).get_hash().to_string();
    let name = format!("ratewell_{}", &sha[..16]);
    let reply: &'static [u8] = format!("${}\r\n{name}\r\n", name.len()).into_bytes().leak();
    let port = fake_server(reply, true);
    let l = build(&format!("redis://127.0.0.1:{port}"), Failover::Closed).await.unwrap();
    let v = l.check("k", 1).await;
    assert_eq!(v.source(), Source::Failover(FailoverReason::BadReply));
    assert!(!v.is_admitted(), "fail-closed");
    assert_eq!(l.metrics().failover_bad_reply, 1);
    let r = l.check_at(&[Some("k")], 1, Nanos::new(0)).await;
    assert!(matches!(r, Err(Error::BadReply(_))), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_the_trace_grammar_does_not_allow_are_keys() {
    let server = Server::start();
    let l = RedisLimiter::builder(&server.url())
        .layer("l", &policy("fixed-window limit=2 window=1h align=first"))
        .build()
        .await
        .unwrap();
    let long = "x".repeat(10_000);
    let keys =
        ["", " ", "{", "}{", "a{b}c", "x{b}y", "{b}", "line\nbreak", "ключ", "*?[", long.as_str()];
    // Each is its own key (a hash tag chooses the slot, not the state): two each, then rejected.
    for key in keys {
        for expected in [true, true, false] {
            let v = l.check(key, 1).await;
            assert_eq!(v.source(), Source::Server, "{key:?}");
            assert_eq!(v.is_admitted(), expected, "{key:?}");
        }
    }
    // Absurd costs: impossible, not an error.
    let v = l.check("costly", u32::MAX).await;
    assert!(v.decision().is_impossible());
    assert_eq!(v.source(), Source::Server);
    // Times the backend cannot represent.
    for ns in [1, 999, u64::MAX] {
        let r = l.check_at(&[Some("t")], 1, Nanos::new(ns)).await;
        assert!(matches!(r, Err(Error::Time(_))), "{ns}: {r:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layers_and_policies_outside_the_domain_are_errors() {
    let server = Server::start();
    let url = server.url();
    let p = policy("fixed-window limit=2 window=1s");
    let none = RedisLimiter::builder(&url).build().await;
    assert!(matches!(none, Err(Error::Layers(_))), "{none:?}");
    let mut nine = RedisLimiter::builder(&url);
    for i in 0..9 {
        nine = nine.layer(format!("l{i}"), &p);
    }
    assert!(matches!(nine.build().await, Err(Error::Layers(_))));
    let twice = RedisLimiter::builder(&url).layer("a", &p).layer("a", &p).build().await;
    assert!(matches!(twice, Err(Error::Layers(_))));
    let odd = RedisLimiter::builder(&url)
        .layer("a", &policy("sliding-log limit=3 window=1500ns"))
        .build()
        .await;
    match odd {
        Err(Error::Domain(e)) => assert!(e.reason().contains("microseconds"), "{e}"),
        other => panic!("{other:?}"),
    }
    let l = RedisLimiter::builder(&url).layer("a", &p).layer("b", &p).build().await.unwrap();
    assert!(matches!(l.check_layers(&[Some("k")], 1).await, Err(Error::Layers(_))));
    // A layer with no key is skipped; a request with no key at all is admitted.
    let v = l.check_layers(&[None, None], 1).await.unwrap();
    assert!(v.is_admitted());
}

/// A key whose state something else overwrote is a bad reply, decided by the failover: never a
/// fresh key with a full budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_that_does_not_parse_is_a_bad_reply_not_a_fresh_key() {
    let server = Server::start();
    for (spec, key) in [
        ("fixed-window limit=3 window=1m", "words"),
        ("token-bucket capacity=3 rate=1/m", "bucket"),
        ("sliding-log limit=3 window=1m", "log"),
    ] {
        let l = RedisLimiter::builder(&server.url())
            .prefix("rw:")
            .layer("l", &policy(spec))
            .failover(Failover::Closed)
            .build()
            .await
            .unwrap();
        // Spend the budget, so that a fresh key would be the only way to be admitted.
        for _ in 0..3 {
            assert_eq!(l.check(key, 1).await.source(), Source::Server, "{spec}");
        }
        let rejected = l.check(key, 1).await;
        assert_eq!((rejected.source(), rejected.is_admitted()), (Source::Server, false), "{spec}");
        let redis_key = format!("rw:l:{{{key}}}");
        if spec.starts_with("sliding-log") {
            server.cli(&["LSET", &redis_key, "0", "not a log entry"]).unwrap();
        } else {
            server.cli(&["SET", &redis_key, "garbage", "PX", "60000"]).unwrap();
        }
        let v = l.check(key, 1).await;
        assert_eq!(v.source(), Source::Failover(FailoverReason::BadReply), "{spec}");
        assert!(!v.is_admitted(), "{spec}: fail-closed, not a fresh key's full budget");
        assert_eq!(l.metrics().failover_bad_reply, 1, "{spec}");
        let r = l.check_at(&[Some(key)], 1, Nanos::new(1_000_000)).await;
        match r {
            Err(Error::BadReply(message)) => {
                assert!(message.contains("does not parse"), "{spec}: {message}")
            }
            other => panic!("{spec}: {other:?}"),
        }
        // The key is left as it was found: the failover decided, nothing was written.
        let left = if spec.starts_with("sliding-log") {
            server.cli(&["LINDEX", &redis_key, "0"]).unwrap()
        } else {
            server.cli(&["GET", &redis_key]).unwrap()
        };
        assert!(left.contains("not a log entry") || left.contains("garbage"), "{spec}: {left}");
    }
}
