//! [`RedisLimiter`]: layered decisions in Redis, the connection, and the failover.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use ratewell::{
    Absent, Decision, Layer, LayerKey, LayeredDecision, LayeredLimiter, MAX_LAYERS, Nanos, Outcome,
    Parameters, Policy,
};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, RedisError, ServerErrorKind, Value};
use tokio::sync::Notify;

use crate::keys::{redis_key, slot};
use crate::script::{Compiled, DomainError, SOURCE};

/// A trace's keys live this long after their last decision (ms): a trace's clock is not the
/// server's, so its keys cannot expire by their reset times.
const TRACE_TTL_MS: u64 = 86_400_000;
/// The largest time (us) a caller may pass in: 2^52, far inside the script's exact domain.
const MAX_TRACE_US: u64 = 1 << 52;

/// What a decision is when the server cannot make it: chosen when the limiter is built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failover {
    /// Admit the request (availability over the limit). The decision reports the whole limit as
    /// remaining: nothing was counted.
    Open,
    /// Reject it, with `retry_after` the current reconnect backoff.
    Closed,
    /// Decide it in process, with every layer's limits divided by `instances` (the number of
    /// processes sharing the limit), so that the instances together stay near the policy.
    Local {
        /// How many instances share the limit (at least 1).
        instances: u32,
    },
}

/// Why the failover decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FailoverReason {
    /// The server did not answer within the timeout.
    Timeout,
    /// The connection was down (refused, reset, or not yet back after a timeout).
    Down,
    /// The server answered with an error or a reply that is not the script's (a server that is
    /// not Redis, or one that lies).
    BadReply,
}

/// Who made a decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// The server's script: the shared, exact decision.
    Server,
    /// The configured [`Failover`], for this reason.
    Failover(FailoverReason),
}

/// Why a limiter could not be built, or a call that reports errors (a trace's replay) failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The URL does not parse as a Redis URL.
    Url(String),
    /// A policy the script cannot decide exactly.
    Domain(DomainError),
    /// The layers: none, more than [`MAX_LAYERS`], a name repeated or empty, or keys that do not
    /// match them.
    Layers(String),
    /// A `Failover::Local` whose divided policy is not valid.
    Failover(String),
    /// The server answered, but not as Redis does.
    NotRedis(String),
    /// A time passed in that is not a whole number of microseconds, or beyond 2^52 us.
    Time(u64),
    /// The server did not answer within the timeout.
    Timeout,
    /// The connection failed or is down.
    Down(String),
    /// The server answered with an error, or a reply that is not the script's.
    BadReply(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Url(e) => write!(f, "not a Redis URL: {e}"),
            Error::Domain(e) => write!(f, "{e}"),
            Error::Layers(e) => write!(f, "layers: {e}"),
            Error::Failover(e) => write!(f, "local failover: {e}"),
            Error::NotRedis(e) => write!(f, "the server does not answer as Redis does: {e}"),
            Error::Time(ns) => write!(
                f,
                "time {ns} ns: the Redis backend decides on whole microseconds below 2^52 us"
            ),
            Error::Timeout => write!(f, "the server did not answer within the timeout"),
            Error::Down(e) => write!(f, "the connection is down: {e}"),
            Error::BadReply(e) => write!(f, "unexpected reply from the server: {e}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<DomainError> for Error {
    fn from(e: DomainError) -> Self {
        Error::Domain(e)
    }
}

/// Counts of what a limiter did, since it was built.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Metrics {
    /// Decisions the server made.
    pub server: u64,
    /// Decisions the failover made because a call timed out.
    pub failover_timeout: u64,
    /// Decisions the failover made because the connection was down.
    pub failover_down: u64,
    /// Decisions the failover made because of an error reply.
    pub failover_bad_reply: u64,
    /// Times the script was loaded into a server (once per server, and after `SCRIPT FLUSH`).
    pub script_loads: u64,
    /// Times the connection was marked down.
    pub disconnects: u64,
    /// Times a probe found the server back.
    pub reconnects: u64,
    /// Charges taken back (a layer on another slot rejected, or a caller's refund).
    pub refunds: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) server: AtomicU64,
    failover_timeout: AtomicU64,
    failover_down: AtomicU64,
    failover_bad_reply: AtomicU64,
    script_loads: AtomicU64,
    disconnects: AtomicU64,
    reconnects: AtomicU64,
    refunds: AtomicU64,
}

pub(crate) fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// The connection: one node through redis-rs's connection manager, or a cluster.
#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Conn {
    async fn query(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        match self {
            Conn::Single(c) => cmd.query_async(&mut c.clone()).await,
            Conn::Cluster(c) => cmd.query_async(&mut c.clone()).await,
        }
    }
}

/// Where the limiter connects.
#[derive(Clone, Debug)]
enum Target {
    Single(redis::Client),
    Cluster(Vec<String>),
}

