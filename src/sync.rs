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

/// A mutex [`lock`] can take: the crate's (loom's under model checking) and `std`'s (the policy
/// registry's, which the models do not explore).
pub(crate) trait Lockable {
    type Guard<'a>
    where
        Self: 'a;
    fn lock_ignoring_poison(&self) -> Self::Guard<'_>;
}

impl<T> Lockable for std::sync::Mutex<T> {
    type Guard<'a>
        = std::sync::MutexGuard<'a, T>
    where
        T: 'a;
    fn lock_ignoring_poison(&self) -> Self::Guard<'_> {
        self.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(ratewell_loom)]
impl<T> Lockable for loom::sync::Mutex<T> {
    type Guard<'a>
        = loom::sync::MutexGuard<'a, T>
    where
        T: 'a;
    fn lock_ignoring_poison(&self) -> Self::Guard<'_> {
        self.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Lock `mutex`, whether or not a thread panicked holding it: every structure behind the crate's
/// mutexes is valid after each of its updates, so a panic elsewhere (a caller's hasher, a
/// failed allocation) leaves nothing half-written to refuse. The crate's one way to lock.
#[inline]
pub(crate) fn lock<M: Lockable>(mutex: &M) -> M::Guard<'_> {
    mutex.lock_ignoring_poison()
}
