//! The layer, its service, and the future of one request.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::header::HeaderName;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use pin_project_lite::pin_project;
use ratewell::{Clock, IpPrefixes, KeyHasher, LayerKey, LayeredDecision, LayeredLimiter};
use ratewell::{MAX_LAYERS, OwnedReservation, QuantaClock};
use tower::{Layer, Service};

use crate::body::ResponseBody;
use crate::builder::{Absent, Builder, CostFn, PeerFn};
use crate::client_ip::{Resolved, TrustedProxies};
use crate::key::{Client, Key, KeyContext};
use crate::metrics::{self, Counters, LayerCounter, Metrics};
use crate::response;

/// The `RateLimit-Policy` field name.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// The `RateLimit` field name.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

pub(crate) struct Shared<C: Clock> {
    pub(crate) limiter: Arc<LayeredLimiter<C>>,
    pub(crate) keys: Box<[(Key, Absent)]>,
    /// The layers whose key is required ([`Absent::Reject`]).
    pub(crate) required: Box<[usize]>,
    pub(crate) trusted: TrustedProxies,
    pub(crate) prefixes: IpPrefixes,
    pub(crate) peer: Arc<PeerFn>,
    pub(crate) cost: Option<Arc<CostFn>>,
    pub(crate) needs_client: bool,
    pub(crate) delays: bool,
    pub(crate) status: StatusCode,
    pub(crate) impossible_status: StatusCode,
    pub(crate) admitted_headers: bool,
    /// No admitted response needs a decision's report (no headers, no dry run, no delay): an
    /// admission is decided by `allow`, and a request `allow` rejected is decided again, with
    /// its report, by `check_into` (see [`Shared::decide_reported`]).
    pub(crate) lean: bool,
    pub(crate) dry_run: bool,
    /// One limit, keyed by [`Key::client_ip`], no trusted proxy, no cost function, no required
    /// key: [`Shared::decide_client_ip`] decides.
    pub(crate) direct_ip: bool,
    /// The `RateLimit-Policy` value, the same on every response.
    pub(crate) policy_field: &'static HeaderValue,
    /// Per layer, the hash of [`Key::global`]'s one key in that layer's table (the same on
    /// every request: hashed once, when the layer is built).
    pub(crate) global_hashes: [u64; MAX_LAYERS],
    pub(crate) counters: Counters,
}

/// A [`tower::Layer`] that rate limits every request by one or more [`Limit`](crate::Limit)s.
///
/// Cloning it (or the services it makes) shares one engine: every connection, every route it is
/// applied to, every clone counts against the same budgets.
///
/// # Examples
///
/// ```
/// use ratewell_tower::{Key, Limit, RateLimitLayer};
///
/// let layer = RateLimitLayer::builder()
///     .limit(Limit::new("ip", "token-bucket capacity=20 rate=10/s", Key::client_ip()))
///     .limit(Limit::new("api-key", "fixed-window limit=1000 window=1h", Key::header("x-api-key")))
///     .build()?;
/// // axum: Router::new().route(...).layer(layer)
/// # Ok::<(), ratewell_tower::BuildError>(())
/// ```
pub struct RateLimitLayer<C: Clock = QuantaClock> {
    pub(crate) shared: Arc<Shared<C>>,
}

impl<C: Clock> Clone for RateLimitLayer<C> {
    fn clone(&self) -> Self {
        RateLimitLayer { shared: Arc::clone(&self.shared) }
    }
}

impl<C: Clock> fmt::Debug for RateLimitLayer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("policy", &self.shared.policy_field)
            .finish_non_exhaustive()
    }
}

impl RateLimitLayer<QuantaClock> {
    /// A builder with no limit yet, on the TSC clock.
    pub fn builder() -> Builder<QuantaClock> {
        Builder::new()
    }
}

impl<C: Clock> RateLimitLayer<C> {
    /// What every service of this layer has decided so far.
    pub fn metrics(&self) -> Metrics {
        self.shared.metrics()
    }

