//! The limiter of HTTP requests every adapter drives: it resolves the client, extracts each
//! limit's key, decides all limits at once, and says what to do with the request; and the parts
//! of its configuration it holds from the builder ([`Absent`], the peer and cost functions).

use std::cell::{Cell, RefCell};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use http::header::HeaderName;
use http::{Extensions, HeaderMap, HeaderValue, Method, Request, StatusCode, Uri};
use ratewell::{Clock, IpPrefixes, KeyHasher, LayerKey, LayeredDecision, LayeredLimiter};
use ratewell::{MAX_LAYERS, OwnedReservation, QuantaClock};

use crate::client_ip::{Resolved, TrustedProxies};
use crate::key::{Client, Key, KeyContext};
use crate::metrics::{self, Counters, LayerCounter, Metrics};
use crate::response::{self, RATELIMIT, RATELIMIT_POLICY, Ready};

/// What a layer does with a request that has no key for it (an anonymous request on an API-key
/// limit).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Absent {
    /// Skip the layer: the request is not limited by it (nor charged on it).
    #[default]
    Skip,
    /// Answer with this status (401 for a missing credential, 400 for a missing field) and a
    /// problem-details body, without charging any layer.
    Reject(StatusCode),
}

/// What finds the peer's address in a request's extensions
/// ([`Builder::peer_addr`](crate::Builder::peer_addr)).
pub(crate) type PeerFn = dyn Fn(&Extensions) -> Option<IpAddr> + Send + Sync;
/// What a request costs ([`Builder::cost`](crate::Builder::cost)).
pub(crate) type CostFn = dyn Fn(KeyContext<'_>) -> u32 + Send + Sync;

/// One or more [`Limit`](crate::Limit)s on HTTP requests, decided all or nothing, and the
/// answers that go with them: what an adapter (the tower layer, the pingora one) asks about
/// each request with [`decide`](Self::decide). Built by [`Builder::build`](crate::Builder::build).
///
/// # Examples
///
/// ```
/// use http::Request;
/// use ratewell_http::{Head, HttpLimiter, Key, Limit, Verdict};
///
/// let limiter = HttpLimiter::builder()
///     .limit(Limit::new("key", "fixed-window limit=1 window=1m", Key::header("x-api-key")))
///     .build()?;
/// let request = Request::builder().header("x-api-key", "k").body(())?;
/// assert!(matches!(limiter.decide(Head::of(&request)), Verdict::Pass(_)));
/// match limiter.decide(Head::of(&request)) {
///     Verdict::Respond(answer) => assert_eq!(answer.status(), 429),
///     _ => panic!("the second request of the minute is rejected"),
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct HttpLimiter<C: Clock = QuantaClock> {
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
    /// its report, by `check_into` (see [`HttpLimiter::decide_reported`]).
    pub(crate) lean: bool,
    pub(crate) dry_run: bool,
    /// One limit, keyed by [`Key::client_ip`], no trusted proxy, no cost function, no required
    /// key: [`HttpLimiter::decide_client_ip`] decides.
    pub(crate) direct_ip: bool,
    /// The `RateLimit-Policy` value, the same on every response.
    pub(crate) policy_field: &'static HeaderValue,
    /// Per layer, the hash of [`Key::global`]'s one key in that layer's table (the same on
    /// every request: hashed once, when the layer is built).
    pub(crate) global_hashes: [u64; MAX_LAYERS],
    pub(crate) counters: Counters,
}

impl<C: Clock> fmt::Debug for HttpLimiter<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpLimiter")
            .field("limits", &self.keys.len())
            .field("metrics", &self.metrics())
            .finish_non_exhaustive()
    }
}

/// What a limiter reads of a request: its head, and the peer's address when the adapter knows
/// it (else the builder's [`peer_addr`](crate::Builder::peer_addr) function reads it from the
/// extensions).
#[derive(Clone, Copy, Debug)]
pub struct Head<'a> {
    /// The method.
    pub method: &'a Method,
    /// The URI.
    pub uri: &'a Uri,
    /// The headers.
    pub headers: &'a HeaderMap,
    /// The extensions.
    pub extensions: &'a Extensions,
    /// The peer's address, if the adapter has it apart from the extensions (pingora's
    /// session); `None`: the builder's `peer_addr` function finds it.
    pub peer: Option<IpAddr>,
}

