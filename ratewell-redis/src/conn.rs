//! The connection to the server: connecting, loading the decision code (a function library, or a
//! script where `FUNCTION` is missing), requests submitted through the batch queues
//! ([`crate::batch`]) and the call that carries them, the connection's down state and the
//! background probe that brings it back.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use ratewell::LayeredLimiter;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, RedisError, ServerErrorKind, Value};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::batch::{Batcher, Batchers, Joined, Request};
use crate::error::Error;
use crate::failover::Failover;
use crate::keys::redis_key;
use crate::metrics::{Counters, bump};
use crate::script::{Code, LayerSpec};
use crate::target::{
    Sentinel, Target, Tls, cluster_tls, is_connection_error, is_tls_error, open_client,
    resolve_primary, with_scheme,
};

/// The connection: one node through redis-rs's connection manager, a cluster, or the primary
/// that Redis Sentinel names.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(Arc<SentinelConn>),
}

impl Conn {
    /// One command's reply as the server sent it: errors inside an array stay values (a batch's
    /// failed request), a top-level error is an `Err`.
    pub(crate) async fn query(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        let reply = match self {
            Conn::Single(c) => c.clone().req_packed_command(cmd).await?,
            Conn::Cluster(c) => c.clone().req_packed_command(cmd).await?,
            Conn::Sentinel(s) => s.primary()?.req_packed_command(cmd).await?,
        };
        match reply {
            Value::ServerError(e) => Err(e.into()),
            other => Ok(other),
        }
    }
}

/// The connection to the primary that the sentinels name, replaced when they name another.
pub(crate) struct SentinelConn {
    target: Sentinel,
    tls: Option<Tls>,
    timeout: Duration,
    /// The primary's address and the connection to it, once one has been found.
    current: ArcSwapOption<(String, ConnectionManager)>,
}

impl SentinelConn {
    /// The connection to the primary last found; a connection error while none is known.
    pub(crate) fn primary(&self) -> Result<ConnectionManager, RedisError> {
        match &*self.current.load() {
            Some(current) => Ok(current.1.clone()),
            None => Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                format!("no sentinel has named a primary for {} yet", self.target.name),
            ))),
        }
    }

    /// Ask the sentinels which server is primary now; a server other than the one connected
    /// to gets a new connection (the old one is dropped: its decisions in flight end).
    pub(crate) async fn refresh(&self) -> Result<(), RedisError> {
        let (addr, client) = resolve_primary(&self.target, self.tls.as_ref(), self.timeout).await?;
        if self.current.load().as_ref().is_some_and(|c| c.0 == addr) {
            return Ok(());
        }
        let wait = self.timeout.max(Duration::from_millis(200));
        let manager = tokio::time::timeout(
            wait,
            ConnectionManager::new_with_config(client, manager_config(self.timeout)),
        )
        .await
        .map_err(|_| {
            RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("the primary at {addr} did not answer within {wait:?}"),
            ))
        })??;
        self.current.store(Some(Arc::new((addr, manager))));
        Ok(())
    }
}

fn manager_config(timeout: Duration) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout.max(Duration::from_millis(100))))
        .set_response_timeout(None)
        .set_number_of_retries(1)
        .set_min_delay(Duration::from_millis(1))
        .set_max_delay(Duration::from_millis(10))
}

/// An error at connect that no reconnect mends: refused TLS, a refused password, a server that
/// is not Redis.
fn fatal(e: RedisError) -> Error {
    let refused = e.kind() == ErrorKind::AuthenticationFailed
        || e.code().is_some_and(|c| c == "NOAUTH" || c == "WRONGPASS")
        || e.to_string().contains("NOAUTH");
    if is_tls_error(&e) {
        Error::Tls(e.to_string())
    } else if refused {
        Error::Refused(e.to_string())
    } else {
        Error::NotRedis(e.to_string())
    }
}

