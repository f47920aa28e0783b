//! ratewell: an exact, lock-free, bounded-memory rate-limiter engine.
//!
//! ```
//! use ratewell::{Limiter, Policy};
//!
//! let policy: Policy = "leaky-bucket rate=10r/s burst=20 nodelay".parse()?;
//! let limiter = Limiter::new(&policy);
//! let decision = limiter.check();
//! if decision.is_admitted() {
//!     // serve
//! } else if let Some(seconds) = decision.retry_after_header() {
//!     // answer 429 with `Retry-After: {seconds}`
//!     let _ = seconds;
//! }
//! # Ok::<(), ratewell::PolicyError>(())
//! ```
//!
//! # Design
//!
//! Layers, each knowing only the ones below it: a [`Clock`] (the TSC via quanta by default); the
//! algorithms as pure functions of `(configuration, state word, now, cost)`; one compare-exchange
//! loop that applies a decision to an `AtomicU64`; the direct [`Limiter`] (one cache-padded word)
//! and the [`KeyedLimiter`] (a bounded, sharded table with no lock on the hot path: see its docs
//! and `src/keyed/table.rs` for the protocol); the [`Decision`] and its HTTP renderings; the [`Policy`]
//! grammar.
//!
//! # Guarantees
//!
//! - **Exact.** Rates are exact rationals, never floats; decisions follow `docs/SEMANTICS.md` to the
//!   nanosecond, and are tested against a naive reference model in rational arithmetic.
//! - **Atomic.** Concurrent decisions on one key are linearizable: the state word is updated by
//!   compare-exchange from the value the decision was computed from, so nothing is lost and never
//!   more is admitted than the policy allows.
//! - **Rejections are read-only.** A rejected request changes no state and writes no memory.
//! - **Safe with bad clocks.** A limiter decides at the running maximum of its clock's readings:
//!   a clock stepped back by any amount never mints capacity (time stands still until it catches
//!   up). See [`Clock::MONOTONIC`].
//! - **Answers a proxy can act on.** A [`Decision`] says what remains, when more quota comes
//!   ([`Decision::replenish_after_ns`]), when the key is full again, how long to wait after a
//!   rejection, and tells a full key table ([`Outcome::TableFull`]) from an over-limit request;
//!   it renders as `Retry-After` and the IETF `RateLimit` / `RateLimit-Policy` fields.
//! - **No panics on input.** Malformed policies are errors naming the token at fault; absurd
//!   parameters that the packed state cannot hold exactly are rejected at parse time.
//!
//! # Algorithms: which to pick
//!
//! | policy | promise | pick it when |
//! |--------|---------|--------------|
//! | `token-bucket capacity=B rate=R` (GCRA) | bursts up to `B`, then `R` on average, refilled continuously | the default for APIs: smooth, one word, O(1) |
//! | `token-bucket capacity=B refill=K every=I` | Envoy's local limiter: `K` tokens added at each multiple of `I` | matching Envoy, or refills on a visible schedule |
//! | `leaky-bucket rate=R burst=B [nodelay\|delay=D]` | nginx `limit_req`: `B+1` at once from idle, excess queued (delayed) or rejected | matching nginx; smoothing traffic to a backend |
//! | `fixed-window limit=N window=W` | at most `N` per window, but up to `2N` across a boundary | cheap quotas users can read ("100 per minute") |
//! | `sliding-window limit=N window=W` | Cloudflare's weighted estimate of the last `W` | near-sliding accuracy at fixed-window cost |
//! | `sliding-log limit=N window=W` | exactly at most `N` in any closed span of length `W` | exactness matters and `N` is small (memory `O(N)` per key) |
//!
//! # State layouts and idle horizons
//!
//! Each one-word algorithm documents its bit layout (in its module) and stores time modulo a
//! power of two, so no field overflows however long the process runs. Decisions are exact as long
//! as a key is not silent for longer than its layout's *idle horizon* ([`Policy::idle_horizon_ns`]):
//! 146 years for GCRA and leaky buckets whose period is a whole number of ns, 198 days for
//! `compat=nginx`, `2^(64 - bits(N) - 1)` windows for a fixed window. After a longer silence one
//! decision may be stricter than the specification, never looser. Configurations whose horizon
//! would be under 19.5 hours are rejected by the parser.
//!
//! # The pure decision
//!
//! [`WordPolicy`] is the decision itself, on a [`State`] word the caller stores: what the limiters
//! apply to their atomics, and what another store (or a simulation) applies to its own.
//!
//! # Configuration
//!
//! The crate has no features. The `ratewell_loom` cfg switches the atomics to loom's for the model checks in
//! `loom-tests/`.
//!
//! # Caveats
//!
//! - [`KeyedLimiter`] stores keys as 54-bit fingerprints: two distinct keys merge with probability
//!   at most about 2^-54 per pair sharing a bucket.
//! - Its capacity is fixed; beyond it, live keys are evicted (counted) or refused
//!   ([`OnFull::Refuse`]), after every reclaimable key has been reclaimed.
//! - The sliding log locks a mutex (per limiter, or per shard of the keyed table): its state is a
//!   list, not one word. Its memory grows with use, bounded by the capacity and the limit, and is
//!   reported by [`Metrics::memory_bytes`].
//! - The contract is `docs/SEMANTICS.md` in the repository.
#![deny(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

mod algorithms;
#[cfg(ratewell_broken_protocol)]
mod broken;
mod cas;
mod clock;
mod decision;
mod headers;
mod keyed;
mod layered;
mod limiter;
mod mem;
mod policy;
mod snapshot;
mod sync;
mod word;

pub use clock::{Clock, CoarseClock, ManualClock, QuantaClock, SharedClock};

pub use decision::{Decision, Outcome};
/// The shared table's lock and initialisation protocols, for the loom models; not part of the
/// API.
#[cfg(ratewell_loom)]
#[doc(hidden)]
pub use keyed::shared::protocol as shared_protocol;
pub use keyed::{Builder, CapacityError, Charge, KeyedLimiter, Metrics, OnFull, PolicyId, Request};
pub use keyed::{IpKey, IpPrefixes};
#[cfg(all(target_os = "linux", not(ratewell_loom)))]
pub use keyed::{SharedError, SharedInfo};
pub use layered::{
    Absent, KeyCountError, KeyHasher, Layer, LayerKey, LayeredDecision, LayeredLimiter,
    LayersError, MAX_LAYERS, OwnedReservation, Reservation,
};
pub use limiter::Limiter;
pub use mem::Region;
pub use policy::{Parameters, Policy, PolicyError};
pub use snapshot::{Restored, Resume, SnapshotError, SnapshotInfo};
pub use word::{Fields, LogPolicy, LogState, Nanos, State, WordPolicy};
