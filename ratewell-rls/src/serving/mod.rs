//! What the service answers on: the rate limit service's messages ([`proto`]) and gRPC service
//! ([`grpc`]), TLS on the gRPC port ([`tls`]), the JSON form of `POST /json` ([`json`]), the
//! HTTP routes ([`http`]) and health ([`health`]).

pub mod grpc;
pub(crate) mod handler;
pub(crate) mod health;
pub(crate) mod http;
pub mod json;
pub mod proto;
pub mod tls;
