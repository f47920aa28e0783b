//! The layer, its service, and the future of one request: the tower side of an
//! [`HttpLimiter`], which decides.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::{Request, Response};
use pin_project_lite::pin_project;
use ratewell::{Clock, LayeredLimiter, OwnedReservation, QuantaClock};
use ratewell_http::{Fields, Head, HttpLimiter, Ready, Verdict};
use tower::{Layer, Service};

use crate::body::ResponseBody;
use ratewell_http::Metrics;

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
    pub(crate) shared: Arc<HttpLimiter<C>>,
}

impl<C: Clock> Clone for RateLimitLayer<C> {
    fn clone(&self) -> Self {
        RateLimitLayer { shared: Arc::clone(&self.shared) }
    }
}

impl<C: Clock> fmt::Debug for RateLimitLayer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer").field("limiter", &self.shared).finish()
    }
}

impl<C: Clock> RateLimitLayer<C> {
    /// The layer deciding with `limiter` (built by [`ratewell_http::Builder::build`]).
    pub fn from_limiter(limiter: HttpLimiter<C>) -> Self {
        RateLimitLayer { shared: Arc::new(limiter) }
    }

    /// The limiter that decides (shared by every clone).
    pub fn http_limiter(&self) -> &Arc<HttpLimiter<C>> {
        &self.shared
    }

    /// What every service of this layer has decided so far.
    pub fn metrics(&self) -> Metrics {
        self.shared.metrics()
    }

    /// Write a snapshot of every limit's keys to `w` while requests go on, for
    /// [`Builder::restore`](crate::Builder::restore) in the next process (see
    /// `ratewell::LayeredLimiter::snapshot`).
    pub fn snapshot(&self, w: impl std::io::Write) -> std::io::Result<ratewell::SnapshotInfo> {
        self.shared.snapshot(w)
    }

    /// [`snapshot`](Self::snapshot) into the file at `path`, replacing it only once the new one
    /// is whole (written beside it, synced, renamed over it).
    pub fn save(
        &self,
        path: impl AsRef<std::path::Path>,
    ) -> std::io::Result<ratewell::SnapshotInfo> {
        self.shared.save(path)
    }

    /// The engine: a [`LayeredLimiter`] with one layer per limit, in order.
    pub fn limiter(&self) -> &Arc<LayeredLimiter<C>> {
        self.shared.limiter()
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
    shared: Arc<HttpLimiter<C>>,
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
        match self.shared.decide(Head::of(&request)) {
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
        Ready { response: Option<Box<Ready>> },
    }
}

/// A request waiting its delay: dropped before it reaches the inner service, it is refunded.
struct Delayed<S, B, C: Clock> {
    service: Option<S>,
    request: Option<Request<B>>,
    reservation: Option<Box<OwnedReservation<C>>>,
    shared: Arc<HttpLimiter<C>>,
}

impl<S, B, C: Clock> Drop for Delayed<S, B, C> {
    fn drop(&mut self) {
        if self.reservation.is_some() {
            // The reservation's own drop takes the charge back.
            self.shared.delay_dropped();
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
            return Poll::Ready(Ok(with_fields(response, std::mem::take(headers))));
        }
        poll_slow(state, cx)
    }
}

/// The inner service's response, with the `RateLimit` fields if there are any to add.
#[inline]
fn with_fields<B>(response: Response<B>, fields: Fields) -> Response<ResponseBody<B>> {
    let mut response = response.map(ResponseBody::inner);
    fields.write(response.headers_mut());
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
                return Poll::Ready(Ok(with_fields(response, std::mem::take(headers))));
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
                let headers = std::mem::take(headers);
                state.set(State::Inner { future, headers });
            }
            StateProj::Ready { response } => {
                let response = response.take().expect("polled after completion");
                let (status, headers, body) = response.into_parts();
                let mut response = Response::new(ResponseBody::full(body));
                *response.status_mut() = status;
                *response.headers_mut() = headers;
                return Poll::Ready(Ok(response));
            }
        }
    }
}