    /// Write a snapshot of every limit's keys to `w` while requests go on, for
    /// [`Builder::restore`](crate::Builder::restore) in the next process (see
    /// `ratewell::LayeredLimiter::snapshot`).
    pub fn snapshot(&self, w: impl std::io::Write) -> std::io::Result<ratewell::SnapshotInfo> {
        self.shared.limiter.snapshot(w)
    }

    /// [`snapshot`](Self::snapshot) into the file at `path`, replacing it only once the new one
    /// is whole (written beside it, synced, renamed over it).
    pub fn save(
        &self,
        path: impl AsRef<std::path::Path>,
    ) -> std::io::Result<ratewell::SnapshotInfo> {
        self.shared.limiter.save(path)
    }

    /// The engine: a [`LayeredLimiter`] with one layer per limit, in order.
    pub fn limiter(&self) -> &Arc<LayeredLimiter<C>> {
        &self.shared.limiter
    }
}

impl<S, C: Clock> Layer<S> for RateLimitLayer<C> {
    type Service = RateLimit<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit { inner, shared: Arc::clone(&self.shared) }
    }
}

/// The service of a [`RateLimitLayer`]: decides each request in `call`, and either answers it
/// (429, or the configured status) or passes it to the inner service.
///
/// `poll_ready` is the inner service's: a full limit never holds back readiness (a connection's
/// other requests, other keys, go on).
pub struct RateLimit<S, C: Clock = QuantaClock> {
    inner: S,
    shared: Arc<Shared<C>>,
}

impl<S: Clone, C: Clock> Clone for RateLimit<S, C> {
    fn clone(&self) -> Self {
        RateLimit { inner: self.inner.clone(), shared: Arc::clone(&self.shared) }
    }
}

impl<S: fmt::Debug, C: Clock> fmt::Debug for RateLimit<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit").field("inner", &self.inner).finish_non_exhaustive()
    }
}

impl<S, C: Clock> RateLimit<S, C> {
    /// What every service of this layer has decided so far.
    pub fn metrics(&self) -> Metrics {
        self.shared.metrics()
    }
}

impl<S, B, ResB, C> Service<Request<B>> for RateLimit<S, C>
where
    S: Service<Request<B>, Response = Response<ResB>> + Clone,
    C: Clock + Send + Sync + 'static,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, S, B, C>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    #[inline]
    fn call(&mut self, request: Request<B>) -> Self::Future {
        match self.shared.decide(&request) {
            Verdict::Pass(headers) => {
                let future = self.inner.call(request);
                ResponseFuture { state: State::Inner { future, headers } }
            }
            Verdict::Delay { delay, reservation, headers } => {
                // The request reaches the inner service later: it takes the service that was
                // made ready, and leaves a clone to be made ready for the next request.
                let clone = self.inner.clone();
                let service = std::mem::replace(&mut self.inner, clone);
                let delayed = Delayed {
                    service: Some(service),
                    request: Some(request),
                    reservation: Some(reservation),
                    shared: Arc::clone(&self.shared),
                };
                ResponseFuture {
                    state: State::Delayed {
                        sleep: Box::pin(tokio::time::sleep(delay)),
                        delayed: Box::new(delayed),
                        headers,
                    },
                }
            }
            Verdict::Respond(response) => {
                ResponseFuture { state: State::Ready { response: Some(response) } }
            }
        }
    }
}

