//! The running service: gRPC (`envoy.service.ratelimit.v3.RateLimitService` and
//! `grpc.health.v1.Health`), HTTP (`/healthcheck`, `POST /json`), the debug port (`/rlconfig`),
//! Prometheus (`/metrics`), and the configuration directory's watch.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use prometheus_client::registry::Registry;
use ratewell::Clock;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic_health::ServingStatus;

use crate::grpc::rate_limit_service_server::{RateLimitService as Grpc, RateLimitServiceServer};
use crate::memory::MemoryStore;
use crate::proto::{Code, RateLimitRequest, RateLimitResponse};
use crate::redis_store::RedisStore;
use crate::runtime;
use crate::service::{RateLimitService, Store};
use crate::settings::{LogLevel, Settings};
use crate::stats::StatsCollector;

/// The gRPC service's name, as health checks ask for it.
pub const SERVICE_NAME: &str = "envoy.service.ratelimit.v3.RateLimitService";

/// Log `message` at `level` if the settings' level lets it through.
fn log(settings: &Settings, level: LogLevel, message: impl std::fmt::Display) {
    if level >= settings.log_level {
        let tag = match level {
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
        };
        eprintln!("ratewell-rls {tag}: {message}");
    }
}

/// The gRPC handler.
struct Handler<C: Clock + Clone>(Arc<RateLimitService<C>>);

#[tonic::async_trait]
impl<C: Clock + Clone + Send + Sync + 'static> Grpc for Handler<C> {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        match self.0.should_rate_limit(request.get_ref()).await {
            Ok(response) => Ok(tonic::Response::new(response)),
            Err(e) => Err(e.into()),
        }
    }
}

/// A service started by [`start`]: its bound addresses, and the handle that stops it.
#[derive(Debug)]
pub struct Running<C: Clock + Clone> {
    /// The gRPC address.
    pub grpc: SocketAddr,
    /// The HTTP address (`/healthcheck`, `/json`).
    pub http: SocketAddr,
    /// The debug address (`/rlconfig`).
    pub debug: SocketAddr,
    /// The Prometheus address, when `USE_PROMETHEUS`.
    pub prometheus: Option<SocketAddr>,
    /// The service, for tests and embedding.
    pub service: Arc<RateLimitService<C>>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    /// `STATE_FILE`, written once more when the service stops.
    state: Option<(std::path::PathBuf, Arc<Settings>)>,
}

impl<C: Clock + Clone> Running<C> {
    /// Stop every listener and the watch, and wait for them; then write `STATE_FILE`.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
        if let Some((path, settings)) = &self.state {
            save_state(&self.service, path, settings);
        }
    }
}

/// Write the memory store's keys to `path`, logging the outcome.
fn save_state<C: Clock + Clone>(
    service: &RateLimitService<C>,
    path: &std::path::Path,
    settings: &Settings,
) {
    let Store::Memory(store) = service.store() else { return };
    match store.save(path) {
        Ok(keys) => log(
            settings,
            LogLevel::Debug,
            format!("STATE_FILE {}: {keys} keys written", path.display()),
        ),
        Err(e) => log(settings, LogLevel::Error, format!("STATE_FILE {}: {e}", path.display())),
    }
}

