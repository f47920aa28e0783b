//! Clocks: nanoseconds since the limiter's epoch.
//!
//! Limiters are generic over [`Clock`] (monomorphised, never a trait object on the hot path).
//! [`QuantaClock`] reads the TSC; [`CoarseClock`] reads a time kept by a background thread (cheaper,
//! less precise); [`ManualClock`] is set by hand (tests, `replay`, loom, fuzzing).

use std::sync::Arc;
use std::time::Duration;

use crate::sync::{AtomicU64, Ordering};

/// A source of time in nanoseconds since an epoch of the clock's choosing.
///
/// Readings may go backwards, by any amount: a limiter never lets its time go below the latest
/// reading it has acted on (see [`MONOTONIC`](Clock::MONOTONIC)), so an earlier reading never
/// mints capacity. While the clock is behind that reading, the limiter's time stands still:
/// nothing refills until the clock catches up (stricter, never looser).
///
/// # Examples
///
/// A wall-clock-based clock (it may be stepped back by NTP or an operator):
///
/// ```
/// use std::time::{SystemTime, UNIX_EPOCH};
/// use ratewell::{Clock, Limiter, Policy};
///
/// struct Wall;
/// impl Clock for Wall {
///     fn now(&self) -> u64 {
///         let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
///         u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
///     }
/// }
///
/// let limiter = Limiter::with_clock(&"token-bucket capacity=1 rate=1/h".parse::<Policy>()?, Wall);
/// assert!(limiter.check().is_admitted());
/// assert!(!limiter.check().is_admitted());
/// # Ok::<(), ratewell::PolicyError>(())
/// ```
pub trait Clock {
    /// Nanoseconds since this clock's epoch.
    fn now(&self) -> u64;

    /// `true` if readings never go backwards on one thread and readings on different threads
    /// differ by at most a few microseconds (the crate's TSC clocks). Such readings are used as
    /// they are: the algorithms themselves take a reading earlier than a key's state at the
    /// state's time, for steps back shorter than the policy's idle horizon (at least 19.5 hours).
    ///
    /// `false` (the default) for any other clock: the limiter then keeps the latest reading it
    /// has acted on in one word of its own and decides at the later of the two, so a step back of
    /// any size is safe. That word is written whenever the clock has moved past it (a shared
    /// write when several threads decide at once): declare a clock monotonic only if it is.
    const MONOTONIC: bool = false;
}

/// The latest reading a limiter has acted on, for clocks that are not [`Clock::MONOTONIC`]: the
/// limiter decides at `max(reading, floor)`, the running maximum of its readings.
///
/// A plain `std` atomic, not modelled by loom: it publishes nothing but its own value (`Relaxed`),
/// and `fetch_max` alone makes it the maximum of every reading stored.
///
/// The limiter's time is that reading plus an *offset*, 0 unless a snapshot was restored
/// (`src/snapshot.rs`): the offset puts the clock's readings on the snapshot's time line, so the
/// restored states keep their meaning without rewriting any of them.
#[derive(Debug, Default)]
pub(crate) struct Floor {
    max: std::sync::atomic::AtomicU64,
    offset: u64,
}

impl Floor {
    /// The time to decide at: the clock's reading, or the latest one acted on if that is later,
    /// plus the offset.
    #[inline]
    pub(crate) fn now<C: Clock>(&self, clock: &C) -> u64 {
        self.reading(clock).wrapping_add(self.offset)
    }

    /// The clock's reading, or the latest one acted on if that is later (no offset).
    #[inline]
    pub(crate) fn reading<C: Clock>(&self, clock: &C) -> u64 {
        let now = clock.now();
        if C::MONOTONIC {
            return now;
        }
        let floor = self.max.load(std::sync::atomic::Ordering::Relaxed);
        if now > floor { self.raise(now) } else { floor }
    }

    /// Decide from now on at `reading + offset`.
    pub(crate) fn set_offset(&mut self, offset: u64) {
        self.offset = offset;
    }

    #[inline]
    fn raise(&self, now: u64) -> u64 {
        self.max.fetch_max(now, std::sync::atomic::Ordering::Relaxed).max(now)
    }
}

/// The TSC via `quanta`, scaled to nanoseconds: the default clock.
///
/// # Examples
///
/// ```
/// use ratewell::{Clock, QuantaClock};
///
/// let clock = QuantaClock::new();
/// let a = clock.now();
/// assert!(clock.now() >= a);
/// ```
#[derive(Clone, Debug)]
pub struct QuantaClock {
    clock: quanta::Clock,
    start: u64,
}

impl QuantaClock {
    /// A clock whose epoch is now.
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        let start = clock.raw();
        QuantaClock { clock, start }
    }
}

impl Default for QuantaClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for QuantaClock {
    const MONOTONIC: bool = true;