/// Connect to `target`: `(connection, true)`, or a lazy connection and `false` when the server
/// does not answer within `timeout`.
pub(crate) async fn connect(
    target: &Target,
    tls: Option<&Tls>,
    timeout: Duration,
) -> Result<(Conn, bool), Error> {
    match target {
        Target::Single(url) => {
            let client = open_client(url, tls)?;
            let config = manager_config(timeout);
            let wait = timeout.max(Duration::from_millis(200));
            match tokio::time::timeout(
                wait,
                ConnectionManager::new_with_config(client.clone(), config.clone()),
            )
            .await
            {
                Ok(Ok(c)) => Ok((Conn::Single(c), true)),
                Ok(Err(e)) if !is_connection_error(&e) || is_tls_error(&e) => Err(fatal(e)),
                _ => {
                    let c = ConnectionManager::new_lazy_with_config(client, config)
                        .map_err(|e| Error::Url(e.to_string()))?;
                    Ok((Conn::Single(c), false))
                }
            }
        }
        Target::Sentinel(sentinel) => {
            let conn = Arc::new(SentinelConn {
                target: sentinel.clone(),
                tls: tls.cloned(),
                timeout,
                current: ArcSwapOption::empty(),
            });
            match conn.refresh().await {
                Ok(()) => Ok((Conn::Sentinel(conn), true)),
                Err(e) if !is_connection_error(&e) || is_tls_error(&e) => Err(fatal(e)),
                // No sentinel answered, or none names a primary that answers: start down, and
                // ask again in the background.
                Err(_) => Ok((Conn::Sentinel(conn), false)),
            }
        }
        Target::Cluster(nodes) => {
            let mut builder = redis::cluster::ClusterClientBuilder::new(
                nodes.iter().map(|n| with_scheme(n, tls.is_some())).collect::<Vec<_>>(),
            )
            .connection_timeout(timeout.max(Duration::from_millis(100)))
            .response_timeout(timeout.max(Duration::from_millis(100)));
            if let Some(tls) = tls {
                builder = cluster_tls(builder, tls)?;
            }
            let client = builder.build().map_err(|e| Error::Url(e.to_string()))?;
            let c = tokio::time::timeout(Duration::from_secs(5), client.get_async_connection())
                .await
                .map_err(|_| Error::Down("no cluster node answered within 5 s".into()))?
                .map_err(|e| {
                    if is_tls_error(&e) {
                        Error::Tls(e.to_string())
                    } else {
                        Error::Down(e.to_string())
                    }
                })?;
            Ok((Conn::Cluster(c), true))
        }
    }
}

/// A write refused by a replica: the server connected to is no longer the primary (a failover
/// demoted it). Handled as a connection that is down, so the probe finds the primary again.
fn is_read_only(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
}

/// A server error that says the command does not exist (Redis 6 has no `FUNCTION`; a server may
/// rename it away).
fn is_unknown_command(e: &RedisError) -> bool {
    e.detail().is_some_and(|d| d.starts_with("unknown command"))
        || e.to_string().contains("unknown command")
}

/// `FCALL` of a library the server does not have (a new server, `FUNCTION FLUSH`, a failover to
/// a replica without it).
fn is_missing_function(e: &RedisError) -> bool {
    e.detail().is_some_and(|d| d.starts_with("Function not found"))
        || e.to_string().contains("Function not found")
}

/// What every handle of one limiter shares: the connection and its state, the layers, the
/// failover and the counters.
pub(crate) struct Shared {
    pub(crate) conn: Conn,
    pub(crate) code: &'static Code,
    /// `true` while the server takes the function library (`FCALL`); `false` once it has been
    /// found without `FUNCTION`: then the script (`EVALSHA`).
    pub(crate) functions: AtomicBool,
    /// Whether the builder allows the module's command.
    pub(crate) module: bool,
    /// `true` while the server has the module's command (`RATEWELL.BATCH`): calls go to it.
    pub(crate) native: AtomicBool,
    pub(crate) layers: Vec<LayerSpec>,
    pub(crate) prefix: String,
    pub(crate) timeout: Duration,
    pub(crate) failover: Failover,
    pub(crate) local: Option<LayeredLimiter>,
    pub(crate) backoff_min: Duration,
    pub(crate) backoff_max: Duration,
    pub(crate) backoff_ns: AtomicU64,
    pub(crate) down: AtomicBool,
    pub(crate) wake: Arc<Notify>,
    pub(crate) counters: Counters,
    pub(crate) cluster: bool,
    /// A cluster's node URLs as given (empty on one node): where `delete_keys` starts.
    pub(crate) nodes: Vec<String>,
    pub(crate) batchers: Batchers,
    /// The most requests one call carries.
    pub(crate) max_batch: usize,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // The reconnect task holds only a weak reference: wake it so that it sees it is the last.
        self.wake.notify_one();
    }
}