/// A new memory store, its keys restored from `STATE_FILE` if that file exists and can be
/// (else the counts start empty, and the reason is logged).
fn memory_store<C: Clock + Clone>(
    settings: &Settings,
    clock: C,
) -> std::io::Result<MemoryStore<C>> {
    let mut store = MemoryStore::new(settings.memory_capacity, clock)
        .map_err(|e| std::io::Error::other(format!("MEMORY_CAPACITY: {e}")))?;
    let Some(path) = &settings.state_file else { return Ok(store) };
    match std::fs::read(path) {
        Ok(bytes) => match store.restore(&bytes) {
            Ok(keys) => log(
                settings,
                LogLevel::Info,
                format!("STATE_FILE {}: {keys} keys restored", path.display()),
            ),
            Err(e) => log(
                settings,
                LogLevel::Warn,
                format!("STATE_FILE {}: {e}; the counts start empty", path.display()),
            ),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => log(
            settings,
            LogLevel::Warn,
            format!("STATE_FILE {}: {e}; the counts start empty", path.display()),
        ),
    }
    Ok(store)
}

/// Whether the service reports itself healthy: a configuration is in force (with
/// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`, one with at least one domain).
fn healthy<C: Clock + Clone>(service: &RateLimitService<C>, settings: &Settings) -> bool {
    let (loaded, has_domains) = service.config_state();
    loaded && (!settings.healthy_with_config || has_domains)
}

/// Start the service on `settings`' addresses (port 0 takes a free one), deciding on `clock`.
pub async fn start<C: Clock + Clone + Send + Sync + 'static>(
    settings: Settings,
    clock: C,
) -> std::io::Result<Running<C>> {
    let store = match &settings.redis {
        None => Store::Memory(memory_store(&settings, clock)?),
        Some(redis) => Store::Redis(
            RedisStore::connect(redis)
                .await
                .map_err(|e| std::io::Error::other(format!("redis: {e}")))?,
        ),
    };
    let service = Arc::new(RateLimitService::with_store(settings.service.clone(), store));
    for notice in &settings.notices {
        log(&settings, LogLevel::Warn, notice);
    }
    let mut last = None;
    load_counted(&service, &settings, &mut last);
    if !settings.force_start && !service.config_state().0 {
        log(
            &settings,
            LogLevel::Warn,
            "no configuration loaded: requests are answered `no rate limit configuration loaded` until one is",
        );
    }

    let (stop, stopped) = watch::channel(false);
    let (reporter, health) = tonic_health::server::health_reporter();
    let status = |ok: bool| if ok { ServingStatus::Serving } else { ServingStatus::NotServing };
    let initially = status(healthy(&service, &settings));
    reporter.set_service_status("", initially).await;
    reporter.set_service_status(SERVICE_NAME, initially).await;

    let grpc_listener = TcpListener::bind(settings.grpc).await?;
    let http_listener = TcpListener::bind(settings.http).await?;
    let debug_listener = TcpListener::bind(settings.debug).await?;
    let prometheus_listener = match &settings.prometheus {
        Some((addr, _)) => Some(TcpListener::bind(addr).await?),
        None => None,
    };
    let mut running = Running {
        grpc: grpc_listener.local_addr()?,
        http: http_listener.local_addr()?,
        debug: debug_listener.local_addr()?,
        prometheus: prometheus_listener.as_ref().map(TcpListener::local_addr).transpose()?,
        service: service.clone(),
        stop,
        tasks: Vec::new(),
        state: settings.state_file.clone().map(|path| (path, Arc::new(settings.clone()))),
    };
    if let Some((path, settings)) = running.state.clone() {
        let (service, mut stopped) = (service.clone(), stopped.clone());
        running.tasks.push(tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(settings.state_interval) => {}
                    _ = stopped.changed() => return,
                }
                let (service, path, settings) = (service.clone(), path.clone(), settings.clone());
                // A snapshot reads every key: off the runtime's workers.
                let _ = tokio::task::spawn_blocking(move || save_state(&service, &path, &settings))
                    .await;
            }
        }));
    }

    let grpc = tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .add_service(health)
        .add_service(RateLimitServiceServer::new(Handler(service.clone())));
    let incoming =
        tonic::transport::server::TcpIncoming::from(grpc_listener).with_nodelay(Some(true));
    let until = stopped_signal(stopped.clone());
    running.tasks.push(tokio::spawn(async move {
        let _ = grpc.serve_with_incoming_shutdown(incoming, until).await;
    }));

    let app = Router::new()
        .route("/healthcheck", get(healthcheck::<C>))
        .route("/json", post(json::<C>))
        .with_state((service.clone(), Arc::new(settings.clone())));
    running.tasks.push(serve(http_listener, app, stopped.clone()));

    let debug = Router::new()
        .route("/rlconfig", get(rlconfig::<C>))
        .with_state((service.clone(), Arc::new(settings.clone())));
    running.tasks.push(serve(debug_listener, debug, stopped.clone()));

    if let (Some(listener), Some((_, path))) = (prometheus_listener, &settings.prometheus) {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(StatsCollector(service.stats().clone())));
        let registry = Arc::new(registry);
        let app = Router::new().route(path, get(metrics)).with_state(registry);
        running.tasks.push(serve(listener, app, stopped.clone()));
    }

    // The watch: reload on change, and report health as it follows.
    let watched = service.clone();
    let mut stopped_watch = stopped.clone();
    running.tasks.push(tokio::spawn(async move {
        let mut was = initially;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(settings.reload_interval) => {}
                _ = stopped_watch.changed() => return,
            }
            // A few small files read at each interval: short enough to stay on this task.
            load_counted(&watched, &settings, &mut last);
            let now = status(healthy(&watched, &settings));
            if now != was {
                reporter.set_service_status("", now).await;
                reporter.set_service_status(SERVICE_NAME, now).await;
                was = now;
            }
        }
    }));
    Ok(running)
}