    #[inline]
    fn now(&self) -> u64 {
        // `delta_as_nanos` returns 0 for a reading below `start` (another core's TSC behind).
        self.clock.delta_as_nanos(self.start, self.clock.raw())
    }
}

/// The clock of a shared table (`KeyedLimiter::open_shared`): the TSC (quanta's counter) read
/// as every process attached to the table reads it, from the origin and scale in the table's
/// header, so that all of them read the same time for the same instant.
///
/// A process's own [`QuantaClock`] has its own calibration and epoch: two processes would
/// disagree by the difference of their epochs, and drift apart by the difference of their
/// calibrations. This clock's reading is `(counter - origin) * scale / 2^32` with the header's
/// `origin` and `scale` (nanoseconds per 2^32 ticks, measured by the process that made the
/// table; each process that attaches checks that its own calibration is within 10%: that it reads
/// the same counter). Where quanta
/// reads no TSC, its counter is `CLOCK_MONOTONIC` in nanoseconds, and the scale 2^32.
#[derive(Clone, Debug)]
pub struct SharedClock {
    clock: quanta::Clock,
    origin: u64,
    scale: u64,
}

#[cfg_attr(not(all(target_os = "linux", not(ratewell_loom))), allow(dead_code))] // shared tables only
impl SharedClock {
    /// A reading of the counter now, and its scale as this process calibrates it.
    pub(crate) fn calibrate() -> (u64, u64) {
        let clock = quanta::Clock::new();
        (clock.raw(), clock.delta_as_nanos(0, 1 << 32))
    }

    pub(crate) fn new(origin: u64, scale: u64) -> Self {
        SharedClock { clock: quanta::Clock::new(), origin, scale }
    }
}

impl Clock for SharedClock {
    const MONOTONIC: bool = true;

    #[inline]
    fn now(&self) -> u64 {
        let ticks = self.clock.raw().saturating_sub(self.origin);
        ((u128::from(ticks) * u128::from(self.scale)) >> 32) as u64
    }
}

/// A coarse clock: `quanta`'s recent time, kept by a background thread.
///
/// A read is one load of a shared word, cheaper than a TSC read, at the price of precision: a
/// reading lags real time by up to the refresh interval, so limits are enforced on a clock that
/// moves in steps. The first `CoarseClock` of the process starts quanta's upkeep thread with its
/// interval; it then runs for the life of the process and every later `CoarseClock` shares it
/// (quanta allows one per process).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use ratewell::{Clock, CoarseClock};
///
/// let clock = CoarseClock::new(Duration::from_millis(1));
/// let a = clock.now();
/// assert!(clock.now() >= a);
/// ```
#[derive(Clone, Debug)]
pub struct CoarseClock {
    start: quanta::Instant,
    clock: quanta::Clock,
}

impl CoarseClock {
    /// A coarse clock whose epoch is now; the upkeep thread refreshes every `interval` (the first
    /// caller's interval wins).
    pub fn new(interval: Duration) -> Self {
        static UPKEEP: std::sync::OnceLock<Option<quanta::Handle>> = std::sync::OnceLock::new();
        // `start` fails if another component of the process already runs quanta's upkeep thread:
        // its time serves equally well.
        UPKEEP.get_or_init(|| quanta::Upkeep::new(interval).start().ok());
        let clock = quanta::Clock::new();
        CoarseClock { start: clock.recent(), clock }
    }
}

impl Clock for CoarseClock {
    const MONOTONIC: bool = true;

    #[inline]
    fn now(&self) -> u64 {
        self.clock.recent().saturating_duration_since(self.start).as_nanos() as u64
    }
}

/// A clock set by hand, shared by its clones.
///
/// # Examples
///
/// ```
/// use ratewell::{Clock, ManualClock};
///
/// let clock = ManualClock::new(5);
/// let view = clock.clone();
/// clock.advance(10);
/// assert_eq!(view.now(), 15);
/// clock.set(3); // clocks may go backwards; limiters never go below a reading they acted on
/// assert_eq!(view.now(), 3);
/// ```
#[derive(Clone, Debug)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock reading `now` ns.
    pub fn new(now: u64) -> Self {
        ManualClock { now: Arc::new(AtomicU64::new(now)) }
    }

    /// Set the reading to `now` ns (it may go backwards).
    pub fn set(&self, now: u64) {
        // Relaxed: the clock publishes only its own value.
        self.now.store(now, Ordering::Relaxed);
    }

    /// Move the reading forward by `ns` (saturating).
    pub fn advance(&self, ns: u64) {
        let now = self.now.load(Ordering::Relaxed);
        self.now.store(now.saturating_add(ns), Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now(&self) -> u64 {
        self.now.load(Ordering::Relaxed)
    }
}
