//! [`Builder`]: a limiter's layers, connection settings and [`Failover`], compiled and connected;
//! and the constructors that start one ([`RedisLimiter::builder`],
//! [`RedisLimiter::sentinel_builder`], [`RedisLimiter::cluster_builder`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::Duration;

use ratewell::{Layer, LayeredLimiter, MAX_LAYERS, Parameters, Policy};
use tokio::sync::Notify;

use crate::batch::{Batchers, DEFAULT_BATCH, MAX_BATCH};
use crate::conn::{Shared, connect, reconnect};
use crate::error::Error;
use crate::failover::Failover;
use crate::limiter::RedisLimiter;
use crate::metrics::Counters;
use crate::per_call::PerCallLimiter;
use crate::script::{Code, Compiled, LayerSpec};
use crate::target::{Sentinel, Target, Tls, is_connection_error};

/// Builds a [`RedisLimiter`]: see [`RedisLimiter::builder`].
#[derive(Debug)]
pub struct Builder {
    target: Result<Target, Error>,
    tls: Option<Tls>,
    layers: Vec<(String, Policy)>,
    prefix: String,
    timeout: Duration,
    failover: Failover,
    backoff: (Duration, Duration),
    batch: usize,
    module: bool,
}

impl RedisLimiter {
    /// A builder for a limiter on the server at `url` (`redis://HOST:PORT[/DB]`,
    /// `rediss://...`, `unix:///path`).
    pub fn builder(url: &str) -> Builder {
        let target = redis::Client::open(url)
            .map(|_| Target::Single(url.to_owned()))
            .map_err(|e| Error::Url(e.to_string()));
        Builder::with_target(target)
    }

    /// A builder for a limiter on the primary that Redis Sentinel names. The sentinels are
    /// asked in order which server is primary (`SENTINEL get-master-addr-by-name`), and that
    /// server must say so itself (`ROLE`). When the connection breaks, or the server answers a
    /// decision as a replica does (`READONLY`: a failover demoted it), the connection counts as
    /// down (decisions fail, as [`Failover`] says) and the background probe asks the sentinels
    /// again, connecting to the new primary. A decision in flight at the failover fails; one
    /// the old primary applied but had not yet replicated is lost with it (Redis's replication
    /// is asynchronous), so across a failover the limit can admit up to those charges again.
    ///
    /// ```no_run
    /// use ratewell_redis::{RedisLimiter, Sentinel};
    ///
    /// # async fn run() -> Result<(), ratewell_redis::Error> {
    /// let limiter = RedisLimiter::sentinel_builder(Sentinel {
    ///     name: "mymaster".into(),
    ///     sentinels: vec!["redis://10.0.0.5:26379".into(), "redis://10.0.0.6:26379".into()],
    ///     username: None,
    ///     password: None,
    /// })
    /// .layer("per-client", &"fixed-window limit=100 window=1m".parse().unwrap())
    /// .build()
    /// .await?;
    /// # Ok(()) }
    /// ```
    pub fn sentinel_builder(sentinel: Sentinel) -> Builder {
        let target = if sentinel.sentinels.is_empty() {
            Err(Error::Url("no sentinel given".into()))
        } else {
            sentinel
                .sentinels
                .iter()
                .try_for_each(|n| redis::Client::open(n.as_str()).map(drop))
                .map(|()| Target::Sentinel(sentinel))
                .map_err(|e| Error::Url(e.to_string()))
        };
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
}

impl Builder {
    /// A layer named `name` deciding by `policy`; layers are checked in the order added (all or
    /// nothing, as `ratewell::LayeredLimiter`). At most [`MAX_LAYERS`].
    pub fn layer(mut self, name: impl Into<String>, policy: &Policy) -> Self {
        self.layers.push((name.into(), policy.clone()));
        self
    }

