//! What the service's tests share: a service started in process on loopback (free ports, a
//! manual clock, a configuration directory of their own), a gRPC client, and request builders.
#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ratewell::ManualClock;
use ratewell_rls::grpc::rate_limit_service_client::RateLimitServiceClient;
use ratewell_rls::proto::{
    Code, DescriptorStatus, Entry, RateLimit, RateLimitDescriptor, RateLimitRequest,
    RateLimitResponse, Unit,
};
use ratewell_rls::server::{Running, start};
use ratewell_rls::settings::Settings;
use tonic::transport::Channel;

pub const S: u64 = 1_000_000_000;
/// Signal numbers (the same on Linux and the BSDs).
pub const SIGHUP: u32 = 1;
pub const SIGTERM: u32 = 15;

/// A service running in process, its configuration directory, clock and client.
pub struct Harness {
    pub running: Running<ManualClock>,
    pub clock: ManualClock,
    pub dir: tempfile::TempDir,
    pub client: RateLimitServiceClient<Channel>,
}

/// The settings of a test service: loopback, free ports, `RUNTIME_ROOT` at `root`, the
/// directory checked every 20 ms, and `env` on top.
pub fn settings(root: &Path, env: &[(&str, &str)]) -> Settings {
    try_settings(root, env).expect("valid test settings")
}

