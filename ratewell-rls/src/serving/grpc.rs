//! The gRPC service `envoy.service.ratelimit.v3.RateLimitService`: the server and client that
//! tonic-build generates (see `build.rs`), and the server's handler over a
//! [`RateLimitService`](crate::service::RateLimitService).

#![allow(missing_docs, unreachable_pub, clippy::all)]
include!(concat!(env!("OUT_DIR"), "/envoy.service.ratelimit.v3.RateLimitService.rs"));