    /// Connect over TLS ([`Tls`]: the CA, a client certificate, whether the name is checked),
    /// to the server, every node of a cluster, or the sentinels and the primary they name. A
    /// `redis://` URL is taken as `rediss://`. Needs the `tls` feature: without it,
    /// [`build`](Self::build) is [`Error::Tls`]. A certificate refused either way is an
    /// [`Error::Tls`] when the limiter is built, not a server that is down.
    pub fn tls(mut self, tls: Tls) -> Self {
        self.tls = Some(tls);
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

    /// Whether calls go to the native command of ratewell-redis-module (`RATEWELL.BATCH`) where
    /// the server has it loaded (default `true`): found with `COMMAND INFO` at connect and each
    /// time the server comes back, and given up at the first call a server answers "unknown
    /// command" (the call then goes to the function library). `false`: always the function
    /// library. The two decide the same keys in the same bytes;
    /// [`Metrics::module_calls`](crate::Metrics::module_calls) counts the module's calls.
    pub fn module(mut self, use_it: bool) -> Self {
        self.module = use_it;
        self
    }

    /// What decides when the server cannot (default [`Failover::Closed`]).
    pub fn failover(mut self, failover: Failover) -> Self {
        self.failover = failover;
        self
    }

    /// The most requests one server call carries (default 64; at least 1, at most 1024). While
    /// a call is in flight on a connection, the requests that arrive queue and go together as
    /// the next call; a request that finds nothing in flight goes at once, alone. 1 sends one
    /// request per call, one call at a time.
    pub fn batch(mut self, max: usize) -> Self {
        self.batch = max.clamp(1, MAX_BATCH);
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
    /// ([`PerCallLimiter::decide`]), and connect, as
    /// [`build`](Self::build) does. It takes no layers and has no failover (its caller decides
    /// what an error means): a builder with layers or `Failover::Local` is [`Error::Layers`].
    pub async fn build_per_call(self) -> Result<PerCallLimiter, Error> {
        if !self.layers.is_empty() || matches!(self.failover, Failover::Local { .. }) {
            return Err(Error::Layers(
                "a per-call limiter names its policies per call: no layers, no local failover"
                    .into(),
            ));
        }
        Ok(PerCallLimiter { shared: self.connect_shared(Vec::new(), None).await? })
    }

    /// Connect, load the script and start the reconnect task.
    async fn connect_shared(
        self,
        layers: Vec<LayerSpec>,
        local: Option<LayeredLimiter>,
    ) -> Result<Arc<Shared>, Error> {
        let target = self.target?;
        let (conn, up) = connect(&target, self.tls.as_ref(), self.timeout).await?;
        let cluster = matches!(target, Target::Cluster(_));
        let shared = Arc::new(Shared {
            conn,
            code: Code::get(),
            functions: AtomicBool::new(true),
            module: self.module,
            native: AtomicBool::new(false),
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
            cluster,
            nodes: match &target {
                Target::Cluster(nodes) => nodes.clone(),
                Target::Single(_) | Target::Sentinel(_) => Vec::new(),
            },
            batchers: Batchers::new(cluster),
            max_batch: self.batch,
        });
        if up {
            // Load the code now, so that the first decision is one round trip; a server that
            // answers this with garbage is not Redis.
            match tokio::time::timeout(self.timeout.max(Duration::from_secs(1)), shared.load())
                .await
            {
                Ok(Ok(reply)) if shared.loaded(&reply) => shared.detect_module().await,
                Ok(Ok(other)) => {
                    return Err(Error::NotRedis(format!(
                        "loading the code answered {other:?}, not the library's name or the \
                         script's SHA1"
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

impl Builder {
    fn with_target(target: Result<Target, Error>) -> Self {
        Builder {
            target,
            tls: None,
            layers: Vec::new(),
            prefix: "ratewell:".into(),
            timeout: Duration::from_millis(50),
            failover: Failover::Closed,
            backoff: (Duration::from_millis(10), Duration::from_secs(1)),
            batch: DEFAULT_BATCH,
            module: true,
        }
    }
}

/// One policy divided among `instances`: limits and bursts divided (at least 1, a burst at
/// least 0), rates divided exactly.
pub(crate) fn divide(policy: &Policy, instances: u32) -> Result<Policy, Error> {
    let n = instances.max(1);
    let div = |v: u32| (v / n).max(1);
    let period = |p: u64| p.checked_mul(u64::from(n)).filter(|&p| p < 1 << 63);
    let bad = || Error::Failover(format!("`{policy}` divided by {n} instances overflows"));
    let divided = match policy.parameters() {
        Parameters::TokenBucket { capacity, count, period_ns } => Parameters::TokenBucket {
            capacity: div(capacity),
            count,
            period_ns: period(period_ns).ok_or_else(bad)?,
        },
        Parameters::DiscreteFill { capacity, refill, every_ns } => Parameters::DiscreteFill {
            capacity: div(capacity).max(refill.min(capacity)),
            refill,
            every_ns: period(every_ns).ok_or_else(bad)?,
        },
        Parameters::LeakyBucket { count, period_ns, burst, delay, nginx } => {
            Parameters::LeakyBucket {
                count,
                period_ns: period(period_ns).ok_or_else(bad)?,
                burst: burst / n,
                delay: delay.map(|d| d / n),
                nginx,
            }
        }
        Parameters::FixedWindow { limit, window_ns, align_first } => {
            Parameters::FixedWindow { limit: div(limit), window_ns, align_first }
        }
        Parameters::SlidingWindow { limit, window_ns } => {
            Parameters::SlidingWindow { limit: div(limit), window_ns }
        }
        Parameters::SlidingLog { limit, window_ns } => {
            Parameters::SlidingLog { limit: div(limit), window_ns }
        }
        other => return Err(Error::Failover(format!("cannot divide {other:?}"))),
    };
    let divided = Policy::new(divided)
        .map_err(|e| Error::Failover(format!("`{policy}` divided by {n} instances: {e}")))?;
    Ok(divided.with_dry_run(policy.is_dry_run()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each algorithm divided among 4 instances, against the policy written out by hand.
    #[test]
    fn divide_splits_limits_and_stretches_rates() {
        for (policy, divided) in [
            ("token-bucket capacity=100 rate=10/s", "token-bucket capacity=25 rate=10/4s"),
            ("token-bucket capacity=3 rate=1/m", "token-bucket capacity=1 rate=1/4m"),
            (
                "token-bucket capacity=100 refill=10 every=1s",
                "token-bucket capacity=25 refill=10 every=4s",
            ),
            ("leaky-bucket rate=10/s burst=8 delay=4", "leaky-bucket rate=10/4s burst=2 delay=1"),
            ("leaky-bucket rate=10/s burst=3 nodelay", "leaky-bucket rate=10/4s burst=0 nodelay"),
            (
                "fixed-window limit=1000 window=1h align=first dry-run",
                "fixed-window limit=250 window=1h align=first dry-run",
            ),
            ("sliding-window limit=2 window=1s", "sliding-window limit=1 window=1s"),
            ("sliding-log limit=100 window=1m", "sliding-log limit=25 window=1m"),
        ] {
            let p: Policy = policy.parse().unwrap();
            assert_eq!(divide(&p, 4).unwrap().to_string(), divided, "{policy}");
            assert_eq!(divide(&p, 1).unwrap(), p, "{policy}");
        }
        // Four times the period is past what a bucket can hold exactly.
        let p: Policy = "token-bucket capacity=1 rate=1/10000d".parse().unwrap();
        assert!(matches!(divide(&p, 4), Err(Error::Failover(_))));
    }
}
