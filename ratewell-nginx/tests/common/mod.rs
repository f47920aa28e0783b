//! Debian's real nginx with the module loaded, on a free loopback port, and a small HTTP/1.1
//! client for it.
//!
//! The module is `RATEWELL_NGINX_MODULE`'s, or built once by `scripts/nginx-module`; nginx is
//! `NGINX`'s, or `nginx` on the path (or in /usr/sbin). Without either the tests fail, saying
//! what is missing: they never pass without nginx.

#![allow(dead_code, unreachable_pub)] // each test file uses some of the helpers

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The module's path.
pub fn module() -> &'static Path {
    static MODULE: OnceLock<PathBuf> = OnceLock::new();
    MODULE.get_or_init(|| {
        if let Some(path) = std::env::var_os("RATEWELL_NGINX_MODULE") {
            return PathBuf::from(path);
        }
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/nginx-module");
        let out = Command::new(&script)
            .stderr(Stdio::inherit())
            .output()
            .unwrap_or_else(|e| panic!("{}: {e}", script.display()));
        assert!(out.status.success(), "scripts/nginx-module failed: see above");
        let text = String::from_utf8(out.stdout).unwrap();
        PathBuf::from(text.lines().last().expect("scripts/nginx-module prints the path"))
    })
}

/// The drop-in build's path: beside the module (`scripts/nginx-module` builds both).
pub fn drop_in() -> PathBuf {
    module().with_file_name("ngx_http_ratewell_limit_req_module.so")
}

/// The nginx binary.
pub fn nginx() -> PathBuf {
    if let Some(path) = std::env::var_os("NGINX") {
        return PathBuf::from(path);
    }
    let on_path = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain([PathBuf::from("/usr/sbin")])
        .map(|dir| dir.join("nginx"))
        .find(|path| path.is_file())
        .expect("no nginx: install Debian's (apt-get install nginx nginx-dev), or set NGINX")
}

/// A loopback port nobody listens on now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A running nginx, stopped (SIGQUIT, then SIGKILL) when dropped.
pub struct Nginx {
    pub dir: PathBuf,
    pub port: u16,
    module: PathBuf,
    child: Child,
}

/// The `http` block's lines every test's configuration shares: temporary paths in `dir`, no
/// access log, and a file to serve (a `return` ends a request before the preaccess phase).
fn config(dir: &Path, port: u16, workers: usize, http: &str, modules: &[&Path]) -> String {
    let d = dir.display();
    let load: String = modules.iter().map(|m| format!("load_module {};\n", m.display())).collect();
    format!(
        "{load}\
         worker_processes {workers};\n\
         pid {d}/nginx.pid;\n\
         error_log {d}/error.log info;\n\
         events {{ worker_connections 1024; }}\n\
         http {{\n\
             access_log off;\n\
             client_body_temp_path {d}/body; proxy_temp_path {d}/proxy;\n\
             fastcgi_temp_path {d}/fastcgi; uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;\n\
             {http}\n\
             server {{\n\
                 listen 127.0.0.1:{port} reuseport;\n\
                 root {d}/html;\n\
                 add_header X-Worker $pid always;\n\
                 SERVER\n\
             }}\n\
         }}\n"
    )
}

/// A fresh directory for one nginx.
fn scratch() -> PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("ratewell-nginx-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("html")).unwrap();
    std::fs::write(dir.join("html/index.html"), "ok\n").unwrap();
    dir
}

/// What `nginx -t` says of a configuration: its exit status and its messages.
pub fn test_config(http: &str, server: &str) -> (bool, String) {
    test_config_loading(&[module()], http, server)
}