/// Builds a [`RedisLimiter`]: see [`RedisLimiter::builder`].
#[derive(Debug)]
pub struct Builder {
    target: Result<Target, Error>,
    layers: Vec<(String, Policy)>,
    prefix: String,
    timeout: Duration,
    failover: Failover,
    backoff: (Duration, Duration),
}

impl Builder {
    /// A layer named `name` deciding by `policy`; layers are checked in the order added (all or
    /// nothing, as `ratewell::LayeredLimiter`). At most [`MAX_LAYERS`].
    pub fn layer(mut self, name: impl Into<String>, policy: &Policy) -> Self {
        self.layers.push((name.into(), policy.clone()));
        self
    }

    /// The prefix of every key this limiter stores (default `ratewell:`).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long a decision waits for the server before the failover decides (default 50 ms).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.max(Duration::from_micros(1));
        self
    }

    /// What decides when the server cannot (default [`Failover::Closed`]).
    pub fn failover(mut self, failover: Failover) -> Self {
        self.failover = failover;
        self
    }

    /// The reconnect backoff: probes start `min` after a failure and double up to `max`
    /// (default 10 ms and 1 s).
    pub fn backoff(mut self, min: Duration, max: Duration) -> Self {
        let min = min.max(Duration::from_millis(1));
        self.backoff = (min, max.max(min));
        self
    }

    fn compile(&self) -> Result<Vec<LayerSpec>, Error> {
        if self.layers.is_empty() || self.layers.len() > MAX_LAYERS {
            return Err(Error::Layers(format!(
                "1 to {MAX_LAYERS} layers, not {}",
                self.layers.len()
            )));
        }
        let mut out: Vec<LayerSpec> = Vec::with_capacity(self.layers.len());
        for (name, policy) in &self.layers {
            if name.is_empty() || out.iter().any(|l| &l.name == name) {
                return Err(Error::Layers(format!(
                    "layer names must be distinct and not empty: `{name}`"
                )));
            }
            let compiled = Compiled::new(policy)?;
            let mut args = Vec::with_capacity(8);
            compiled.push_args(&mut args);
            out.push(LayerSpec { name: name.clone(), policy: policy.clone(), compiled, args });
        }
        Ok(out)
    }

    /// Build the limiter and connect. A URL that does not parse, a policy outside the script's
    /// domain, or a server that answers but is not Redis is an error; a server that does not
    /// answer (down, or not within the timeout) is not: the limiter starts with the connection
    /// down, the failover deciding, and reconnects in the background.
    ///
    /// Must be called within a tokio runtime (the reconnect task runs on it).
    pub async fn build(self) -> Result<RedisLimiter, Error> {
        let layers = self.compile()?;
        let local = match self.failover {
            Failover::Local { instances } => {
                let divided = layers
                    .iter()
                    .map(|l| Ok(Layer::new(l.name.clone(), &divide(&l.policy, instances)?)))
                    .collect::<Result<Vec<_>, Error>>()?;
                Some(LayeredLimiter::new(divided).map_err(|e| Error::Failover(e.to_string()))?)
            }
            _ => None,
        };
        Ok(RedisLimiter { shared: self.connect_shared(layers, local).await? })
    }

    /// Build a limiter whose calls name their own policies, costs and modes
    /// ([`PerCallLimiter::decide`](crate::PerCallLimiter::decide)), and connect, as
    /// [`build`](Self::build) does. It takes no layers and has no failover (its caller decides
    /// what an error means): a builder with layers or `Failover::Local` is [`Error::Layers`].
    pub async fn build_per_call(self) -> Result<crate::PerCallLimiter, Error> {
        if !self.layers.is_empty() || matches!(self.failover, Failover::Local { .. }) {
            return Err(Error::Layers(
                "a per-call limiter names its policies per call: no layers, no local failover"
                    .into(),
            ));
        }
        Ok(crate::PerCallLimiter { shared: self.connect_shared(Vec::new(), None).await? })
    }

    /// Connect, load the script and start the reconnect task.
    async fn connect_shared(
        self,
        layers: Vec<LayerSpec>,
        local: Option<LayeredLimiter>,
    ) -> Result<Arc<Shared>, Error> {
        let target = self.target?;
        let script = redis::Script::new(SOURCE);
        let (conn, up) = connect(&target, self.timeout).await?;
        let shared = Arc::new(Shared {
            conn,
            sha: script.get_hash().to_string(),
            layers,
            prefix: self.prefix,
            timeout: self.timeout,
            failover: self.failover,
            local,
            backoff_min: self.backoff.0,
            backoff_max: self.backoff.1,
            backoff_ns: AtomicU64::new(self.backoff.0.as_nanos() as u64),
            down: AtomicBool::new(!up),
            wake: Arc::new(Notify::new()),
            counters: Counters::default(),
            cluster: matches!(target, Target::Cluster(_)),
        });
        if up {
            // Load the script now, so that the first decision is one round trip; a server that
            // answers this with garbage is not Redis.
            let load = redis::cmd("SCRIPT").arg("LOAD").arg(SOURCE).clone();
            match tokio::time::timeout(
                self.timeout.max(Duration::from_secs(1)),
                shared.conn.query(&load),
            )
            .await
            {
                Ok(Ok(Value::BulkString(sha))) if sha == shared.sha.as_bytes() => {
                    bump(&shared.counters.script_loads)
                }
                Ok(Ok(other)) => {
                    return Err(Error::NotRedis(format!(
                        "SCRIPT LOAD answered {other:?}, not the script's SHA1"
                    )));
                }
                Ok(Err(e)) if is_connection_error(&e) => shared.mark_down(),
                Ok(Err(e)) => return Err(Error::NotRedis(e.to_string())),
                Err(_) => shared.mark_down(),
            }
        }
        tokio::spawn(reconnect(Arc::downgrade(&shared), shared.wake.clone()));
        if !up {
            shared.wake.notify_one();
        }
        Ok(shared)
    }
}

