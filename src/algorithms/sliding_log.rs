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

/// A log's entries as the algorithm reads and writes them: a [`Log`] on the heap, or a shared
/// table's log in its region (`keyed/shared/logs.rs`). Entries are `(time, cost)`, oldest first,
/// times strictly increasing, costs at least 1.
pub(crate) trait Entries {
    /// Entries held.
    fn len(&self) -> usize;
    /// Entry `i`, oldest first.
    fn get(&self, i: usize) -> (u64, u64);
    /// The cost of every entry held.
    fn total(&self) -> u64;

    /// The newest entry.
    fn newest(&self) -> Option<(u64, u64)> {
        self.len().checked_sub(1).map(|i| self.get(i))
    }
}

/// [`Entries`] that an admission and a refund write.
pub(crate) trait EntriesMut: Entries {
    /// Drop the `expired` oldest entries, add `cost` at `at` (to the newest entry if it is at
    /// `at`, else as a new newest entry, `at` being later than every entry), and make the total
    /// `total`.
    fn admit(&mut self, expired: usize, at: u64, cost: u64, total: u64);
    /// Take `back` (at most its cost) off entry `i` and the total, dropping the entry when no
    /// cost is left.
    fn take_off(&mut self, i: usize, back: u64);
}

impl Entries for Log {
    fn len(&self) -> usize {
        self.entries.len()
    }
    fn get(&self, i: usize) -> (u64, u64) {
        self.entries[i]
    }
    fn total(&self) -> u64 {
        self.total
    }
}

impl EntriesMut for Log {
    fn admit(&mut self, expired: usize, at: u64, cost: u64, total: u64) {
        self.entries.drain(..expired);
        self.total = total;
        match self.entries.back_mut() {
            Some((t, c)) if *t == at => *c += cost,
            _ => {
                if self.entries.capacity() == 0 {
                    self.entries.reserve_exact(4);
                }
                self.entries.push_back((at, cost));
            }
        }
    }
    fn take_off(&mut self, i: usize, back: u64) {
        let entry = &mut self.entries[i].1;
        *entry -= back;
        self.total -= back;
        if *entry == 0 {
            self.entries.remove(i);
        }
    }
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

    /// A copy of `entries` on the heap.
    #[cfg(all(target_os = "linux", not(ratewell_loom)))] // shared tables
    pub(crate) fn copied(entries: &impl Entries) -> Log {
        let mut log =
            Log { entries: VecDeque::with_capacity(entries.len()), total: entries.total() };
        log.entries.extend((0..entries.len()).map(|i| entries.get(i)));
        log
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

    /// The most entries a log of this policy holds (its limit, and at least 1).
    #[cfg(all(target_os = "linux", not(ratewell_loom)))] // shared tables
    pub(crate) fn max_entries(&self) -> u64 {
        self.limit.max(1)
    }

    /// Decide, and log the request when `commit` and admitted; without `commit`, a peek: the
    /// outcome of the request, with the log's remaining, reset and replenish times as they are.
    ///
    /// Only an admission writes: it drops the entries that can never count again (older than
    /// `at - W`, with `at` the new newest time). A rejection or a peek reads, so a later reading
    /// between the newest entry and this one still sees every entry it should.
    pub(crate) fn decide(
        &self,
        log: &mut impl EntriesMut,
        now: u64,
        cost: u32,
        commit: bool,
    ) -> Decision {
        if commit {
            self.take(log, now, cost).0
        } else {
            self.evaluate(log, now, u64::from(cost), false).0
        }
    }

    /// Decide and log the request if admitted; the time of its entry (what
    /// [`give_back`](Self::give_back) needs) when it was.
    pub(crate) fn take(
        &self,
        log: &mut impl EntriesMut,
        now: u64,
        cost: u32,
    ) -> (Decision, Option<u64>) {
        let (decision, admit) = self.evaluate(log, now, u64::from(cost), true);
        let Some(Admit { expired, live, at }) = admit else { return (decision, None) };
        let cost = u64::from(cost);
        log.admit(expired, at, cost, live + cost);
        (decision, Some(at))
    }

    /// Take back an admission of `cost` logged at `at`: its cost comes off that entry, if the
    /// log still holds it (exact: the log is then the one without the admission); an entry
    /// already dropped has nothing left to give back.
    pub(crate) fn give_back(&self, log: &mut impl EntriesMut, at: u64, cost: u64) {
        // The entries' times increase strictly: a binary search for `at`.
        let (mut lo, mut hi) = (0, log.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match log.get(mid).0.cmp(&at) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => {
                    let back = cost.min(log.get(mid).1);
                    log.take_off(mid, back);
                    return;
                }
            }
        }
    }

    /// The decision on `log` without logging anything (a peek).
    pub(crate) fn peek(&self, log: &impl Entries, now: u64, cost: u32) -> Decision {
        self.evaluate(log, now, u64::from(cost), false).0
    }

    /// The log as it is at `now`, as a decision that takes nothing (impossible).
    pub(crate) fn probe(&self, log: &impl Entries, now: u64) -> Decision {
        self.evaluate(log, now, u64::MAX, false).0
    }

    /// The decision on `log`, and what an admission to be committed changes.
    fn evaluate(
        &self,
        log: &impl Entries,
        now: u64,
        cost: u64,
        commit: bool,
    ) -> (Decision, Option<Admit>) {
        let len = log.len();
        let newest = log.newest().map(|(t, _)| t);
        // Decide at the later of `now` and the newest entry; report waits from `now`.
        let at = newest.map_or(now, |t| t.max(now));
        // Entries at or after `at - W` are live.
        let oldest_live = at.saturating_sub(self.window);
        let mut expired = 0;
        let mut dead = 0u64;
        while expired < len {
            let (t, c) = log.get(expired);
            if t >= oldest_live {
                break;
            }
            dead = dead.saturating_add(c);
            expired += 1;
        }
        // Exact for a log this code wrote; saturating for a shared table's log that another
        // process's bytes corrupted (a wrong decision then, never an overflow).
        let live = log.total().saturating_sub(dead);
        let remaining = self.limit.saturating_sub(live);
        let reset_at = |newest: u64| newest.saturating_add(self.window + 1).saturating_sub(now);
        let reset = if live == 0 { 0 } else { newest.map_or(0, reset_at) };
        // More quota comes when the oldest live entry stops counting.
        let next = if expired < len { reset_at(log.get(expired).0) } else { 0 };
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
        for i in expired..len {
            let (t, c) = log.get(i);
            freed = c.saturating_add(freed);
            if live.saturating_sub(freed) + cost <= self.limit {
                retry = reset_at(t);
                break;
            }
        }
        (Decision::rejected(self.limit, remaining, reset, retry).replenish(next), None)
    }

    /// `true` once every entry has expired at `now` (a reading earlier than the newest entry
    /// never counts as expired).
    pub(crate) fn is_fresh(&self, log: &impl Entries, now: u64) -> bool {
        log.newest().is_none_or(|(t, _)| t.saturating_add(self.window) < now)
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
