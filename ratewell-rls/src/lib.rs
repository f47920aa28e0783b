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
#![forbid(unsafe_code)]

pub mod check;
pub mod clock;
pub mod config;
pub mod grpc;
pub mod json;
pub mod logging;
pub mod mapper;
pub mod memory;
mod metadata;
pub mod otel;
pub mod proto;
pub mod redis_store;
pub mod runtime;
pub mod server;
pub mod service;
pub mod settings;
pub mod stats;
pub mod statsd;
pub mod tls;
pub mod xds;
pub mod xds_grpc;
pub mod xds_proto;