/// Connect to `target`: `(connection, true)`, or a lazy connection and `false` when the server
/// does not answer within `timeout`.
async fn connect(target: &Target, timeout: Duration) -> Result<(Conn, bool), Error> {
    match target {
        Target::Single(client) => {
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(timeout.max(Duration::from_millis(100))))
                .set_response_timeout(None)
                .set_number_of_retries(1)
                .set_min_delay(Duration::from_millis(1))
                .set_max_delay(Duration::from_millis(10));
            let wait = timeout.max(Duration::from_millis(200));
            match tokio::time::timeout(
                wait,
                ConnectionManager::new_with_config(client.clone(), config.clone()),
            )
            .await
            {
                Ok(Ok(c)) => Ok((Conn::Single(c), true)),
                Ok(Err(e)) if !is_connection_error(&e) => Err(Error::NotRedis(e.to_string())),
                _ => {
                    let c = ConnectionManager::new_lazy_with_config(client.clone(), config)
                        .map_err(|e| Error::Url(e.to_string()))?;
                    Ok((Conn::Single(c), false))
                }
            }
        }
        Target::Cluster(nodes) => {
            let client = redis::cluster::ClusterClientBuilder::new(nodes.clone())
                .connection_timeout(timeout.max(Duration::from_millis(100)))
                .response_timeout(timeout.max(Duration::from_millis(100)))
                .build()
                .map_err(|e| Error::Url(e.to_string()))?;
            let c = tokio::time::timeout(Duration::from_secs(5), client.get_async_connection())
                .await
                .map_err(|_| Error::Down("no cluster node answered within 5 s".into()))?
                .map_err(|e| Error::Down(e.to_string()))?;
            Ok((Conn::Cluster(c), true))
        }
    }
}

fn is_connection_error(e: &RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() || e.is_timeout()
}

/// One policy divided among `instances`: limits and bursts divided (at least 1, a burst at
/// least 0), rates divided exactly.
fn divide(policy: &Policy, instances: u32) -> Result<Policy, Error> {
    let n = instances.max(1);
    let div = |v: u32| (v / n).max(1);
    let period = |p: u64| p.checked_mul(u64::from(n)).filter(|&p| p < 1 << 63);
    let bad = || Error::Failover(format!("`{policy}` divided by {n} instances overflows"));
    let spec = match policy.parameters() {
        Parameters::TokenBucket { capacity, count, period_ns } => format!(
            "token-bucket capacity={} rate={count}/{}ns",
            div(capacity),
            period(period_ns).ok_or_else(bad)?
        ),
        Parameters::DiscreteFill { capacity, refill, every_ns } => format!(
            "token-bucket capacity={} refill={refill} every={}ns",
            div(capacity).max(refill.min(capacity)),
            period(every_ns).ok_or_else(bad)?
        ),
        Parameters::LeakyBucket { count, period_ns, burst, delay, nginx } => {
            let mut s = format!(
                "leaky-bucket rate={count}/{}ns burst={}",
                period(period_ns).ok_or_else(bad)?,
                burst / n
            );
            match delay {
                None => s.push_str(" nodelay"),
                Some(d) => s.push_str(&format!(" delay={}", d / n)),
            }
            if nginx {
                s.push_str(" compat=nginx");
            }
            s
        }
        Parameters::FixedWindow { limit, window_ns, align_first } => format!(
            "fixed-window limit={} window={window_ns}ns align={}",
            div(limit),
            if align_first { "first" } else { "clock" }
        ),
        Parameters::SlidingWindow { limit, window_ns } => {
            format!("sliding-window limit={} window={window_ns}ns", div(limit))
        }
        Parameters::SlidingLog { limit, window_ns } => {
            format!("sliding-log limit={} window={window_ns}ns", div(limit))
        }
        other => return Err(Error::Failover(format!("cannot divide {other:?}"))),
    };
    let divided: Policy = spec.parse().map_err(|e| Error::Failover(format!("{spec}: {e}")))?;
    Ok(divided.with_dry_run(policy.is_dry_run()))
}

