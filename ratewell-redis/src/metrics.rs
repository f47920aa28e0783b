//! What a limiter counts: [`Metrics`].

use std::sync::atomic::{AtomicU64, Ordering};

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
    /// Calls of the server's code: each carries one request, or a batch of those that queued
    /// while the previous call was in flight (requests over calls is the mean batch).
    pub calls: u64,
    /// Of those calls, the ones the native command of ratewell-redis-module decided
    /// (`RATEWELL.BATCH`); the rest went to the function library (or the script).
    pub module_calls: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) server: AtomicU64,
    pub(crate) failover_timeout: AtomicU64,
    pub(crate) failover_down: AtomicU64,
    pub(crate) failover_bad_reply: AtomicU64,
    pub(crate) script_loads: AtomicU64,
    pub(crate) disconnects: AtomicU64,
    pub(crate) reconnects: AtomicU64,
    pub(crate) refunds: AtomicU64,
    pub(crate) calls: AtomicU64,
    pub(crate) module_calls: AtomicU64,
}

pub(crate) fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl Counters {
    pub(crate) fn snapshot(&self) -> Metrics {
        let c = self;
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
            calls: l(&c.calls),
            module_calls: l(&c.module_calls),
        }
    }
}
