//! Building an [`HttpLimiter`]: the limits, their keys, and what a rejection looks like.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use http::{Extensions, HeaderValue, StatusCode};
use ratewell::{
    Clock, IpPrefixes, KeyHasher, Layer, LayerKey, LayeredLimiter, LayersError, MAX_LAYERS, Policy,
    PolicyError, QuantaClock, Resume,
};

use crate::client_ip::TrustedProxies;
use crate::key::{Key, KeyContext};
use crate::limiter::{Absent, CostFn, HttpLimiter, PeerFn};
use crate::metrics::Counters;

/// One limit: a name (its `RateLimit` item), a policy in the grammar of `docs/SEMANTICS.md`, and
/// the key it counts by.
///
/// # Examples
///
/// ```
/// use http::StatusCode;
/// use ratewell_http::{Absent, Key, Limit};
///
/// let per_ip = Limit::new("ip", "token-bucket capacity=20 rate=10/s", Key::client_ip())
///     .capacity(1_000_000);
/// let per_key = Limit::new("api-key", "sliding-window limit=1000 window=1m", Key::header("x-api-key"))
///     .when_absent(Absent::Reject(StatusCode::UNAUTHORIZED));
/// ```
#[derive(Clone, Debug)]
pub struct Limit {
    pub(crate) name: String,
    pub(crate) policy: Result<Policy, PolicyError>,
    pub(crate) key: Key,
    pub(crate) capacity: Option<usize>,
    pub(crate) absent: Absent,
}

impl Limit {
    /// A limit named `name` of `policy` (parsed when the layer is built; a bad policy is a
    /// [`BuildError`] then) keyed by `key`.
    pub fn new(name: impl Into<String>, policy: &str, key: Key) -> Self {
        Limit {
            name: name.into(),
            policy: policy.parse(),
            key,
            capacity: None,
            absent: Absent::Skip,
        }
    }

    /// A limit of an already parsed policy.
    pub fn with_policy(name: impl Into<String>, policy: Policy, key: Key) -> Self {
        Limit { name: name.into(), policy: Ok(policy), key, capacity: None, absent: Absent::Skip }
    }

    /// The most keys the limit holds at once (its memory bound; the engine's default, 100,000,
    /// unless set). Beyond it, the coldest keys are evicted.
    pub fn capacity(mut self, keys: usize) -> Self {
        self.capacity = Some(keys);
        self
    }

    /// What a request without this limit's key gets ([`Absent::Skip`] unless set).
    pub fn when_absent(mut self, absent: Absent) -> Self {
        self.absent = absent;
        self
    }
}

/// Why a layer could not be built.
#[derive(Debug)]
#[non_exhaustive]
pub enum BuildError {
    /// A limit's policy does not parse.
    Policy {
        /// The limit's name.
        limit: String,
        /// Why.
        error: PolicyError,
    },
    /// The layered limiter refused the limits (none, more than [`ratewell::MAX_LAYERS`], a name
    /// used twice, a capacity it cannot allocate).
    Layers(LayersError),
    /// A trusted-proxy network that is neither an address nor a CIDR network.
    TrustedProxy(String),
    /// A limit's name that a header cannot carry (empty, or not printable ASCII).
    Name(String),
    /// An [`Absent::Reject`] or rejection status that is not an error status (400 to 599).
    Status(StatusCode),
    /// The snapshot given to [`Builder::restore`] cannot be restored into these limits.
    Snapshot(ratewell::SnapshotError),
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::Policy { limit, error } => write!(f, "limit {limit:?}: {error}"),
            BuildError::Layers(error) => error.fmt(f),
            BuildError::TrustedProxy(net) => {
                write!(
                    f,
                    "trusted proxy {net:?} is neither an address nor a network like 10.0.0.0/8"
                )
            }
            BuildError::Name(name) => {
                write!(f, "limit name {name:?} must be 1 to 64 printable ASCII characters")
            }
            BuildError::Status(status) => write!(f, "status {status} is not an error status"),
            BuildError::Snapshot(error) => write!(f, "restoring the snapshot: {error}"),
        }
    }
}

impl std::error::Error for BuildError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BuildError::Policy { error, .. } => Some(error),
            BuildError::Layers(error) => Some(error),
            BuildError::Snapshot(error) => Some(error),
            _ => None,
        }
    }
}

/// The configuration of an [`HttpLimiter`]; see [`HttpLimiter::builder`] (and an adapter's
/// own, `ratewell_http::RateLimitLayer::builder`).
pub struct Builder<C: Clock = QuantaClock> {
    limits: Vec<Limit>,
    trusted: TrustedProxies,
    prefixes: IpPrefixes,
    peer: Arc<PeerFn>,
    cost: Option<Arc<CostFn>>,
    status: StatusCode,
    impossible_status: StatusCode,
    admitted_headers: bool,
    dry_run: bool,
    clock: C,
    /// A snapshot to restore the limits' keys from, and how time passed since.
    snapshot: Option<(Vec<u8>, Resume)>,
}

