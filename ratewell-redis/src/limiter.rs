//! [`RedisLimiter`]: layered decisions in Redis, and the failover's decision when the server
//! cannot make one.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ratewell::{Absent, Decision, LayerKey, LayeredDecision, Nanos, Outcome, Policy};
use redis::aio::ConnectionLike;

use crate::batch::Request;
use crate::conn::{Conn, Shared};
use crate::error::Error;
use crate::failover::Failover;
use crate::keys::slot;
use crate::metrics::{Metrics, bump};
use crate::verdict::{Charged, FailoverReason, Receipt, Source, Verdict, parse_reply};

/// A trace's keys live this long after their last decision (ms): a trace's clock is not the
/// server's, so its keys cannot expire by their reset times.
const TRACE_TTL_MS: u64 = 86_400_000;
/// The largest time (us) a caller may pass in: 2^52, far inside the script's exact domain.
const MAX_TRACE_US: u64 = 1 << 52;

/// Layered limits decided by a Redis (or Valkey) server that every instance shares: see the crate
/// documentation. Cheap to clone (one `Arc`).
#[derive(Clone)]
pub struct RedisLimiter {
    pub(crate) shared: Arc<Shared>,
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
        self.shared.counters.snapshot()
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

    /// Delete every key under this limiter's prefix (`SCAN` and `UNLINK`, on every primary of a
    /// cluster): what a replay does when it ends. Returns how many keys were deleted.
    pub async fn delete_keys(&self) -> Result<u64, Error> {
        let s = &self.shared;
        let mut pattern = String::with_capacity(s.prefix.len() + 1);
        for ch in s.prefix.chars() {
            if matches!(ch, '*' | '?' | '[' | ']' | '\\') {
                pattern.push('\\');
            }
            pattern.push(ch);
        }
        pattern.push('*');
        let wait = s.timeout.max(Duration::from_secs(1));
        match &s.conn {
            Conn::Single(c) => scan_and_unlink(&mut c.clone(), &pattern, wait, false).await,
            Conn::Sentinel(c) => {
                let mut primary = c.primary().map_err(|e| Error::Down(e.to_string()))?;
                scan_and_unlink(&mut primary, &pattern, wait, false).await
            }
            Conn::Cluster(_) => {
                let nodes = redis::cmd("CLUSTER").arg("NODES").clone();
                let reply = timed(wait, s.conn.query(&nodes)).await?;
                let text: String =
                    redis::from_redis_value(reply).map_err(|e| Error::BadReply(e.to_string()))?;
                let seed = s.nodes.first().ok_or_else(|| Error::Url("no cluster node".into()))?;
                let seed =
                    redis::Client::open(seed.as_str()).map_err(|e| Error::Url(e.to_string()))?;
                let mut deleted = 0;
                for (host, port) in primaries(&text) {
                    let info = seed.get_connection_info().clone();
                    let addr = match info.addr() {
                        redis::ConnectionAddr::TcpTls { insecure, tls_params, .. } => {
                            redis::ConnectionAddr::TcpTls {
                                host,
                                port,
                                insecure: *insecure,
                                tls_params: tls_params.clone(),
                            }
                        }
                        _ => redis::ConnectionAddr::Tcp(host, port),
                    };
                    let client = redis::Client::open(info.set_addr(addr))
                        .map_err(|e| Error::Url(e.to_string()))?;
                    let mut conn = timed(wait, client.get_multiplexed_async_connection()).await?;
                    // A node's keys span its slots: one key per UNLINK (no CROSSSLOT).
                    deleted += scan_and_unlink(&mut conn, &pattern, wait, true).await?;
                }
                Ok(deleted)
            }
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
        let mut args: Vec<Vec<u8>> = head(when, cost, "refund").into();
        for &i in &group.layers {
            args.extend(s.layers[i].args.iter().map(|a| a.as_bytes().to_vec()));
        }
        args.extend(group.states.iter().cloned());
        s.submit(Request { keys: group.keys.clone(), args, fields: 1 }).await?;
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
        let mut args: Vec<Vec<u8>> =
            head(when, cost, if op == Op::Take { "take" } else { "peek" }).into();
        for &i in group {
            args.extend(s.layers[i].args.iter().map(|a| a.as_bytes().to_vec()));
        }
        let fields = 1 + 6 * group.len();
        let reply = s.submit(Request { keys: redis_keys.clone(), args, fields }).await?;
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

fn trace_us(now: Nanos) -> Result<u64, Error> {
    let ns = now.get();
    if !ns.is_multiple_of(1_000) || ns / 1_000 > MAX_TRACE_US {
        return Err(Error::Time(ns));
    }
    Ok(ns / 1_000)
}

/// The script's first four arguments: the time (empty: the server's; else the microseconds as a
/// little-endian double, exact below 2^52, which the script reads without a decimal conversion),
/// the cost, the operation and the fixed TTL (empty: each key's reset time).
fn head(when: When, cost: u32, op: &'static str) -> [Vec<u8>; 4] {
    let (now, ttl) = match when {
        When::Server => (Vec::new(), Vec::new()),
        When::At(us) => ((us as f64).to_le_bytes().to_vec(), TRACE_TTL_MS.to_string().into_bytes()),
    };
    [now, cost.to_string().into_bytes(), op.as_bytes().to_vec(), ttl]
}

/// A call, by `wait`: a timeout and an error reply are errors.
async fn timed<T>(
    wait: Duration,
    call: impl std::future::Future<Output = Result<T, redis::RedisError>>,
) -> Result<T, Error> {
    match tokio::time::timeout(wait, call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(Error::BadReply(e.to_string())),
        Err(_) => Err(Error::Timeout),
    }
}

/// `SCAN` one node for `pattern` and `UNLINK` what it finds (one key per command if
/// `one_by_one`: a cluster node refuses keys of different slots in one command).
async fn scan_and_unlink(
    conn: &mut impl ConnectionLike,
    pattern: &str,
    wait: Duration,
    one_by_one: bool,
) -> Result<u64, Error> {
    let (mut cursor, mut deleted) = (0u64, 0u64);
    loop {
        let mut scan = redis::cmd("SCAN");
        scan.arg(cursor).arg("MATCH").arg(pattern).arg("COUNT").arg(1000);
        let reply = timed(wait, conn.req_packed_command(&scan)).await?;
        let (next, keys): (u64, Vec<Vec<u8>>) =
            redis::from_redis_value(reply).map_err(|e| Error::BadReply(e.to_string()))?;
        if !keys.is_empty() {
            let mut pipe = redis::pipe();
            if one_by_one {
                for k in &keys {
                    pipe.cmd("UNLINK").arg(k);
                }
            } else {
                pipe.cmd("UNLINK").arg(&keys);
            }
            let counts: Vec<u64> = timed(wait, pipe.query_async(conn)).await?;
            deleted += counts.iter().sum::<u64>();
        }
        if next == 0 {
            return Ok(deleted);
        }
        cursor = next;
    }
}

/// The primaries in `CLUSTER NODES` output that are not failed: `(host, port)`.
fn primaries(nodes: &str) -> Vec<(String, u16)> {
    nodes
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let flags = fields.get(2)?;
            if !flags.split(',').any(|f| f == "master") || flags.contains("fail") {
                return None;
            }
            // ip:port@cport[,hostname]
            let addr = fields.get(1)?.split('@').next()?;
            let (host, port) = addr.rsplit_once(':')?;
            Some((host.to_string(), port.parse().ok()?))
        })
        .collect()
}
