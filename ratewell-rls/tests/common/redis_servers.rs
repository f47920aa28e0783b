//! Redis processes of a test's own for the TLS, Sentinel and per-second tests: `redis-server`
//! over TLS (certificates made by rcgen), `redis-sentinel` with a configuration file of its own,
//! each on a free loopback port and killed on drop; `redis-cli` to reach them; and the service
//! in process on the real clock, so that a Redis setup's answers are compared with the memory
//! store's on the same requests.
//!
//! Included with `#[path = "common/redis_servers.rs"] mod redis_servers;` next to `mod common;`.
#![allow(dead_code, unreachable_pub)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ratewell_rls::clock::EpochClock;
use ratewell_rls::grpc::rate_limit_service_client::RateLimitServiceClient;
use ratewell_rls::proto::{RateLimitRequest, RateLimitResponse};
use ratewell_rls::server::{Running, start};
use ratewell_rls::settings::Settings;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use tonic::transport::Channel;

use crate::common::write_config;

/// The bound on every wait for a process (generous: the machine may be busy).
pub const WAIT: Duration = Duration::from_secs(30);

/// What a machine without Redis gets, instead of a test that passes silently.
pub fn missing(program: &str) -> String {
    format!(
        "{program} not found on PATH: install Redis 7 built with TLS (Debian/Ubuntu: \
         `apt-get install redis-server redis-sentinel redis-tools`) and run the tests again"
    )
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("a loopback port").local_addr().unwrap().port()
}

/// Poll `done` (a blocking check) until it holds; panics with `what` past `limit`.
pub fn poll(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A Redis process (`redis-server` or `redis-sentinel`) on `port`, its directory and how
/// `redis-cli` reaches it; killed on drop.
pub struct Process {
    pub port: u16,
    /// `redis-cli`'s arguments to reach it: `-h 127.0.0.1 -p PORT`, and the TLS files and
    /// password when it needs them.
    pub reach: Vec<String>,
    pub dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Process {
    /// Start `program args...` in `dir`, then wait until `redis-cli` (with `reach`) has its PONG
    /// (or `NOAUTH`, a server that asks for a password).
    pub fn spawn(
        program: &str,
        args: &[String],
        port: u16,
        reach: Vec<String>,
        dir: tempfile::TempDir,
    ) -> Process {
        let child = match Command::new(program)
            .args(args)
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
        {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!("{}", missing(program)),
            Err(e) => panic!("{program} did not start: {e}"),
        };
        let mut p = Process { port, reach, dir, child: Some(child) };
        let start = Instant::now();
        loop {
            let answer = p.cli_any(&["PING"]);
            if answer.trim() == "PONG" || answer.contains("NOAUTH") {
                break;
            }
            if let Some(status) = p.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("{program} {args:?} exited ({status}) before it answered PING: {answer}");
            }
            assert!(
                start.elapsed() < WAIT,
                "{program} on port {port} did not answer PING within {WAIT:?}: {answer:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        p
    }

    /// `redis-cli REACH ARGS...`: its standard output and error together (an error reply
    /// included), whatever its exit status.
    pub fn cli_any(&self, args: &[&str]) -> String {
        let out = match Command::new("redis-cli")
            .args(&self.reach)
            .args(args)
            .stdin(Stdio::null())
            .output()
        {
            Ok(o) => o,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                panic!("{}", missing("redis-cli"))
            }
            Err(e) => panic!("redis-cli: {e}"),
        };
        let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&out.stderr));
        text
    }

    /// `redis-cli REACH ARGS...`, which must answer without an error: its output.
    pub fn cli(&self, args: &[&str]) -> String {
        let text = self.cli_any(args);
        let upper = text.to_ascii_uppercase();
        assert!(
            !upper.starts_with("ERR")
                && !upper.contains("(ERROR)")
                && !upper.starts_with("NOAUTH")
                && !upper.starts_with("WRONGPASS")
                && !upper.contains("COULD NOT CONNECT"),
            "redis-cli {args:?} on port {}: {text}",
            self.port
        );
        text
    }

    /// A field of `INFO` (`role`, `master_port`, ...).
    pub fn info(&self, field: &str) -> Option<String> {
        let info = self.cli_any(&["INFO"]);
        info.lines().find_map(|l| l.strip_prefix(&format!("{field}:")).map(|v| v.trim().to_owned()))
    }

    /// The keys it holds (`--scan`), sorted.
    pub fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> =
            self.cli(&["--scan"]).lines().map(str::to_owned).filter(|k| !k.is_empty()).collect();
        keys.sort();
        keys
    }

    pub fn dbsize(&self) -> u64 {
        let out = self.cli(&["DBSIZE"]);
        out.trim().parse().unwrap_or_else(|_| panic!("DBSIZE on port {}: {out:?}", self.port))
    }

    /// `redis-cli MONITOR` on it, from now on: every command it runs, with its keys.
    pub fn monitor(&self) -> Monitor {
        let file = tempfile::NamedTempFile::new().unwrap();
        let child = Command::new("redis-cli")
            .args(&self.reach)
            .arg("MONITOR")
            .stdin(Stdio::null())
            .stdout(file.reopen().unwrap())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("redis-cli MONITOR: {e}"));
        let monitor = Monitor { child, file };
        // Its OK comes once the server has it as a monitor (redis-cli flushes each line).
        poll("redis-cli MONITOR started", WAIT, || monitor.text().starts_with("OK"));
        monitor
    }

    /// SIGKILL, and wait until it is gone.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `redis-cli MONITOR` on a server; killed on drop.
