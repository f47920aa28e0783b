//! A small rate-limiting reverse proxy: a hyper server in front of one HTTP upstream, with the
//! ratewell layer deciding every request before it is forwarded.
//!
//! ```text
//! cargo run --release -p ratewell-tower --example proxy -- \
//!     --listen 127.0.0.1:8080 --upstream 127.0.0.1:9000 \
//!     --policy 'token-bucket capacity=20 rate=10/s'
//! ```
//!
//! See `--help` for every option. `--metrics ADDR` serves Prometheus metrics with the
//! `prometheus` feature (`--features prometheus`); without it, the option is refused.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::ExitCode;
#[cfg(feature = "prometheus")]
use std::sync::Arc;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode, Uri};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
#[cfg(feature = "prometheus")]
use prometheus_client::encoding::prometheus_text;
#[cfg(feature = "prometheus")]
use prometheus_client::registry::Registry;
use ratewell_http::proxy::{ArgsError, Extras, ProxyArgs, usage};
use ratewell_tower::{Absent, BuildError, ForwardedHeader, Limit, RateLimitLayer, TrustedProxies};
use tokio::signal::unix::{SignalKind, signal};
use tower::{Layer, ServiceBuilder};

/// The options this proxy serves beyond the common ones (`--metrics` needs the `prometheus`
/// feature too: without it, `main` refuses it).
const EXTRAS: Extras = Extras { metrics: true, state: true, comparison: false };

const ABOUT: &str = "A rate-limiting reverse proxy (ratewell-tower example).\n";

const NOTES: &str = "\
It prints 'listening on ADDR' once it serves (then 'metrics on ADDR' with --metrics; port 0 in
either picks a free one, which ADDR names). Rejected requests get 429 with Retry-After,
RateLimit-Policy, RateLimit and a problem-details body; admitted ones are forwarded with the
client's address appended to X-Forwarded-For.
";

/// The layer, its keys restored from `--state` when that file exists and can be.
fn layer_with_state(o: &ProxyArgs) -> Result<RateLimitLayer, String> {
    let fresh = || layer(o, None).map_err(|(Unbuilt::Config(e) | Unbuilt::State(e))| e);
    let Some(path) = &o.state else { return fresh() };
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return fresh(),
        Err(e) => {
            eprintln!("proxy: --state {}: {e}; the limits start empty", path.display());
            return fresh();
        }
    };
    match layer(o, Some(bytes)) {
        Err(Unbuilt::State(e)) => {
            eprintln!("proxy: --state {}: {e}; the limits start empty", path.display());
            layer(o, None)
        }
        other => other,
    }
    .map_err(|(Unbuilt::Config(e) | Unbuilt::State(e))| e)
}

/// Why the layer was not built: its configuration, or the state it was to start from.
enum Unbuilt {
    Config(String),
    State(String),
}

fn layer(o: &ProxyArgs, state: Option<Vec<u8>>) -> Result<RateLimitLayer, Unbuilt> {
    let trusted = TrustedProxies::new(&o.trusted).map_err(|e| Unbuilt::Config(e.to_string()))?;
    let trusted = if o.forwarded { trusted.header(ForwardedHeader::Forwarded) } else { trusted };
    let mut builder = RateLimitLayer::builder()
        .trusted_proxies(trusted)
        .dry_run(o.dry_run)
        .admitted_headers(o.headers);
    for arg in &o.limits {
        let mut limit =
            Limit::new(arg.name.clone(), &arg.policy, arg.key().map_err(Unbuilt::Config)?);
        if o.required.contains(&arg.name) {
            limit = limit.when_absent(Absent::Reject(StatusCode::UNAUTHORIZED));
        }
        builder = builder.limit(limit);
    }
    if let Some(name) = o.required.iter().find(|r| !o.limits.iter().any(|l| &l.name == *r)) {
        return Err(Unbuilt::Config(format!("--require {name:?}: no such limit")));
    }
    if let Some(bytes) = state {
        builder = builder.restore(bytes);
    }
    builder.build().map_err(|e| match e {
        BuildError::Snapshot(_) => Unbuilt::State(e.to_string()),
        e => Unbuilt::Config(e.to_string()),
    })
}

/// Headers of one connection, not to be forwarded (RFC 9110 §7.6.1).
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "upgrade",
];

type Body = Either<Incoming, Full<Bytes>>;