impl Shared {
    pub(crate) fn mark_down(&self) {
        if !self.down.swap(true, Ordering::AcqRel) {
            bump(&self.counters.disconnects);
            self.wake.notify_one();
        }
    }

    /// Load the code into the server: the function library (`FUNCTION LOAD REPLACE`, on every
    /// primary of a cluster), or the script (`SCRIPT LOAD`) where the server has no `FUNCTION`.
    /// Returns the reply of the load, to check that the server is Redis.
    pub(crate) async fn load(&self) -> Result<Value, RedisError> {
        if self.functions.load(Ordering::Relaxed) {
            let mut load = redis::cmd("FUNCTION");
            load.arg("LOAD").arg("REPLACE").arg(&self.code.library);
            match self.conn.query(&load).await {
                Ok(v) => {
                    bump(&self.counters.script_loads);
                    return Ok(v);
                }
                Err(e) if is_unknown_command(&e) => self.functions.store(false, Ordering::Relaxed),
                Err(e) => return Err(e),
            }
        }
        let mut load = redis::cmd("SCRIPT");
        load.arg("LOAD").arg(&self.code.script);
        let v = self.conn.query(&load).await?;
        bump(&self.counters.script_loads);
        Ok(v)
    }

    /// Whether the server has the module's command (`COMMAND INFO ratewell.batch`): calls go to
    /// it from now on if it has (and the builder allows it). An error leaves it as it was.
    pub(crate) async fn detect_module(&self) {
        if !self.module {
            return;
        }
        let mut info = redis::cmd("COMMAND");
        info.arg("INFO").arg("ratewell.batch");
        let wait = self.timeout.max(Duration::from_secs(1));
        if let Ok(Ok(Value::Array(items))) =
            tokio::time::timeout(wait, self.conn.query(&info)).await
        {
            let found = items.first().is_some_and(|i| !matches!(i, Value::Nil));
            self.native.store(found, Ordering::Relaxed);
        }
    }

    /// Whether a load's reply is the one Redis gives: the library's name, or the script's SHA1.
    pub(crate) fn loaded(&self, reply: &Value) -> bool {
        let want = if self.functions.load(Ordering::Relaxed) {
            &self.code.function
        } else {
            &self.code.sha
        };
        match reply {
            Value::BulkString(b) => b == want.as_bytes(),
            Value::SimpleString(s) => s == want,
            // A cluster answers an all-primaries load with one node's reply, or "OK".
            Value::Okay => self.cluster,
            _ => false,
        }
    }

    /// Decide one request: sent at once if nothing is in flight on its connection (its slot),
    /// else queued for the next call. Its reply is `[now_us, fields...]`, as a call of that
    /// request alone would answer. Never waits past the timeout, and not at all while down.
    pub(crate) async fn submit(self: &Arc<Self>, request: Request) -> Result<Value, Error> {
        if self.down.load(Ordering::Acquire) {
            return Err(Error::Down("reconnecting".into()));
        }
        let deadline = Instant::now() + self.deadline();
        let batcher = self.batchers.of(&request.keys);
        let request = match batcher.join(request) {
            Joined::Lead(request) => request,
            Joined::Queued(rx) => {
                return match tokio::time::timeout_at(deadline, rx).await {
                    Ok(Ok(reply)) => reply,
                    Ok(Err(_)) => {
                        Err(Error::Down("the call carrying the request was dropped".into()))
                    }
                    Err(_) => {
                        self.mark_down();
                        Err(Error::Timeout)
                    }
                };
            }
        };
        let lead = Lead { shared: self, batcher: &batcher };
        let reply = self.send(&[&request], deadline).await.pop();
        drop(lead);
        reply.unwrap_or_else(|| Err(Error::BadReply("no reply".into())))
    }