/// What `nginx -t` says of a configuration loading `modules`.
pub fn test_config_loading(modules: &[&Path], http: &str, server: &str) -> (bool, String) {
    let dir = scratch();
    let conf = config(&dir, free_port(), 1, http, modules).replace("SERVER", server);
    std::fs::write(dir.join("nginx.conf"), conf).unwrap();
    let out = Command::new(nginx())
        .arg("-t")
        .args(["-p", &format!("{}/", dir.display())])
        .args(["-c", &dir.join("nginx.conf").display().to_string()])
        .args(["-e", &dir.join("error.log").display().to_string()])
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

impl Nginx {
    /// nginx with `workers` workers, the `http` block's lines `http` and the server's `server`.
    pub fn start(workers: usize, http: &str, server: &str) -> Nginx {
        Nginx::start_loading(module(), workers, http, server)
    }

    /// [`start`](Self::start), loading `module` (the drop-in build, say).
    pub fn start_loading(module: &Path, workers: usize, http: &str, server: &str) -> Nginx {
        let dir = scratch();
        let port = free_port();
        std::fs::write(
            dir.join("nginx.conf"),
            config(&dir, port, workers, http, &[module]).replace("SERVER", server),
        )
        .unwrap();
        let child = Command::new(nginx())
            .args(["-p", &format!("{}/", dir.display())])
            .args(["-c", &dir.join("nginx.conf").display().to_string()])
            .args(["-e", &dir.join("error.log").display().to_string()])
            .args(["-g", "daemon off;"])
            .stdin(Stdio::null())
            .spawn()
            .expect("nginx starts");
        let nginx = Nginx { dir, port, module: module.to_path_buf(), child };
        let until = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < until, "nginx did not listen: {}", nginx.error_log());
            std::thread::sleep(Duration::from_millis(20));
        }
        nginx.wait_for_workers(workers);
        nginx
    }

    /// The master's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The workers' pids (the master's children).
    pub fn workers(&self) -> Vec<u32> {
        let path = format!("/proc/{}/task/{}/children", self.pid(), self.pid());
        let text = std::fs::read_to_string(path).unwrap_or_default();
        text.split_whitespace().filter_map(|p| p.parse().ok()).collect()
    }

    fn wait_for_workers(&self, n: usize) {
        let until = Instant::now() + Duration::from_secs(20);
        while self.workers().len() < n {
            assert!(Instant::now() < until, "nginx started no {n} workers: {}", self.error_log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The error log so far.
    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("error.log")).unwrap_or_default()
    }

    /// Replace the configuration and reload (SIGHUP), waiting until the workers that served
    /// the old one have gone and `workers` new ones serve; false when nginx refused the new
    /// configuration (it logs why, and the old workers go on).
    pub fn reload(&self, workers: usize, http: &str, server: &str) -> bool {
        let old = self.workers();
        let conf =
            config(&self.dir, self.port, workers, http, &[&self.module]).replace("SERVER", server);
        std::fs::write(self.dir.join("nginx.conf"), conf).unwrap();
        let log_before = self.error_log().len();
        signal(self.pid(), "HUP");
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            let log = self.error_log();
            let fresh = &log[log_before.min(log.len())..];
            if fresh.contains("[emerg]") {
                return false;
            }
            let now = self.workers();
            if now.len() == workers && now.iter().all(|p| !old.contains(p)) {
                return true;
            }
            assert!(Instant::now() < until, "the reload did not finish: {fresh}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A new connection to it.
    pub fn client(&self) -> Client {
        Client::connect(self.port)
    }
}

/// Send `sig` to `pid` (with kill(1): the tests use no unsafe code).
pub fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill").arg(format!("-{sig}")).arg(pid.to_string()).status();
    assert!(status.is_ok_and(|s| s.success()), "kill -{sig} {pid}");
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg("-QUIT").arg(self.child.id().to_string()).status();
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            if let Ok(Some(_)) = self.child.try_wait() {
                let _ = std::fs::remove_dir_all(&self.dir);
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// nginx as a daemon of its own (the master detached, its pid in `nginx.pid`), as a binary
/// upgrade needs: the new binary is started by the running master, and a master whose parent
/// is the process that started it ignores SIGUSR2. Every master is stopped (SIGTERM) when
/// dropped.
pub struct Daemon {
    pub dir: PathBuf,
    pub port: u16,
}

impl Daemon {
    /// nginx with `workers` workers, `http` and `server` (as [`Nginx::start`]), by nginx's
    /// absolute path (a binary upgrade executes the path it was started by).
    pub fn start(workers: usize, http: &str, server: &str) -> Daemon {
        let daemon = Daemon { dir: scratch(), port: free_port() };
        daemon.configure(workers, http, server);
        let status = Command::new(nginx())
            .args(["-p", &format!("{}/", daemon.dir.display())])
            .args(["-c", &daemon.dir.join("nginx.conf").display().to_string()])
            .args(["-e", &daemon.dir.join("error.log").display().to_string()])
            .stdin(Stdio::null())
            .status()
            .expect("nginx starts");
        assert!(status.success(), "nginx did not start: {}", daemon.error_log());
        let until = Instant::now() + Duration::from_secs(20);
        while daemon.master().is_none_or(|m| children(m).len() < workers) {
            assert!(Instant::now() < until, "nginx started no workers: {}", daemon.error_log());
            std::thread::sleep(Duration::from_millis(20));
        }
        daemon
    }

    /// Write the configuration the next master (a binary upgrade's) reads.
    pub fn configure(&self, workers: usize, http: &str, server: &str) {
        let conf =
            config(&self.dir, self.port, workers, http, &[module()]).replace("SERVER", server);
        std::fs::write(self.dir.join("nginx.conf"), conf).unwrap();
    }

    /// The master's pid (`nginx.pid`), while it runs.
    pub fn master(&self) -> Option<u32> {
        Daemon::pid_in(&self.dir.join("nginx.pid"))
    }

    /// The old master's pid during a binary upgrade (`nginx.pid.oldbin`), while it runs.
    pub fn old_master(&self) -> Option<u32> {
        Daemon::pid_in(&self.dir.join("nginx.pid.oldbin"))
    }

    fn pid_in(path: &Path) -> Option<u32> {
        let pid = std::fs::read_to_string(path).ok()?.trim().parse().ok()?;
        alive(pid).then_some(pid)
    }

    /// The error log so far.
    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("error.log")).unwrap_or_default()
    }

    /// A new connection to it.
    pub fn client(&self) -> Client {
        Client::connect(self.port)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let masters: Vec<u32> = [self.master(), self.old_master()].into_iter().flatten().collect();
        for &pid in &masters {
            let _ = Command::new("kill").arg("-TERM").arg(pid.to_string()).status();
        }
        let until = Instant::now() + Duration::from_secs(10);
        while masters.iter().any(|&pid| alive(pid)) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether process `pid` runs (exists and is no zombie).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')))
}

/// The children of process `pid` (a master's workers, or a new binary's master).
pub fn children(pid: u32) -> Vec<u32> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"));
    text.unwrap_or_default().split_whitespace().filter_map(|p| p.parse().ok()).collect()
}

/// The zones' table files process `pid` holds open (`/memfd:ratewell_zone:NAME`), by name.
pub fn table_files(pid: u32) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy();
            let name = target.strip_prefix("/memfd:ratewell_zone:")?;
            Some(name.trim_end_matches(" (deleted)").to_string())
        })
        .collect();
    names.sort();
    names
}

