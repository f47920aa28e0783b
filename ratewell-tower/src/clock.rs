//! tokio's clock as a decision clock.

/// tokio's clock ([`tokio::time::Instant`]) as a [`ratewell::Clock`]: decisions follow the same
/// time as the delays the layer sleeps, so a test on a paused runtime
/// (`tokio::time::pause`, `#[tokio::test(start_paused = true)]`) controls both.
///
/// It reads the time through the runtime (a system call where a TSC read would do): for tests
/// and for services that want the layer on tokio's time; the default clock is the engine's
/// `QuantaClock`.
#[derive(Clone, Copy, Debug)]
pub struct TokioClock {
    start: tokio::time::Instant,
}

impl TokioClock {
    /// A clock whose epoch is now.
    pub fn new() -> Self {
        TokioClock { start: tokio::time::Instant::now() }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl ratewell::Clock for TokioClock {
    fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}
