//! The running service: gRPC (`envoy.service.ratelimit.v3.RateLimitService` and
//! `grpc.health.v1.Health`), HTTP (`/healthcheck`, `POST /json`), the debug port (`/rlconfig`),
//! Prometheus (`/metrics`), and the configuration directory's watch.

use std::net::SocketAddr;
use std::sync::Arc;

use ratewell::Clock;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic_health::ServingStatus;

use crate::configuration::config::RateLimitConfig;
use crate::configuration::runtime;
use crate::configuration::xds::{self, XdsApply, XdsLog};
use crate::service::{RateLimitService, Store};
use crate::serving::grpc::rate_limit_service_server::RateLimitServiceServer;
use crate::serving::handler::Handler;
pub use crate::serving::health::HEALTH_NAME;
use crate::serving::health::{HEALTH_NAMES, Health};
use crate::serving::http::{self, Routes, stopped_signal};
pub use crate::serving::proto::SERVICE_NAME;
use crate::serving::tls;
use crate::settings::{LogLevel, Settings};
use crate::stores::memory::MemoryStore;
use crate::stores::redis::RedisStore;
use crate::telemetry::logging::Logger;
use crate::telemetry::otel::Tracing;
use crate::telemetry::statsd;

/// How long a stop waits for the gRPC requests in flight, below Kubernetes' default grace
/// period of 30 s before SIGKILL: streams still open then (a health watch) are cut.
pub const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// The settings' log lines: `LOG_FORMAT` and `LOG_LEVEL`.
fn logger(settings: &Settings) -> Logger {
    Logger { json: settings.log_json, level: settings.log_level }
}

/// Log `message` at `level` if the settings' level lets it through.
fn log(settings: &Settings, level: LogLevel, message: impl std::fmt::Display) {
    logger(settings).log(level, message);
}

/// A service started by [`start`]: its bound addresses, and the handle that stops it.
#[derive(Debug)]
pub struct Running<C: Clock + Clone> {
    /// The gRPC address (unspecified, port 0, with `GRPC_UDS`).
    pub grpc: SocketAddr,
    /// `GRPC_UDS`: the unix socket the gRPC server listens on instead.
    pub grpc_uds: Option<std::path::PathBuf>,
    /// The HTTP address (`/healthcheck`, `/json`).
    pub http: SocketAddr,
    /// The debug address (`/rlconfig`).
    pub debug: SocketAddr,
    /// The Prometheus address, when `USE_PROMETHEUS`.
    pub prometheus: Option<SocketAddr>,
    /// The service, for tests and embedding.
    pub service: Arc<RateLimitService<C>>,
    stop: watch::Sender<bool>,
    /// The gRPC server's own stop, sent first: it finishes the requests in flight.
    grpc_stop: watch::Sender<bool>,
    grpc_task: Option<JoinHandle<()>>,
    /// Health: set to stopping first, so that it answers NOT_SERVING and `/healthcheck` 500
    /// from then on.
    health: Arc<Health>,
    reporter: tonic_health::server::HealthReporter,
    tasks: Vec<JoinHandle<()>>,
    /// `STATE_FILE`, written once more when the service stops.
    state: Option<(std::path::PathBuf, Arc<Settings>)>,
    /// `TRACING_ENABLED`: its queued spans are sent when the service stops.
    tracing: Option<Arc<Tracing>>,
}