struct LayerSpec {
    name: String,
    policy: Policy,
    compiled: Compiled,
    args: Vec<String>,
}

pub(crate) struct Shared {
    conn: Conn,
    sha: String,
    layers: Vec<LayerSpec>,
    pub(crate) prefix: String,
    timeout: Duration,
    failover: Failover,
    local: Option<LayeredLimiter>,
    backoff_min: Duration,
    backoff_max: Duration,
    backoff_ns: AtomicU64,
    pub(crate) down: AtomicBool,
    wake: Arc<Notify>,
    pub(crate) counters: Counters,
    pub(crate) cluster: bool,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // The reconnect task holds only a weak reference: wake it so that it sees it is the last.
        self.wake.notify_one();
    }
}

impl Shared {
    pub(crate) fn metrics(&self) -> Metrics {
        let c = &self.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Metrics {
            server: l(&c.server),
            failover_timeout: l(&c.failover_timeout),
            failover_down: l(&c.failover_down),
            failover_bad_reply: l(&c.failover_bad_reply),
            script_loads: l(&c.script_loads),
            disconnects: l(&c.disconnects),
            reconnects: l(&c.reconnects),
            refunds: l(&c.refunds),
        }
    }

    fn mark_down(&self) {
        if !self.down.swap(true, Ordering::AcqRel) {
            bump(&self.counters.disconnects);
            self.wake.notify_one();
        }
    }

    /// One script call: `EVALSHA`, and on `NOSCRIPT` (a new server, `SCRIPT FLUSH`) load the
    /// script and call it again. Never waits past the timeout, and not at all while down.
    pub(crate) async fn eval(&self, keys: &[String], args: &[&str]) -> Result<Value, Error> {
        if self.down.load(Ordering::Acquire) {
            return Err(Error::Down("reconnecting".into()));
        }
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&self.sha).arg(keys.len()).arg(keys).arg(args);
        let call = async {
            match self.conn.query(&cmd).await {
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    let load = redis::cmd("SCRIPT").arg("LOAD").arg(SOURCE).clone();
                    self.conn.query(&load).await?;
                    bump(&self.counters.script_loads);
                    self.conn.query(&cmd).await
                }
                other => other,
            }
        };
        match tokio::time::timeout(self.deadline(), call).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) if is_connection_error(&e) => {
                self.mark_down();
                Err(Error::Down(e.to_string()))
            }
            Ok(Err(e)) => Err(Error::BadReply(e.to_string())),
            Err(_) => {
                // A server that does not answer within the timeout is treated as down until a
                // probe finds it back: the next decisions do not wait for it too.
                self.mark_down();
                Err(Error::Timeout)
            }
        }
    }

    /// The timer of one call. tokio's timer rounds a deadline up to its next 1 ms tick and the
    /// driver's wait is itself in whole milliseconds: measured, a `timeout(19 ms)` fires 21.0 to
    /// 21.5 ms after it started, and with the waking tasks' own work up to 3.1 ms late on a busy
    /// two-core machine. So a timeout of 6 ms or more is set 3 ms early: a call fails over
    /// between `timeout - 3 ms` and `timeout` after it started (`tests/faults.rs` measures it).
    fn deadline(&self) -> Duration {
        if self.timeout >= Duration::from_millis(6) {
            self.timeout - Duration::from_millis(3)
        } else {
            self.timeout
        }
    }

    fn keys_for(&self, layer: usize, key: &str) -> String {
        redis_key(&self.prefix, &self.layers[layer].name, key)
    }
}

/// Probe a down connection with backoff until it answers, then mark it up.
async fn reconnect(shared: Weak<Shared>, wake: Arc<Notify>) {
    loop {
        wake.notified().await;
        loop {
            let Some(s) = shared.upgrade() else { return };
            if !s.down.load(Ordering::Acquire) {
                break;
            }
            let wait = Duration::from_nanos(s.backoff_ns.load(Ordering::Relaxed));
            let timeout = s.timeout.max(Duration::from_millis(100));
            drop(s);
            tokio::time::sleep(wait).await;
            let Some(s) = shared.upgrade() else { return };
            let ping = redis::cmd("PING").clone();
            let probe = || tokio::time::timeout(timeout, s.conn.query(&ping));
            let ok = match probe().await {
                Ok(Ok(_)) => true,
                // The connection broke (the server restarted): the manager reconnects on that
                // error, so a second probe at once reaches a server that is back, instead of
                // one backoff later.
                Ok(Err(e)) if is_connection_error(&e) => matches!(probe().await, Ok(Ok(_))),
                _ => false,
            };
            if ok {
                s.backoff_ns.store(s.backoff_min.as_nanos() as u64, Ordering::Relaxed);
                s.down.store(false, Ordering::Release);
                bump(&s.counters.reconnects);
                break;
            }
            let next = (wait * 2).min(s.backoff_max);
            s.backoff_ns.store(next.as_nanos() as u64, Ordering::Relaxed);
        }
    }
}