    /// One call carrying `requests`, in order; one reply (or error) per request.
    pub(crate) async fn send(
        &self,
        requests: &[&Request],
        deadline: Instant,
    ) -> Vec<Result<Value, Error>> {
        let all = |e: Error| requests.iter().map(|_| Err(e.clone())).collect();
        if self.down.load(Ordering::Acquire) {
            return all(Error::Down("reconnecting".into()));
        }
        let counts: Vec<Vec<u8>> = std::iter::once(requests.len())
            .chain(requests.iter().flat_map(|r| [r.keys.len(), r.args.len()]))
            .map(|n| n.to_string().into_bytes())
            .collect();
        let keys: Vec<&str> =
            requests.iter().flat_map(|r| r.keys.iter().map(String::as_str)).collect();
        let mut args: Vec<&[u8]> =
            Vec::with_capacity(counts.len() + requests.iter().map(|r| r.args.len()).sum::<usize>());
        args.push(&counts[0]);
        for (i, r) in requests.iter().enumerate() {
            args.push(&counts[1 + 2 * i]);
            args.push(&counts[2 + 2 * i]);
            args.extend(r.args.iter().map(Vec::as_slice));
        }
        bump(&self.counters.calls);
        let reply = match self.call(&keys, &args, deadline).await {
            Ok(reply) => reply,
            Err(e) => return all(e),
        };
        // The library answers an array; the module one string holding the same fields.
        let items: Vec<Field> = match reply {
            Value::Array(items) => items.into_iter().map(Field::Value).collect(),
            Value::BulkString(blob) => match module_fields(&blob) {
                Some(items) => items,
                None => return all(Error::BadReply("the module's reply does not decode".into())),
            },
            _ => return all(Error::BadReply("the script's reply is not an array".into())),
        };
        if items.len() != 1 + requests.iter().map(|r| r.fields).sum::<usize>() {
            return all(Error::BadReply("the script's reply has the wrong length".into()));
        }
        let mut items = items.into_iter();
        let now = match items.next() {
            Some(Field::Value(v)) => v,
            _ => Value::Int(0),
        };
        requests
            .iter()
            .map(|r| {
                let mut fields = Vec::with_capacity(1 + r.fields);
                fields.push(now.clone());
                let mut error = None;
                for f in items.by_ref().take(r.fields) {
                    match f {
                        Field::Value(Value::ServerError(e)) if fields.len() == 1 => {
                            error = Some(e.to_string())
                        }
                        Field::Value(v) => fields.push(v),
                        Field::Error(e) => error = error.or(Some(e)),
                    }
                }
                match error {
                    Some(e) => Err(Error::BadReply(e)),
                    None => Ok(Value::Array(fields)),
                }
            })
            .collect()
    }

    /// One call of the code (`FCALL`, or `EVALSHA` where the server has no `FUNCTION`) with
    /// `keys` and `args`, by `deadline`. Code the server lacks is loaded and the call made again;
    /// a server found without `FUNCTION` is called with the script from then on. A connection
    /// error, or no answer by the deadline, marks the connection down.
    pub(crate) async fn call(
        &self,
        keys: &[&str],
        args: &[&[u8]],
        deadline: Instant,
    ) -> Result<Value, Error> {
        let command = |functions: bool| {
            let mut cmd;
            if functions {
                cmd = redis::cmd("FCALL");
                cmd.arg(&self.code.function);
            } else {
                cmd = redis::cmd("EVALSHA");
                cmd.arg(&self.code.sha);
            }
            cmd.arg(keys.len()).arg(keys).arg(args);
            cmd
        };
        let call = async {
            if self.native.load(Ordering::Relaxed) {
                let mut cmd = redis::cmd("RATEWELL.BATCH");
                cmd.arg(keys).arg(frame(args));
                match self.conn.query(&cmd).await {
                    // The module is gone (a failover to a server without it): the library.
                    Err(e) if is_unknown_command(&e) => self.native.store(false, Ordering::Relaxed),
                    other => {
                        bump(&self.counters.module_calls);
                        return other;
                    }
                }
            }
            let functions = self.functions.load(Ordering::Relaxed);
            match self.conn.query(&command(functions)).await {
                Err(e)
                    if is_missing_function(&e)
                        || is_unknown_command(&e)
                        || e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) =>
                {
                    if functions && is_unknown_command(&e) {
                        // A server without FCALL (Redis 6): the script from now on.
                        self.functions.store(false, Ordering::Relaxed);
                    }
                    self.load().await?;
                    self.conn.query(&command(self.functions.load(Ordering::Relaxed))).await
                }
                other => other,
            }
        };
        match tokio::time::timeout_at(deadline, call).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) if is_connection_error(&e) || is_read_only(&e) => {
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
    pub(crate) fn deadline(&self) -> Duration {
        if self.timeout >= Duration::from_millis(6) {
            self.timeout - Duration::from_millis(3)
        } else {
            self.timeout
        }
    }

    pub(crate) fn keys_for(&self, layer: usize, key: &str) -> String {
        redis_key(&self.prefix, &self.layers[layer].name, key)
    }
}

