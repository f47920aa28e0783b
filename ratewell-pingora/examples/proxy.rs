//! A rate-limiting reverse proxy on pingora, with the tower example's command line (one parser:
//! `ratewell_http::proxy`): ratewell's limits decided in `request_filter`, the RateLimit fields
//! added in `response_filter`.
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
use ratewell_http::proxy::{ArgsError, Extras, ProxyArgs, usage};
use ratewell_pingora::{Absent, ForwardedHeader, Limit, RateLimit, RateLimitCtx, TrustedProxies};

/// The options this proxy serves beyond the common ones: the comparisons of `benches/`.
const EXTRAS: Extras = Extras { metrics: false, state: false, comparison: true };

const ABOUT: &str = "A rate-limiting reverse proxy on pingora (ratewell-pingora example).\n";

const NOTES: &str = "\
It prints 'listening on ADDR' before it serves. Rejected requests get 429 with Retry-After,
RateLimit-Policy, RateLimit and a problem-details body.
";

fn limit(o: &ProxyArgs) -> Result<RateLimit, String> {
    let trusted = TrustedProxies::new(&o.trusted).map_err(|e| e.to_string())?;
    let trusted = if o.forwarded { trusted.header(ForwardedHeader::Forwarded) } else { trusted };
    let mut builder = RateLimit::builder()
        .trusted_proxies(trusted)
        .dry_run(o.dry_run)
        .admitted_headers(o.headers);
    for arg in &o.limits {
        let mut limit = Limit::new(arg.name.clone(), &arg.policy, arg.key()?);
        if o.required.contains(&arg.name) {
            limit = limit.when_absent(Absent::Reject(StatusCode::UNAUTHORIZED));
        }
        builder = builder.limit(limit);
    }
    if let Some(name) = o.required.iter().find(|r| !o.limits.iter().any(|l| &l.name == *r)) {
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
    let options = match ProxyArgs::parse(std::env::args().skip(1), EXTRAS) {
        Ok(o) => o,
        Err(ArgsError::Help) => {
            print!("{ABOUT}\n{}\n{NOTES}", usage(EXTRAS));
            return ExitCode::SUCCESS;
        }
        Err(ArgsError::Invalid(e)) => {
            eprintln!("proxy: {e}\n(see --help)");
            return ExitCode::from(2);
        }
    };
    let limiter = match options.pingora_limits {
        Some(max) => {
            // pingora-limits counts in `isize`: a limit beyond it is no limit in practice.
            let max = isize::try_from(max).unwrap_or(isize::MAX);
            Limiter::PingoraLimits(Rate::new(std::time::Duration::from_secs(1)), max)
        }
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
