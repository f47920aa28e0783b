//! Building a [`RateLimitLayer`]: [`RateLimitLayer::builder`] to start,
//! [`ratewell_http::Builder`]'s settings, and a layer at the end.

use std::net::IpAddr;

use http::{Extensions, StatusCode};
use ratewell::{Clock, IpPrefixes, QuantaClock, Resume};
use ratewell_http::{BuildError, KeyContext, Limit, TrustedProxies};

use crate::service::RateLimitLayer;

/// The configuration of a [`RateLimitLayer`]; see [`RateLimitLayer::builder`]. Each setting is
/// [`ratewell_http::Builder`]'s, which documents it.
#[derive(Debug)]
pub struct Builder<C: Clock = QuantaClock>(ratewell_http::Builder<C>);

impl Builder<QuantaClock> {
    pub(crate) fn new() -> Self {
        Builder(ratewell_http::HttpLimiter::builder())
    }
}

impl RateLimitLayer<QuantaClock> {
    /// A builder with no limit yet, on the TSC clock.
    pub fn builder() -> Builder<QuantaClock> {
        Builder::new()
    }
}

impl<C: Clock + Send + Sync + 'static> Builder<C> {
    /// Add a limit. Limits are decided in order, all or nothing: a request passes only if every
    /// limit whose key it has admits it, and is then charged on each.
    pub fn limit(self, limit: Limit) -> Self {
        Builder(self.0.limit(limit))
    }

    /// The proxies whose forwarding header names the client ([`TrustedProxies`]).
    pub fn trusted_proxies(self, proxies: TrustedProxies) -> Self {
        Builder(self.0.trusted_proxies(proxies))
    }

    /// How much of a client's address [`Key::client_ip`](crate::Key::client_ip) keys by.
    pub fn client_prefixes(self, prefixes: IpPrefixes) -> Self {
        Builder(self.0.client_prefixes(prefixes))
    }

    /// Where the connection's peer address is found in a request's extensions (by default a
    /// `SocketAddr` or an `IpAddr` extension; under axum, its `ConnectInfo`):
    ///
    /// ```
    /// use std::net::SocketAddr;
    /// use axum::extract::ConnectInfo;
    ///
    /// let builder = ratewell_tower::RateLimitLayer::builder()
    ///     .peer_addr(|ext| ext.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip()));
    /// ```
    pub fn peer_addr<F>(self, f: F) -> Self
    where
        F: Fn(&Extensions) -> Option<IpAddr> + Send + Sync + 'static,
    {
        Builder(self.0.peer_addr(f))
    }

    /// What a request costs (1 by default).
    pub fn cost<F>(self, f: F) -> Self
    where
        F: Fn(KeyContext<'_>) -> u32 + Send + Sync + 'static,
    {
        Builder(self.0.cost(f))
    }

    /// The status of a rejection (429 by default).
    pub fn rejection_status(self, status: StatusCode) -> Self {
        Builder(self.0.rejection_status(status))
    }

    /// The status of an impossible request (429 by default).
    pub fn impossible_status(self, status: StatusCode) -> Self {
        Builder(self.0.impossible_status(status))
    }

    /// Whether admitted responses carry `RateLimit-Policy` and `RateLimit` (yes by default).
    pub fn admitted_headers(self, on: bool) -> Self {
        Builder(self.0.admitted_headers(on))
    }

    /// Reject nothing; headers and metrics as if enforcing.
    pub fn dry_run(self, on: bool) -> Self {
        Builder(self.0.dry_run(on))
    }

    /// Decide on another clock (the engine's `ManualClock` in tests, or
    /// [`TokioClock`](crate::TokioClock) to follow tokio's, paused or not).
    pub fn clock<C2: Clock + Send + Sync + 'static>(self, clock: C2) -> Builder<C2> {
        Builder(self.0.clock(clock))
    }

    /// Start from the keys of a snapshot written by [`RateLimitLayer::snapshot`] or
    /// [`RateLimitLayer::save`], counting the system time that passed since it was written
    /// (see [`ratewell_http::Builder::restore`]).
    pub fn restore(self, snapshot: impl Into<Vec<u8>>) -> Self {
        Builder(self.0.restore(snapshot))
    }

    /// [`restore`](Self::restore), with time passed as `resume` says.
    pub fn restore_with(self, snapshot: impl Into<Vec<u8>>, resume: Resume) -> Self {
        Builder(self.0.restore_with(snapshot, resume))
    }

    /// The layer, or the first thing wrong with the configuration.
    pub fn build(self) -> Result<RateLimitLayer<C>, BuildError> {
        self.0.build().map(RateLimitLayer::from_limiter)
    }
}
