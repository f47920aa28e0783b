//! The HTTP routes: `GET /healthcheck` and `POST /json` on the HTTP port, `/rlconfig` on the
//! debug port, and Prometheus's page (`USE_PROMETHEUS`) on its own.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use ratewell::Clock;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::service::RateLimitService;
use crate::serving::health::Health;
use crate::serving::json;
use crate::serving::proto::Code;
use crate::telemetry::logging::{LogLevel, Logger};
use crate::telemetry::stats::{PROMETHEUS_CONTENT_TYPE, Stats};

/// What the routes read: the service, its health, and where to log.
pub(crate) struct Routes<C: Clock + Clone> {
    pub(crate) service: Arc<RateLimitService<C>>,
    pub(crate) health: Arc<Health>,
    pub(crate) log: Logger,
}

impl<C: Clock + Clone> Clone for Routes<C> {
    fn clone(&self) -> Self {
        Routes { service: self.service.clone(), health: self.health.clone(), log: self.log }
    }
}

impl<C: Clock + Clone + Send + Sync + 'static> Routes<C> {
    /// The HTTP port's routes: `/healthcheck` and `/json`.
    pub(crate) fn http(&self) -> Router {
        Router::new()
            .route("/healthcheck", get(healthcheck::<C>))
            .route("/json", post(json::<C>))
            .with_state(self.clone())
    }

    /// The debug port's: `/rlconfig`.
    pub(crate) fn debug(&self) -> Router {
        Router::new().route("/rlconfig", get(rlconfig::<C>)).with_state(self.clone())
    }
}

/// Prometheus's page at `path`, read live from `stats`.
pub(crate) fn metrics(path: &str, stats: Arc<Stats>) -> Router {
    Router::new().route(path, get(prometheus)).with_state(stats)
}

/// Serve `app` on `listener` until `stopped` turns true.
pub(crate) fn serve(
    listener: TcpListener,
    app: Router,
    stopped: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).with_graceful_shutdown(stopped_signal(stopped)).await;
    })
}

/// Ready once `stopped` reads true.
pub(crate) async fn stopped_signal(mut stopped: watch::Receiver<bool>) {
    let _ = stopped.wait_for(|s| *s).await;
}

async fn healthcheck<C: Clock + Clone + Send + Sync + 'static>(
    State(routes): State<Routes<C>>,
) -> Response {
    if routes.health.healthy(routes.service.config_state().1) {
        (StatusCode::OK, "OK").into_response()
    } else {
        StatusCode::INTERNAL_SERVER_ERROR.into_response()
    }
}

async fn json<C: Clock + Clone + Send + Sync + 'static>(
    State(routes): State<Routes<C>>,
    body: Bytes,
) -> Response {
    let request = match json::request(&body) {
        Ok(request) => request,
        Err(e) => {
            routes.log.log(LogLevel::Debug, format_args!("/json: {e}"));
            return (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response();
        }
    };
    let response = match routes.service.should_rate_limit(&request).await {
        Ok(response) => response,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
    };
    let status = match Code::try_from(response.overall_code) {
        Ok(Code::OverLimit) => StatusCode::TOO_MANY_REQUESTS,
        Ok(Code::Ok) => StatusCode::OK,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let body = json::response(&response).to_string();
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

async fn rlconfig<C: Clock + Clone + Send + Sync + 'static>(
    State(routes): State<Routes<C>>,
) -> String {
    routes.service.dump_config()
}

async fn prometheus(State(stats): State<Arc<Stats>>) -> Response {
    let text = stats.prometheus_text();
    ([(header::CONTENT_TYPE, PROMETHEUS_CONTENT_TYPE)], text).into_response()
}
