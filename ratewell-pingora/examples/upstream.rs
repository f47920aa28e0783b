//! A minimal upstream for the benchmarks: answers `200 ok` to every request, keeping
//! connections alive. `cargo run --release --example upstream -- ADDR` prints
//! `listening on ADDR`.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let addr = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:9000".into());
    let listener = tokio::net::TcpListener::bind(&addr).await.expect("bind the upstream");
    println!("listening on {}", listener.local_addr().expect("an address"));
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        tokio::spawn(async move {
            let service = hyper::service::service_fn(|_| async {
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
            });
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