/// [`settings`], or why they are refused.
pub fn try_settings(root: &Path, env: &[(&str, &str)]) -> Result<Settings, String> {
    let mut vars: HashMap<String, String> = [
        ("HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", "0"),
        ("DEBUG_HOST", "127.0.0.1"),
        ("DEBUG_PORT", "0"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("RELOAD_INTERVAL", "20ms"),
        ("MEMORY_CAPACITY", "10000"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    vars.insert("RUNTIME_ROOT".into(), root.display().to_string());
    for (k, v) in env {
        vars.insert(k.to_string(), v.to_string());
    }
    Settings::from_env(&vars).map_err(|e| format!("settings: {e}"))
}

/// The configuration directory under `root`.
pub fn config_dir(root: &Path) -> PathBuf {
    root.join("ratelimit").join("config")
}

/// Write `files` (name, YAML) into the configuration directory under `root`.
pub fn write_config(root: &Path, files: &[(&str, &str)]) {
    let dir = config_dir(root);
    std::fs::create_dir_all(&dir).unwrap();
    for (name, yaml) in files {
        std::fs::write(dir.join(name), yaml).unwrap();
    }
}

impl Harness {
    /// A service with `files` as its configuration, its clock at `now_s` seconds.
    pub async fn start(files: &[(&str, &str)], env: &[(&str, &str)], now_s: u64) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        write_config(dir.path(), files);
        let clock = ManualClock::new(now_s * S);
        let running =
            start(settings(dir.path(), env), clock.clone()).await.expect("the service starts");
        let client = RateLimitServiceClient::connect(format!("http://{}", running.grpc))
            .await
            .expect("a connection");
        Harness { running, clock, dir, client }
    }

    /// One `ShouldRateLimit` call.
    pub async fn call(
        &mut self,
        request: RateLimitRequest,
    ) -> Result<RateLimitResponse, tonic::Status> {
        self.client.should_rate_limit(request).await.map(|r| r.into_inner())
    }

    /// Replace the configuration and wait until the service has loaded or refused it.
    ///
    /// The service reads the directory every 20 ms, on a thread of its own, so the change is
    /// made in one step whenever at most one file changes: each file is written beside the
    /// directory and renamed into it (whole or not there at all, and a file of the same name
    /// never missing), then the files `files` does not name are removed. The next load the
    /// service counts is then of this configuration, not of a state half-way.
    pub async fn reconfigure(&self, files: &[(&str, &str)]) {
        let stats = self.running.service.stats();
        let before = stats.config_load_success.load(Ordering::Relaxed)
            + stats.config_load_error.load(Ordering::Relaxed);
        let dir = config_dir(self.dir.path());
        std::fs::create_dir_all(&dir).unwrap();
        let staging = self.dir.path().join("staging");
        std::fs::create_dir_all(&staging).unwrap();
        for (name, yaml) in files {
            std::fs::write(staging.join(name), yaml).unwrap();
            std::fs::rename(staging.join(name), dir.join(name)).unwrap();
        }
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            if !files.iter().any(|(name, _)| entry.file_name() == *name) {
                std::fs::remove_file(entry.path()).unwrap();
            }
        }
        wait_until(DEADLINE, || {
            stats.config_load_success.load(Ordering::Relaxed)
                + stats.config_load_error.load(Ordering::Relaxed)
                > before
        })
        .await;
    }
}

/// The bound on a wait for something the test expects to happen: generous, so that only a hang
/// reaches it on a busy machine (a wait ends as soon as its event is seen).
pub const DEADLINE: Duration = Duration::from_secs(20);

/// Poll `done` until it holds or `limit` passes; panics on the limit.
pub async fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "not done within {limit:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A request of `descriptors` (each a list of entries) in `domain`, with `hits` as the
/// request's `hits_addend`.
pub fn request(domain: &str, descriptors: &[&[(&str, &str)]], hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: descriptors
            .iter()
            .map(|entries| RateLimitDescriptor {
                entries: entries
                    .iter()
                    .map(|(k, v)| Entry { key: k.to_string(), value: v.to_string() })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        hits_addend: hits,
    }
}

/// A status with a limit.
pub fn status(code: Code, rpu: u32, unit: Unit, remaining: u32, reset_s: i64) -> DescriptorStatus {
    named(code, "", rpu, unit, remaining, reset_s)
}

/// A status with a named limit.
pub fn named(
    code: Code,
    name: &str,
    rpu: u32,
    unit: Unit,
    remaining: u32,
    reset_s: i64,
) -> DescriptorStatus {
    DescriptorStatus {
        code: code as i32,
        current_limit: Some(RateLimit {
            name: name.into(),
            requests_per_unit: rpu,
            unit: unit as i32,
        }),
        limit_remaining: remaining,
        duration_until_reset: Some(prost_types::Duration { seconds: reset_s, nanos: 0 }),
    }
}

/// A status without a limit.
pub fn no_limit(remaining: u32) -> DescriptorStatus {
    DescriptorStatus { code: Code::Ok as i32, limit_remaining: remaining, ..Default::default() }
}

/// A response of `statuses`.
pub fn response(code: Code, statuses: Vec<DescriptorStatus>) -> RateLimitResponse {
    RateLimitResponse { overall_code: code as i32, statuses, ..Default::default() }
}

/// The `ratewell-rls` binary, started with `env` on free loopback ports; killed when dropped.
pub struct Binary {
    pub child: std::process::Child,
    pub grpc: std::net::SocketAddr,
    pub http: std::net::SocketAddr,
    pub debug: std::net::SocketAddr,
    pub prometheus: Option<std::net::SocketAddr>,
    /// What it wrote to standard error so far (read it with [`Binary::lines`]).
    pub log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    /// The thread that reads standard error into `log`; it ends when the process has exited
    /// and its last line is in `log`.
    reader: std::thread::JoinHandle<()>,
}

impl Binary {
    pub fn spawn(env: &[(&str, &str)]) -> Binary {
        use std::io::BufRead;
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_ratewell-rls"));
        command
            .env_clear()
            .stderr(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null());
        for (k, v) in [
            ("HOST", "127.0.0.1"),
            ("PORT", "0"),
            ("GRPC_HOST", "127.0.0.1"),
            ("GRPC_PORT", "0"),
            ("DEBUG_HOST", "127.0.0.1"),
            ("DEBUG_PORT", "0"),
            ("RELOAD_INTERVAL", "50ms"),
            ("MEMORY_CAPACITY", "100000"),
            ("LOG_LEVEL", "info"),
        ] {
            command.env(k, v);
        }
        for (k, v) in env {
            command.env(k, v);
        }
        let mut child = command.spawn().expect("the binary starts");
        let stderr = child.stderr.take().unwrap();
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let lines = log.clone();
        let reader = std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                // Pushed before it is announced: every line up to the listening lines is in
                // the log once `spawn` returns. A test that panicked holding the lock has
                // poisoned it; the lines go on being kept for the assertions after.
                lines.lock().unwrap_or_else(|e| e.into_inner()).push(line.clone());
                // Plain, or inside a JSON log line (LOG_FORMAT=json).
                if line.contains("ratewell-rls listening") {
                    let _ = tx.send(line);
                }
            }
        });
        let snapshot = |log: &std::sync::Mutex<Vec<String>>| {
            log.lock().unwrap_or_else(|e| e.into_inner()).clone()
        };
        let listening = rx
            .recv_timeout(DEADLINE)
            .unwrap_or_else(|_| panic!("the binary did not listen: {:?}", snapshot(&log)));
        let field = |line: &str, name: &str| -> Option<std::net::SocketAddr> {
            line.split_whitespace().find_map(|w| w.strip_prefix(&format!("{name}="))).map(|a| {
                let end = a.find(|c: char| !(c.is_ascii_hexdigit() || ".:[]".contains(c)));
                a[..end.unwrap_or(a.len())].parse().unwrap()
            })
        };
        // With USE_PROMETHEUS (the binary's settings come from `env` alone), its address comes
        // on a line of its own, written right after the first: waited for, however long the
        // machine takes to write it.
        let truthy = ["1", "t", "T", "TRUE", "true", "True"];
        let use_prometheus = env
            .iter()
            .rev()
            .find(|(k, _)| *k == "USE_PROMETHEUS")
            .is_some_and(|(_, v)| truthy.contains(v));
        let prometheus = if use_prometheus {
            let line = rx.recv_timeout(DEADLINE).unwrap_or_else(|_| {
                panic!("USE_PROMETHEUS, and no prometheus address: {:?}", snapshot(&log))
            });
            field(&line, "prometheus")
        } else {
            None
        };
        Binary {
            grpc: field(&listening, "grpc").unwrap(),
            http: field(&listening, "http").unwrap(),
            debug: field(&listening, "debug").unwrap(),
            prometheus,
            child,
            log,
            reader,
        }
    }

    /// The lines it wrote to standard error so far.
    pub fn lines(&self) -> Vec<String> {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Wait until it has logged a line containing `text` (the line is read from its standard
    /// error by a thread of its own, some time after the process wrote it); panics, with the
    /// lines so far, past [`DEADLINE`].
    pub async fn wait_logged(&self, text: &str) {
        let deadline = Instant::now() + DEADLINE;
        while !self.logged(text) {
            assert!(Instant::now() < deadline, "{text:?} not logged within {DEADLINE:?}: {:?}", {
                self.lines()
            });
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Every line it wrote to standard error, once it has exited (the reader has reached the
    /// end of the stream).
    pub fn lines_to_end(&mut self) -> Vec<String> {
        assert!(self.child.try_wait().unwrap().is_some(), "the process is still running");
        let deadline = Instant::now() + DEADLINE;
        while !self.reader.is_finished() {
            assert!(Instant::now() < deadline, "standard error not closed within {DEADLINE:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
        self.lines()
    }

    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::connect(format!("http://{}", self.grpc))
            .await
            .expect("a connection")
    }

    /// Wait until the process catches signal number `signal`. The binary installs its handlers
    /// after it writes the listening line, so a signal sent as soon as `spawn` returns can meet
    /// the default action (death by the signal). Linux shows the signals a process catches in
    /// `/proc/PID/status` (`SigCgt`); where it does not, this returns at once.
    pub fn wait_catches(&self, signal: u32) {
        let path = format!("/proc/{}/status", self.child.id());
        let deadline = Instant::now() + DEADLINE;
        loop {
            let Ok(status) = std::fs::read_to_string(&path) else { return };
            let caught = status
                .lines()
                .find_map(|l| l.strip_prefix("SigCgt:"))
                .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok());
            match caught {
                None => return,
                Some(mask) if mask & (1 << (signal - 1)) != 0 => return,
                Some(_) => {}
            }
            assert!(Instant::now() < deadline, "signal {signal} not caught within {DEADLINE:?}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Stop it as a service manager does (SIGTERM), once it catches SIGTERM, and wait for it to
    /// exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        self.wait_catches(SIGTERM);
        let pid = self.child.id().to_string();
        let sent = std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(sent.success(), "kill -TERM {pid}");
        self.child.wait().unwrap()
    }

    /// Its exit status, once it has exited; panics if it has not within `limit`.
    pub async fn exited_within(&mut self, limit: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "the process did not exit within {limit:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Whether it logged a line containing `text`.
    pub fn logged(&self, text: &str) -> bool {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).iter().any(|l| l.contains(text))
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A plain HTTP/1.1 exchange on loopback: the status code and body.
pub async fn http(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    body: &[u8],
) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: localhost\r\ncontent-length: {}\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body).await.unwrap();
    let mut out = Vec::new();
    stream.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let code = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (code, dechunk(&body))
}

/// The body of a chunked response, or `body` if it is not chunked.
fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    loop {
        let Some((size, tail)) = rest.split_once("\r\n") else { return body.to_owned() };
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else { return body.to_owned() };
        if size == 0 {
            return out;
        }
        if tail.len() < size {
            return body.to_owned();
        }
        out.push_str(&tail[..size]);
        rest = tail[size..].trim_start_matches("\r\n");
    }
}

/// Wait, if need be, until the current window of `unit_s` seconds has at least `margin_s`
/// seconds left on the wall clock (tests on the real clock that must not straddle a boundary).
pub async fn clear_of_boundary(unit_s: u64, margin_s: u64) {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let into = now.as_secs_f64() % unit_s as f64;
    let left = unit_s as f64 - into;
    if left < margin_s as f64 {
        tokio::time::sleep(Duration::from_secs_f64(left + 0.05)).await;
    }
}

/// `clients` clients, each on its own connection to `grpc`, send `per_client` copies of
/// `request` one after another; the OK answers.
pub async fn flood(
    grpc: std::net::SocketAddr,
    clients: usize,
    per_client: usize,
    request: RateLimitRequest,
) -> usize {
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let mut c =
            RateLimitServiceClient::connect(format!("http://{grpc}")).await.expect("a connection");
        let request = request.clone();
        tasks.push(tokio::spawn(async move {
            let mut ok = 0;
            for _ in 0..per_client {
                let r = c.should_rate_limit(request.clone()).await.unwrap().into_inner();
                ok += usize::from(r.overall_code == Code::Ok as i32);
            }
            ok
        }));
    }
    let mut ok = 0;
    for t in tasks {
        ok += t.await.unwrap();
    }
    ok
}