/// A decision and who made it.
#[derive(Clone, Debug)]
pub struct Verdict {
    decision: LayeredDecision,
    source: Source,
    receipt: Option<Receipt>,
}

impl Verdict {
    /// `true` if the request may proceed.
    pub fn is_admitted(&self) -> bool {
        self.decision.is_admitted()
    }

    /// The layered decision: combined (`decision()`) and per layer (`layer(i)`), as in process.
    pub fn layered(&self) -> &LayeredDecision {
        &self.decision
    }

    /// The combined decision.
    pub fn decision(&self) -> Decision {
        self.decision.decision()
    }

    /// Who decided.
    pub fn source(&self) -> Source {
        self.source
    }

    /// What [`RedisLimiter::refund`] needs to take an admitted charge back (`None` for a
    /// rejection, a peek, or a failover decision).
    pub fn receipt(&self) -> Option<&Receipt> {
        self.receipt.as_ref()
    }
}

/// An admitted charge on the server, to take back with [`RedisLimiter::refund`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Receipt {
    cost: u32,
    groups: Vec<Charged>,
}

impl Receipt {
    /// The cost charged.
    pub fn cost(&self) -> u32 {
        self.cost
    }

    /// The same charge with `cost` units to give back (a part of it).
    pub(crate) fn with_cost(&self, cost: u32) -> Receipt {
        if cost >= self.cost {
            return self.clone();
        }
        // Part of the charge: the state before it must not be restored (that would give back
        // all of it), so the receipts keep only the state the charge stored.
        let groups = self
            .groups
            .iter()
            .map(|g| Charged {
                states: g
                    .states
                    .iter()
                    .map(|s| s.split('|').next().unwrap_or_default().to_string())
                    .collect(),
                ..g.clone()
            })
            .collect();
        Receipt { cost, groups }
    }
}

/// One script call's charge: its layers, keys, and the states the charge stored.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Charged {
    layers: Vec<usize>,
    keys: Vec<String>,
    states: Vec<String>,
}

/// Layered limits decided by a Redis (or Valkey) server that every instance shares: see the crate
/// documentation. Cheap to clone (one `Arc`).
#[derive(Clone)]
pub struct RedisLimiter {
    shared: Arc<Shared>,
}

impl fmt::Debug for RedisLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLimiter")
            .field("layers", &self.shared.layers.iter().map(|l| &l.name).collect::<Vec<_>>())
            .field("prefix", &self.shared.prefix)
            .field("timeout", &self.shared.timeout)
            .field("failover", &self.shared.failover)
            .finish()
    }
}

/// When a decision is made: the server's clock, or a time passed in (us).
#[derive(Clone, Copy)]
enum When {
    Server,
    At(u64),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Take,
    Peek,
}

impl RedisLimiter {
    /// A builder for a limiter on the server at `url` (`redis://HOST:PORT[/DB]`,
    /// `rediss://...`, `unix:///path`).
    pub fn builder(url: &str) -> Builder {
        let target =
            redis::Client::open(url).map(Target::Single).map_err(|e| Error::Url(e.to_string()));
        Builder::with_target(target)
    }

    /// A builder for a limiter on a Redis Cluster, given some of its nodes' URLs.
    pub fn cluster_builder<S: AsRef<str>>(nodes: &[S]) -> Builder {
        let nodes: Vec<String> = nodes.iter().map(|s| s.as_ref().to_string()).collect();
        let target = nodes
            .iter()
            .try_for_each(|n| redis::Client::open(n.as_str()).map(drop))
            .map(|()| Target::Cluster(nodes))
            .map_err(|e| Error::Url(e.to_string()));
        Builder::with_target(target)
    }

    /// The layers' names, in order.
    pub fn layer_names(&self) -> impl Iterator<Item = &str> {
        self.shared.layers.iter().map(|l| l.name.as_str())
    }

    /// The policy of layer `i`.
    pub fn policy(&self, i: usize) -> Option<&Policy> {
        self.shared.layers.get(i).map(|l| &l.policy)
    }

    /// The counts so far.
    pub fn metrics(&self) -> Metrics {
        self.shared.metrics()
    }

    /// `true` while the connection is considered down (the failover decides).
    pub fn is_down(&self) -> bool {
        self.shared.down.load(Ordering::Acquire)
    }

