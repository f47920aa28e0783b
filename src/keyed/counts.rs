//! Admitted and rejected counters that a decision updates without a locked instruction.
//!
//! A keyed limiter counts every decision. A `fetch_add` per decision is a second locked
//! instruction next to the state's compare-exchange (a full barrier on x86: it drains the store
//! buffer), and a counter shared between threads is a cache line they pass back and forth. So:
//!
//! - every thread that counts leases an index below [`OWNED`] from a process-wide bitmap, for as
//!   long as it lives (its thread-local lease gives the index back when the thread exits);
//! - a [`Counts`] keeps one cache-padded pair of counters per index. Only the thread holding the
//!   index writes them, so an update is a plain load and store (`Relaxed`), not a read-modify-write:
//!   no other writer can come between the two;
//! - a thread without an index (more than [`OWNED`] threads counting at once, or one whose
//!   thread-locals are being torn down) adds to one of [`SHARED`] striped pairs with `fetch_add`.
//!
//! Reading sums every pair, with `Relaxed` loads: a total of counts each exact, possibly a moment
//! behind decisions being made meanwhile.
//!
//! A shared table (`shared/`) keeps its counters in its region: one block of [`OWNED`] cells per
//! process attached (leased by the process's identity, and taken over from a dead one, whose
//! counts it keeps adding to), and the striped pairs, shared by every process. Its sum is every
//! block's.
//!
//! Handing an index over: the exiting thread's last stores to its counters come before the
//! `Release` of its bit; the next thread takes the bit with an `Acquire` compare-exchange, so its
//! first load of each counter sees those stores, and it goes on from there.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::mem::Slab;

/// Threads that can count at the same time without a read-modify-write.
pub(crate) const OWNED: usize = 64;
/// Striped counters for the threads beyond [`OWNED`].
pub(crate) const SHARED: usize = 8;

/// Bit `i` set: index `i` is leased to a live thread.
static LEASED: AtomicU64 = AtomicU64::new(0);

/// Counters a thread's cell spans: one cache line of `u64`s, of which it uses the first two.
const CELL: usize = 128 / 8;
/// This thread has not asked for an index yet (past every cell).
const UNASKED: usize = usize::MAX / 2;
/// This thread has no index: it counts on the shared stripes (past every cell).
const NO_INDEX: usize = OWNED;

thread_local! {
    /// This thread's cell among a [`Counts`]'s owned ones, or [`UNASKED`], or [`NO_INDEX`], so
    /// that a count is one bounds check and one increment. No destructor, so reading it is a
    /// plain thread-local load, valid until the thread is gone.
    static INDEX: Cell<usize> = const { Cell::new(UNASKED) };
    /// Holds the leased index; gives it back when the thread exits.
    static LEASE: Lease = Lease::take();
}

const _: () = assert!(OWNED <= 64 && NO_INDEX + 1 < UNASKED);

/// One thread's counters (rejected, admitted), on a cache line pair of its own; and one stripe.
#[derive(Default)]
#[repr(C, align(128))]
pub(crate) struct Counters([AtomicU64; CELL]);

/// A shared table's counters in its region: every process's block of [`OWNED`] cells, then the
/// [`SHARED`] stripes, then the refunds.
#[cfg_attr(not(all(target_os = "linux", not(ratewell_loom))), allow(dead_code))] // shared tables only
pub(crate) const fn region_cells(blocks: usize) -> usize {
    blocks * OWNED + SHARED + 1
}

struct Lease(Option<usize>);

impl Lease {
    fn take() -> Self {
        let mut leased = LEASED.load(Ordering::Relaxed);
        loop {
            let free = !leased;
            if free == 0 {
                return Lease(None);
            }
            let bit = free.trailing_zeros() as usize;
            match LEASED.compare_exchange_weak(
                leased,
                leased | 1 << bit,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Lease(Some(bit)),
                Err(now) => leased = now,
            }
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // Whatever this thread counts from now on goes to the shared stripes.
        let _ = INDEX.try_with(|i| i.set(NO_INDEX));
        if let Some(bit) = self.0 {
            LEASED.fetch_and(!(1 << bit), Ordering::Release);
        }
    }
}

/// One limiter's admitted and rejected counts, and its refunds.
pub(crate) struct Counts {
    /// This process's cells (none: a shared table with no block left for this process counts
    /// on the stripes).
    owned: Slab<Counters>,
    /// The stripes; then one more cell, whose first word counts refunds.
    shared: Slab<Counters>,
    /// A shared table's every block of cells, this process's included, for the sum.
    all: Option<Slab<Counters>>,
}

impl Counts {
    pub(crate) fn new() -> Self {
        let cells = |n: usize| Slab::from_box((0..n).map(|_| Counters::default()).collect());
        Counts { owned: cells(OWNED), shared: cells(SHARED + 1), all: None }
    }

