//! Sliding log: the exact sliding window, at the price of a log per key.
//!
//! Admit iff `c <= N` and (admitted cost with time in the closed interval `[now - W, now]`) `+ c <= N`;
//! admitted requests are logged, rejected ones are not. This is the one algorithm whose state is not
//! a single word: each key owns a ring of `(time, cost)` entries. Entries admitted at the same
//! instant are merged, and every entry carries cost >= 1 while the live total is at most `N`, so a
//! log never holds more than `N` entries; `N` is at most 65,536 (a configuration error above).
//!
//! A reading earlier than the newest entry is taken at the newest entry's time (the later of the
//! two), so the log stays sorted and no entry is dropped early.
//!
//! # Contract
//!
//! The sliding log's counterpart of [`OneWord`](super::OneWord), on a [`Log`] its caller keeps
//! under a lock (the direct limiter's mutex, a shard of the keyed log table):
//!
//! - [`SlidingLog::decide`] decides and, when `commit` and admitted, logs the request (a peek
//!   without `commit` writes nothing); the only method that writes;
//! - [`SlidingLog::probe`] is the log's state at `now` as a decision that takes nothing;
//! - [`SlidingLog::is_fresh`] says the log decides like an empty one (it may then be dropped).

use std::collections::VecDeque;

use super::{Invalid, invalid};
use crate::decision::Decision;

/// The largest limit a sliding log accepts (entries per key).
pub(crate) const MAX_LIMIT: u32 = 65_536;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SlidingLog {
    limit: u64,
    window: u64,
}

/// One key's log.
#[derive(Debug, Default)]
pub(crate) struct Log {
    entries: VecDeque<(u64, u64)>,
    total: u64,
}

/// What committing an admission changes: the entries to drop, the live cost, the entry's time.
struct Admit {
    expired: usize,
    live: u64,
    at: u64,
}

impl Log {
    /// The entries, oldest first: `(time, cost)`.
    pub(crate) fn entries(&self) -> impl ExactSizeIterator<Item = (u64, u64)> + '_ {
        self.entries.iter().copied()
    }

    /// A log of `entries` (oldest first), if it is one that `policy` could have written: times
    /// strictly increasing, costs at least 1, at most `limit` in all, every entry within the
    /// window of the newest. `None` otherwise (a corrupted snapshot).
    pub(crate) fn from_entries(policy: &SlidingLog, entries: Vec<(u64, u64)>) -> Option<Log> {
        let newest = entries.last().map_or(0, |&(t, _)| t);
        let mut total = 0u64;
        let mut last = None;
        for &(t, cost) in &entries {
            if cost == 0 || last.is_some_and(|l| l >= t) || t.saturating_add(policy.window) < newest
            {
                return None;
            }
            total = total.checked_add(cost)?;
            last = Some(t);
        }
        (total <= policy.limit).then(|| Log { entries: entries.into(), total })
    }

    /// Bytes of the entry buffer (16 an entry of its capacity).
    pub(crate) fn allocated_bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<(u64, u64)>()
    }
}

impl SlidingLog {
    pub(crate) fn new(limit: u32, window_ns: u64) -> Result<Self, Invalid> {
        if limit > MAX_LIMIT {
            return invalid("limit", format!("a limit of at most {MAX_LIMIT} for a sliding log"));
        }
        Ok(SlidingLog { limit: u64::from(limit), window: window_ns })
    }

    /// Decide, and log the request when `commit` and admitted; without `commit`, a peek: the
    /// outcome of the request, with the log's remaining, reset and replenish times as they are.
    ///
    /// Only an admission writes: it drops the entries that can never count again (older than
    /// `at - W`, with `at` the new newest time). A rejection or a peek reads, so a later reading
    /// between the newest entry and this one still sees every entry it should.
    pub(crate) fn decide(&self, log: &mut Log, now: u64, cost: u32, commit: bool) -> Decision {
        if commit {
            self.take(log, now, cost).0
        } else {
            self.evaluate(log, now, u64::from(cost), false).0
        }
    }

    /// Decide and log the request if admitted; the time of its entry (what
    /// [`give_back`](Self::give_back) needs) when it was.
    pub(crate) fn take(&self, log: &mut Log, now: u64, cost: u32) -> (Decision, Option<u64>) {
        let (decision, admit) = self.evaluate(log, now, u64::from(cost), true);
        let Some(Admit { expired, live, at }) = admit else { return (decision, None) };
        let cost = u64::from(cost);
        log.entries.drain(..expired);
        log.total = live + cost;
        match log.entries.back_mut() {
            Some((t, c)) if *t == at => *c += cost,
            _ => {
                if log.entries.capacity() == 0 {
                    log.entries.reserve_exact(4);
                }
                log.entries.push_back((at, cost));
            }
        }
        (decision, Some(at))
    }

