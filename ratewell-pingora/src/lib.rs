//! [ratewell] for [pingora]: exact limits, several per request (all or nothing), decided in a
//! proxy's `request_filter`, with the same keys, client addresses and answers as the tower
//! layer (both are [`ratewell_http`]).
//!
//! ```no_run
//! use async_trait::async_trait;
//! use pingora_core::upstreams::peer::HttpPeer;
//! use pingora_core::Result;
//! use pingora_http::ResponseHeader;
//! use pingora_proxy::{ProxyHttp, Session};
//! use ratewell_pingora::{Key, Limit, RateLimit, RateLimitCtx};
//!
//! struct Proxy {
//!     limit: RateLimit,
//! }
//!
//! #[async_trait]
//! impl ProxyHttp for Proxy {
//!     type CTX = RateLimitCtx;
//!     fn new_ctx(&self) -> RateLimitCtx {
//!         RateLimitCtx::default()
//!     }
//!     async fn request_filter(&self, session: &mut Session, ctx: &mut RateLimitCtx) -> Result<bool> {
//!         // Answered (429, 401) by the limiter itself: stop here.
//!         self.limit.check(session, ctx).await
//!     }
//!     async fn upstream_peer(&self, _: &mut Session, _: &mut RateLimitCtx) -> Result<Box<HttpPeer>> {
//!         Ok(Box::new(HttpPeer::new("127.0.0.1:9000", false, String::new())))
//!     }
//!     async fn response_filter(
//!         &self,
//!         _: &mut Session,
//!         response: &mut ResponseHeader,
//!         ctx: &mut RateLimitCtx,
//!     ) -> Result<()> {
//!         self.limit.decorate(response, ctx)
//!     }
//! }
//!
//! let limit = RateLimit::builder()
//!     .limit(Limit::new("ip", "token-bucket capacity=20 rate=10/s", Key::client_ip()))
//!     .build()
//!     .map(RateLimit::new)?;
//! # let _ = Proxy { limit };
//! # Ok::<(), ratewell_pingora::BuildError>(())
//! ```
//!
//! What it does with a request (the contract is `docs/SEMANTICS.md`, section "HTTP"):
//!
//! - **Rejected**: [`RateLimit::check`] writes the answer itself (429 with `Retry-After`,
//!   `RateLimit-Policy`, `RateLimit` and a problem-details body; over gRPC `grpc-status` 8) and
//!   returns `Ok(true)`, so pingora stops there. It never answers through an error: pingora's
//!   error path sends a bare status and logs every rejection as an error.
//! - **Admitted**: `Ok(false)`; [`RateLimit::decorate`] in `response_filter` adds the fields to
//!   the upstream's response.
//! - **Delayed** (a leaky bucket's `delay=N`): `check` waits on tokio's timer; a client that
//!   closes its connection meanwhile (a request without a body is watched while it waits), or a
//!   session pingora drops, gives the charge back.
//! - **The client** is the session's peer, or the rightmost untrusted address of a trusted
//!   proxy's `X-Forwarded-For` or `Forwarded` ([`TrustedProxies`]).
//!
//! A per-connection limit (pingora's `ConnectionFilter`) is not provided: it runs before TLS
//! and HTTP, under the `connection_filter` feature, and would see only the peer's address; a
//! [`Key::client_ip`] limit on requests covers that key with the answers a client can act on.
//!
//! [ratewell]: https://docs.rs/ratewell
//! [pingora]: https://github.com/cloudflare/pingora

#![forbid(unsafe_code)]

use std::sync::Arc;

use bytes::Bytes;
use pingora_core::{Error, ErrorType, Result};
use pingora_http::ResponseHeader;
use pingora_proxy::Session;
use ratewell::{Clock, QuantaClock};
use ratewell_http::{Fields, Head, HttpLimiter, Verdict};

pub use ratewell_http::{
    Absent, BuildError, Builder, ForwardedHeader, IpPrefixes, Key, KeyContext, KeyValue,
    LayerMetrics, Limit, Metrics, Policy, QUOTA_EXCEEDED, RATELIMIT, RATELIMIT_POLICY,
    TrustedProxies,
};

/// One or more limits on a pingora proxy's requests (see the [crate](self) documentation).
/// Cloning it shares one engine: every clone counts against the same budgets.
pub struct RateLimit<C: Clock = QuantaClock> {
    limiter: Arc<HttpLimiter<C>>,
}

impl<C: Clock> Clone for RateLimit<C> {
    fn clone(&self) -> Self {
        RateLimit { limiter: Arc::clone(&self.limiter) }
    }
}

impl<C: Clock> std::fmt::Debug for RateLimit<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimit").field("limiter", &self.limiter).finish()
    }
}

