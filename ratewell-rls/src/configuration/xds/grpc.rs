//! The gRPC service `envoy.service.discovery.v3.AggregatedDiscoveryService`: the client and
//! server that tonic-build generates (see `build.rs`). The client is the xDS configuration
//! client's ([`crate::configuration::xds`]); the server is for tests and embedding.

#![allow(missing_docs, unreachable_pub, clippy::all)]
include!(concat!(env!("OUT_DIR"), "/envoy.service.discovery.v3.AggregatedDiscoveryService.rs"));
