//! ratewell's policies decided in a Redis (or Valkey) server that every instance of a service
//! shares: the same decisions as the in-process engine, made atomically in the server on its
//! clock, with the failure mode chosen on purpose, and leases that keep a hot key's decisions in
//! process.
//!
//! ```no_run
//! use std::time::Duration;
//! use ratewell_redis::{Failover, RedisLimiter};
//!
//! # async fn run() -> Result<(), ratewell_redis::Error> {
//! let limiter = RedisLimiter::builder("redis://127.0.0.1:6379")
//!     .layer("per-client", &"token-bucket capacity=20 rate=10/s".parse().unwrap())
//!     .timeout(Duration::from_millis(20))
//!     .failover(Failover::Local { instances: 4 })
//!     .build()
//!     .await?;
//! let verdict = limiter.check("client-42", 1).await;
//! if !verdict.is_admitted() {
//!     // 429, with verdict.decision().retry_after_header()
//! }
//! # Ok(()) }
//! ```
//!
//! # What the server computes
//!
//! `src/decide.lua` decides every algorithm of `docs/SEMANTICS.md` (and a layered request whose
//! keys share a hash slot) atomically: loaded as a function library and called with `FCALL`, or
//! as a script called with `EVALSHA` where the server has no `FUNCTION`. Decisions that arrive
//! while a call is in flight go together as the next call ([`Builder::batch`]), each decided as
//! a call of its own would be. Its numbers are doubles, exact to 2^53: the script's header
//! gives the argument, and a policy outside that domain (or with a window or fill interval that
//! is not a whole number of microseconds, the backend's resolution) is refused when the limiter is
//! built ([`DomainError`]). On times that are whole microseconds its decisions equal the engine's
//! field for field (`tests/parity.rs` checks every algorithm against `ratewell::Limiter`).
//!
//! # Keys
//!
//! The state of `key` on layer `name` is stored at `{prefix}{name}:{{key}}` (a key that carries its
//! own `{hash tag}` is used as it is), so one key's layers share a cluster slot and a layered
//! request is one script call. Each key expires when its state is fresh again. On a cluster,
//! layers whose keys fall in different slots are decided one slot after another, all or nothing:
//! a slot that rejects takes the earlier slots' charges back (refunds, as in process).
//!
//! # Failure
//!
//! A call that does not answer within the timeout, or a connection that is down, is decided by
//! the [`Failover`] chosen at build time, and says so ([`Verdict::source`], [`Metrics`]). After a
//! timeout the connection counts as down: later decisions fail over at once, without waiting,
//! while a background task probes the server with exponential backoff and brings it back. A
//! decision that timed out may still be applied by the server later (it was sent): that charge
//! then counts, so the shared limit errs on the side of admitting less.
//!
//! # Leases
//!
//! [`Leases`] keep a hot key's decisions in process: a lease charges `k` units to the shared key
//! as one ordinary decision of cost `k`, spends them with an atomic decrement, and refunds what
//! is left when it ends. The policy holds exactly across all instances; what leases cost is
//! under-admission, at most the units leased and not yet spent.
//!
//! # Feature flags
//!
//! - `tls`: [`Builder::tls`], TLS to the server, a cluster's nodes or the sentinels (rustls with
//!   its `ring` provider; the server's certificate checked against a CA given or the system's
//!   roots, a client certificate for a server that asks for one).
//! - `prometheus`: [`prometheus::RedisCollector`] (from [`RedisLimiter::collector`]) and
//!   [`prometheus::LeasesCollector`], collectors of prometheus-client for the limiter's and the
//!   leases' metrics.
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod batch;
mod builder;
mod conn;
mod error;
mod failover;
mod keys;
mod lease;
mod limiter;
mod metrics;
mod per_call;
#[cfg(feature = "prometheus")]
pub mod prometheus;
mod script;
mod target;
mod verdict;

pub use builder::Builder;
pub use error::Error;
pub use failover::Failover;
pub use lease::{LeaseMetrics, Leases};
pub use limiter::RedisLimiter;
pub use metrics::Metrics;
pub use per_call::{CallDecision, CallItem, CallPolicy, Mode, PerCallLimiter};
pub use script::DomainError;
pub use target::{Sentinel, Tls};
pub use verdict::{FailoverReason, Receipt, Source, Verdict};
