//! Opportunistic batching: at most one call in flight per connection (per hash slot on a
//! cluster). A request that finds none in flight is sent at once, alone; the requests that
//! arrive while a call is in flight queue, and go as one call when it
//! returns (at most [`Builder::batch`](crate::Builder::batch), 64 unless set). No timer: a lone task's decision is never delayed, and under load a call carries
//! what queued during the previous one's round trip, and what the callers that call answered
//! submit as soon as they run (they run before the next call goes).
//!
//! A request joins the queue when its future is first polled: decisions started in order (one
//! task awaiting each in turn, or futures first polled in order) are decided in that order.
//! The server decides a call's requests in queue order, each as its own call would be decided
//! (`decide.lua`, `batch`), so batching changes how many round trips the decisions take, never
//! what they are. Every request keeps its own deadline, counted from when it was submitted: a
//! request caught in a call that does not return fails over by its own timeout, and a request
//! whose caller stopped waiting before its call was sent is not sent.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use redis::Value;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::conn::Shared;
use crate::error::Error;
use crate::keys::slot;
use crate::metrics::bump;

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

/// The requests one call carries at most, unless the builder says otherwise
/// (`benches/round_trips.rs` sweeps 1, 4, 16 and 64).
pub(crate) const DEFAULT_BATCH: usize = 64;
/// The most a builder may set.
pub(crate) const MAX_BATCH: usize = 1024;

/// One request of a call: its keys and arguments (`decide.lua`'s `K` and `A`), and the number of
/// fields its reply has (1 for a refund, 1 + 6 per layer otherwise).
pub(crate) struct Request {
    pub(crate) keys: Vec<String>,
    pub(crate) args: Vec<Vec<u8>>,
    pub(crate) fields: usize,
}

struct Waiting {
    request: Request,
    reply: oneshot::Sender<Result<Value, Error>>,
}

#[derive(Default)]
struct Queue {
    waiting: VecDeque<Waiting>,
    /// A call is in flight (or about to be): new requests queue. Never `false` while requests
    /// wait.
    busy: bool,
}

/// One connection's (one slot's) queue.
#[derive(Default)]
pub(crate) struct Batcher {
    queue: Mutex<Queue>,
}

impl Batcher {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // The queue is consistent between statements: a panic elsewhere leaves it usable.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The queues of a limiter: one, or one per hash slot in use on a cluster.
pub(crate) enum Batchers {
    Single(Arc<Batcher>),
    Cluster(Mutex<HashMap<u16, Arc<Batcher>>>),
}

impl Batchers {
    pub(crate) fn new(cluster: bool) -> Self {
        if cluster {
            Batchers::Cluster(Mutex::new(HashMap::new()))
        } else {
            Batchers::Single(Arc::default())
        }
    }

    fn of(&self, keys: &[String]) -> Arc<Batcher> {
        match self {
            Batchers::Single(b) => b.clone(),
            Batchers::Cluster(slots) => {
                let slot = keys.first().map_or(0, |k| slot(k.as_bytes()));
                let mut slots = slots.lock().unwrap_or_else(PoisonError::into_inner);
                slots.entry(slot).or_default().clone()
            }
        }
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
        let mut q = self.batcher.lock();
        if q.waiting.is_empty() {
            q.busy = false;
            return;
        }
        drop(q);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(drain(self.shared.clone(), self.batcher.clone()));
            }
            Err(_) => {
                // No runtime to drain on (it is shutting down): the waiting requests fail now.
                let mut q = self.batcher.lock();
                for w in q.waiting.drain(..) {
                    let _ = w.reply.send(Err(Error::Down("the runtime is shutting down".into())));
                }
                q.busy = false;
            }
        }
    }
}

/// Send what waits, up to the limiter's batch at a time, until nothing does.
async fn drain(shared: Arc<Shared>, batcher: Arc<Batcher>) {
    loop {
        let batch: Vec<Waiting> = {
            let mut q = batcher.lock();
            let max = shared.max_batch;
            let mut batch = Vec::with_capacity(q.waiting.len().min(max));
            while batch.len() < max {
                match q.waiting.pop_front() {
                    // Its caller stopped waiting (it failed over): not sent.
                    Some(w) if w.reply.is_closed() => {}
                    Some(w) => batch.push(w),
                    None => break,
                }
            }
            if batch.is_empty() {
                q.busy = false;
                return;
            }
            batch
        };
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

impl Shared {
    /// Decide one request: sent at once if nothing is in flight on its connection (its slot),
    /// else queued for the next call. Its reply is `[now_us, fields...]`, as a call of that
    /// request alone would answer. Never waits past the timeout, and not at all while down.
    pub(crate) async fn submit(self: &Arc<Self>, request: Request) -> Result<Value, Error> {
        if self.down.load(std::sync::atomic::Ordering::Acquire) {
            return Err(Error::Down("reconnecting".into()));
        }
        let deadline = Instant::now() + self.deadline();
        let batcher = self.batchers.of(&request.keys);
        let (request, queued) = {
            let mut q = batcher.lock();
            if q.busy {
                let (tx, rx) = oneshot::channel();
                q.waiting.push_back(Waiting { request, reply: tx });
                (None, Some(rx))
            } else {
                q.busy = true;
                (Some(request), None)
            }
        };
        if let Some(rx) = queued {
            return match tokio::time::timeout_at(deadline, rx).await {
                Ok(Ok(reply)) => reply,
                Ok(Err(_)) => Err(Error::Down("the call carrying the request was dropped".into())),
                Err(_) => {
                    self.mark_down();
                    Err(Error::Timeout)
                }
            };
        }
        let request = request.expect("either queued or sent");
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
        if self.down.load(std::sync::atomic::Ordering::Acquire) {
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
}