pub struct Monitor {
    child: Child,
    file: tempfile::NamedTempFile,
}

impl Monitor {
    /// What it has printed so far.
    pub fn text(&self) -> String {
        std::fs::read_to_string(self.file.path()).unwrap_or_default()
    }

    /// Stop it: what it printed.
    pub fn stop(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.text()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A plain `redis-server` on a free loopback port; `extra` on its command line and `password`
/// (its `requirepass`, or empty) for `redis-cli`.
pub fn redis_server(extra: &[&str], password: &str) -> Process {
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let mut args = base_args(&dir);
    args.extend(["--port".into(), port.to_string()]);
    args.extend(extra.iter().map(|s| s.to_string()));
    let mut reach = vec!["-h".into(), "127.0.0.1".into(), "-p".into(), port.to_string()];
    with_password(&mut reach, password);
    Process::spawn("redis-server", &args, port, reach, dir)
}

fn base_args(dir: &tempfile::TempDir) -> Vec<String> {
    let mut args: Vec<String> =
        ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--daemonize", "no"]
            .iter()
            .map(|s| s.to_string())
            .collect();
    args.extend(["--dir".into(), dir.path().display().to_string()]);
    args
}

fn with_password(reach: &mut Vec<String>, password: &str) {
    if !password.is_empty() {
        reach.extend(["-a".into(), password.into(), "--no-auth-warning".into()]);
    }
}

/// A certificate and key (PEM files) and the CA that issued it.
#[derive(Clone, Debug)]
pub struct CertFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Certificates for Redis over TLS, written to a temporary directory: a CA; a server
/// certificate for `localhost` and `127.0.0.1`, one for `localhost` only, and one for both from
/// another CA; a client certificate from the CA.
pub struct Pki {
    pub dir: tempfile::TempDir,
    /// The CA's certificate (`REDIS_TLS_CACERT`).
    pub ca: PathBuf,
    pub server: CertFiles,
    pub localhost_only: CertFiles,
    pub foreign: CertFiles,
    pub client: CertFiles,
}

struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

fn ca(name: &str) -> Ca {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.distinguished_name.push(DnType::CommonName, name);
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    Ca { pem: cert.pem(), issuer: Issuer::new(params, key) }
}

impl Pki {
    pub fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| -> PathBuf {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let main = ca("ratewell test CA");
        let other = ca("another CA");
        let ca_path = write("ca.pem", &main.pem);
        let other_path = write("other-ca.pem", &other.pem);
        let leaf = |ca: &Ca, ca_path: &Path, name: &str, sans: &[&str], client: bool| {
            let mut params =
                CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                    .unwrap();
            params.extended_key_usages = vec![if client {
                ExtendedKeyUsagePurpose::ClientAuth
            } else {
                ExtendedKeyUsagePurpose::ServerAuth
            }];
            params.distinguished_name.push(DnType::CommonName, sans[0]);
            let key = KeyPair::generate().unwrap();
            let cert = params.signed_by(&key, &ca.issuer).unwrap();
            CertFiles {
                ca: ca_path.to_owned(),
                cert: write(&format!("{name}.pem"), &cert.pem()),
                key: write(&format!("{name}.key"), &key.serialize_pem()),
            }
        };
        let server = leaf(&main, &ca_path, "server", &["localhost", "127.0.0.1"], false);
        let localhost_only = leaf(&main, &ca_path, "localhost", &["localhost"], false);
        let foreign = leaf(&other, &other_path, "foreign", &["localhost", "127.0.0.1"], false);
        let client = leaf(&main, &ca_path, "client", &["ratewell-client"], true);
        Pki { ca: ca_path, server, localhost_only, foreign, client, dir }
    }

    /// `REDIS_TLS_*` for the CA, the client certificate when `client_cert`, and
    /// `REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=skip_hostname`.
    pub fn env(&self, client_cert: bool, skip_hostname: bool) -> Vec<(String, String)> {
        let s = |p: &Path| p.display().to_string();
        let mut env = vec![
            ("REDIS_TLS_CACERT".to_owned(), s(&self.ca)),
            ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION".to_owned(), skip_hostname.to_string()),
        ];
        if client_cert {
            env.push(("REDIS_TLS_CLIENT_CERT".to_owned(), s(&self.client.cert)));
            env.push(("REDIS_TLS_CLIENT_KEY".to_owned(), s(&self.client.key)));
        }
        env
    }

    /// A `redis-server` that listens only over TLS (`--port 0 --tls-port P`) with `server` as
    /// its certificate, verifying clients against the CA and requiring their certificate when
    /// `auth_clients`; `extra` on its command line, `password` for `redis-cli`. Ready once
    /// `redis-cli --tls` (trusting `server`'s CA, with the client certificate) has its PONG.
    pub fn tls_server(
        &self,
        server: &CertFiles,
        auth_clients: bool,
        extra: &[&str],
        password: &str,
    ) -> Process {
        let port = free_port();
        let dir = tempfile::tempdir().unwrap();
        let s = |p: &Path| p.display().to_string();
        let mut args = base_args(&dir);
        args.extend(["--port".into(), "0".into(), "--tls-port".into(), port.to_string()]);
        args.extend(["--tls-cert-file".into(), s(&server.cert)]);
        args.extend(["--tls-key-file".into(), s(&server.key)]);
        args.extend(["--tls-ca-cert-file".into(), s(&self.ca)]);
        let auth = if auth_clients { "yes" } else { "no" };
        args.extend(["--tls-auth-clients".into(), auth.into()]);
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut reach = vec!["--tls".into(), "--cacert".into(), s(&server.ca)];
        reach.extend(["--cert".into(), s(&self.client.cert), "--key".into(), s(&self.client.key)]);
        reach.extend(["-h".into(), "127.0.0.1".into(), "-p".into(), port.to_string()]);
        with_password(&mut reach, password);
        let p = Process::spawn("redis-server", &args, port, reach, dir);
        // It speaks only TLS: a plain client has no answer.
        let plain = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "PING"])
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli");
        assert!(
            !String::from_utf8_lossy(&plain.stdout).contains("PONG"),
            "port {port} answered a plain PING"
        );
        p
    }
}

