//! A `redis-server` of the test's own, on a free loopback port in a temporary directory, and a
//! three-node cluster of them.
#![allow(dead_code, unreachable_pub)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The one line a machine without Redis gets, instead of a test that passes silently.
pub const HOW_TO_GET_REDIS: &str = "redis-server not found on PATH: run the tests with \
    `scripts/test`, which installs it where a package manager can, or install it yourself \
    (Debian/Ubuntu: `apt-get install redis-server`) and run them again";

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("a loopback port").local_addr().unwrap().port()
}

/// A running `redis-server`, killed (and its directory removed) on drop.
pub struct Server {
    pub port: u16,
    dir: PathBuf,
    child: Option<Child>,
    extra: Vec<String>,
}

impl Server {
    pub fn start() -> Server {
        Server::start_with(&[])
    }

    pub fn start_with(extra: &[&str]) -> Server {
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("ratewell-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let mut s =
            Server { port, dir, child: None, extra: extra.iter().map(|s| s.to_string()).collect() };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        let mut cmd = Command::new("redis-server");
        cmd.arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--enable-debug-command", "local"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!("{HOW_TO_GET_REDIS}"),
            Err(e) => panic!("redis-server did not start: {e}"),
        };
        self.child = Some(child);
        self.wait_ready();
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            // A server that asks for a password (`--requirepass`, ACL users) answers NOAUTH.
            let ready = |o: String| o.trim() == "PONG" || o.starts_with("NOAUTH");
            if self.cli(&["PING"]).map(ready).unwrap_or(false) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("redis-server on port {} did not answer PING within 10 s", self.port);
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `redis-cli -p PORT ARGS...`: its output.
    pub fn cli(&self, args: &[&str]) -> Option<String> {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .stderr(Stdio::null())
            .output()
            .ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        let ok =
            Command::new("kill").args([sig, &pid]).status().map(|s| s.success()).unwrap_or(false);
        assert!(ok, "kill {sig} {pid}");
    }

    /// SIGKILL: the server dies mid-run.
    pub fn kill(&mut self) {
        self.signal("-KILL");
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }

    /// Start again on the same port (an empty server: the state died with it).
    pub fn restart(&mut self) {
        self.spawn();
    }

    /// SIGSTOP, and wait until the process is stopped: the signal is delivered asynchronously,
    /// and from then on the server answers nothing.
    pub fn stop(&self) {
        self.signal("-STOP");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.stopped() {
            assert!(Instant::now() < deadline, "redis-server not stopped 20 s after SIGSTOP");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Whether the process is stopped by a signal: state `T` in `/proc/PID/stat` (Linux), or
    /// in `ps`'s `stat` column elsewhere.
    fn stopped(&self) -> bool {
        let pid = self.pid();
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            // `PID (COMM) STATE ...`: the state follows the last `)`.
            return stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('T'));
        }
        Command::new("ps")
            .args(["-o", "stat=", "-p", &pid.to_string()])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim_start().starts_with('T'))
    }

    pub fn resume(&self) {
        self.signal("-CONT");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill").args(["-CONT", &c.id().to_string()]).status();
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What decides on a test's server: the function library (the module not loaded), or the
/// native command of ratewell-redis-module (loaded with `--loadmodule`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    Library,
    Module,
}

/// Both paths: the tests that must hold on both run on each.
pub const PATHS: [Path; 2] = [Path::Library, Path::Module];

/// The module's shared object, built once (`cargo build -p ratewell-redis-module`: with
/// `--release` from an optimized build, the benchmarks').
pub fn module_path() -> &'static str {
    static PATH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut args =
            vec!["build", "--quiet", "-p", "ratewell-redis-module", "--message-format=json"];
        if !cfg!(debug_assertions) {
            args.push("--release");
        }
        let out = Command::new(cargo)
            .args(&args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .stderr(Stdio::inherit())
            .output()
            .expect("cargo");
        assert!(out.status.success(), "building ratewell-redis-module failed");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains("\"reason\":\"compiler-artifact\"") && l.contains("cdylib"))
            .find_map(|l| {
                let at = l.find("\"filenames\":[")? + "\"filenames\":[".len();
                l[at..]
                    .split('"')
                    .find(|f| f.ends_with(".so") || f.ends_with(".dylib"))
                    .map(str::to_string)
            })
            .expect("cargo named the module's shared object")
    })
}

impl Server {
    /// A server on `path`, with `extra` arguments.
    pub fn start_on(path: Path, extra: &[&str]) -> Server {
        match path {
            Path::Library => Server::start_with(extra),
            Path::Module => {
                let mut args = vec!["--loadmodule", module_path()];
                args.extend_from_slice(extra);
                Server::start_with(&args)
            }
        }
    }
}

/// Check that `metrics` show the calls on `path`: all to the module, or none.
pub fn assert_path(path: Path, metrics: ratewell_redis::Metrics) {
    assert!(metrics.calls > 0, "no call was made");
    match path {
        Path::Module => assert_eq!(metrics.module_calls, metrics.calls, "{metrics:?}"),
        Path::Library => assert_eq!(metrics.module_calls, 0, "{metrics:?}"),
    }
}

/// Three masters, slots spread by `redis-cli --cluster create`.
pub struct Cluster {
    pub nodes: Vec<Server>,
}

impl Cluster {
    pub fn start() -> Cluster {
        Cluster::start_on(Path::Library)
    }

    pub fn start_on(path: Path) -> Cluster {
        let nodes: Vec<Server> = (0..3)
            .map(|_| {
                Server::start_on(
                    path,
                    &["--cluster-enabled", "yes", "--cluster-node-timeout", "5000"],
                )
            })
            .collect();
        for n in &nodes {
            // Each node's cluster config file lives in its own directory.
            assert!(n.cli(&["PING"]).is_some());
        }
        let addrs: Vec<String> = nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("redis-cli");
        assert!(out.success(), "redis-cli --cluster create failed");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ok = nodes.iter().all(|n| {
                n.cli(&["CLUSTER", "INFO"]).is_some_and(|i| i.contains("cluster_state:ok"))
            });
            if ok {
                break;
            }
            assert!(Instant::now() < deadline, "the cluster did not reach cluster_state:ok");
            std::thread::sleep(Duration::from_millis(50));
        }
        Cluster { nodes }
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Server::url).collect()
    }
}

/// A small deterministic generator (xorshift64*), so that a failing sequence can be replayed
/// from its seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}