/// Read the configuration directory and, if it changed since the snapshot `last` digests, load
/// it: put in force, or refused (counted once per change, and logged), keeping the one in force.
fn load_counted<C: Clock + Clone>(
    service: &RateLimitService<C>,
    settings: &Settings,
    last: &mut Option<u64>,
) {
    let dir = settings.config_dir();
    let prefix = settings
        .runtime_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let files = runtime::read_dir(&dir, &prefix, settings.ignore_dotfiles);
    let digest = match &files {
        Ok(files) => runtime::digest(files),
        Err(_) => u64::MAX,
    };
    if *last == Some(digest) {
        return;
    }
    *last = Some(digest);
    let result =
        files.map_err(|e| format!("error reading {}: {e}", dir.display())).and_then(|files| {
            runtime::load(&files, settings.merge_domains)
                .map_err(|e| e.to_string())
                .map(|c| (c, files.len()))
        });
    match result {
        Ok((config, n)) => match service.set_config(config) {
            Ok(()) => log(
                settings,
                LogLevel::Info,
                format_args!("loaded {n} configuration files from {}", dir.display()),
            ),
            Err(e) => {
                log(settings, LogLevel::Error, format_args!("error loading new configuration: {e}"))
            }
        },
        Err(e) => {
            service.config_error();
            log(settings, LogLevel::Error, format_args!("error loading new configuration: {e}"));
        }
    }
}

async fn stopped_signal(mut stopped: watch::Receiver<bool>) {
    let _ = stopped.wait_for(|s| *s).await;
}

fn serve(listener: TcpListener, app: Router, stopped: watch::Receiver<bool>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).with_graceful_shutdown(stopped_signal(stopped)).await;
    })
}

type AppState<C> = (Arc<RateLimitService<C>>, Arc<Settings>);

async fn healthcheck<C: Clock + Clone + Send + Sync + 'static>(
    State((service, settings)): State<AppState<C>>,
) -> Response {
    if healthy(&service, &settings) {
        (StatusCode::OK, "OK").into_response()
    } else {
        StatusCode::INTERNAL_SERVER_ERROR.into_response()
    }
}

async fn json<C: Clock + Clone + Send + Sync + 'static>(
    State((service, settings)): State<AppState<C>>,
    body: Bytes,
) -> Response {
    let request = match crate::json::request(&body) {
        Ok(request) => request,
        Err(e) => {
            log(&settings, LogLevel::Debug, format_args!("/json: {e}"));
            return (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response();
        }
    };
    let response = match service.should_rate_limit(&request).await {
        Ok(response) => response,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
    };
    let status = match Code::try_from(response.overall_code) {
        Ok(Code::OverLimit) => StatusCode::TOO_MANY_REQUESTS,
        Ok(Code::Ok) => StatusCode::OK,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let body = crate::json::response(&response).to_string();
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

async fn rlconfig<C: Clock + Clone + Send + Sync + 'static>(
    State((service, _)): State<AppState<C>>,
) -> String {
    service.dump_config()
}

async fn metrics(State(registry): State<Arc<Registry>>) -> Response {
    let mut text = String::new();
    match prometheus_client::encoding::text::encode(&mut text, &registry) {
        Ok(()) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}