async fn forward(
    client: Client<HttpConnector, Incoming>,
    upstream: String,
    mut request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let path = request.uri().path_and_query().map_or("/", |p| p.as_str());
    let uri: Uri = match format!("http://{upstream}{path}").parse() {
        Ok(uri) => uri,
        Err(_) => return Ok(status(StatusCode::BAD_REQUEST, "bad request target\n")),
    };
    *request.uri_mut() = uri;
    let peer = request.extensions().get::<SocketAddr>().map(SocketAddr::ip);
    let headers = request.headers_mut();
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    // Append the peer this proxy sees, as every proxy on the way does.
    if let Some(peer) = peer {
        let forwarded = match headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
            Some(before) => format!("{before}, {peer}"),
            None => peer.to_string(),
        };
        if let Ok(value) = HeaderValue::from_str(&forwarded) {
            headers.insert("x-forwarded-for", value);
        }
    }
    match client.request(request).await {
        Ok(mut response) => {
            for name in HOP_BY_HOP {
                response.headers_mut().remove(name);
            }
            Ok(response.map(Either::Left))
        }
        Err(_) => Ok(status(StatusCode::BAD_GATEWAY, "upstream unavailable\n")),
    }
}

/// `GET /metrics`: the registry in Prometheus's text format; anything else 404.
#[cfg(feature = "prometheus")]
async fn serve_metrics(listener: tokio::net::TcpListener, registry: Arc<Registry>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let registry = Arc::clone(&registry);
        let service = hyper::service::service_fn(move |request: Request<Incoming>| {
            let registry = Arc::clone(&registry);
            async move {
                if request.uri().path() != "/metrics" {
                    return Ok::<_, Infallible>(status(StatusCode::NOT_FOUND, "not found\n"));
                }
                let mut text = String::new();
                if prometheus_text::encode(&mut text, &registry).is_err() {
                    return Ok(status(StatusCode::INTERNAL_SERVER_ERROR, "cannot encode\n"));
                }
                let mut response = Response::new(Either::Right(Full::new(Bytes::from(text))));
                response.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
                );
                Ok(response)
            }
        });
        tokio::spawn(async move {
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn status(status: StatusCode, body: &'static str) -> Response<Body> {
    let mut response = Response::new(Either::Right(Full::new(Bytes::from_static(body.as_bytes()))));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    response
}

#[tokio::main]
async fn main() -> ExitCode {
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
    let limit = match layer_with_state(&options) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("proxy: {e}");
            return ExitCode::from(2);
        }
    };
    let listener = match tokio::net::TcpListener::bind(&options.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("proxy: cannot listen on {}: {e}", options.listen);
            return ExitCode::from(1);
        }
    };
    let local = listener.local_addr().expect("a bound listener has an address");
    #[cfg(not(feature = "prometheus"))]
    if options.metrics.is_some() {
        eprintln!(
            "proxy: --metrics needs the prometheus feature (cargo run -p ratewell-tower \
             --features prometheus --example proxy)"
        );
        return ExitCode::from(2);
    }
    let metrics = match &options.metrics {
        Some(addr) => match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => Some(l),
            Err(e) => {
                eprintln!("proxy: cannot serve metrics on {addr}: {e}");
                return ExitCode::from(1);
            }
        },
        None => None,
    };
    println!("listening on {local}");
    #[cfg(feature = "prometheus")]
    if let Some(metrics) = metrics {
        let at = metrics.local_addr().expect("a bound listener has an address");
        println!("metrics on {at}");
        let mut registry = Registry::default();
        registry.register_collector(Box::new(limit.collector()));
        tokio::spawn(serve_metrics(metrics, Arc::new(registry)));
    }
    #[cfg(not(feature = "prometheus"))]
    let _: Option<tokio::net::TcpListener> = metrics;
    let client: Client<HttpConnector, Incoming> =
        Client::builder(TokioExecutor::new()).build_http();
    if let Some(path) = options.state.clone() {
        let (limit, every) = (limit.clone(), options.state_interval);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.tick().await;
            loop {
                tick.tick().await;
                if let Err(e) = limit.save(&path) {
                    eprintln!("proxy: --state {}: {e}", path.display());
                }
            }
        });
    }
    let (mut terminate, mut interrupt) =
        match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
            (Ok(t), Ok(i)) => (t, i),
            (Err(e), _) | (_, Err(e)) => {
                eprintln!("proxy: cannot handle signals: {e}");
                return ExitCode::from(1);
            }
        };
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = terminate.recv() => break,
            _ = interrupt.recv() => break,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(_) => continue,
        };
        let (client, upstream) = (client.clone(), options.upstream.clone());
        let service = ServiceBuilder::new()
            .map_request(move |mut request: Request<Incoming>| {
                request.extensions_mut().insert(peer);
                request
            })
            .service(limit.layer(tower::service_fn(move |request| {
                forward(client.clone(), upstream.clone(), request)
            })));
        tokio::spawn(async move {
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service))
                .await;
        });
    }
    // A signal: keep the limits' keys for the next start.
    if let Some(path) = &options.state {
        match limit.save(path) {
            Ok(info) => {
                eprintln!("proxy: state of {} keys written to {}", info.keys, path.display())
            }
            Err(e) => {
                eprintln!("proxy: --state {}: {e}", path.display());
                return ExitCode::from(1);
            }
        }
    }
    ExitCode::SUCCESS
}