impl<'a> Head<'a> {
    /// The head of `request`; its peer from the extensions.
    pub fn of<B>(request: &'a Request<B>) -> Self {
        Head {
            method: request.method(),
            uri: request.uri(),
            headers: request.headers(),
            extensions: request.extensions(),
            peer: None,
        }
    }

    /// The head of a request's parts (pingora's `RequestHeader` dereferences to them), with
    /// the peer's address.
    pub fn of_parts(parts: &'a http::request::Parts, peer: Option<IpAddr>) -> Self {
        Head {
            method: &parts.method,
            uri: &parts.uri,
            headers: &parts.headers,
            extensions: &parts.extensions,
            peer,
        }
    }
}

/// The `RateLimit-Policy` and `RateLimit` values for an admitted response (none when the
/// builder turned them off), boxed: a future that carries them inline is 40 bytes larger, and
/// every request (with or without the fields) moves its future.
#[derive(Debug, Default)]
pub struct Fields(Option<Box<(&'static HeaderValue, Option<HeaderValue>)>>);

impl Fields {
    /// Add the fields to a response's headers.
    #[inline]
    pub fn write(self, headers: &mut HeaderMap) {
        if let Some(fields) = self.0 {
            let (policy, field) = *fields;
            headers.insert(RATELIMIT_POLICY, policy.clone());
            if let Some(field) = field {
                headers.insert(RATELIMIT, field);
            }
        }
    }

    /// Whether there is nothing to add.
    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// The fields as `(name, value)` pairs (for a response type that is not [`HeaderMap`]).
    pub fn pairs(&self) -> impl Iterator<Item = (HeaderName, HeaderValue)> + '_ {
        let fields = self.0.as_deref();
        let policy = fields.map(|(p, _)| (RATELIMIT_POLICY, (*p).clone()));
        let field = fields.and_then(|(_, f)| f.clone()).map(|f| (RATELIMIT, f));
        policy.into_iter().chain(field)
    }
}

/// What to do with a request, as [`HttpLimiter::decide`] says.
pub enum Verdict<C: Clock = QuantaClock> {
    /// Forward it; add the fields to its response.
    Pass(Fields),
    /// Forward it after `delay` (a delaying leaky bucket), then commit the reservation; drop
    /// the reservation (and call [`HttpLimiter::delay_dropped`]) if the request is dropped
    /// before, which gives its charge back.
    Delay {
        /// How long the request waits.
        delay: Duration,
        /// The request's charges, refunded if dropped uncommitted.
        reservation: Box<OwnedReservation<C>>,
        /// The fields for its response.
        headers: Fields,
    },
    /// Answer it with this (a 429, an impossible request, a missing required key).
    Respond(Box<Ready>),
}

impl<C: Clock> fmt::Debug for Verdict<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Pass(fields) => f.debug_tuple("Pass").field(fields).finish(),
            Verdict::Delay { delay, headers, .. } => {
                f.debug_struct("Delay").field("delay", delay).field("headers", headers).finish()
            }
            Verdict::Respond(ready) => f.debug_tuple("Respond").field(&ready.status()).finish(),
        }
    }
}

impl<C: Clock> HttpLimiter<C> {
    /// What every request decided so far: per limit and for the whole limiter.
    pub fn metrics(&self) -> Metrics {
        let limiter = &self.limiter;
        self.counters.read((0..limiter.len()).map(|i| {
            (limiter.name(i).unwrap_or_default().to_owned(), limiter.metrics(i).unwrap_or_default())
        }))
    }

    /// The engine underneath (its tables' metrics, peeks at a key's state).
    pub fn limiter(&self) -> &Arc<LayeredLimiter<C>> {
        &self.limiter
    }

