//! The parts of an Envoy rate limit service (`envoy.service.ratelimit.v3.RateLimitService`) that
//! read envoyproxy/ratelimit's configuration as that service reads it:
//!
//! - [`proto`]: the service's messages, field for field as Envoy's API declares them;
//! - [`xds`]: the xDS configuration client (`CONFIG_TYPE=GRPC_XDS_SOTW`), with its messages
//!   ([`xds_proto`]) and its generated gRPC client ([`xds_grpc`]);
//! - [`config`]: the YAML files (one per domain), checked with the Go service's error messages,
//!   and the lookup of a request descriptor's limit (exact values, wildcards in configuration
//!   order, key-only defaults; statistics keys with `detailed_metric`, `value_to_metric` and
//!   `share_threshold`);
//! - [`tls`]: TLS and mutual TLS on the gRPC server, with the certificate files re-read when
//!   they change.
//!
//! `tests/go_config.rs` ports envoyproxy/ratelimit's `test/config` suite case for case, with its
//! fixtures; the crate README lists each case and every difference.
//!
//! # Layout
//!
//! The sources are folders by concern, each owning its settings (read from the environment by
//! [`settings`], which imports them; no concern imports another's settings):
//! `configuration/` (the YAML files, the directory, xDS, `check`), `stores/` (memory, Redis, the
//! clock), `serving/` (the gRPC messages and service, TLS, HTTP and JSON, health), `telemetry/`
//! (statistics, statsd, Prometheus, tracing, logs) and `service/` (`ShouldRateLimit` itself).
//! `server.rs` wires them into the running service, and nothing in the crate imports it. The
//! modules below keep the paths they have always had.
#![forbid(unsafe_code)]

mod configuration;
mod env;
pub mod server;
pub mod service;
mod serving;
pub mod settings;
mod stores;
mod telemetry;

pub use configuration::xds::{grpc as xds_grpc, proto as xds_proto};
pub use configuration::{check, config, runtime, xds};
pub use serving::{grpc, json, proto, tls};
pub use stores::{clock, memory, redis as redis_store};
pub use telemetry::{logging, mapper, otel, stats, statsd};
