//! The gRPC handler of `ShouldRateLimit`: the service's answer, in a server span when tracing
//! is on (`TRACING_ENABLED`).

use std::sync::Arc;

use ratewell::Clock;

use crate::service::RateLimitService;
use crate::serving::grpc::rate_limit_service_server::RateLimitService as Grpc;
use crate::serving::proto::{RateLimitRequest, RateLimitResponse};
use crate::telemetry::otel::Tracing;

/// The handler: the service, and the tracing of its calls.
pub(crate) struct Handler<C: Clock + Clone>(
    pub(crate) Arc<RateLimitService<C>>,
    pub(crate) Option<Arc<Tracing>>,
);

#[tonic::async_trait]
impl<C: Clock + Clone + Send + Sync + 'static> Grpc for Handler<C> {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        if let Some(tracing) = &self.1 {
            let call = async {
                match self.0.should_rate_limit(request.get_ref()).await {
                    Ok(response) => Ok(tonic::Response::new(response)),
                    Err(e) => Err(e.into()),
                }
            };
            return tracing
                .should_rate_limit(request.metadata(), &request.get_ref().domain, call)
                .await;
        }
        match self.0.should_rate_limit(request.get_ref()).await {
            Ok(response) => Ok(tonic::Response::new(response)),
            Err(e) => Err(e.into()),
        }
    }
}