/// The `RateLimit-Policy` and `RateLimit` values for an admitted response, boxed: a future that
/// carries them inline is 40 bytes larger, and every request (with or without the fields) moves
/// its future.
pub(crate) type Fields = Option<Box<(&'static HeaderValue, Option<HeaderValue>)>>;

enum Verdict<C: Clock> {
    Pass(Fields),
    Delay { delay: Duration, reservation: Box<OwnedReservation<C>>, headers: Fields },
    Respond(Box<response::Ready>),
}

impl<C: Clock> Shared<C> {
    fn metrics(&self) -> Metrics {
        let limiter = &self.limiter;
        self.counters.read((0..limiter.len()).map(|i| {
            (limiter.name(i).unwrap_or_default().to_owned(), limiter.metrics(i).unwrap_or_default())
        }))
    }

    /// The client's address and network (counting what the forwarding header told).
    #[inline]
    fn client<B>(&self, request: &Request<B>) -> Option<Client> {
        let Some(peer) = (self.peer)(request.extensions()) else {
            self.counters.add(metrics::MISSING_PEER);
            return None;
        };
        if !self.trusted.any() {
            let ip = self.untrusted_peer(peer, request.headers());
            return Some(Client { ip, network: self.prefixes.key(ip) });
        }
        let ip = match self.trusted.resolve(peer, request.headers()) {
            Resolved::Untrusted(ip) => {
                self.counters.add(metrics::FORWARDED_UNTRUSTED);
                ip
            }
            Resolved::Malformed(ip) => {
                self.counters.add(metrics::FORWARDED_MALFORMED);
                ip
            }
            resolved => resolved.ip(),
        };
        Some(Client { ip, network: self.prefixes.key(ip) })
    }

    #[inline]
    fn decide<B>(&self, request: &Request<B>) -> Verdict<C> {
        if self.direct_ip {
            return self.decide_client_ip(request);
        }
        self.decide_any(request)
    }

    /// [`decide`](Self::decide) for the common configuration of one limit keyed by the client's
    /// address, with no trusted proxy, no cost function and no required key: the peer's network
    /// is the key, with no key context to build. A request without a peer address takes the
    /// general path (which counts it and skips the limit).
    #[inline]
    fn decide_client_ip<B>(&self, request: &Request<B>) -> Verdict<C> {
        let Some(peer) = (self.peer)(request.extensions()) else {
            return self.decide_any(request);
        };
        let headers = request.headers();
        let network = ClientNetwork(self.prefixes.key(self.untrusted_peer(peer, headers)));
        self.decide_keys(&[&network], 1, &Cell::new(0), headers)
    }

    /// The client when no proxy is trusted: the peer itself; a forwarding header it sent is
    /// counted and ignored.
    #[inline]
    fn untrusted_peer(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        if self.trusted.sent_by(headers) {
            self.counters.add(metrics::FORWARDED_UNTRUSTED);
        }
        peer.to_canonical()
    }

    #[inline]
    fn decide_any<B>(&self, request: &Request<B>) -> Verdict<C> {
        let client = if self.needs_client { self.client(request) } else { None };
        let cx = KeyContext::new(request, client.as_ref());
        if !self.required.is_empty() {
            if let Some(response) = self.missing_required(&cx) {
                return Verdict::Respond(response);
            }
        }
        let cost = self.cost.as_ref().map_or(1, |f| f(cx));
        // Each layer's key is extracted when the layer hashes it: no key is copied out of the
        // request, and a layer after a rejecting one may never extract its own.
        let absent = Cell::new(0u8);
        if let [(key, _)] = &*self.keys {
            // One limit (the common case): one key, without the arrays sized for eight.
            let lazy =
                LazyKey { key, cx: &cx, absent: &absent, bit: 1, global: self.global_hashes[0] };
            return self.decide_keys(&[&lazy], cost, &absent, request.headers());
        }
        let n = self.keys.len();
        let lazy: [LazyKey<'_, '_>; MAX_LAYERS] = std::array::from_fn(|i| LazyKey {
            key: &self.keys[i.min(n - 1)].0,
            cx: &cx,
            absent: &absent,
            bit: 1 << i,
            global: self.global_hashes[i],
        });
        let keys: [&dyn LayerKey; MAX_LAYERS] = std::array::from_fn(|i| &lazy[i] as &dyn LayerKey);
        self.decide_keys(&keys[..n], cost, &absent, request.headers())
    }

    /// The decision on `keys` (one per layer): by `allow` on the lean path, else reported.
    #[inline(always)]
    fn decide_keys(
        &self,
        keys: &[&dyn LayerKey],
        cost: u32,
        absent: &Cell<u8>,
        request: &HeaderMap,
    ) -> Verdict<C> {
        if self.lean && self.limiter.allow(keys, cost) == Ok(true) {
            // Admissions are counted by the engine; only skipped layers here.
            let mut skipped = absent.get();
            while skipped != 0 {
                self.counters.layer(skipped.trailing_zeros() as usize, LayerCounter::Skipped);
                skipped &= skipped - 1;
            }
            return Verdict::Pass(None);
        }
        self.decide_reported(keys, cost, request)
    }

    /// The answer for a request without the key of a limit that requires one.
    #[cold]
    fn missing_required(&self, cx: &KeyContext<'_>) -> Option<Box<response::Ready>> {
        for &i in self.required.iter() {
            let (key, absent) = &self.keys[i];
            if let (None, Absent::Reject(status)) = (key.extract(*cx), absent) {
                self.counters.layer(i, LayerCounter::AbsentRejected);
                let name = self.limiter.name(i).unwrap_or_default();
                return Some(Box::new(response::absent(*status, name, cx.headers())));
            }
        }
        None
    }

    /// A decision whose report is needed: for the headers, a dry run, a delay, or (on the lean
    /// path) a request `allow` rejected.
    ///
    /// On the lean path the request is decided again by `check_into`, never reported from a
    /// peek: between `allow` and a peek, other requests and the clock move the key's state, and
    /// a peek can then find room (a refill, a refund) that the 429 would report as a wait of
    /// nothing. `allow`'s rejection charged nothing, so deciding again is deciding the request
    /// once, at the later instant: admitted, it passes; rejected, its `Retry-After` and fields
    /// are that rejection's own.
    #[inline(never)]
    fn decide_reported(
        &self,
        keys: &[&dyn LayerKey],
        cost: u32,
        request: &HeaderMap,
    ) -> Verdict<C> {
        let n = keys.len();
        let mut reservation = None;
        let mut decision = LayeredDecision::default();
        // With no layer that delays, a plain check; else a reservation, refunded if the
        // request is dropped while it waits.
        let checked = if self.delays {
            self.limiter.reserve_owned(keys, cost).map(|r| {
                decision = *r.decision();
                reservation = Some(r);
            })
        } else {
            self.limiter.check_into(keys, cost, &mut decision)
        };
        // The key count is the layer count by construction.
        debug_assert!(checked.is_ok());

        let combined = decision.decision();
        let pass = combined.is_admitted() || self.dry_run;
        self.count(&decision, n);
        if !pass {
            return Verdict::Respond(Box::new(self.rejection(&decision, request)));
        }
        let headers = self.admitted_headers.then(|| Box::new(self.fields(&decision)));
        let delay = combined.delay_ns();
        match reservation {
            Some(reservation) if delay > 0 && !self.dry_run => {
                self.counters.add(metrics::DELAYED);
                Verdict::Delay {
                    delay: Duration::from_nanos(delay),
                    reservation: Box::new(reservation),
                    headers,
                }
            }
            Some(reservation) => {
                reservation.commit();
                Verdict::Pass(headers)
            }
            None => Verdict::Pass(headers),
        }
    }

    #[inline]
    fn count(&self, decision: &LayeredDecision, n: usize) {
        let would_reject = would_reject(decision);
        for i in 0..n {
            let counter = match decision.layer(i) {
                None => LayerCounter::Skipped,
                Some(_) if would_reject & (1 << i) != 0 => LayerCounter::WouldReject,
                // Admissions are the engine's count.
                Some(d) if d.is_admitted() => continue,
                Some(_) if self.dry_run => LayerCounter::WouldReject,
                Some(_) => LayerCounter::Rejected,
            };
            self.counters.layer(i, counter);
        }
    }

    /// `RateLimit-Policy` and `RateLimit` (absent when every layer was skipped). The field is
    /// written into a buffer of the thread's, reused from request to request, and copied into
    /// its value: one allocation, of the value's own size.
    fn fields(&self, decision: &LayeredDecision) -> (&'static HeaderValue, Option<HeaderValue>) {
        thread_local! {
            static FIELD: RefCell<String> = RefCell::new(String::with_capacity(256));
        }
        let field = FIELD.with_borrow_mut(|field| {
            field.clear();
            self.limiter.write_ratelimit_field(decision, field);
            (!field.is_empty()).then(|| {
                HeaderValue::from_bytes(field.as_bytes())
                    .expect("RateLimit fields are printable ASCII")
            })
        });
        (self.policy_field, field)
    }

    fn rejection(&self, decision: &LayeredDecision, request: &HeaderMap) -> response::Ready {
        let combined = decision.decision();
        let (policy, field) = self.fields(decision);
        let would_reject = would_reject(decision);
        let violated = (0..self.keys.len()).filter(|&i| {
            decision.layer(i).is_some_and(|d| !d.is_admitted()) && would_reject & (1 << i) == 0
        });
        let names: Vec<&str> = violated.map(|i| self.limiter.name(i).unwrap_or_default()).collect();
        if combined.is_impossible() {
            response::impossible(self.impossible_status, policy.clone(), field, &names, request)
        } else {
            let wait = combined.retry_after_ns().unwrap_or(1).max(1);
            response::rejected(self.status, wait, policy.clone(), field, &names, request)
        }
    }
}

/// A layer's key, extracted from the request when the layer hashes it; an absent key sets the
/// layer's bit in `absent`.
struct LazyKey<'r, 'a> {
    key: &'r Key,
    cx: &'r KeyContext<'a>,
    absent: &'r Cell<u8>,
    bit: u8,
    /// The layer's hash of [`Key::global`]'s key.
    global: u64,
}

impl LayerKey for LazyKey<'_, '_> {
    #[inline]
    fn key_hash(&self, hasher: &KeyHasher<'_>) -> Option<u64> {
        if self.key.is_global() {
            return Some(self.global);
        }
        match self.key.extract(*self.cx) {
            Some(value) => Some(hasher.hash(&value)),
            None => {
                self.absent.set(self.absent.get() | self.bit);
                None
            }
        }
    }
}

/// The key of [`Key::client_ip`] on [`Shared::decide_client_ip`]'s path: the network's bits,
/// hashed alone (a layer on that path has no other kind of key to tell them from, and every
/// decision of the layer hashes them this way).
struct ClientNetwork(ratewell::IpKey);

impl LayerKey for ClientNetwork {
    #[inline]
    fn key_hash(&self, hasher: &KeyHasher<'_>) -> Option<u64> {
        Some(hasher.hash(&self.0.to_bits()))
    }
}

/// Each layer's hash of [`Key::global`]'s key, for [`Shared::global_hashes`]: a key that hashes
/// the key it is given and skips the layer, peeked once per layer (a skipped layer is neither
/// decided nor charged).
pub(crate) fn global_hashes<C: Clock>(limiter: &LayeredLimiter<C>) -> [u64; MAX_LAYERS] {
    struct Capture<'c>(&'c Cell<u64>);
    impl LayerKey for Capture<'_> {
        fn key_hash(&self, hasher: &KeyHasher<'_>) -> Option<u64> {
            self.0.set(hasher.hash(&Key::GLOBAL_VALUE));
            None
        }
    }
    let mut hashes = [0; MAX_LAYERS];
    for (i, hash) in hashes.iter_mut().enumerate().take(limiter.len()) {
        let cell = Cell::new(0);
        let capture = Capture(&cell);
        let mut keys: [&dyn LayerKey; MAX_LAYERS] = [&ratewell::Absent; MAX_LAYERS];
        keys[i] = &capture;
        let _ = limiter.peek(&keys[..limiter.len()], 1);
        *hash = cell.get();
    }
    hashes
}

