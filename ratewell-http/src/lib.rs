//! The HTTP side of [ratewell]'s adapters: what the tower layer (`ratewell-tower`) and the
//! pingora one (`ratewell-pingora`) share, on the `http` crate's types, so that neither keeps a
//! copy of it.
//!
//! - **Client addresses** ([`TrustedProxies`]): the peer, or the rightmost untrusted address of a
//!   trusted proxy's `X-Forwarded-For` or RFC 7239 `Forwarded`; malformed and oversized headers
//!   fall back to the peer.
//! - **Keys** ([`Key`]): the client's network, a header, a bearer token, the path, one global
//!   key, or any function of the request ([`KeyContext`]).
//! - **Limits** ([`Limit`], [`Builder`]): several, decided all or nothing by the engine's
//!   `LayeredLimiter`, each skipped or answered 400/401 when its key is absent ([`Absent`]).
//! - **Answers** ([`HttpLimiter::decide`] → [`Verdict`]): forward (with the `RateLimit-Policy`
//!   and `RateLimit` fields, [`Fields`]), delay (a leaky bucket's, with a reservation refunded if
//!   the request is dropped), or respond ([`Ready`]: 429 with `Retry-After` and an RFC 9457
//!   problem-details body of the `quota-exceeded` type; over gRPC, `grpc-status` 8 and
//!   `grpc-retry-pushback-ms`).
//!
//! ```
//! use http::Request;
//! use ratewell_http::{Head, HttpLimiter, Key, Limit, Verdict};
//!
//! let limiter = HttpLimiter::builder()
//!     .limit(Limit::new("ip", "token-bucket capacity=2 rate=1/s", Key::client_ip()))
//!     .build()?;
//! let peer: std::net::IpAddr = "192.0.2.7".parse()?;
//! let request = Request::get("/").body(())?;
//! for _ in 0..2 {
//!     assert!(matches!(limiter.decide(Head { peer: Some(peer), ..Head::of(&request) }), Verdict::Pass(_)));
//! }
//! let Verdict::Respond(answer) = limiter.decide(Head { peer: Some(peer), ..Head::of(&request) }) else {
//!     panic!("the third request at once is over the burst");
//! };
//! assert_eq!(answer.status(), 429);
//! assert_eq!(answer.headers()["retry-after"], "1");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The contract is `docs/SEMANTICS.md`, section "HTTP".
//!
//! # Feature flags
//!
//! - `prometheus`: [`prometheus::LayerCollector`] and [`prometheus::LimiterCollector`],
//!   collectors of prometheus-client for the limiter's and the engine's metrics.
//! - `proxy`: [`proxy`], the command line of the example proxies of `ratewell-tower` and
//!   `ratewell-pingora` (one parser, [`proxy::ProxyArgs`], and its usage text); std only.
//!
//! [ratewell]: https://docs.rs/ratewell

#![forbid(unsafe_code)]

mod builder;
mod client_ip;
mod key;
mod limiter;
mod metrics;
#[cfg(feature = "prometheus")]
pub mod prometheus;
#[cfg(feature = "proxy")]
pub mod proxy;
mod response;

pub use builder::{BuildError, Builder, Limit};
pub use client_ip::{DEFAULT_MAX_FORWARDED_BYTES, ForwardedHeader, TrustedProxies};
pub use key::{Key, KeyContext, KeyValue};
pub use limiter::{Absent, Fields, Head, HttpLimiter, Verdict};
pub use metrics::{LayerMetrics, Metrics};
pub use ratewell::{IpPrefixes, Policy};
pub use response::{QUOTA_EXCEEDED, RATELIMIT, RATELIMIT_POLICY, Ready};