impl<C: Clock + Clone> Running<C> {
    /// Stop as the Go service stops on SIGTERM: health turns NOT_SERVING (gRPC, every name) and
    /// `/healthcheck` answers 500 at once; the gRPC server stops taking connections and finishes
    /// the requests in flight (for at most [`DRAIN_TIMEOUT`]); then every other listener and the watch stop, and `STATE_FILE`
    /// is written; then the spans still queued (`TRACING_ENABLED`) are sent, waiting at most a
    /// few seconds for the collector.
    pub async fn stop(mut self) {
        self.health.drain();
        for name in HEALTH_NAMES {
            self.reporter.set_service_status(name, ServingStatus::NotServing).await;
        }
        let _ = self.grpc_stop.send(true);
        if let Some(mut task) = self.grpc_task.take() {
            // Bounded: a stream that never ends (a health watch) must not hold the exit.
            if tokio::time::timeout(DRAIN_TIMEOUT, &mut task).await.is_err() {
                task.abort();
            }
        }
        if let Some(path) = &self.grpc_uds {
            // As Go's listener does on close: the socket's file goes with it.
            let _ = std::fs::remove_file(path);
        }
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
        if let Some((path, settings)) = &self.state {
            save_state(&self.service, path, settings);
        }
        if let Some(tracing) = &self.tracing {
            tracing.shutdown().await;
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
    // Always said, whatever LOG_LEVEL: which store decides is what an operator must know.
    crate::telemetry::logging::emit(settings.log_json, "info", &settings.backend);
    for notice in &settings.notices {
        log(&settings, LogLevel::Warn, notice);
    }
    let mut last = None;
    // Over xDS the directory is not read (as in the Go service): the control plane's
    // configuration is the whole of it.
    if settings.xds.is_none() {
        load_counted(&service, &settings, &mut last);
    }
    if !settings.force_start && !service.config_state().0 {
        log(
            &settings,
            LogLevel::Warn,
            "no configuration loaded: requests are answered `no rate limit configuration loaded` until one is",
        );
    }

    let (stop, stopped) = watch::channel(false);
    let (grpc_stop, grpc_stopped) = watch::channel(false);
    // Over xDS without FORCE_START_WITHOUT_INITIAL_CONFIG, unhealthy until the control plane
    // answers (the Go service does not listen until then).
    let health = Arc::new(Health::new(
        settings.healthy_with_config,
        settings.xds.is_some() && !settings.force_start,
    ));
    let (reporter, health_service) = tonic_health::server::health_reporter();
    let status = |ok: bool| if ok { ServingStatus::Serving } else { ServingStatus::NotServing };
    let initially = status(health.healthy(service.config_state().1));
    for name in HEALTH_NAMES {
        reporter.set_service_status(name, initially).await;
    }
    // Read before a listener is bound: a bad certificate stops the start, as in Go.
    let tls = match &settings.tls {
        Some(tls) => Some(tls.load().map_err(|e| std::io::Error::other(format!("TLS: {e}")))?),
        None => None,
    };

    // GRPC_UDS: the gRPC server on a unix socket instead of GRPC_HOST:GRPC_PORT, as in Go.
    let (grpc_listener, grpc_unix) = match &settings.grpc_uds {
        Some(path) => (None, Some(bind_unix(path)?)),
        None => (Some(TcpListener::bind(settings.grpc).await?), None),
    };
    let http_listener = TcpListener::bind(settings.http).await?;
    let debug_listener = TcpListener::bind(settings.debug).await?;
    let prometheus_listener = match &settings.prometheus {
        Some((addr, _)) => Some(TcpListener::bind(addr).await?),
        None => None,
    };
    let mut running = Running {
        grpc: match &grpc_listener {
            Some(listener) => listener.local_addr()?,
            None => SocketAddr::from(([0, 0, 0, 0], 0)),
        },
        grpc_uds: settings.grpc_uds.clone(),
        http: http_listener.local_addr()?,
        debug: debug_listener.local_addr()?,
        prometheus: prometheus_listener.as_ref().map(TcpListener::local_addr).transpose()?,
        service: service.clone(),
        stop,
        grpc_stop,
        grpc_task: None,
        health: health.clone(),
        reporter: reporter.clone(),
        tasks: Vec::new(),
        state: settings.state_file.clone().map(|path| (path, Arc::new(settings.clone()))),
        tracing: None,
    };
    // Started once nothing else can fail: its batch task runs from here on.
    if let Some(tracing) = &settings.tracing {
        let logged = settings.clone();
        let failed: Arc<dyn Fn(String) + Send + Sync> =
            Arc::new(move |line| log(&logged, LogLevel::Warn, line));
        let started = Tracing::start(tracing, failed).map_err(std::io::Error::other)?;
        log(
            &settings,
            LogLevel::Info,
            format_args!(
                "tracing: spans sent over OTLP ({:?}) to {}, sampling rate {}, service.name {:?}, service.namespace {:?}, service.instance.id {:?}",
                tracing.protocol,
                tracing.endpoint,
                tracing.sampling_rate,
                tracing.service_name,
                tracing.service_namespace,
                tracing.service_instance_id
            ),
        );
        running.tracing = Some(Arc::new(started));
    }
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

    let (age, grace) = settings.grpc_max_connection_age;
    let grpc = tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .max_connection_age(age)
        .max_connection_age_grace(grace)
        .add_service(health_service)
        .add_service(RateLimitServiceServer::new(Handler(
            service.clone(),
            running.tracing.clone(),
        )));
    let until = stopped_signal(grpc_stopped);
    running.grpc_task = Some(match (tls, grpc_listener) {
        (_, None) => {
            let incoming =
                tokio_stream::wrappers::UnixListenerStream::new(grpc_unix.expect("GRPC_UDS bound"));
            tokio::spawn(async move {
                let _ = grpc.serve_with_incoming_shutdown(incoming, until).await;
            })
        }
        (Some(tls), Some(grpc_listener)) => {
            let logged = settings.clone();
            let incoming =
                tls::incoming(grpc_listener, tls, move |level, m| log(&logged, level, m));
            tokio::spawn(async move {
                let _ = grpc.serve_with_incoming_shutdown(incoming, until).await;
            })
        }
        (None, Some(grpc_listener)) => {
            let incoming =
                tonic::transport::server::TcpIncoming::from(grpc_listener).with_nodelay(Some(true));
            tokio::spawn(async move {
                let _ = grpc.serve_with_incoming_shutdown(incoming, until).await;
            })
        }
    });

    let routes =
        Routes { service: service.clone(), health: health.clone(), log: logger(&settings) };
    running.tasks.push(http::serve(http_listener, routes.http(), stopped.clone()));
    running.tasks.push(http::serve(debug_listener, routes.debug(), stopped.clone()));
    if let (Some(listener), Some((_, path))) = (prometheus_listener, &settings.prometheus) {
        let app = http::metrics(path, service.stats().clone());
        running.tasks.push(http::serve(listener, app, stopped.clone()));
    }
    if let Some(statsd) = settings.statsd.clone() {
        // Off the decisions' path: a task reads the counters at each flush.
        running.tasks.push(statsd::spawn(statsd, service.stats().clone(), stopped.clone()));
    }

    // Health follows a configuration put in force at once (over xDS), not at the next tick.
    let loaded = Arc::new(tokio::sync::Notify::new());
    if let Some(xds) = settings.xds.clone() {
        let (applied, merge, notify) = (service.clone(), settings.merge_domains, loaded.clone());
        let answered = health.clone();
        // The whole state of the world, loaded as the directory's files are: all or nothing.
        let apply: XdsApply = Arc::new(move |files| {
            let result = match RateLimitConfig::new(&files, merge) {
                Ok(config) => applied.set_config(config),
                Err(e) => {
                    applied.config_error();
                    Err(e.to_string())
                }
            };
            answered.answered();
            notify.notify_one();
            result
        });
        let logged = Arc::new(settings.clone());
        let log_fn: XdsLog = Arc::new(move |level, line| log(&logged, level, line));
        let client = xds::spawn(xds, apply, log_fn, stopped.clone());
        running.tasks.push(client.task);
    }

    // The watch: reload on change (the directory, unless over xDS), and report health as it
    // follows.
    let watched = service.clone();
    let mut stopped_watch = stopped.clone();
    running.tasks.push(tokio::spawn(async move {
        let mut was = initially;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(settings.reload_interval) => {}
                _ = loaded.notified() => {}
                _ = stopped_watch.changed() => return,
            }
            // A few small files read at each interval: short enough to stay on this task.
            if settings.xds.is_none() {
                load_counted(&watched, &settings, &mut last);
            }
            let now = status(health.healthy(watched.config_state().1));
            if now != was {
                for name in HEALTH_NAMES {
                    reporter.set_service_status(name, now).await;
                }
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

/// Listen on the unix socket at `path`. A socket left there by an earlier process (nothing
/// listens on it any more) is replaced; any other file there is an error, left as it is.
fn bind_unix(path: &std::path::Path) -> std::io::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    format!("GRPC_UDS={}: another process listens on it", path.display()),
                ));
            }
            std::fs::remove_file(path)?;
        }
        Ok(_) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("GRPC_UDS={}: a file that is not a socket is there", path.display()),
            ));
        }
        Err(_) => {}
    }
    tokio::net::UnixListener::bind(path)
        .map_err(|e| std::io::Error::new(e.kind(), format!("GRPC_UDS={}: {e}", path.display())))
}