/// A `redis-sentinel` on a free loopback port monitoring `master` (`mymaster`, quorum 1) at
/// 127.0.0.1:`master_port` with `master_password`, asking its own clients for
/// `sentinel_password`; its configuration file (which it rewrites) in a directory of its own.
pub fn sentinel(
    master: &str,
    master_port: u16,
    master_password: &str,
    sentinel_password: &str,
) -> Process {
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "port {port}\n\
         bind 127.0.0.1\n\
         protected-mode no\n\
         daemonize no\n\
         dir {dir}\n\
         sentinel monitor {master} 127.0.0.1 {master_port} 1\n\
         sentinel auth-pass {master} {master_password}\n\
         sentinel down-after-milliseconds {master} 1000\n\
         sentinel failover-timeout {master} 5000\n\
         requirepass {sentinel_password}\n",
        dir = dir.path().display()
    );
    let file = dir.path().join("sentinel.conf");
    std::fs::write(&file, config).unwrap();
    let mut reach = vec!["-h".into(), "127.0.0.1".into(), "-p".into(), port.to_string()];
    with_password(&mut reach, sentinel_password);
    Process::spawn("redis-sentinel", &[file.display().to_string()], port, reach, dir)
}

/// The service in process on the real clock (the Redis store decides on the server's clock):
/// its configuration directory and a client.
pub struct Service {
    pub running: Running<EpochClock>,
    pub client: RateLimitServiceClient<Channel>,
    pub dir: tempfile::TempDir,
}