    /// The counts of a shared table: `cells` ([`region_cells`]`(blocks)` of them) in its region,
    /// this process counting in block `block` (`None`: on the stripes).
    #[cfg_attr(not(all(target_os = "linux", not(ratewell_loom))), allow(dead_code))] // shared tables only
    pub(crate) fn in_region(
        region: &std::sync::Arc<crate::mem::Region>,
        offset: usize,
        blocks: usize,
        block: Option<usize>,
    ) -> Option<Self> {
        let size = size_of::<Counters>();
        let owned = match block {
            Some(b) => Slab::in_region(region, offset + b * OWNED * size, OWNED)?,
            None => Slab::from_box(Box::new([])),
        };
        let all = Slab::in_region(region, offset, blocks * OWNED)?;
        let shared = Slab::in_region(region, offset + blocks * OWNED * size, SHARED + 1)?;
        Some(Counts { owned, shared, all: Some(all) })
    }

    /// Count one refund.
    #[inline]
    pub(crate) fn refund(&self) {
        self.shared[SHARED].0[0].fetch_add(1, Ordering::Relaxed);
    }

    /// Refunds counted.
    #[inline]
    pub(crate) fn refunds(&self) -> u64 {
        self.shared[SHARED].0[0].load(Ordering::Relaxed)
    }

    /// Count one decision.
    #[inline]
    pub(crate) fn record(&self, admitted: bool) {
        // Column 1 admitted, 0 rejected: the bool is the offset in the cell.
        let column = usize::from(admitted);
        let at = INDEX.with(Cell::get);
        match self.owned.get(at) {
            Some(cell) => {
                let counter = &cell.0[column];
                // This thread is the only writer of its cell: no update can come in between.
                counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
            }
            None => self.record_unowned(at, column),
        }
    }

    /// A thread's first count (it leases an index), or one of a thread without an index.
    #[cold]
    #[inline(never)]
    fn record_unowned(&self, at: usize, column: usize) {
        if at == UNASKED {
            // `try_with` fails only while this thread's thread-locals are being destroyed.
            let leased = LEASE.try_with(|lease| lease.0).ok().flatten();
            INDEX.with(|i| i.set(leased.unwrap_or(NO_INDEX)));
            if leased.is_some() {
                return self.record(column == 1);
            }
        }
        // Threads without an index spread over the stripes by the address of their thread-local.
        let stripe = INDEX.with(|i| std::ptr::from_ref(i) as usize >> 6) % SHARED;
        self.shared[stripe].0[column].fetch_add(1, Ordering::Relaxed);
    }

    /// `(admitted, rejected)` over every thread.
    pub(crate) fn sum(&self) -> (u64, u64) {
        let cells = self.all.as_deref().unwrap_or(&self.owned);
        let owned = cells.iter().map(|cell| [&cell.0[0], &cell.0[1]]);
        let shared = self.shared[..SHARED].iter().map(|pair| [&pair.0[0], &pair.0[1]]);
        owned.chain(shared).fold((0, 0), |(a, r), [rejected, admitted]| {
            // Saturating: a shared table's cells are other processes' bytes.
            let add =
                |sum: u64, counter: &AtomicU64| sum.saturating_add(counter.load(Ordering::Relaxed));
            (add(a, admitted), add(r, rejected))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn counts_from_many_threads_add_up() {
        // More threads than indices, several rounds (indices are handed over as threads exit).
        let counts = Arc::new(Counts::new());
        for _ in 0..3 {
            let handles: Vec<_> = (0..OWNED + 20)
                .map(|t| {
                    let counts = Arc::clone(&counts);
                    std::thread::spawn(move || {
                        for i in 0..1000 {
                            counts.record((i + t) % 3 != 0);
                        }
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap();
            }
        }
        let threads = 3 * (OWNED + 20);
        let rejected: usize =
            (0..OWNED + 20).map(|t| (0..1000).filter(|i| (i + t) % 3 == 0).count()).sum::<usize>()
                * 3;
        assert_eq!(counts.sum(), ((threads * 1000 - rejected) as u64, rejected as u64));
    }
}