    /// Decide a request of `cost` (0 is taken as 1) with one key for every layer, on the server's
    /// clock; the failover decides when the server cannot.
    pub async fn check(&self, key: &str, cost: u32) -> Verdict {
        let keys = vec![Some(key); self.shared.layers.len()];
        self.decide(&keys, cost, When::Server, Op::Take)
            .await
            .unwrap_or_else(|e| self.fail(&keys, cost, &e))
    }

    /// Decide a request with one key per layer (`None`: the layer is skipped), on the server's
    /// clock; the failover decides when the server cannot. Keys that are not one per layer are
    /// [`Error::Layers`].
    pub async fn check_layers(&self, keys: &[Option<&str>], cost: u32) -> Result<Verdict, Error> {
        self.expect_keys(keys)?;
        Ok(match self.decide(keys, cost, When::Server, Op::Take).await {
            Ok(v) => v,
            Err(e) => self.fail(keys, cost, &e),
        })
    }

    /// What [`check_layers`](Self::check_layers) would decide now, taking nothing (on the
    /// server; errors are returned, not failed over).
    pub async fn peek_layers(&self, keys: &[Option<&str>], cost: u32) -> Result<Verdict, Error> {
        self.expect_keys(keys)?;
        self.decide(keys, cost, When::Server, Op::Peek).await
    }

    /// Decide at a time passed in (`now`, ns on the caller's clock, a whole number of us: a
    /// trace's time), with one key per layer. No failover: an unreachable server is an error.
    /// Keys decided this way expire a day after their last decision, not at their reset time.
    pub async fn check_at(
        &self,
        keys: &[Option<&str>],
        cost: u32,
        now: Nanos,
    ) -> Result<Verdict, Error> {
        self.expect_keys(keys)?;
        self.decide(keys, cost, When::At(trace_us(now)?), Op::Take).await
    }

    /// What [`check_at`](Self::check_at) would decide, taking nothing.
    pub async fn peek_at(
        &self,
        keys: &[Option<&str>],
        cost: u32,
        now: Nanos,
    ) -> Result<Verdict, Error> {
        self.expect_keys(keys)?;
        self.decide(keys, cost, When::At(trace_us(now)?), Op::Peek).await
    }

    /// Take an admitted charge back (the request did not run), on the server's clock: each layer
    /// gets back what `docs/SEMANTICS.md` says a refund restores.
    pub async fn refund(&self, receipt: &Receipt) -> Result<(), Error> {
        self.refund_when(receipt, When::Server).await
    }

    /// [`refund`](Self::refund) at a time passed in, as [`check_at`](Self::check_at).
    pub async fn refund_at(&self, receipt: &Receipt, now: Nanos) -> Result<(), Error> {
        self.refund_when(receipt, When::At(trace_us(now)?)).await
    }

    /// Delete every key under this limiter's prefix (`SCAN` and `UNLINK`; one node only): what
    /// a replay does when it ends. Returns how many keys were deleted.
    pub async fn delete_keys(&self) -> Result<u64, Error> {
        let s = &self.shared;
        if s.cluster {
            return Err(Error::Layers("delete_keys scans one node, not a cluster".into()));
        }
        let mut pattern = String::with_capacity(s.prefix.len() + 1);
        for ch in s.prefix.chars() {
            if matches!(ch, '*' | '?' | '[' | ']' | '\\') {
                pattern.push('\\');
            }
            pattern.push(ch);
        }
        pattern.push('*');
        let wait = s.timeout.max(Duration::from_secs(1));
        let query = |cmd: Cmd| async move {
            match tokio::time::timeout(wait, s.conn.query(&cmd)).await {
                Ok(Ok(v)) => Ok(v),
                Ok(Err(e)) => Err(Error::BadReply(e.to_string())),
                Err(_) => Err(Error::Timeout),
            }
        };
        let (mut cursor, mut deleted) = (0u64, 0u64);
        loop {
            let mut scan = redis::cmd("SCAN");
            scan.arg(cursor).arg("MATCH").arg(&pattern).arg("COUNT").arg(1000);
            let reply = query(scan).await?;
            let (next, keys): (u64, Vec<String>) =
                redis::from_redis_value(reply).map_err(|e| Error::BadReply(e.to_string()))?;
            if !keys.is_empty() {
                let mut unlink = redis::cmd("UNLINK");
                unlink.arg(&keys);
                let n: u64 = redis::from_redis_value(query(unlink).await?)
                    .map_err(|e| Error::BadReply(e.to_string()))?;
                deleted += n;
            }
            if next == 0 {
                return Ok(deleted);
            }
            cursor = next;
        }
    }

    fn expect_keys(&self, keys: &[Option<&str>]) -> Result<(), Error> {
        if keys.len() != self.shared.layers.len() {
            return Err(Error::Layers(format!(
                "{} keys for {} layers",
                keys.len(),
                self.shared.layers.len()
            )));
        }
        Ok(())
    }

