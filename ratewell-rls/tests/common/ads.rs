//! An ADS server for the xDS tests (the generated server trait, on 127.0.0.1): each stream the
//! client opens is handed to the test, which reads its requests and writes its responses. Every
//! wait is bounded.
#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::time::Duration;

use prost::Message;
use ratewell_rls::xds_grpc::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use ratewell_rls::xds_proto::{
    DiscoveryRequest, DiscoveryResponse, RATE_LIMIT_CONFIG_TYPE_URL, RateLimitConfig,
};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::{Server, ServerTlsConfig};

/// `config` as a resource of a response.
pub fn any(config: &RateLimitConfig) -> prost_types::Any {
    prost_types::Any { type_url: RATE_LIMIT_CONFIG_TYPE_URL.into(), value: config.encode_to_vec() }
}

/// A response of `version` and `nonce` whose resources are `resources`.
pub fn response(version: &str, nonce: &str, resources: Vec<prost_types::Any>) -> DiscoveryResponse {
    DiscoveryResponse {
        version_info: version.into(),
        resources,
        type_url: RATE_LIMIT_CONFIG_TYPE_URL.into(),
        nonce: nonce.into(),
        ..Default::default()
    }
}

/// How long a test waits for one request or stream.
pub const WAIT: Duration = Duration::from_secs(5);

/// One stream the client opened: its metadata, the client's certificates, its requests, and
/// where the test writes responses.
pub struct Stream {
    pub metadata: tonic::metadata::MetadataMap,
    pub peer_certs: usize,
    pub requests: tonic::Streaming<DiscoveryRequest>,
    pub responses: mpsc::UnboundedSender<Result<DiscoveryResponse, tonic::Status>>,
}

impl Stream {
    pub async fn request(&mut self) -> DiscoveryRequest {
        tokio::time::timeout(WAIT, self.requests.message())
            .await
            .expect("a request within the wait")
            .expect("no stream error")
            .expect("the stream is open")
    }

    pub fn send(&self, response: DiscoveryResponse) {
        self.responses.send(Ok(response)).expect("the stream is open");
    }
}

pub struct Ads(mpsc::UnboundedSender<Stream>);

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream =
        UnboundedReceiverStream<Result<DiscoveryResponse, tonic::Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: tonic::Request<tonic::Streaming<DiscoveryRequest>>,
    ) -> Result<tonic::Response<Self::StreamAggregatedResourcesStream>, tonic::Status> {
        let (tx, rx) = mpsc::unbounded_channel();
        let peer_certs = request.peer_certs().map_or(0, |c| c.len());
        let metadata = request.metadata().clone();
        let stream = Stream { metadata, peer_certs, requests: request.into_inner(), responses: tx };
        let _ = self.0.send(stream);
        Ok(tonic::Response::new(UnboundedReceiverStream::new(rx)))
    }
}

/// An ADS server on `listener`; it stops (dropping its connections) when `stop` fires.
pub struct AdsServer {
    pub addr: SocketAddr,
    streams: mpsc::UnboundedReceiver<Stream>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl AdsServer {
    pub async fn start(listener: TcpListener, tls: Option<ServerTlsConfig>) -> AdsServer {
        let addr = listener.local_addr().unwrap();
        let (tx, streams) = mpsc::unbounded_channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let mut builder = Server::builder();
        if let Some(tls) = tls {
            builder = builder.tls_config(tls).unwrap();
        }
        let router = builder.add_service(AggregatedDiscoveryServiceServer::new(Ads(tx)));
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let task = tokio::spawn(async move {
            let _ = router
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await;
        });
        AdsServer { addr, streams, stop: Some(stop), task }
    }

    pub async fn bind(tls: Option<ServerTlsConfig>) -> AdsServer {
        AdsServer::start(TcpListener::bind("127.0.0.1:0").await.unwrap(), tls).await
    }

    pub async fn stream(&mut self) -> Stream {
        self.stream_within(WAIT).await
    }

    /// The next stream, waiting at most `wait` for it.
    pub async fn stream_within(&mut self, wait: Duration) -> Stream {
        tokio::time::timeout(wait, self.streams.recv())
            .await
            .expect("a stream within the wait")
            .expect("the server runs")
    }

    /// Whether no stream opens within `wait`.
    pub async fn no_stream_for(&mut self, wait: Duration) -> bool {
        tokio::time::timeout(wait, self.streams.recv()).await.is_err()
    }

    /// Stop: no more connections, then `streams` end (a graceful shutdown waits for them), and
    /// the listener closes with the server's task.
    pub async fn shutdown(mut self, streams: Vec<Stream>) {
        let _ = self.stop.take().map(|s| s.send(()));
        drop(streams);
        tokio::time::timeout(WAIT, self.task).await.expect("the server stops").unwrap();
    }
}
