//! The proxy example, started as a process in front of an upstream of this test's: 429 after
//! the burst, and bad arguments exit 2.

#[path = "../../ratewell-http/tests/support/proxy_example.rs"]
mod proxy_example;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The example's binary, built once per test run.
fn proxy_binary() -> PathBuf {
    proxy_example::proxy_example(&[])
}

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An upstream answering 200 to anything, on its own thread.
fn upstream() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let mut seen = Vec::new();
                while let Ok(n) = stream.read(&mut buf) {
                    if n == 0 {
                        return;
                    }
                    seen.extend_from_slice(&buf[..n]);
                    while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                        seen.drain(..end + 4);
                        let reply = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        if stream.write_all(reply.as_bytes()).is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    addr
}

fn status(addr: &str) -> u16 {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.write_all(b"GET / HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n").unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0)
}

#[test]
fn the_example_answers_429_after_the_burst() {
    let upstream = upstream();
    let listen = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    let child = Command::new(proxy_binary())
        .args(["--listen", &listen, "--upstream", &upstream])
        .args(["--policy", "token-bucket capacity=3 rate=1/h"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _running = Running(child);
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(&listen).is_err() {
        assert!(Instant::now() < deadline, "the example did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    let statuses: Vec<u16> = (0..5).map(|_| status(&listen)).collect();
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
}

#[test]
fn bad_arguments_exit_2() {
    for args in [
        &["--listen", "127.0.0.1:1"][..],
        &["--listen", "127.0.0.1:1", "--upstream", "127.0.0.1:2"],
        &[
            "--listen",
            "127.0.0.1:1",
            "--upstream",
            "127.0.0.1:2",
            "--policy",
            "token-bucket capacity=0 rate=1/s",
        ],
        &[
            "--listen",
            "127.0.0.1:1",
            "--upstream",
            "127.0.0.1:2",
            "--layer",
            "x:cookie:fixed-window limit=1 window=1s",
        ],
        &[
            "--listen",
            "127.0.0.1:1",
            "--upstream",
            "127.0.0.1:2",
            "--policy",
            "fixed-window limit=1 window=1s",
            "--trusted-proxy",
            "nonsense",
        ],
        &["--listen", "127.0.0.1:1", "--upstream", "127.0.0.1:2", "--pingora-limits", "0"],
        // The tower example's metrics and state: not options of this one.
        &[
            "--listen",
            "127.0.0.1:1",
            "--upstream",
            "127.0.0.1:2",
            "--policy",
            "fixed-window limit=1 window=1s",
            "--state",
            "state.bin",
        ],
        &["--bogus"],
    ] {
        let out = Command::new(proxy_binary()).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(!out.stderr.is_empty(), "{args:?}: a message");
    }
    let help = Command::new(proxy_binary()).arg("--help").output().unwrap();
    assert!(
        help.status.success() && String::from_utf8_lossy(&help.stdout).contains("--trusted-proxy")
    );
}
