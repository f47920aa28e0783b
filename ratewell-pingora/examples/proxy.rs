//! A rate-limiting reverse proxy on pingora, with the tower example's command line: ratewell's
//! limits decided in `request_filter`, the RateLimit fields added in `response_filter`.
//!
//! ```text
//! cargo run --release --example proxy -- \
//!     --listen 127.0.0.1:8080 --upstream 127.0.0.1:9000 \
//!     --policy 'token-bucket capacity=20 rate=10/s'
//! ```
//!
//! `--pingora-limits N` decides with pingora-limits' `Rate` instead (at most N requests per
//! client address per second, as its own rate-limiter example does), for the comparison in
//! `benches/`. See `--help` for every option.

use std::process::ExitCode;

use async_trait::async_trait;
use http::StatusCode;
use pingora_core::Result;
use pingora_core::server::Server;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_http::ResponseHeader;
use pingora_limits::rate::Rate;
use pingora_proxy::{ProxyHttp, Session, http_proxy_service};
use ratewell_pingora::{
    Absent, ForwardedHeader, Key, Limit, RateLimit, RateLimitCtx, TrustedProxies,
};

const HELP: &str = "\
A rate-limiting reverse proxy on pingora (ratewell-pingora example).

usage: proxy --listen ADDR --upstream HOST:PORT [--policy POLICY] [--layer NAME:KEY:POLICY]...
             [--require NAME]... [--trusted-proxy CIDR]... [--forwarded] [--dry-run]
             [--no-headers] [--pingora-limits N | --no-limit]

  --listen ADDR            address to serve on (127.0.0.1:8080)
  --upstream HOST:PORT     the HTTP server requests are forwarded to
  --policy POLICY          a limit named \"ip\" per client address, in the policy grammar:
                           'token-bucket capacity=20 rate=10/s'
  --layer NAME:KEY:POLICY  a limit named NAME, keyed by KEY, one of
                             ip              the client address (IPv6 per /64)
                             header=NAME     a request header (an API key)
                             bearer          the token of 'Authorization: Bearer'
                             path            the request path
                             global          one budget for every request
                           Limits apply in order, all or nothing.
  --require NAME           answer 401 to a request without limit NAME's key (default: skip
                           the limit for that request)
  --trusted-proxy CIDR     a proxy in front of this one whose forwarding header names the client
                           (repeatable; the client is the rightmost untrusted address)
  --forwarded              read RFC 7239 'Forwarded' from trusted proxies, not X-Forwarded-For
  --dry-run                reject nothing; headers as if enforcing
  --no-headers             no RateLimit fields on admitted responses
  --pingora-limits N       no ratewell limit: pingora-limits' Rate, at most N requests per client
                           address per second (its example's limiter), for comparison
  --no-limit               no limit at all: the proxy alone, for comparison

It prints 'listening on ADDR' before it serves. Rejected requests get 429 with Retry-After,
RateLimit-Policy, RateLimit and a problem-details body.
";

struct Options {
    listen: String,
    upstream: String,
    limits: Vec<(String, String, String)>,
    required: Vec<String>,
    trusted: Vec<String>,
    forwarded: bool,
    dry_run: bool,
    headers: bool,
    pingora_limits: Option<isize>,
    no_limit: bool,
}

fn parse(args: impl Iterator<Item = String>) -> Result<Options, String> {
    let mut o = Options {
        listen: String::new(),
        upstream: String::new(),
        limits: Vec::new(),
        required: Vec::new(),
        trusted: Vec::new(),
        forwarded: false,
        dry_run: false,
        headers: true,
        pingora_limits: None,
        no_limit: false,
    };
    let mut args = args.peekable();
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--help" | "-h" => return Err(String::new()),
            "--listen" => o.listen = value()?,
            "--upstream" => o.upstream = value()?,
            "--policy" => o.limits.push(("ip".into(), "ip".into(), value()?)),
            "--layer" => {
                let spec = value()?;
                let mut parts = spec.splitn(3, ':');
                match (parts.next(), parts.next(), parts.next()) {
                    (Some(name), Some(key), Some(policy)) => {
                        o.limits.push((name.into(), key.into(), policy.into()))
                    }
                    _ => return Err(format!("--layer {spec:?}: expected NAME:KEY:POLICY")),
                }
            }
            "--require" => o.required.push(value()?),
            "--trusted-proxy" => o.trusted.push(value()?),
            "--forwarded" => o.forwarded = true,
            "--dry-run" => o.dry_run = true,
            "--no-headers" => o.headers = false,
            "--pingora-limits" => {
                let v = value()?;
                let n = v.parse::<isize>().ok().filter(|&n| n > 0);
                o.pingora_limits =
                    Some(n.ok_or(format!("--pingora-limits {v:?}: a positive count"))?);
            }
            "--no-limit" => o.no_limit = true,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if o.listen.is_empty() || o.upstream.is_empty() {
        return Err("--listen and --upstream are required".into());
    }
    let others = usize::from(o.pingora_limits.is_some()) + usize::from(o.no_limit);
    if o.limits.is_empty() && others == 0 {
        return Err("give at least one --policy or --layer".into());
    }
    if others + usize::from(!o.limits.is_empty()) > 1 {
        return Err("--pingora-limits, --no-limit and ratewell's limits (--policy, --layer) \
                    exclude each other"
            .into());
    }
    Ok(o)
}

fn key(spec: &str) -> Result<Key, String> {
    Ok(match spec {
        "ip" => Key::client_ip(),
        "bearer" => Key::bearer_token(),
        "path" => Key::path(),
        "global" => Key::global(),
        _ => match spec.strip_prefix("header=") {
            Some(name) => {
                Key::try_header(name).map_err(|e| format!("key {spec:?}: {name:?}: {e}"))?
            }
            None => {
                return Err(format!(
                    "unknown key {spec:?} (ip, header=NAME, bearer, path, global)"
                ));
            }
        },
    })
}

fn limit(o: &Options) -> Result<RateLimit, String> {
    let trusted = TrustedProxies::new(&o.trusted).map_err(|e| e.to_string())?;
    let trusted = if o.forwarded { trusted.header(ForwardedHeader::Forwarded) } else { trusted };
    let mut builder = RateLimit::builder()
        .trusted_proxies(trusted)
        .dry_run(o.dry_run)
        .admitted_headers(o.headers);
    for (name, key_spec, policy) in &o.limits {
        let mut limit = Limit::new(name.clone(), policy, key(key_spec)?);
        if o.required.contains(name) {
            limit = limit.when_absent(Absent::Reject(StatusCode::UNAUTHORIZED));
        }
        builder = builder.limit(limit);
    }
    if let Some(name) = o.required.iter().find(|r| !o.limits.iter().any(|(n, ..)| n == *r)) {
        return Err(format!("--require {name:?}: no such limit"));
    }
    builder.build().map(RateLimit::new).map_err(|e| e.to_string())
}

/// How the proxy limits: ratewell, pingora-limits' estimator, or not at all.
enum Limiter {
    Ratewell(RateLimit),
    Nothing,
    /// pingora-limits' `Rate` over 1 s windows and the most requests a client may make in one.
    PingoraLimits(Rate, isize),
}

struct Proxy {
    upstream: String,
    limiter: Limiter,
}

#[async_trait]
impl ProxyHttp for Proxy {
    type CTX = RateLimitCtx;

    fn new_ctx(&self) -> RateLimitCtx {
        RateLimitCtx::default()
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut RateLimitCtx) -> Result<bool> {
        match &self.limiter {
            Limiter::Ratewell(limit) => limit.check(session, ctx).await,
            Limiter::Nothing => Ok(false),
            Limiter::PingoraLimits(rate, max) => {
                // As pingora-limits' example: the estimate of this second's requests so far.
                let client = session.client_addr().and_then(|a| a.as_inet()).map(|a| a.ip());
                let seen = rate.observe(&client, 1);
                if seen <= *max {
                    return Ok(false);
                }
                let mut header = ResponseHeader::build(429, None)?;
                header.insert_header("X-Rate-Limit-Limit", max.to_string())?;
                header.insert_header("X-Rate-Limit-Remaining", "0")?;
                header.insert_header("X-Rate-Limit-Reset", "1")?;
                header.insert_header("Content-Length", "0")?;
                session.set_keepalive(None);
                session.write_response_header(Box::new(header), true).await?;
                Ok(true)
            }
        }
    }

    async fn upstream_peer(&self, _: &mut Session, _: &mut RateLimitCtx) -> Result<Box<HttpPeer>> {
        Ok(Box::new(HttpPeer::new(self.upstream.as_str(), false, String::new())))
    }

    async fn response_filter(
        &self,
        _: &mut Session,
        response: &mut ResponseHeader,
        ctx: &mut RateLimitCtx,
    ) -> Result<()> {
        match &self.limiter {
            Limiter::Ratewell(limit) => limit.decorate(response, ctx),
            Limiter::PingoraLimits(..) | Limiter::Nothing => Ok(()),
        }
    }
}

fn main() -> ExitCode {
    let options = match parse(std::env::args().skip(1)) {
        Ok(o) => o,
        Err(e) if e.is_empty() => {
            print!("{HELP}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("proxy: {e}\n(see --help)");
            return ExitCode::from(2);
        }
    };
    let limiter = match options.pingora_limits {
        Some(max) => Limiter::PingoraLimits(Rate::new(std::time::Duration::from_secs(1)), max),
        None if options.no_limit => Limiter::Nothing,
        None => match limit(&options) {
            Ok(limit) => Limiter::Ratewell(limit),
            Err(e) => {
                eprintln!("proxy: {e}");
                return ExitCode::from(2);
            }
        },
    };
    let mut server = match Server::new(None) {
        Ok(server) => server,
        Err(e) => {
            eprintln!("proxy: cannot start the server: {e}");
            return ExitCode::from(1);
        }
    };
    server.bootstrap();
    let proxy = Proxy { upstream: options.upstream.clone(), limiter };
    let mut service = http_proxy_service(&server.configuration, proxy);
    service.add_tcp(&options.listen);
    server.add_service(service);
    println!("listening on {}", options.listen);
    server.run_forever()
}