/// The settings `tests/common`'s `try_settings` makes, statsd off, or why they are refused.
pub fn try_settings(root: &Path, env: &[(&str, &str)]) -> Result<Settings, String> {
    let mut all = vec![("USE_STATSD", "false")];
    all.extend_from_slice(env);
    crate::common::try_settings(root, &all)
}

impl Service {
    /// Start with `config` (domain YAML) and `env`; the settings' refusal or the start's error
    /// as text. Bounded: a start that hangs is an error too.
    pub async fn start(config: &str, env: &[(&str, &str)]) -> Result<Service, String> {
        let dir = tempfile::tempdir().unwrap();
        write_config(dir.path(), &[("config.yaml", config)]);
        let settings = try_settings(dir.path(), env)?;
        let running = tokio::time::timeout(WAIT, start(settings, EpochClock::new()))
            .await
            .map_err(|_| format!("the start did not finish within {WAIT:?}"))?
            .map_err(|e| e.to_string())?;
        let client = RateLimitServiceClient::connect(format!("http://{}", running.grpc))
            .await
            .expect("a connection");
        Ok(Service { running, client, dir })
    }

    /// The memory store's service for `config`.
    pub async fn memory(config: &str) -> Service {
        Service::start(config, &[]).await.expect("the memory service starts")
    }

    /// One `ShouldRateLimit` call, summed up (bounded).
    pub async fn send(&mut self, request: &RateLimitRequest) -> Answer {
        let call = self.client.should_rate_limit(request.clone());
        let r = tokio::time::timeout(WAIT, call)
            .await
            .unwrap_or_else(|_| panic!("no answer within {WAIT:?}"));
        answer(r.map(|r| r.into_inner()))
    }
}

/// A status summed up: its code, its limit (requests per unit, unit) and remaining; not the
/// reset, which two clocks may see a second apart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    pub code: i32,
    pub limit: Option<(u32, i32)>,
    pub remaining: u32,
}

/// An answer summed up: the overall code and each status, or the gRPC error's code.
pub type Answer = Result<(i32, Vec<Status>), tonic::Code>;

pub fn answer(r: Result<RateLimitResponse, tonic::Status>) -> Answer {
    match r {
        Ok(r) => Ok((
            r.overall_code,
            r.statuses
                .iter()
                .map(|s| Status {
                    code: s.code,
                    limit: s.current_limit.as_ref().map(|l| (l.requests_per_unit, l.unit)),
                    remaining: s.limit_remaining,
                })
                .collect(),
        )),
        Err(e) => Err(e.code()),
    }
}

/// The overall code of `answer` (an error as -1 - its gRPC code).
pub fn code(answer: &Answer) -> i32 {
    match answer {
        Ok((code, _)) => *code,
        Err(e) => -1 - *e as i32,
    }
}

/// The overall codes of `answers`.
pub fn codes(answers: &[Answer]) -> Vec<i32> {
    answers.iter().map(code).collect()
}

/// `requests` answered by the memory store's service for `config`, started afresh.
pub async fn on_memory(config: &str, requests: &[RateLimitRequest]) -> Vec<Answer> {
    let mut memory = Service::memory(config).await;
    let mut out = Vec::new();
    for r in requests {
        out.push(memory.send(r).await);
    }
    out
}

/// The wall clock's second.
pub fn epoch_second() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
}