    /// Take back an admission of `cost` logged at `at`: its cost comes off that entry, if the
    /// log still holds it (exact: the log is then the one without the admission); an entry
    /// already dropped has nothing left to give back.
    pub(crate) fn give_back(&self, log: &mut Log, at: u64, cost: u64) {
        let Ok(i) = log.entries.binary_search_by_key(&at, |&(t, _)| t) else { return };
        let entry = &mut log.entries[i].1;
        let back = cost.min(*entry);
        *entry -= back;
        log.total -= back;
        if *entry == 0 {
            log.entries.remove(i);
        }
    }

    /// The decision on `log` without logging anything (a peek).
    pub(crate) fn peek(&self, log: &Log, now: u64, cost: u32) -> Decision {
        self.evaluate(log, now, u64::from(cost), false).0
    }

    /// The log as it is at `now`, as a decision that takes nothing (impossible).
    pub(crate) fn probe(&self, log: &Log, now: u64) -> Decision {
        self.evaluate(log, now, u64::MAX, false).0
    }

    /// The decision on `log`, and what an admission to be committed changes.
    fn evaluate(&self, log: &Log, now: u64, cost: u64, commit: bool) -> (Decision, Option<Admit>) {
        // Decide at the later of `now` and the newest entry; report waits from `now`.
        let at = log.entries.back().map_or(now, |&(t, _)| t.max(now));
        // Entries at or after `at - W` are live.
        let oldest_live = at.saturating_sub(self.window);
        let expired = log.entries.iter().take_while(|&&(t, _)| t < oldest_live).count();
        let dead: u64 = log.entries.iter().take(expired).map(|&(_, c)| c).sum();
        let live = log.total - dead;
        let remaining = self.limit - live;
        let reset_at = |newest: u64| newest.saturating_add(self.window + 1).saturating_sub(now);
        let newest = log.entries.back().map(|&(t, _)| t);
        let reset = if live == 0 { 0 } else { newest.map_or(0, reset_at) };
        // More quota comes when the oldest live entry stops counting.
        let next = log.entries.get(expired).map_or(0, |&(t, _)| reset_at(t));
        if cost > self.limit {
            return (Decision::impossible(self.limit, remaining, reset).replenish(next), None);
        }
        if live + cost <= self.limit {
            if !commit {
                let d = Decision::admitted(self.limit, remaining, reset, 0).replenish(next);
                return (d, None);
            }
            let next = if live == 0 { reset_at(at) } else { next };
            let d =
                Decision::admitted(self.limit, remaining - cost, reset_at(at), 0).replenish(next);
            return (d, Some(Admit { expired, live, at }));
        }
        // Entry `t` stops counting at `t + W + 1`; wait for the oldest live ones until `cost` fits.
        let mut freed = 0;
        let mut retry = 0;
        for &(t, c) in log.entries.iter().skip(expired) {
            freed += c;
            if live - freed + cost <= self.limit {
                retry = reset_at(t);
                break;
            }
        }
        (Decision::rejected(self.limit, remaining, reset, retry).replenish(next), None)
    }

    /// `true` once every entry has expired at `now` (a reading earlier than the newest entry
    /// never counts as expired).
    pub(crate) fn is_fresh(&self, log: &Log, now: u64) -> bool {
        log.entries.back().is_none_or(|&(t, _)| t.saturating_add(self.window) < now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closed_interval_and_retry() {
        let s = SlidingLog::new(2, 100).unwrap();
        let mut log = Log::default();
        assert!(s.decide(&mut log, 10, 1, true).is_admitted());
        assert!(s.decide(&mut log, 50, 1, true).is_admitted());
        // The entry at 10 still counts at 110 (110 - 100 = 10 is inside [10, 110]).
        let d = s.decide(&mut log, 110, 1, true);
        assert_eq!(d.retry_after_ns(), Some(1));
        assert!(s.decide(&mut log, 111, 1, true).is_admitted());
        // Live: 50 and 111. One fits once 50 expires (at 151), two once 111 does (at 212).
        assert_eq!(s.decide(&mut log, 111, 1, false).retry_after_ns(), Some(40));
        assert_eq!(s.decide(&mut log, 111, 2, false).retry_after_ns(), Some(101));
        assert!(s.decide(&mut log, 111, 3, false).is_impossible());
        assert!(SlidingLog::new(65_537, 100).is_err());
    }
}