/// A request's part of the limiter's work: the fields its response gets. Keep one in the
/// proxy's `CTX` (or be it).
#[derive(Debug, Default)]
pub struct RateLimitCtx {
    fields: Fields,
}

impl RateLimit<QuantaClock> {
    /// A builder with no limit yet, on the TSC clock: [`ratewell_http::Builder`], whose
    /// [`build`](Builder::build) gives what [`new`](Self::new) takes.
    pub fn builder() -> Builder<QuantaClock> {
        HttpLimiter::builder()
    }
}

impl<C: Clock + Send + Sync + 'static> RateLimit<C> {
    /// The limits of `limiter`.
    pub fn new(limiter: HttpLimiter<C>) -> Self {
        RateLimit { limiter: Arc::new(limiter) }
    }

    /// Decide the session's request, in `request_filter`: `Ok(true)` if the limiter answered it
    /// (a rejection, an impossible request, a required key missing), which `request_filter`
    /// returns so that pingora stops; `Ok(false)` to proxy it, its response's fields kept in
    /// `ctx` for [`decorate`](Self::decorate). A delayed request returns after its delay; if
    /// the session is dropped first, its charge is given back.
    pub async fn check(&self, session: &mut Session, ctx: &mut RateLimitCtx) -> Result<bool> {
        let peer = session.client_addr().and_then(|a| a.as_inet()).map(|a| a.ip());
        let verdict = self.limiter.decide(Head::of_parts(session.req_header(), peer));
        match verdict {
            Verdict::Pass(fields) => {
                ctx.fields = fields;
                Ok(false)
            }
            Verdict::Delay { delay, reservation, headers } => {
                let waiting = Waiting { limiter: &self.limiter, reservation: Some(reservation) };
                let sleep = tokio::time::sleep(delay);
                tokio::pin!(sleep);
                // A request without a body is watched while it waits: a client that closes
                // the connection is not waiting any more, and its charge is given back. (One
                // with a body is not: watching would read its body.)
                let downstream = session.as_downstream_mut();
                if downstream.is_body_done() {
                    tokio::select! {
                        () = &mut sleep => {}
                        read = downstream.read_body_or_idle(true) => {
                            if let Err(e) = read {
                                drop(waiting);
                                return Err(e);
                            }
                            // Bytes of a pipelined next request: keep waiting.
                            sleep.await;
                        }
                    }
                } else {
                    sleep.await;
                }
                waiting.commit();
                ctx.fields = headers;
                Ok(false)
            }
            Verdict::Respond(answer) => {
                let (status, headers, body) = answer.into_parts();
                let mut response = ResponseHeader::build(status, Some(headers.len() + 1))?;
                for (name, value) in &headers {
                    response.insert_header(name.clone(), value.clone())?;
                }
                response.insert_header(http::header::CONTENT_LENGTH, body.len())?;
                let end = body.is_empty();
                session.write_response_header(Box::new(response), end).await?;
                if !end {
                    session.write_response_body(Some(Bytes::clone(&body)), true).await?;
                }
                Ok(true)
            }
        }
    }

    /// Add the `RateLimit-Policy` and `RateLimit` fields of the request's decision to the
    /// upstream's response, in `response_filter` (nothing if the builder turned them off).
    pub fn decorate(&self, response: &mut ResponseHeader, ctx: &mut RateLimitCtx) -> Result<()> {
        let fields = std::mem::take(&mut ctx.fields);
        for (name, value) in fields.pairs() {
            response.insert_header(name, value).map_err(|e| {
                Error::because(ErrorType::InternalError, "adding the RateLimit fields", e)
            })?;
        }
        Ok(())
    }

    /// What every request decided so far.
    pub fn metrics(&self) -> Metrics {
        self.limiter.metrics()
    }

    /// The limiter that decides (shared by every clone).
    pub fn http_limiter(&self) -> &Arc<HttpLimiter<C>> {
        &self.limiter
    }
}

/// A delayed request's charge: given back if dropped before [`commit`](Self::commit) (the
/// session went away while it waited).
struct Waiting<'a, C: Clock> {
    limiter: &'a HttpLimiter<C>,
    reservation: Option<Box<ratewell::OwnedReservation<C>>>,
}

impl<C: Clock> Waiting<'_, C> {
    fn commit(mut self) {
        if let Some(reservation) = self.reservation.take() {
            reservation.commit();
        }
    }
}

impl<C: Clock> Drop for Waiting<'_, C> {
    fn drop(&mut self) {
        if self.reservation.take().is_some() {
            // The reservation's own drop takes the charge back.
            self.limiter.delay_dropped();
        }
    }
}