impl<C: Clock> fmt::Debug for Builder<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("limits", &self.limits)
            .field("trusted", &self.trusted)
            .field("prefixes", &self.prefixes)
            .field("status", &self.status)
            .field("impossible_status", &self.impossible_status)
            .field("admitted_headers", &self.admitted_headers)
            .field("dry_run", &self.dry_run)
            .finish_non_exhaustive()
    }
}

/// The peer address as a server puts it in the request's extensions: a [`SocketAddr`] (hyper
/// servers insert one; see the crate's examples) or an [`IpAddr`].
fn default_peer(extensions: &Extensions) -> Option<IpAddr> {
    extensions
        .get::<SocketAddr>()
        .map(SocketAddr::ip)
        .or_else(|| extensions.get::<IpAddr>().copied())
}

/// The `RateLimit-Policy` value `field`, kept for the life of the process, once per distinct
/// value: every response clones it, and a clone of a static value is a copy of its pointer,
/// where a clone of a shared one is an atomic increment (and its drop a decrement) on a line
/// every thread writes. Layers rebuilt with the same limits reuse the value kept.
fn interned(field: String) -> &'static HeaderValue {
    static KEPT: Mutex<BTreeMap<String, &'static HeaderValue>> = Mutex::new(BTreeMap::new());
    let mut kept = KEPT.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(value) = kept.get(&field) {
        return value;
    }
    let text: &'static str = Box::leak(field.clone().into_boxed_str());
    let value = HeaderValue::from_maybe_shared(Bytes::from_static(text.as_bytes()))
        .expect("a RateLimit-Policy field is printable ASCII");
    let value: &'static HeaderValue = Box::leak(Box::new(value));
    kept.insert(field, value);
    value
}

impl HttpLimiter<QuantaClock> {
    /// A builder with no limit yet, on the TSC clock.
    pub fn builder() -> Builder<QuantaClock> {
        Builder::new()
    }
}

impl Builder<QuantaClock> {
    pub(crate) fn new() -> Self {
        Builder {
            limits: Vec::new(),
            trusted: TrustedProxies::none(),
            prefixes: IpPrefixes::default(),
            peer: Arc::new(default_peer),
            cost: None,
            status: StatusCode::TOO_MANY_REQUESTS,
            impossible_status: StatusCode::TOO_MANY_REQUESTS,
            admitted_headers: true,
            dry_run: false,
            clock: QuantaClock::new(),
            snapshot: None,
        }
    }
}

