//! [`LayeredDecision`]: the decision on a request of a [`LayeredLimiter`] (the combined verdict
//! and each layer's), and the HTTP fields a layered limiter renders: its `RateLimit-Policy`, and
//! the `RateLimit` of a decision.

use super::{LayerState, LayeredLimiter, MAX_LAYERS};
use crate::clock::Clock;
use crate::decision::{Decision, Outcome};
#[cfg(doc)]
use crate::policy::Policy;

/// The decision on a request of a [`LayeredLimiter`]: the combined verdict, and each layer's own
/// decision.
///
/// Combined (over the enforcing layers that decided; dry-run layers are reported only per layer
/// and in [`would_reject`](Self::would_reject)): impossible if any layer finds the cost
/// impossible, else rejected if any rejects (or finds its table full), else admitted. Its
/// `limit` and `remaining` are the layer's with the least remaining (the first on ties); its
/// `reset_after` the largest; its `retry_after` the largest over the rejecting layers; its
/// `delay` the largest. A request whose every layer was skipped is admitted, with nothing
/// remaining and nothing to wait for.
#[derive(Clone, Copy, Debug)]
pub struct LayeredDecision {
    layers: [Decision; MAX_LAYERS],
    len: u8,
    /// Bit `i`: layer `i` was skipped (its key absent).
    pub(super) skipped: u8,
    /// Bit `i`: layer `i` is a dry run.
    dry_run: u8,
    /// Bit `i`: layer `i` is a dry run that would have rejected.
    would_reject: u8,
    /// The enforcing layer whose outcome decides a request it did not admit: the first
    /// impossible one, else the first that rejected, else the first whose table was full.
    rejected_by: Option<u8>,
}

const NOTHING: Decision = Decision::admitted(0, 0, 0, 0);

/// How strongly an outcome decides a request: impossible over rejected over table full.
#[inline]
fn rank(outcome: Outcome) -> u8 {
    match outcome {
        Outcome::Impossible => 3,
        Outcome::Rejected => 2,
        Outcome::TableFull => 1,
        _ => 0,
    }
}

impl Default for LayeredDecision {
    /// A decision of no layer (admitted, nothing remaining): a buffer for
    /// [`LayeredLimiter::check_into`].
    fn default() -> Self {
        LayeredDecision {
            layers: [NOTHING; MAX_LAYERS],
            len: 0,
            skipped: 0,
            dry_run: 0,
            would_reject: 0,
            rejected_by: None,
        }
    }
}

impl LayeredDecision {
    /// Start a decision of `len` layers: every layer's decision is then recorded (or the layer
    /// marked skipped) before it is read.
    #[inline]
    pub(super) fn start(&mut self, len: usize) {
        self.len = len as u8;
        self.skipped = 0;
        self.dry_run = 0;
        self.would_reject = 0;
        self.rejected_by = None;
    }

    /// Record layer `i`'s decision; an enforcing layer's that is not an admission may be the
    /// one that decides the request (the first of the strongest outcome: see [`rank`]).
    #[inline]
    pub(super) fn record(&mut self, i: usize, layer: &LayerState, decision: Decision) {
        self.record_as(i, layer.policy.is_dry_run(), decision);
    }

    #[inline]
    fn record_as(&mut self, i: usize, dry_run: bool, decision: Decision) {
        self.layers[i] = decision;
        if decision.is_admitted() {
            if dry_run {
                self.dry_run |= 1 << i;
            }
            return;
        }
        if dry_run {
            self.dry_run |= 1 << i;
            self.would_reject |= 1 << i;
            return;
        }
        let stronger = match self.rejected_by {
            None => true,
            Some(by) => rank(decision.outcome()) > rank(self.layers[usize::from(by)].outcome()),
        };
        if stronger {
            self.rejected_by = Some(i as u8);
        }
    }

    /// The enforcing layers that decided.
    #[inline]
    fn enforcing(&self) -> impl Iterator<Item = (usize, &Decision)> {
        let ignored = self.skipped | self.dry_run;
        self.layers[..usize::from(self.len)]
            .iter()
            .enumerate()
            .filter(move |&(i, _)| ignored & (1 << i) == 0)
    }

    /// The layered decision of layers decided elsewhere (another store deciding the same
    /// layers, such as a Redis script), combined exactly as [`LayeredLimiter`] combines its own:
    /// one `(decision, dry_run)` per layer in order, `None` for a skipped layer (its key absent).
    /// `None` for more than [`MAX_LAYERS`] layers.
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{Decision, LayeredDecision, Outcome};
    ///
    /// let ok = Decision::from_parts(Outcome::Admitted, 10, 4, 600, 0, Some(100));
    /// let no = Decision::from_parts(Outcome::Rejected, 5, 0, 900, 300, Some(300));
    /// let d = LayeredDecision::from_layers([(Some(ok), false), (Some(no), false), (None, false)])
    ///     .expect("three layers");
    /// assert!(!d.is_admitted());
    /// assert_eq!(d.decided_by(), Some(1));
    /// assert_eq!(d.decision().retry_after_ns(), Some(300));
    /// assert!(d.is_skipped(2));
    /// ```
    pub fn from_layers<I>(layers: I) -> Option<Self>
    where
        I: IntoIterator<Item = (Option<Decision>, bool)>,
    {
        let mut out = LayeredDecision::default();
        let mut len = 0;
        for (i, (decision, dry_run)) in layers.into_iter().enumerate() {
            if i >= MAX_LAYERS {
                return None;
            }
            len = i + 1;
            match decision {
                Some(decision) => out.record_as(i, dry_run, decision),
                None => out.skipped |= 1 << i,
            }
        }
        out.len = len as u8;
        Some(out)
    }

