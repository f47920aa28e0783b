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
//!
//! This module holds the queues and their requests; the connection (`conn.rs`, `Shared::submit`)
//! submits to them and sends their calls.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use redis::Value;
use tokio::sync::oneshot;

use crate::error::Error;
use crate::keys::slot;

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

/// A queued request, and where its reply goes.
pub(crate) struct Waiting {
    pub(crate) request: Request,
    pub(crate) reply: oneshot::Sender<Result<Value, Error>>,
}

#[derive(Default)]
struct Queue {
    waiting: VecDeque<Waiting>,
    /// A call is in flight (or about to be): new requests queue. Never `false` while requests
    /// wait.
    busy: bool,
}

/// Where a request stands once it has joined its queue.
pub(crate) enum Joined {
    /// Nothing was in flight: the request goes now, alone, and the queue is busy until its call
    /// is over ([`Batcher::release`]).
    Lead(Request),
    /// A call is in flight: the request waits for a later call, and its reply comes here.
    Queued(oneshot::Receiver<Result<Value, Error>>),
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

    /// Join the queue: lead (sent at once) if nothing is in flight, else wait for a later call.
    pub(crate) fn join(&self, request: Request) -> Joined {
        let mut q = self.lock();
        if q.busy {
            let (tx, rx) = oneshot::channel();
            q.waiting.push_back(Waiting { request, reply: tx });
            Joined::Queued(rx)
        } else {
            q.busy = true;
            Joined::Lead(request)
        }
    }

    /// The lead's call is over (or its caller dropped it): `false` when nothing waits, and the
    /// queue is idle again; `true` when requests wait, and it stays busy until they are drained
    /// ([`next_batch`](Self::next_batch)) or failed ([`fail_waiting`](Self::fail_waiting)).
    pub(crate) fn release(&self) -> bool {
        let mut q = self.lock();
        if q.waiting.is_empty() {
            q.busy = false;
            return false;
        }
        true
    }

    /// The next call's requests: up to `max` that wait, in queue order. A request whose caller
    /// stopped waiting (it failed over) is dropped, not sent. Empty when none waits: the queue
    /// is idle again.
    pub(crate) fn next_batch(&self, max: usize) -> Vec<Waiting> {
        let mut q = self.lock();
        let mut batch = Vec::with_capacity(q.waiting.len().min(max));
        while batch.len() < max {
            match q.waiting.pop_front() {
                Some(w) if w.reply.is_closed() => {}
                Some(w) => batch.push(w),
                None => break,
            }
        }
        if batch.is_empty() {
            q.busy = false;
        }
        batch
    }

    /// Answer every waiting request with `error`; the queue is idle again.
    pub(crate) fn fail_waiting(&self, error: &Error) {
        let mut q = self.lock();
        for w in q.waiting.drain(..) {
            let _ = w.reply.send(Err(error.clone()));
        }
        q.busy = false;
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

    /// The queue of a request on `keys`: the one, or its first key's slot's.
    pub(crate) fn of(&self, keys: &[String]) -> Arc<Batcher> {
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
