//! `compare --log` on logs a real nginx wrote (Debian's, started here on a loopback port): the
//! `combined` format, and a `log_format` of its own with `$msec` and a request header as the
//! key, each giving the table of the same requests written as a trace.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use std::{fs, thread};

use common::{ratewell, scratch};

/// Debian's nginx (scripts/test installs it where it is missing).
fn nginx() -> PathBuf {
    ["/usr/sbin/nginx", "/usr/local/sbin/nginx", "/opt/homebrew/bin/nginx", "/usr/local/bin/nginx"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .expect("nginx is not installed: scripts/test installs it (Debian: apt-get install nginx)")
}

struct Running(Child, PathBuf);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let _ = &self.1;
    }
}

fn start(dir: &Path) -> (Running, u16) {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let d = dir.display();
    let conf = format!(
        "worker_processes 2;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
         events {{ worker_connections 256; }}\n\
         http {{\n\
             client_body_temp_path {d}/body; proxy_temp_path {d}/proxy;\n\
             fastcgi_temp_path {d}/fastcgi; uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;\n\
             log_format timed '$remote_addr [$msec] \"$request\" $status $body_bytes_sent key=$http_x_key';\n\
             server {{\n\
                 listen 127.0.0.1:{port};\n\
                 access_log {d}/combined.log combined;\n\
                 access_log {d}/timed.log timed;\n\
                 location / {{ return 200 \"ok\"; }}\n\
             }}\n\
         }}\n"
    );
    fs::write(dir.join("nginx.conf"), conf).unwrap();
    let prefix = format!("{d}/");
    let conf = format!("{d}/nginx.conf");
    let child = Command::new(nginx())
        .args(["-p", &prefix, "-c", &conf, "-e", &format!("{d}/error.log"), "-g", "daemon off;"])
        .stdin(Stdio::null())
        .spawn()
        .expect("start nginx");
    let running = Running(child, dir.to_path_buf());
    let until = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < until,
            "nginx did not listen: {}",
            fs::read_to_string(dir.join("error.log")).unwrap_or_default()
        );
        thread::sleep(Duration::from_millis(20));
    }
    (running, port)
}

/// One request on its own connection, its X-Key header `key`.
fn get(port: u16, key: &str) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(s, "GET /?k={key} HTTP/1.1\r\nHost: x\r\nX-Key: {key}\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
}

#[test]
fn logs_nginx_wrote_give_the_tables_of_their_requests() {
    let dir = scratch("nginx-logs");
    let (mut running, port) = start(&dir);
    // Bursts of 60 requests over 5 keys, a little over half a second apart: some straddle a
    // second's boundary, where whole seconds and milliseconds decide differently.
    for burst in 0..6 {
        for i in 0..60 {
            get(port, &format!("k{}", (i * 7 + burst) % 5));
        }
        thread::sleep(Duration::from_millis(550));
    }
    // nginx writes a line as each request ends; stop it, so that every line is on disk.
    let pid = fs::read_to_string(dir.join("nginx.pid")).unwrap();
    Command::new("kill").args(["-QUIT", pid.trim()]).status().unwrap();
    running.0.wait().unwrap();
    let (combined, timed) = (dir.join("combined.log"), dir.join("timed.log"));
    let timed_text = fs::read_to_string(&timed).unwrap();
    let lines: Vec<&str> = timed_text.lines().collect();
    assert_eq!(lines.len(), 360);
    assert_eq!(fs::read_to_string(&combined).unwrap().lines().count(), 360);
    // The requests, as the test reads them from the log: `$msec` and the X-Key header. (Both
    // logs have the same requests in the same order: nginx writes every log of a request.)
    let read: Vec<(u64, &str)> = lines
        .iter()
        .map(|l| {
            let msec = &l[l.find('[').unwrap() + 1..l.find(']').unwrap()];
            let (s, ms) = msec.split_once('.').unwrap();
            let t = s.parse::<u64>().unwrap() * 1000 + ms.parse::<u64>().unwrap();
            (t, l.rsplit_once("key=").unwrap().1)
        })
        .collect();
    let trace = |unit: u64, key: &dyn Fn(&str) -> String| -> PathBuf {
        let first = read[0].0 / unit * unit;
        let mut latest = 0;
        let csv: String = read
            .iter()
            .map(|&(t, k)| {
                // A line a request that ended later wrote first: decided at the latest time.
                latest = latest.max((t / unit * unit - first) * 1_000_000);
                format!("{latest},{}\n", key(k))
            })
            .collect();
        let path = dir.join(format!("trace-{unit}.csv"));
        fs::write(&path, csv).unwrap();
        path
    };
    let table = |out: &str| out.lines().skip(1).collect::<Vec<_>>().join("\n");
    let compare = |args: &[&str]| {
        let mut all = vec!["compare"];
        all.extend(args);
        all.extend(["--limit", "20/s"]);
        let run = ratewell(&all, "");
        assert_eq!(run.code, Some(0), "{args:?}: {}", run.err);
        run
    };
    let s = |p: &Path| p.to_str().unwrap().to_string();
    // combined: whole seconds, one client address.
    let want = compare(&[&s(&trace(1000, &|_| "127.0.0.1".into()))]);
    let got = compare(&[&s(&combined), "--log", "combined"]);
    assert_eq!(table(&got.out), table(&want.out));
    assert!(got.err.contains("times in whole seconds"), "{}", got.err);
    // The custom format: milliseconds, keyed by the header.
    let format = "$remote_addr [$msec] \"$request\" $status $body_bytes_sent key=$http_x_key";
    let want = compare(&[&s(&trace(1, &|k| k.to_string()))]);
    let got =
        compare(&[&s(&timed), "--log", "nginx", "--log-format", format, "--key", "$http_x_key"]);
    assert_eq!(table(&got.out), table(&want.out));
    assert!(got.err.contains("360 lines read, 360 requests"), "{}", got.err);
    assert!(got.err.contains("times in milliseconds"), "{}", got.err);
    let _ = fs::remove_dir_all(&dir);
}