    /// The combined decision (see the type's documentation): what to answer the request.
    pub fn decision(&self) -> Decision {
        let Some(least) = self.least() else { return NOTHING };
        let (mut reset, mut delay, mut retry) = (0u64, 0u64, 0u64);
        for (_, d) in self.enforcing() {
            reset = reset.max(d.reset_after_ns());
            delay = delay.max(d.delay_ns());
            retry = retry.max(d.retry_after_ns().unwrap_or(0));
        }
        let base = self.layers[least];
        match self.rejected_by {
            None => base.combined(Outcome::Admitted, reset, delay),
            Some(by) => match self.layers[usize::from(by)].outcome() {
                Outcome::Impossible => base.combined(Outcome::Impossible, reset, 0),
                outcome => base.combined(outcome, reset, retry),
            },
        }
    }

    /// `true` if every enforcing layer admitted the request (it was charged to all of them).
    #[inline]
    pub fn is_admitted(&self) -> bool {
        self.rejected_by.is_none()
    }

    /// The combined outcome.
    pub fn outcome(&self) -> Outcome {
        match self.rejected_by {
            None => Outcome::Admitted,
            Some(by) => self.layers[usize::from(by)].outcome(),
        }
    }

    /// The layer that decided: for a rejection, the first enforcing layer that rejected it (or
    /// found it impossible: that layer first); for an admission, the one with the least
    /// remaining. `None` when every layer was skipped or is a dry run.
    pub fn decided_by(&self) -> Option<usize> {
        match self.rejected_by {
            Some(by) => Some(usize::from(by)),
            None => self.least(),
        }
    }

    /// The enforcing layer with the least remaining (the first on ties).
    fn least(&self) -> Option<usize> {
        let mut least: Option<(usize, u64)> = None;
        for (i, d) in self.enforcing() {
            if least.is_none_or(|(_, r)| d.remaining() < r) {
                least = Some((i, d.remaining()));
            }
        }
        least.map(|(i, _)| i)
    }

    /// Layer `i`'s own decision; `None` for a layer skipped (its key absent) or one beyond the
    /// limiter's.
    pub fn layer(&self, i: usize) -> Option<&Decision> {
        (i < usize::from(self.len) && self.skipped & (1 << i) == 0).then(|| &self.layers[i])
    }

    /// The dry-run layers that would have rejected the request (indices, in order).
    pub fn would_reject(&self) -> impl Iterator<Item = usize> + '_ {
        (0..usize::from(self.len)).filter(|i| self.would_reject & (1 << i) != 0)
    }

    /// Whether layer `i` was skipped (its key absent).
    pub fn is_skipped(&self, i: usize) -> bool {
        self.skipped & (1 << i) != 0
    }

    /// The `Retry-After` value of the combined decision (see [`Decision::retry_after_header`]).
    pub fn retry_after_header(&self) -> Option<String> {
        self.decision().retry_after_header()
    }
}

impl<C: Clock> LayeredLimiter<C> {
    /// The `RateLimit-Policy` field: one item per layer, in order, named by the layer
    /// (draft-ietf-httpapi-ratelimit-headers; see [`Policy::ratelimit_policy_field`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{Layer, LayeredLimiter, ManualClock, Policy};
    ///
    /// let layers = vec![
    ///     Layer::new("burst", &"token-bucket capacity=10 rate=10/s".parse::<Policy>()?),
    ///     Layer::new("daily", &"fixed-window limit=10000 window=1d".parse::<Policy>()?),
    /// ];
    /// let limiter = LayeredLimiter::with_clock(layers, ManualClock::new(0))?;
    /// assert_eq!(limiter.ratelimit_policy_field(), r#""burst";q=10;w=1, "daily";q=10000;w=86400"#);
    /// let d = limiter.check(&[&"alice"], 1)?;
    /// assert_eq!(limiter.ratelimit_field(&d), r#""burst";r=9;t=1, "daily";r=9999;t=86400"#);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn ratelimit_policy_field(&self) -> String {
        let items: Vec<String> =
            self.layers.iter().map(|l| l.policy.ratelimit_policy_field(&l.name)).collect();
        items.join(", ")
    }

    /// The `RateLimit` field of a decision of this limiter: one item per layer that decided it
    /// (skipped layers have none), named by the layer.
    pub fn ratelimit_field(&self, decision: &LayeredDecision) -> String {
        let mut field = String::new();
        self.write_ratelimit_field(decision, &mut field);
        field
    }

    /// [`ratelimit_field`](Self::ratelimit_field) appended to `out` (one buffer, no allocation
    /// of its own: for a field written on every response).
    pub fn write_ratelimit_field(&self, decision: &LayeredDecision, out: &mut String) {
        let mut first = true;
        for (i, layer) in self.layers.iter().enumerate() {
            if let Some(d) = decision.layer(i) {
                if !first {
                    out.push_str(", ");
                }
                first = false;
                d.write_ratelimit_field(&layer.name, out);
            }
        }
    }
}