    async fn refund_when(&self, receipt: &Receipt, when: When) -> Result<(), Error> {
        for group in &receipt.groups {
            self.refund_group(group, receipt.cost, when).await?;
        }
        Ok(())
    }

    async fn refund_group(&self, group: &Charged, cost: u32, when: When) -> Result<(), Error> {
        let s = &self.shared;
        let head = head(when, cost, "refund");
        let mut args: Vec<&str> = head.iter().map(String::as_str).collect();
        for &i in &group.layers {
            args.extend(s.layers[i].args.iter().map(String::as_str));
        }
        args.extend(group.states.iter().map(String::as_str));
        s.eval(&group.keys, &args).await?;
        bump(&s.counters.refunds);
        Ok(())
    }

    /// The decision on the server: the layers whose keys share a slot in one script call each,
    /// in the order of their first layer; a group that rejects takes the earlier groups' charges
    /// back (and the later groups are only peeked, for their report).
    async fn decide(
        &self,
        keys: &[Option<&str>],
        cost: u32,
        when: When,
        op: Op,
    ) -> Result<Verdict, Error> {
        let s = &self.shared;
        let cost = cost.max(1);
        let groups = self.groups(keys);
        let mut decisions: Vec<Option<Decision>> = vec![None; s.layers.len()];
        let mut charged: Vec<Charged> = Vec::new();
        let mut rejected = false;
        for group in &groups {
            let op = if rejected { Op::Peek } else { op };
            let (admitted, layer_decisions, charge) =
                self.call_group(group, keys, cost, when, op).await?;
            for (&i, d) in group.iter().zip(layer_decisions) {
                decisions[i] = Some(d);
            }
            if !admitted {
                rejected = true;
            } else if let Some(c) = charge {
                charged.push(c);
            }
        }
        if rejected {
            // All or nothing: give back what earlier groups took, and report those layers as a
            // rejected request reports every layer: their state as it is, charged nothing.
            for c in charged.drain(..) {
                self.refund_group(&c, cost, when).await?;
                let (_, layer_decisions, _) =
                    self.call_group(&c.layers, keys, cost, when, Op::Peek).await?;
                for (&i, d) in c.layers.iter().zip(layer_decisions) {
                    decisions[i] = Some(d);
                }
            }
        }
        let layered = LayeredDecision::from_layers(
            decisions.iter().zip(&s.layers).map(|(d, l)| (*d, l.policy.is_dry_run())),
        )
        .expect("at most MAX_LAYERS layers");
        bump(&s.counters.server);
        let receipt =
            (!charged.is_empty() && op == Op::Take).then_some(Receipt { cost, groups: charged });
        Ok(Verdict { decision: layered, source: Source::Server, receipt })
    }

    /// The layers with a key, grouped by cluster slot (one group on a single node).
    fn groups(&self, keys: &[Option<&str>]) -> Vec<Vec<usize>> {
        let present = keys.iter().enumerate().filter_map(|(i, k)| k.map(|k| (i, k)));
        if !self.shared.cluster {
            let all: Vec<usize> = present.map(|(i, _)| i).collect();
            return if all.is_empty() { Vec::new() } else { vec![all] };
        }
        let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
        for (i, k) in present {
            let slot = slot(self.shared.keys_for(i, k).as_bytes());
            match groups.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, g)) => g.push(i),
                None => groups.push((slot, vec![i])),
            }
        }
        groups.into_iter().map(|(_, g)| g).collect()
    }

    async fn call_group(
        &self,
        group: &[usize],
        keys: &[Option<&str>],
        cost: u32,
        when: When,
        op: Op,
    ) -> Result<(bool, Vec<Decision>, Option<Charged>), Error> {
        let s = &self.shared;
        let redis_keys: Vec<String> =
            group.iter().map(|&i| s.keys_for(i, keys[i].unwrap_or_default())).collect();
        let head = head(when, cost, if op == Op::Take { "take" } else { "peek" });
        let mut args: Vec<&str> = head.iter().map(String::as_str).collect();
        for &i in group {
            args.extend(s.layers[i].args.iter().map(String::as_str));
        }
        let reply = s.eval(&redis_keys, &args).await?;
        let (admitted, fields, states) = parse_reply(reply, group.len())?;
        let decisions: Vec<Decision> =
            group.iter().zip(&fields).map(|(&i, f)| s.layers[i].compiled.decision(f)).collect();
        let charge = (admitted && op == Op::Take && states.iter().any(|s| !s.is_empty()))
            .then(|| Charged { layers: group.to_vec(), keys: redis_keys, states });
        Ok((admitted, decisions, charge))
    }

    /// The failover's decision, counted.
    fn fail(&self, keys: &[Option<&str>], cost: u32, error: &Error) -> Verdict {
        let s = &self.shared;
        let reason = match error {
            Error::Timeout => FailoverReason::Timeout,
            Error::BadReply(_) | Error::NotRedis(_) => FailoverReason::BadReply,
            _ => FailoverReason::Down,
        };
        bump(match reason {
            FailoverReason::Timeout => &s.counters.failover_timeout,
            FailoverReason::Down => &s.counters.failover_down,
            FailoverReason::BadReply => &s.counters.failover_bad_reply,
        });
        let decision = match (&s.failover, &s.local) {
            (Failover::Local { .. }, Some(local)) => {
                let keys: Vec<&dyn LayerKey> = keys
                    .iter()
                    .map(|k| match k {
                        Some(k) => k as &dyn LayerKey,
                        None => &Absent as &dyn LayerKey,
                    })
                    .collect();
                local.check(&keys, cost).expect("one key per layer")
            }
            (failover, _) => {
                let retry = s.backoff_ns.load(Ordering::Relaxed).max(1);
                let layers = keys.iter().zip(&s.layers).map(|(k, l)| {
                    let limit = l.policy.limit();
                    let d = if *failover == Failover::Open {
                        Decision::from_parts(Outcome::Admitted, limit, limit, 0, 0, None)
                    } else {
                        Decision::from_parts(Outcome::Rejected, limit, 0, retry, retry, Some(retry))
                    };
                    (k.map(|_| d), l.policy.is_dry_run())
                });
                LayeredDecision::from_layers(layers).expect("at most MAX_LAYERS layers")
            }
        };
        Verdict { decision, source: Source::Failover(reason), receipt: None }
    }
}

