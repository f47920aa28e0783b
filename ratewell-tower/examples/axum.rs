//! An axum service with three limits in one layer: every client address, each API key when a
//! request has one, and `/search` on its own budget.
//!
//! With no argument it serves on an ephemeral loopback port, sends itself a burst with a real
//! client, prints each answer and exits (CI runs it so). With `--serve ADDR` it serves until
//! killed (the wrk benchmarks in this crate's README run it so):
//!
//! ```text
//! cargo run --release -p ratewell-tower --example axum -- --serve 127.0.0.1:3000 \
//!     [--ip-policy P] [--key-policy P] [--search-policy P] [--key-capacity N] [--no-limit] [--no-headers]
//! curl -i http://127.0.0.1:3000/            # RateLimit-Policy, RateLimit
//! curl -i http://127.0.0.1:3000/metrics     # what the layer decided, per limit
//! ```

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::{ConnectInfo, State};
use axum::routing::get;
use ratewell_tower::{Key, KeyValue, Limit, RateLimitLayer};

struct Options {
    serve: Option<String>,
    ip: String,
    key: String,
    search: String,
    key_capacity: usize,
    limit: bool,
    headers: bool,
}

fn options() -> Result<Options, String> {
    let mut o = Options {
        serve: None,
        ip: "token-bucket capacity=20 rate=10/s".into(),
        key: "sliding-window limit=1000 window=1m".into(),
        search: "fixed-window limit=5 window=10s".into(),
        key_capacity: 100_000,
        limit: true,
        headers: true,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--serve" => o.serve = Some(value()?),
            "--ip-policy" => o.ip = value()?,
            "--key-policy" => o.key = value()?,
            "--search-policy" => o.search = value()?,
            "--key-capacity" => {
                o.key_capacity = value()?.parse().map_err(|e| format!("--key-capacity: {e}"))?
            }
            "--no-limit" => o.limit = false,
            "--no-headers" => o.headers = false,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(o)
}

fn limits(o: &Options) -> Result<RateLimitLayer, ratewell_tower::BuildError> {
    RateLimitLayer::builder()
        // axum puts the peer address in `ConnectInfo` (see `into_make_service_with_connect_info`).
        .peer_addr(|ext| ext.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip()))
        .admitted_headers(o.headers)
        .limit(Limit::new("ip", &o.ip, Key::client_ip()))
        .limit(Limit::new("api-key", &o.key, Key::header("x-api-key")).capacity(o.key_capacity))
        .limit(Limit::new(
            "search",
            &o.search,
            Key::from_fn(|cx| (cx.uri().path() == "/search").then_some(KeyValue::U64(0))),
        ))
        .build()
}

async fn metrics(State(layer): State<Option<RateLimitLayer>>) -> String {
    let Some(layer) = layer else { return "no limit\n".into() };
    let m = layer.metrics();
    let mut out = String::new();
    for l in &m.layers {
        out.push_str(&format!(
            "{}: admitted={} refunded={} rejected={} skipped={} keys={} capacity={} evictions={}\n",
            l.name, l.admitted, l.refunded, l.rejected, l.skipped, l.keys, l.capacity, l.evictions
        ));
    }
    out.push_str(&format!(
        "forwarded_untrusted={} forwarded_malformed={} missing_peer={}\n",
        m.forwarded_untrusted, m.forwarded_malformed, m.missing_peer
    ));
    out
}

fn app(layer: Option<RateLimitLayer>) -> Router {
    let routes = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route("/search", get(|| async { "results\n" }));
    let routes = match &layer {
        Some(layer) => routes.layer(layer.clone()),
        None => routes,
    };
    // Metrics are not limited.
    routes.merge(Router::new().route("/metrics", get(metrics)).with_state(layer))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let o = options().map_err(|e| format!("{e}\nusage: axum [--serve ADDR] [--ip-policy P] [--key-policy P] [--search-policy P] [--key-capacity N] [--no-limit] [--no-headers]"))?;
    let layer = if o.limit { Some(limits(&o)?) } else { None };
    let addr = o.serve.clone().unwrap_or_else(|| "127.0.0.1:0".into());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let local = listener.local_addr()?;
    let service = app(layer.clone()).into_make_service_with_connect_info::<SocketAddr>();
    let server = tokio::spawn(async move { axum::serve(listener, service).await });
    if o.serve.is_some() {
        println!("listening on {local}");
        server.await??;
        return Ok(());
    }

    // A burst against itself: 7 requests with an API key to /search (its budget is 5 per 10 s),
    // then one anonymous request to `/` (the API-key limit skips it).
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let mut statuses = Vec::new();
    for i in 0..8 {
        let (path, key) = if i < 7 { ("/search", Some("demo-key")) } else { ("/", None) };
        let mut request = http::Request::get(format!("http://{local}{path}"));
        if let Some(key) = key {
            request = request.header("x-api-key", key);
        }
        let response = client.request(request.body(http_body_util::Empty::new())?).await?;
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .map_or("-".to_owned(), |v| v.to_str().unwrap_or("?").to_owned())
        };
        println!(
            "GET {path:<8} {} RateLimit: {}{}",
            response.status().as_u16(),
            header("ratelimit"),
            if response.status() == 429 {
                format!("  Retry-After: {}", header("retry-after"))
            } else {
                String::new()
            }
        );
        statuses.push(response.status().as_u16());
    }
    println!(
        "RateLimit-Policy: {}",
        layer.as_ref().map_or(String::new(), |l| l.limiter().ratelimit_policy_field())
    );
    print!("{}", metrics(State(layer)).await);
    server.abort();
    tokio::time::sleep(Duration::from_millis(10)).await;
    if o.limit && statuses != [200, 200, 200, 200, 200, 429, 429, 200] {
        return Err(format!("unexpected statuses {statuses:?}").into());
    }
    Ok(())
}
