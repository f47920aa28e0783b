//! The one place that chooses between `std` atomics and loom's model-checked ones.
//!
//! Every other module imports atomics from here, so `RUSTFLAGS="--cfg ratewell_loom"` swaps the
//! whole crate onto loom without a line of `#[cfg]` elsewhere (the crossbeam arrangement).

#[cfg(not(ratewell_loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(ratewell_loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};

#[cfg(ratewell_loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(ratewell_loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};

/// Lock `mutex`, whether or not a thread panicked holding it: every structure behind the crate's
/// mutexes is valid after each of its updates, so a panic elsewhere (a caller's hasher, a
/// failed allocation) leaves nothing half-written to refuse.
#[inline]
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
