//! A real hyper server on an ephemeral loopback port, with the layer in front of a service that
//! answers 200 and counts its calls; and a real hyper client.
#![allow(dead_code, unreachable_pub)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use ratewell::Clock;
use ratewell_tower::RateLimitLayer;
use tokio::net::TcpListener;
use tower::{Layer, ServiceBuilder};

pub struct Server {
    pub addr: SocketAddr,
    /// Requests that reached the inner service.
    pub calls: Arc<AtomicUsize>,
}

impl Server {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

/// Serve `layer` over a counting 200 service; `with_peer`: put the connection's peer address in
/// every request's extensions (as a `SocketAddr`), as a server that knows its peers does.
pub async fn serve<C: Clock + Send + Sync + 'static>(
    layer: RateLimitLayer<C>,
    with_peer: bool,
) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    tokio::spawn(async move {
        loop {
            let Ok((stream, peer)) = listener.accept().await else { return };
            let counter = Arc::clone(&counter);
            let inner = tower::service_fn(move |_req: Request<Incoming>| {
                counter.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok")))) }
            });
            let service = ServiceBuilder::new()
                .map_request(move |mut req: Request<Incoming>| {
                    if with_peer {
                        req.extensions_mut().insert(peer);
                    }
                    req
                })
                .service(layer.layer(inner));
            tokio::spawn(async move {
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service))
                    .await;
            });
        }
    });
    Server { addr, calls }
}

pub type HttpClient = Client<HttpConnector, Empty<Bytes>>;

pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

pub fn http2_client() -> HttpClient {
    Client::builder(TokioExecutor::new()).http2_only(true).build_http()
}

pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }
}

pub async fn send(client: &HttpClient, request: Request<Empty<Bytes>>) -> Answer {
    let response = client.request(request).await.unwrap();
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Answer { status: parts.status, headers: parts.headers, body }
}

pub async fn get(client: &HttpClient, url: &str, headers: &[(&str, &[u8])]) -> Answer {
    let mut request = Request::get(url);
    for (name, value) in headers {
        request = request.header(*name, http::HeaderValue::from_bytes(value).unwrap());
    }
    send(client, request.body(Empty::new()).unwrap()).await
}

/// A Structured Field List, parsed by `sfv`: each item's string and its integer parameters.
pub fn sf_list(value: &str) -> Vec<(String, Vec<(String, i64)>)> {
    let list: sfv::List =
        sfv::Parser::new(value).parse().unwrap_or_else(|e| panic!("{value}: {e}"));
    list.iter()
        .map(|entry| {
            let sfv::ListEntry::Item(item) = entry else { panic!("{value}: an inner list") };
            let name = item.bare_item.as_string().expect("a string name").as_str().to_owned();
            let params = item
                .params
                .iter()
                .map(|(k, v)| {
                    let v =
                        v.as_integer().unwrap_or_else(|| panic!("{value}: {k} is not an integer"));
                    (k.as_str().to_owned(), i64::from(v))
                })
                .collect();
            (name, params)
        })
        .collect()
}

/// Parameter `key` of `item`.
pub fn param(item: &(String, Vec<(String, i64)>), key: &str) -> Option<i64> {
    item.1.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
}