/// One response: its status and headers (names in lower case).
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// The first value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// How many times header `name` came.
    pub fn count(&self, name: &str) -> usize {
        self.headers.iter().filter(|(n, _)| n == name).count()
    }
}

/// A keep-alive HTTP/1.1 connection.
pub struct Client {
    port: u16,
    reader: BufReader<TcpStream>,
}

impl Client {
    pub fn connect(port: u16) -> Client {
        let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to nginx");
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        Client { port, reader: BufReader::new(stream) }
    }

    /// GET `target` with the extra header lines `headers` ("Name: value\r\n" each).
    pub fn get_with(&mut self, target: &str, headers: &str) -> Response {
        let request = format!("GET {target} HTTP/1.1\r\nHost: localhost\r\n{headers}\r\n");
        if self.reader.get_mut().write_all(request.as_bytes()).is_err() {
            // nginx closed an idle keep-alive connection: once more on a new one.
            *self = Client::connect(self.port);
            self.reader.get_mut().write_all(request.as_bytes()).unwrap();
        }
        match self.read_response().unwrap() {
            Some(response) => response,
            None => {
                *self = Client::connect(self.port);
                self.get_with(target, headers)
            }
        }
    }

    /// GET `target`, or the error of a connection that broke (reconnected for the next).
    pub fn try_get(&mut self, target: &str) -> std::io::Result<Response> {
        let request = format!("GET {target} HTTP/1.1\r\nHost: localhost\r\n\r\n");
        let sent = self.reader.get_mut().write_all(request.as_bytes());
        let got = sent.and_then(|()| self.read_response()).and_then(|r| {
            r.ok_or_else(|| std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "closed"))
        });
        if got.is_err() {
            if let Ok(fresh) = TcpStream::connect(("127.0.0.1", self.port)) {
                fresh.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                self.reader = BufReader::new(fresh);
            }
        }
        got
    }

    /// GET every target, pipelined: written at once, so that nginx reads them in one go and
    /// decides them at one of its cached instants; the responses in order.
    pub fn pipelined(&mut self, targets: &[String]) -> Vec<Response> {
        let requests: String = targets
            .iter()
            .map(|t| format!("GET {t} HTTP/1.1\r\nHost: localhost\r\n\r\n"))
            .collect();
        self.reader.get_mut().write_all(requests.as_bytes()).unwrap();
        targets.iter().map(|_| self.read_response().unwrap().expect("a response")).collect()
    }

    /// The next response; `None` when the connection was closed before one began.
    fn read_response(&mut self) -> std::io::Result<Option<Response>> {
        let mut line = String::new();
        self.reader.read_line(&mut line)?;
        if line.is_empty() {
            return Ok(None);
        }
        let status = line.split(' ').nth(1).and_then(|s| s.parse().ok()).expect(&line);
        let mut headers = Vec::new();
        let mut length = 0;
        let mut close = false;
        loop {
            line.clear();
            self.reader.read_line(&mut line)?;
            let text = line.trim_end();
            if text.is_empty() {
                break;
            }
            let (name, value) = text.split_once(':').expect(text);
            let (name, value) = (name.to_ascii_lowercase(), value.trim().to_string());
            if name == "content-length" {
                length = value.parse().unwrap();
            }
            if name == "connection" && value.eq_ignore_ascii_case("close") {
                close = true;
            }
            headers.push((name, value));
        }
        let mut body = vec![0; length];
        self.reader.read_exact(&mut body)?;
        if close {
            *self = Client::connect(self.port);
        }
        Ok(Some(Response { status, headers, body }))
    }

    pub fn get(&mut self, target: &str) -> Response {
        self.get_with(target, "")
    }
}