/// The request that found nothing in flight, while its call is out: when it ends (or its
/// caller drops it), what queued meanwhile is handed to a task that drains the queue.
struct Lead<'a> {
    shared: &'a Arc<Shared>,
    batcher: &'a Arc<Batcher>,
}

impl Drop for Lead<'_> {
    fn drop(&mut self) {
        if !self.batcher.release() {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(drain(self.shared.clone(), self.batcher.clone()));
            }
            Err(_) => {
                // No runtime to drain on (it is shutting down): the waiting requests fail now.
                self.batcher.fail_waiting(&Error::Down("the runtime is shutting down".into()));
            }
        }
    }
}

/// Send what waits, up to the limiter's batch at a time, until nothing does.
async fn drain(shared: Arc<Shared>, batcher: Arc<Batcher>) {
    loop {
        let batch = batcher.next_batch(shared.max_batch);
        if batch.is_empty() {
            return;
        }
        let deadline = Instant::now() + shared.deadline();
        let requests: Vec<&Request> = batch.iter().map(|w| &w.request).collect();
        let replies = shared.send(&requests, deadline).await;
        for (w, reply) in batch.into_iter().zip(replies) {
            let _ = w.reply.send(reply);
        }
        // The callers just answered are ready to run, and most will submit again at once: let
        // them queue before the next call goes, or it would carry only what queued during the
        // round trip and the next one everything else (alternate calls of 1 and of the batch).
        tokio::task::yield_now().await;
    }
}

/// One field of a call's reply.
enum Field {
    Value(Value),
    /// A request's error, from the module's reply.
    Error(String),
}

/// The fields of the module's reply (`ratewell_redis_module::encode_reply`): the server's time,
/// then each field tagged `0` (an integer), `1` (a string) or `2` (an error's text).
fn module_fields(blob: &[u8]) -> Option<Vec<Field>> {
    let (now, mut rest) = blob.split_first_chunk::<8>()?;
    let mut out = vec![Field::Value(Value::Int(i64::from_le_bytes(*now)))];
    while let Some((&tag, tail)) = rest.split_first() {
        match tag {
            0 => {
                let (v, tail) = tail.split_first_chunk::<8>()?;
                out.push(Field::Value(Value::Int(i64::from_le_bytes(*v))));
                rest = tail;
            }
            1 | 2 => {
                let (len, tail) = tail.split_first_chunk::<4>()?;
                let len = u32::from_le_bytes(*len) as usize;
                if tail.len() < len {
                    return None;
                }
                let (bytes, tail) = tail.split_at(len);
                out.push(if tag == 1 {
                    Field::Value(Value::BulkString(bytes.to_vec()))
                } else {
                    Field::Error(String::from_utf8_lossy(bytes).into_owned())
                });
                rest = tail;
            }
            _ => return None,
        }
    }
    Some(out)
}

/// The library's arguments as the module's command takes them, in one argument: each as a
/// 4-byte little-endian length and its bytes (`ratewell_redis_module::frames` reads it).
fn frame(args: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::with_capacity(args.iter().map(|a| 4 + a.len()).sum());
    for a in args {
        out.extend_from_slice(&(a.len() as u32).to_le_bytes());
        out.extend_from_slice(a);
    }
    out
}

/// Probe a down connection with backoff until it answers, then mark it up.
pub(crate) async fn reconnect(shared: Weak<Shared>, wake: Arc<Notify>) {
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
            if let Conn::Sentinel(sentinel) = &s.conn {
                // The primary may have changed: ask the sentinels before probing it. A failure
                // leaves the last primary known to the probe below.
                let _ = tokio::time::timeout(timeout * 4, sentinel.refresh()).await;
            }
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
                // The server that is back may have the module or not (a failover, a restart).
                s.detect_module().await;
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