impl Builder {
    fn with_target(target: Result<Target, Error>) -> Self {
        Builder {
            target,
            layers: Vec::new(),
            prefix: "ratewell:".into(),
            timeout: Duration::from_millis(50),
            failover: Failover::Closed,
            backoff: (Duration::from_millis(10), Duration::from_secs(1)),
        }
    }
}

fn trace_us(now: Nanos) -> Result<u64, Error> {
    let ns = now.get();
    if !ns.is_multiple_of(1_000) || ns / 1_000 > MAX_TRACE_US {
        return Err(Error::Time(ns));
    }
    Ok(ns / 1_000)
}

/// The script's first four arguments: the time (empty: the server's), the cost, the operation
/// and the fixed TTL (empty: each key's reset time).
fn head(when: When, cost: u32, op: &'static str) -> [String; 4] {
    let (now, ttl) = match when {
        When::Server => (String::new(), String::new()),
        When::At(us) => (us.to_string(), TRACE_TTL_MS.to_string()),
    };
    [now, cost.to_string(), op.to_string(), ttl]
}

/// `(now_us, admitted, per item [outcome, remaining, reset, wait, replenish])` of a per-call
/// decision.
#[allow(clippy::type_complexity)]
pub(crate) fn parse_call_reply(
    reply: Value,
    items: usize,
) -> Result<(u64, bool, Vec<[i64; 5]>), Error> {
    let now = match &reply {
        Value::Array(v) => match v.first() {
            Some(Value::Int(now)) => u64::try_from(*now).ok(),
            _ => None,
        },
        _ => None,
    };
    let now = now.ok_or_else(|| Error::BadReply("no time in the script's reply".into()))?;
    let (admitted, fields, _) = parse_reply(reply, items)?;
    Ok((now, admitted, fields))
}

/// `(admitted, per layer [outcome, remaining, reset, wait, replenish], per layer receipt)`.
#[allow(clippy::type_complexity)]
fn parse_reply(reply: Value, layers: usize) -> Result<(bool, Vec<[i64; 5]>, Vec<String>), Error> {
    let bad = |what: &str| Error::BadReply(format!("{what} in the script's reply"));
    let Value::Array(items) = reply else { return Err(bad("not an array")) };
    if items.len() != 2 + 6 * layers {
        return Err(bad("wrong length"));
    }
    let int = |v: &Value| match v {
        Value::Int(i) => Ok(*i),
        _ => Err(bad("not an integer")),
    };
    let admitted = int(&items[1])? == 1;
    let mut fields = Vec::with_capacity(layers);
    let mut states = Vec::with_capacity(layers);
    for l in 0..layers {
        let at = 2 + 6 * l;
        let mut f = [0i64; 5];
        for (j, slot) in f.iter_mut().enumerate() {
            *slot = int(&items[at + j])?;
            if *slot < 0 {
                return Err(bad("a negative field"));
            }
        }
        if f[0] > 2 {
            return Err(bad("an unknown outcome"));
        }
        states.push(match &items[at + 5] {
            Value::BulkString(b) => {
                String::from_utf8(b.clone()).map_err(|_| bad("a state that is not text"))?
            }
            Value::SimpleString(s) => s.clone(),
            Value::Nil => String::new(),
            _ => return Err(bad("a state that is not a string")),
        });
        fields.push(f);
    }
    Ok((admitted, fields, states))
}