/// `requests` GETs of `target(i)` from `connections` connections at once; the responses in
/// request order.
pub fn load(
    port: u16,
    connections: usize,
    requests: usize,
    target: impl Fn(usize) -> String + Sync,
) -> Vec<Response> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut out: Vec<(usize, Response)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..connections)
            .map(|_| {
                s.spawn(|| {
                    let mut client = Client::connect(port);
                    let mut got = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if i >= requests {
                            return got;
                        }
                        got.push((i, client.get(&target(i))));
                    }
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().unwrap()).collect()
    });
    out.sort_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, r)| r).collect()
}

/// How many of `responses` have status `status`.
pub fn with_status(responses: &[Response], status: u16) -> usize {
    responses.iter().filter(|r| r.status == status).count()
}

/// [`load`], tolerating connections that break (a worker killed): each request's response,
/// or `None` where its connection broke; `during(done)` runs beside the clients, `done` counting
/// the requests answered so far.
pub fn load_tolerant(
    port: u16,
    connections: usize,
    requests: usize,
    target: impl Fn(usize) -> String + Sync,
    during: impl FnOnce(&std::sync::atomic::AtomicUsize) + Send,
) -> Vec<Option<Response>> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let mut out: Vec<(usize, Option<Response>)> = std::thread::scope(|s| {
        let side = s.spawn(|| during(&done));
        let workers: Vec<_> = (0..connections)
            .map(|_| {
                s.spawn(|| {
                    let mut client = Client::connect(port);
                    let mut got = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= requests {
                            return got;
                        }
                        got.push((i, client.try_get(&target(i)).ok()));
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        let out = workers.into_iter().flat_map(|w| w.join().unwrap()).collect();
        side.join().unwrap();
        out
    });
    out.sort_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, r)| r).collect()
}

/// What one wrk run measured: requests answered, those not 2xx or 3xx, and its seconds.
#[derive(Debug)]
pub struct Wrk {
    pub requests: u64,
    pub non_2xx: u64,
    pub seconds: f64,
}

impl Wrk {
    /// Requests answered 2xx or 3xx a second.
    pub fn admitted_per_second(&self) -> f64 {
        (self.requests - self.non_2xx) as f64 / self.seconds
    }

    /// Requests answered a second.
    pub fn offered_per_second(&self) -> f64 {
        self.requests as f64 / self.seconds
    }
}

/// wrk (Debian's; `WRK` names another) on `url` with `args`, each connection writing `depth`
/// requests at once (HTTP/1.1 pipelining), at a lower priority than nginx's workers (`nice -n
/// 10`): where the load and nginx share the machine's cores, the load then waits for the workers,
/// not the workers for the load, as with clients on other machines. Fails, saying so, without
/// wrk.
pub fn wrk(url: &str, depth: usize, args: &[&str]) -> Wrk {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let script =
        std::env::temp_dir().join(format!("ratewell-nginx-wrk-{}-{n}.lua", std::process::id()));
    std::fs::write(
        &script,
        format!(
            "init = function(args)\n\
             \x20 local batch = {{}}\n\
             \x20 for i = 1, {depth} do batch[i] = wrk.format(nil) end\n\
             \x20 pipelined = table.concat(batch)\n\
             end\n\
             request = function() return pipelined end\n"
        ),
    )
    .unwrap();
    let bin = std::env::var("WRK").unwrap_or_else(|_| "wrk".to_string());
    let out = Command::new("nice")
        .args(["-n", "10", &bin])
        .args(args)
        .arg("-s")
        .arg(&script)
        .arg(url)
        .output()
        .unwrap_or_else(|e| panic!("no nice ({e})"));
    let _ = std::fs::remove_file(&script);
    assert!(out.status.code() != Some(127), "no wrk ({bin}): apt-get install wrk, or set WRK");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "wrk failed: {text}{said}");
    // "  284325 requests in 3.01s, 109.60MB read" and "  Non-2xx or 3xx responses: 256635".
    let line = text.lines().find(|l| l.contains(" requests in ")).expect(&text);
    let mut words = line.split_whitespace();
    let requests = words.next().and_then(|w| w.parse().ok()).expect(line);
    let seconds = words.nth(2).and_then(|w| w.trim_end_matches(',').strip_suffix('s'));
    let seconds = seconds.and_then(|w| w.parse().ok()).expect(line);
    let non_2xx = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Non-2xx or 3xx responses:"))
        .map_or(0, |n| n.trim().parse().unwrap());
    Wrk { requests, non_2xx, seconds }
}