    /// Count a delayed request dropped before it was forwarded (its reservation, dropped,
    /// gives the charge back): [`Metrics::delay_refunds`].
    pub fn delay_dropped(&self) {
        self.counters.add(metrics::DELAY_REFUNDS);
    }

    /// Write a snapshot of every limit's keys to `w` while requests go on, for
    /// [`Builder::restore`](crate::Builder::restore) in the next process (see
    /// `ratewell::LayeredLimiter::snapshot`).
    pub fn snapshot(&self, w: impl std::io::Write) -> std::io::Result<ratewell::SnapshotInfo> {
        self.limiter.snapshot(w)
    }

    /// [`snapshot`](Self::snapshot) into the file at `path`, replacing it only once the new one
    /// is whole (written beside it, synced, renamed over it).
    pub fn save(
        &self,
        path: impl AsRef<std::path::Path>,
    ) -> std::io::Result<ratewell::SnapshotInfo> {
        self.limiter.save(path)
    }

    /// Decide a request: resolve its client, extract each limit's key, decide every limit at
    /// once (all or nothing), and say whether to forward it, delay it or answer it.
    #[inline]
    pub fn decide(&self, head: Head<'_>) -> Verdict<C> {
        if self.direct_ip {
            return self.decide_client_ip(head);
        }
        self.decide_any(head)
    }

    /// The peer's address: the adapter's, or the builder's function's.
    #[inline]
    fn peer(&self, head: &Head<'_>) -> Option<IpAddr> {
        head.peer.or_else(|| (self.peer)(head.extensions))
    }
    /// The client's address and network (counting what the forwarding header told).
    #[inline]
    fn client(&self, head: &Head<'_>) -> Option<Client> {
        let Some(peer) = self.peer(head) else {
            self.counters.add(metrics::MISSING_PEER);
            return None;
        };
        if !self.trusted.any() {
            let ip = self.untrusted_peer(peer, head.headers);
            return Some(Client { ip, network: self.prefixes.key(ip) });
        }
        let ip = match self.trusted.resolve(peer, head.headers) {
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

    /// [`decide`](Self::decide) for the common configuration of one limit keyed by the client's
    /// address, with no trusted proxy, no cost function and no required key: the peer's network
    /// is the key, with no key context to build. A request without a peer address takes the
    /// general path (which counts it and skips the limit).
    #[inline]
    fn decide_client_ip(&self, head: Head<'_>) -> Verdict<C> {
        let Some(peer) = self.peer(&head) else {
            return self.decide_any(head);
        };
        let headers = head.headers;
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
    fn decide_any(&self, head: Head<'_>) -> Verdict<C> {
        let client = if self.needs_client { self.client(&head) } else { None };
        let cx = KeyContext::new(&head, client.as_ref());
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
            return self.decide_keys(&[&lazy], cost, &absent, head.headers);
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
        self.decide_keys(&keys[..n], cost, &absent, head.headers)
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
            return Verdict::Pass(Fields(None));
        }
        self.decide_reported(keys, cost, request)
    }

    /// The answer for a request without the key of a limit that requires one.
    #[cold]
    fn missing_required(&self, cx: &KeyContext<'_>) -> Option<Box<Ready>> {
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
        let headers = Fields(self.admitted_headers.then(|| Box::new(self.fields(&decision))));
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

    fn rejection(&self, decision: &LayeredDecision, request: &HeaderMap) -> Ready {
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

/// The key of [`Key::client_ip`] on [`HttpLimiter::decide_client_ip`]'s path: the network's bits,
/// hashed alone (a layer on that path has no other kind of key to tell them from, and every
/// decision of the layer hashes them this way).
struct ClientNetwork(ratewell::IpKey);

impl LayerKey for ClientNetwork {
    #[inline]
    fn key_hash(&self, hasher: &KeyHasher<'_>) -> Option<u64> {
        Some(hasher.hash(&self.0.to_bits()))
    }
}

/// The dry-run layers that would have rejected, as a bit set.
fn would_reject(decision: &LayeredDecision) -> u32 {
    decision.would_reject().fold(0, |mask, i| mask | 1 << i)
}