impl<C: Clock + Send + Sync + 'static> Builder<C> {
    /// Add a limit. Limits are decided in order, all or nothing: a request passes only if every
    /// limit whose key it has admits it, and is then charged on each.
    pub fn limit(mut self, limit: Limit) -> Self {
        self.limits.push(limit);
        self
    }

    /// The proxies whose forwarding header names the client ([`TrustedProxies::none`] unless
    /// set: the peer address is the client's).
    pub fn trusted_proxies(mut self, proxies: TrustedProxies) -> Self {
        self.trusted = proxies;
        self
    }

    /// The prefixes client addresses are keyed at (IPv4 /32, IPv6 /64 unless set).
    pub fn client_prefixes(mut self, prefixes: IpPrefixes) -> Self {
        self.prefixes = prefixes;
        self
    }

    /// Where the connection's peer address is found in a request's extensions, when the
    /// adapter does not pass it ([`Head::peer`](crate::Head::peer)). By default a
    /// [`SocketAddr`] or an [`IpAddr`] extension; under axum, its `ConnectInfo`
    /// (`|ext| ext.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip())`):
    ///
    /// ```
    /// use std::net::{IpAddr, SocketAddr};
    ///
    /// /// What a server put in the extensions.
    /// #[derive(Clone)]
    /// struct Peer(SocketAddr);
    ///
    /// let builder = ratewell_http::HttpLimiter::builder()
    ///     .peer_addr(|ext| ext.get::<Peer>().map(|p| p.0.ip()));
    /// ```
    pub fn peer_addr<F>(mut self, f: F) -> Self
    where
        F: Fn(&Extensions) -> Option<IpAddr> + Send + Sync + 'static,
    {
        self.peer = Arc::new(f);
        self
    }

    /// The cost of a request (1 unless set; 0 counts as 1), charged on every layer.
    pub fn cost<F>(mut self, f: F) -> Self
    where
        F: Fn(KeyContext<'_>) -> u32 + Send + Sync + 'static,
    {
        self.cost = Some(Arc::new(f));
        self
    }

    /// The status of a rejected request (429 unless set).
    pub fn rejection_status(mut self, status: StatusCode) -> Self {
        self.status = status;
        self
    }

    /// The status of a request that no wait would admit: its cost is above a limit's capacity
    /// (429, without `Retry-After`, unless set; 413 is a common choice).
    pub fn impossible_status(mut self, status: StatusCode) -> Self {
        self.impossible_status = status;
        self
    }

    /// Whether admitted responses carry `RateLimit-Policy` and `RateLimit` (yes unless set;
    /// rejections always do).
    pub fn admitted_headers(mut self, on: bool) -> Self {
        self.admitted_headers = on;
        self
    }

    /// A dry run of the whole layer: every request reaches the inner service (none waits a
    /// delay), with the headers and metrics of the decision it would have had; a request that
    /// would have been rejected is counted in [`LayerMetrics::would_reject`](crate::LayerMetrics)
    /// and charged nothing, as a rejection is. (A single limit can be a dry run by its policy's
    /// `dry-run` flag.)
    pub fn dry_run(mut self, on: bool) -> Self {
        self.dry_run = on;
        self
    }

    /// Decide on another clock (the engine's `ManualClock` in tests, or `ratewell_http::TokioClock`
    /// to follow tokio's, paused or not).
    pub fn clock<C2: Clock + Send + Sync + 'static>(self, clock: C2) -> Builder<C2> {
        Builder {
            limits: self.limits,
            trusted: self.trusted,
            prefixes: self.prefixes,
            peer: self.peer,
            cost: self.cost,
            status: self.status,
            impossible_status: self.impossible_status,
            admitted_headers: self.admitted_headers,
            dry_run: self.dry_run,
            clock,
            snapshot: self.snapshot,
        }
    }

    /// Start from the keys of a snapshot written by [`HttpLimiter::snapshot`] or
    /// [`HttpLimiter::save`] (a restart keeps every client's spent budget), counting the
    /// system time that passed since it was written. The limits are matched by name and must
    /// keep their capacities; [`build`](Self::build) fails with [`BuildError::Snapshot`] if the
    /// snapshot cannot be restored (see `ratewell::LayeredLimiter::restore_with`).
    pub fn restore(self, snapshot: impl Into<Vec<u8>>) -> Self {
        self.restore_with(snapshot, Resume::WallClock)
    }

    /// [`restore`](Self::restore), with time passed as `resume` says.
    pub fn restore_with(mut self, snapshot: impl Into<Vec<u8>>, resume: Resume) -> Self {
        self.snapshot = Some((snapshot.into(), resume));
        self
    }

    /// The layer, or the first thing wrong with the configuration.
    pub fn build(self) -> Result<HttpLimiter<C>, BuildError> {
        for status in [self.status, self.impossible_status] {
            if !(status.is_client_error() || status.is_server_error()) {
                return Err(BuildError::Status(status));
            }
        }
        let mut layers = Vec::with_capacity(self.limits.len());
        for limit in &self.limits {
            let name = &limit.name;
            if name.is_empty()
                || name.len() > 64
                || !name.bytes().all(|b| (b' '..=b'~').contains(&b))
            {
                return Err(BuildError::Name(name.clone()));
            }
            if let Absent::Reject(status) = limit.absent {
                if !(status.is_client_error() || status.is_server_error()) {
                    return Err(BuildError::Status(status));
                }
            }
            let policy = limit
                .policy
                .clone()
                .map_err(|error| BuildError::Policy { limit: name.clone(), error })?;
            let layer = Layer::new(name.clone(), &policy);
            layers.push(match limit.capacity {
                Some(n) => layer.capacity(n),
                None => layer,
            });
        }
        let mut limiter =
            LayeredLimiter::with_clock(layers, self.clock).map_err(BuildError::Layers)?;
        if let Some((bytes, resume)) = &self.snapshot {
            limiter.restore_with(&bytes[..], *resume).map_err(BuildError::Snapshot)?;
        }
        let delays = (0..limiter.len()).any(|i| limiter.policy(i).is_some_and(Policy::delays));
        let policy_field = interned(limiter.ratelimit_policy_field());
        let needs_client = self.limits.iter().any(|l| l.key.needs_client_ip());
        let any_dry_run =
            (0..limiter.len()).any(|i| limiter.policy(i).is_some_and(Policy::is_dry_run));
        let lean = !self.admitted_headers && !self.dry_run && !delays && !any_dry_run;
        let global_hashes = global_hashes(&limiter);
        let direct_ip = matches!(&*self.limits, [limit] if limit.key.is_client_ip()
            && limit.absent == Absent::Skip)
            && self.cost.is_none()
            && !self.trusted.any();
        Ok(HttpLimiter {
            global_hashes,
            direct_ip,
            limiter: Arc::new(limiter),
            keys: self.limits.iter().map(|l| (l.key.clone(), l.absent)).collect(),
            required: (0..self.limits.len())
                .filter(|&i| matches!(self.limits[i].absent, Absent::Reject(_)))
                .collect(),
            trusted: self.trusted,
            prefixes: self.prefixes,
            peer: self.peer,
            cost: self.cost,
            needs_client,
            delays,
            status: self.status,
            impossible_status: self.impossible_status,
            admitted_headers: self.admitted_headers,
            lean,
            dry_run: self.dry_run,
            policy_field,
            counters: Counters::new(),
        })
    }
}

/// Each layer's hash of [`Key::global`]'s key, for [`HttpLimiter::global_hashes`]: a key that hashes
/// the key it is given and skips the layer, peeked once per layer (a skipped layer is neither
/// decided nor charged).
fn global_hashes<C: Clock>(limiter: &LayeredLimiter<C>) -> [u64; MAX_LAYERS] {
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