/// The dry-run layers that would have rejected, as a bit set.
fn would_reject(decision: &LayeredDecision) -> u32 {
    decision.would_reject().fold(0, |mask, i| mask | 1 << i)
}

pin_project! {
    /// The future of a request through [`RateLimit`]: the inner service's response with the
    /// `RateLimit` fields added, or the layer's own answer.
    pub struct ResponseFuture<F, S, B, C: Clock> {
        #[pin]
        state: State<F, S, B, C>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, S, B, C: Clock> {
        Inner { #[pin] future: F, headers: Fields },
        Delayed { sleep: Pin<Box<tokio::time::Sleep>>, delayed: Box<Delayed<S, B, C>>, headers: Fields },
        Ready { response: Option<Box<response::Ready>> },
    }
}

/// A request waiting its delay: dropped before it reaches the inner service, it is refunded.
struct Delayed<S, B, C: Clock> {
    service: Option<S>,
    request: Option<Request<B>>,
    reservation: Option<Box<OwnedReservation<C>>>,
    shared: Arc<Shared<C>>,
}

impl<S, B, C: Clock> Drop for Delayed<S, B, C> {
    fn drop(&mut self) {
        if self.reservation.is_some() {
            // The reservation's own drop takes the charge back.
            self.shared.counters.add(metrics::DELAY_REFUNDS);
        }
    }
}

impl<F, S, B, C, ResB, E> Future for ResponseFuture<F, S, B, C>
where
    F: Future<Output = Result<Response<ResB>, E>>,
    S: Service<Request<B>, Response = Response<ResB>, Error = E, Future = F>,
    C: Clock,
{
    type Output = Result<Response<ResponseBody<ResB>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        // The common case first and alone: a request that went straight to the inner service.
        if let StateProj::Inner { future, headers } = state.as_mut().project() {
            let response = ready!(future.poll(cx))?;
            return Poll::Ready(Ok(with_fields(response, headers.take())));
        }
        poll_slow(state, cx)
    }
}

/// The inner service's response, with the `RateLimit` fields if there are any to add.
#[inline]
fn with_fields<B>(response: Response<B>, fields: Fields) -> Response<ResponseBody<B>> {
    let mut response = response.map(ResponseBody::inner);
    if let Some(fields) = fields {
        let (policy, field) = *fields;
        let headers = response.headers_mut();
        headers.insert(RATELIMIT_POLICY, policy.clone());
        if let Some(field) = field {
            headers.insert(RATELIMIT, field);
        }
    }
    response
}

/// [`ResponseFuture::poll`] for a request that waits its delay, or the layer's own answer.
#[cold]
fn poll_slow<F, S, B, C, ResB, E>(
    mut state: Pin<&mut State<F, S, B, C>>,
    cx: &mut Context<'_>,
) -> Poll<Result<Response<ResponseBody<ResB>>, E>>
where
    F: Future<Output = Result<Response<ResB>, E>>,
    S: Service<Request<B>, Response = Response<ResB>, Error = E, Future = F>,
    C: Clock,
{
    loop {
        match state.as_mut().project() {
            StateProj::Inner { future, headers } => {
                let response = ready!(future.poll(cx))?;
                return Poll::Ready(Ok(with_fields(response, headers.take())));
            }
            StateProj::Delayed { sleep, delayed, headers } => {
                ready!(sleep.as_mut().poll(cx));
                let service = delayed.service.as_mut().expect("polled after completion");
                ready!(service.poll_ready(cx))?;
                let request = delayed.request.take().expect("polled after completion");
                let future = service.call(request);
                if let Some(reservation) = delayed.reservation.take() {
                    (*reservation).commit();
                }
                let headers = headers.take();
                state.set(State::Inner { future, headers });
            }
            StateProj::Ready { response } => {
                let response = response.take().expect("polled after completion");
                return Poll::Ready(Ok(response.into_response()));
            }
        }
    }
}
