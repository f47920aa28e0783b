//! The service's clock: monotonic, but read as nanoseconds since the Unix epoch, so that fixed
//! windows open on the epoch's boundaries as envoyproxy/ratelimit's do (replicas and restarts
//! agree on them), while a step of the wall clock neither mints nor freezes quota.

use std::time::{SystemTime, UNIX_EPOCH};

use ratewell::{Clock, QuantaClock};

/// The TSC clock ([`QuantaClock`]) offset by the wall clock's reading when it was made: it
/// reads the Unix time of its start plus the monotonic time since.
///
/// ```
/// use ratewell::Clock;
/// use ratewell_rls::clock::EpochClock;
///
/// let clock = EpochClock::new();
/// let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
/// let drift = clock.now().abs_diff(wall.as_nanos() as u64);
/// assert!(drift < 1_000_000_000);
/// ```
#[derive(Clone, Debug)]
pub struct EpochClock {
    inner: QuantaClock,
    offset: u64,
}

impl EpochClock {
    /// A clock anchored to the wall clock now (a wall clock before 1970 reads as the epoch).
    pub fn new() -> Self {
        let inner = QuantaClock::new();
        let wall = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let offset =
            u64::try_from(wall.as_nanos()).unwrap_or(u64::MAX / 2).saturating_sub(inner.now());
        EpochClock { inner, offset }
    }
}

impl Default for EpochClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for EpochClock {
    const MONOTONIC: bool = true;

    #[inline]
    fn now(&self) -> u64 {
        self.offset + self.inner.now()
    }
}
