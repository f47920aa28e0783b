//! A [tower] layer that rate limits HTTP and gRPC requests with [ratewell]: exact, lock-free
//! limits, several per request (all or nothing), keyed by client address, header, path or any
//! rule, answered with a 429 that a client can act on.
//!
//! ```
//! use ratewell_tower::{Key, Limit, RateLimitLayer};
//!
//! let layer = RateLimitLayer::builder()
//!     // Everyone: 20 at once, then 10 a second, per client address (IPv6 per /64).
//!     .limit(Limit::new("ip", "token-bucket capacity=20 rate=10/s", Key::client_ip()))
//!     // Requests with an API key: 1000 a minute per key (skipped without one).
//!     .limit(Limit::new("api-key", "sliding-window limit=1000 window=1m", Key::header("x-api-key")))
//!     .build()?;
//! # Ok::<(), ratewell_tower::BuildError>(())
//! ```
//!
//! What it does with a request (the contract is `docs/SEMANTICS.md`, section "HTTP"):
//!
//! - **Decides in `call`**, never in `poll_ready`: a full limit is an answer to one request, not
//!   backpressure on a connection. Clones of the layer and its services share one engine, so
//!   every connection counts against the same budgets.
//! - **Keys** ([`Key`]): the client address (the peer, or the rightmost untrusted address of a
//!   trusted proxy's `X-Forwarded-For` / `Forwarded`: see [`TrustedProxies`]), a header, a bearer
//!   token, the path, one global key, or a closure. A limit whose key a request lacks is skipped,
//!   or answers 401/400 ([`Absent`]).
//! - **Rejected**: 429 (configurable) with `Retry-After` in whole seconds rounded up (at least
//!   1), `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers: one list item
//!   per limit) and an RFC 9457 problem-details body of the draft's `quota-exceeded` type
//!   naming the violated limits. A gRPC request (`application/grpc*`) gets `grpc-status` 8
//!   (RESOURCE_EXHAUSTED), the same fields, and `grpc-retry-pushback-ms`.
//! - **Impossible** (a cost above a limit's capacity): 429 (or the configured status) without
//!   `Retry-After`; over gRPC a pushback of -1 (do not retry).
//! - **Admitted**: the inner service's response, with `RateLimit-Policy` and `RateLimit`
//!   (configurable).
//! - **Delaying leaky bucket** (`leaky-bucket ... delay=N`): the request waits its delay (a tokio
//!   timer) before reaching the inner service; dropped while it waits, its charge is refunded.
//! - **Dry run**, of the whole layer or of one limit (its policy's `dry-run` flag): nothing is
//!   rejected; headers and [`Metrics`] are those of the decision.
//!
//! The HTTP logic (client addresses, keys, limits, answers) is [`ratewell_http`]'s, which the
//! pingora adapter shares; this crate is the tower side of it, and re-exports its types.
//!
//! # Feature flags
//!
//! - `prometheus`: [`prometheus::LayerCollector`] (from [`RateLimitLayer::collector`]) and
//!   [`prometheus::LimiterCollector`], collectors of prometheus-client for the layer's and the
//!   engine's metrics.
//!
//! [tower]: https://docs.rs/tower
//! [ratewell]: https://docs.rs/ratewell

#![forbid(unsafe_code)]

mod body;
mod builder;
mod clock;
#[cfg(feature = "prometheus")]
pub mod prometheus;
mod service;

pub use body::ResponseBody;
pub use builder::Builder;
pub use clock::TokioClock;
pub use ratewell_http::{
    Absent, BuildError, DEFAULT_MAX_FORWARDED_BYTES, ForwardedHeader, IpPrefixes, Key, KeyContext,
    KeyValue, LayerMetrics, Limit, Metrics, Policy, QUOTA_EXCEEDED, RATELIMIT, RATELIMIT_POLICY,
    TrustedProxies,
};
pub use service::{RateLimit, RateLimitLayer, ResponseFuture};
