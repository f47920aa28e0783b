//! Policies: an algorithm and its parameters ([`Parameters`]), validated into a [`Policy`] that
//! always builds a limiter. `text.rs` holds the grammar of `docs/SEMANTICS.md`, a view of the
//! same values: parsed with [`FromStr`](std::str::FromStr), printed canonically with
//! [`Display`](std::fmt::Display).

use std::fmt;

use crate::algorithms::{
    Algorithm, Invalid, discrete::Discrete, fixed::Align, fixed::Fixed, gcra::Gcra, invalid,
    leaky::Leaky, nginx::Nginx, sliding::Sliding, sliding_log::SlidingLog,
};

mod text;

use self::text::{COUNT, DURATION, RATE};

/// The largest timestamp or duration, in ns (`2^63 - 1`).
const MAX_NS: u64 = i64::MAX as u64;

/// A validated rate-limiting policy: an algorithm and its parameters.
///
/// Parsing validates everything, including whether the configuration fits the algorithm's packed
/// state exactly (see each algorithm's layout in the crate docs), so a `Policy` value always builds
/// a limiter. `Display` is canonical and parses back to an equal policy.
///
/// # Examples
///
/// ```
/// use ratewell::Policy;
///
/// let p: Policy = "gcra   rate=100/s burst=10".parse()?;
/// assert_eq!(p.to_string(), "token-bucket capacity=10 rate=100/s");
/// assert_eq!(p.to_string().parse::<Policy>()?, p);
///
/// let err = "fixed-window limit=10 window=0s".parse::<Policy>().unwrap_err();
/// assert_eq!(err.token(), "window=0s");
/// # Ok::<(), ratewell::PolicyError>(())
/// ```
#[derive(Clone, Debug)]
pub struct Policy {
    params: Parameters,
    /// A rate written `Nr/s` or `Nr/m` (nginx's spelling), printed back so.
    per_request: bool,
    /// The `dry-run` flag: decide and account as when enforcing, but never reject (honoured by
    /// [`LayeredLimiter`](crate::LayeredLimiter) and `ratewell replay`).
    dry_run: bool,
    pub(crate) algorithm: Algorithm,
}

impl PartialEq for Policy {
    fn eq(&self, other: &Self) -> bool {
        (self.params, self.per_request, self.dry_run)
            == (other.params, other.per_request, other.dry_run)
    }
}

impl Eq for Policy {}

/// Why a policy did not parse: the offending token and what was expected instead.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PolicyError {
    token: String,
    expected: String,
}

impl PolicyError {
    pub(crate) fn new(token: impl Into<String>, expected: impl Into<String>) -> Self {
        PolicyError { token: token.into(), expected: expected.into() }
    }

    /// The token at fault, as written (empty for an empty policy).
    pub fn token(&self) -> &str {
        &self.token
    }

    /// What was expected in its place.
    pub fn expected(&self) -> &str {
        &self.expected
    }
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.token.is_empty() {
            write!(f, "empty policy: expected {}", self.expected)
        } else {
            write!(f, "invalid policy at `{}`: expected {}", self.token, self.expected)
        }
    }
}

impl std::error::Error for PolicyError {}

fn compile(params: &Parameters) -> Result<Algorithm, Invalid> {
    Ok(match *params {
        Parameters::TokenBucket { capacity, count, period_ns } => {
            Algorithm::Gcra(Gcra::new(capacity, u64::from(count), period_ns)?)
        }
        Parameters::DiscreteFill { capacity, refill, every_ns } => {
            Algorithm::Discrete(Discrete::new(capacity, refill, every_ns)?)
        }
        Parameters::LeakyBucket { count, period_ns, burst, delay, nginx: false } => {
            Algorithm::Leaky(Leaky::new(u64::from(count), period_ns, burst, delay)?)
        }
        Parameters::LeakyBucket { count, period_ns, burst, delay, nginx: true } => {
            Algorithm::Nginx(Nginx::new(u64::from(count), period_ns, burst, delay)?)
        }
        Parameters::FixedWindow { limit, window_ns, align_first } => {
            let align = if align_first { Align::First } else { Align::Clock };
            Algorithm::Fixed(Fixed::new(limit, window_ns, align)?)
        }
        Parameters::SlidingWindow { limit, window_ns } => {
            Algorithm::Sliding(Sliding::new(limit, window_ns)?)
        }
        Parameters::SlidingLog { limit, window_ns } => {
            Algorithm::Log(SlidingLog::new(limit, window_ns)?)
        }
    })
}

/// What the grammar holds of each value before an algorithm sees it: counts from 1 (a burst
/// and a delay from 0), durations and rate periods from 1 ns to 2^63-1 ns.
fn check(params: &Parameters) -> Result<(), Invalid> {
    let count = |key, n: u32| if n == 0 { invalid(key, COUNT) } else { Ok(()) };
    let ns = |key, v: u64| if (1..=MAX_NS).contains(&v) { Ok(()) } else { invalid(key, DURATION) };
    let rate = |count: u32, period: u64| {
        if count == 0 || !(1..=MAX_NS).contains(&period) { invalid("rate", RATE) } else { Ok(()) }
    };
    match *params {
        Parameters::TokenBucket { capacity, count: c, period_ns } => {
            count("capacity", capacity)?;
            rate(c, period_ns)
        }
        Parameters::DiscreteFill { capacity, refill, every_ns } => {
            count("capacity", capacity)?;
            count("refill", refill)?;
            ns("every", every_ns)
        }
        Parameters::LeakyBucket { count: c, period_ns, .. } => rate(c, period_ns),
        Parameters::FixedWindow { limit, window_ns, .. }
        | Parameters::SlidingWindow { limit, window_ns }
        | Parameters::SlidingLog { limit, window_ns } => {
            count("limit", limit)?;
            ns("window", window_ns)
        }
    }
}

/// `period_ns`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Parameters {
    /// `token-bucket capacity=B rate=R` (GCRA).
    TokenBucket {
        /// `B`.
        capacity: u32,
        /// The rate's count.
        count: u32,
        /// The rate's period (ns).
        period_ns: u64,
    },
    /// `token-bucket capacity=B refill=K every=I`.
    DiscreteFill {
        /// `B`.
        capacity: u32,
        /// `K`.
        refill: u32,
        /// `I` (ns).
        every_ns: u64,
    },
    /// `leaky-bucket rate=R burst=B [nodelay | delay=D] [compat=nginx]`.
    LeakyBucket {
        /// The rate's count.
        count: u32,
        /// The rate's period (ns).
        period_ns: u64,
        /// `B`.
        burst: u32,
        /// `D`, or `None` for `nodelay`.
        delay: Option<u32>,
        /// `compat=nginx`.
        nginx: bool,
    },
    /// `fixed-window limit=N window=W [align=clock|first]`.
    FixedWindow {
        /// `N`.
        limit: u32,
        /// `W` (ns).
        window_ns: u64,
        /// `align=first` (windows open at a key's first request) rather than on the clock.
        align_first: bool,
    },
    /// `sliding-window limit=N window=W`.
    SlidingWindow {
        /// `N`.
        limit: u32,
        /// `W` (ns).
        window_ns: u64,
    },
    /// `sliding-log limit=N window=W`.
    SlidingLog {
        /// `N`.
        limit: u32,
        /// `W` (ns).
        window_ns: u64,
    },
}

impl TryFrom<Parameters> for Policy {
    type Error = PolicyError;

    /// The policy of `params`, validated as its text would be: the error names the `key=value`
    /// at fault as the canonical text writes it (see [`Policy::new`]).
    fn try_from(params: Parameters) -> Result<Self, PolicyError> {
        let fail = |e: Invalid| PolicyError::new(text::token_of(&params, e.key), e.expected);
        check(&params).map_err(fail)?;
        let algorithm = compile(&params).map_err(fail)?;
        Ok(Policy { params, per_request: false, dry_run: false, algorithm })
    }
}

impl Policy {
    /// The policy of `params`, enforcing: the same validation as the text's, with the same
    /// errors (the token is the `key=value` at fault, as [`Display`](fmt::Display) writes it).
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{Parameters, Policy};
    ///
    /// let p = Policy::new(Parameters::TokenBucket {
    ///     capacity: 10,
    ///     count: 100,
    ///     period_ns: 1_000_000_000,
    /// })?;
    /// assert_eq!(p.to_string(), "token-bucket capacity=10 rate=100/s");
    /// assert_eq!(p, "gcra burst=10 rate=100/s".parse()?);
    ///
    /// let e = Policy::new(Parameters::FixedWindow { limit: 10, window_ns: 0, align_first: false })
    ///     .unwrap_err();
    /// assert_eq!(e.token(), "window=0ns");
    /// assert_eq!(e, "fixed-window limit=10 window=0ns".parse::<Policy>().unwrap_err());
    /// # Ok::<(), ratewell::PolicyError>(())
    /// ```
    pub fn new(params: Parameters) -> Result<Policy, PolicyError> {
        Policy::try_from(params)
    }

    /// The algorithm and its parameters, as the grammar reads them (a store that decides the
    /// policy itself, such as a Redis script, starts from these).
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{Parameters, Policy};
    ///
    /// let p: Policy = "fixed-window limit=10 window=1m align=first".parse()?;
    /// assert_eq!(
    ///     p.parameters(),
    ///     Parameters::FixedWindow { limit: 10, window_ns: 60_000_000_000, align_first: true }
    /// );
    /// # Ok::<(), ratewell::PolicyError>(())
    /// ```
    pub fn parameters(&self) -> Parameters {
        self.params
    }

    /// The most this policy admits at once: the capacity, the limit, or a leaky bucket's
    /// `burst + 1`.
    pub fn limit(&self) -> u64 {
        match self.params {
            Parameters::TokenBucket { capacity, .. }
            | Parameters::DiscreteFill { capacity, .. } => u64::from(capacity),
            Parameters::LeakyBucket { burst, .. } => u64::from(burst) + 1,
            Parameters::FixedWindow { limit, .. }
            | Parameters::SlidingWindow { limit, .. }
            | Parameters::SlidingLog { limit, .. } => u64::from(limit),
        }
    }

    /// The span, in ns, over which [`limit`](Self::limit) applies: the window, or the time an
    /// empty bucket takes to refill completely (what `RateLimit-Policy`'s `w` reports).
    pub fn window_ns(&self) -> u64 {
        let refill = |tokens: u64, count: u32, period: u64| {
            let ns = u128::from(tokens) * u128::from(period) / u128::from(count);
            u64::try_from(ns).unwrap_or(u64::MAX)
        };
        match self.params {
            Parameters::TokenBucket { capacity, count, period_ns } => {
                refill(u64::from(capacity), count, period_ns)
            }
            Parameters::LeakyBucket { count, period_ns, burst, .. } => {
                refill(u64::from(burst) + 1, count, period_ns)
            }
            Parameters::DiscreteFill { capacity, refill, every_ns } => {
                let ns = u128::from(capacity.div_ceil(refill)) * u128::from(every_ns);
                u64::try_from(ns).unwrap_or(u64::MAX)
            }
            Parameters::FixedWindow { window_ns, .. }
            | Parameters::SlidingWindow { window_ns, .. }
            | Parameters::SlidingLog { window_ns, .. } => window_ns,
        }
    }

    /// The long-run rate, `count` per `period` ns: a bucket's refill or leak rate (as nginx
    /// rounds it under `compat=nginx`), a window's limit per window.
    pub(crate) fn long_run_rate(&self) -> (u128, u128) {
        if let Algorithm::Nginx(n) = &self.algorithm {
            return (u128::from(n.milli_per_second()), 1_000 * 1_000_000_000);
        }
        let (count, period) = match self.params {
            Parameters::TokenBucket { count, period_ns, .. }
            | Parameters::LeakyBucket { count, period_ns, .. } => (count, period_ns),
            Parameters::DiscreteFill { refill, every_ns, .. } => (refill, every_ns),
            Parameters::FixedWindow { limit, window_ns, .. }
            | Parameters::SlidingWindow { limit, window_ns }
            | Parameters::SlidingLog { limit, window_ns } => (limit, window_ns),
        };
        (u128::from(count), u128::from(period))
    }

    /// `true` with the `dry-run` flag (nginx's `limit_req_dry_run`): the policy decides and
    /// accounts exactly as when enforcing, but a [`LayeredLimiter`](crate::LayeredLimiter) does
    /// not reject a request for it (its decision says the layer would have). [`Limiter`](crate::Limiter)
    /// and [`KeyedLimiter`](crate::KeyedLimiter) report every decision as it is: a caller of those
    /// that wants a dry run reads this flag.
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::Policy;
    ///
    /// let p: Policy = "fixed-window limit=10 window=1s dry-run".parse()?;
    /// assert!(p.is_dry_run());
    /// assert_eq!(p.to_string(), "fixed-window limit=10 window=1s dry-run");
    /// assert_ne!(p, "fixed-window limit=10 window=1s".parse()?);
    /// assert!("fixed-window limit=10 window=1s dry-run dry-run".parse::<Policy>().is_err());
    /// # Ok::<(), ratewell::PolicyError>(())
    /// ```
    pub fn is_dry_run(&self) -> bool {
        self.dry_run
    }

    /// The same policy, enforcing (`dry_run == false`) or advisory.
    pub fn with_dry_run(mut self, dry_run: bool) -> Self {
        self.dry_run = dry_run;
        self
    }

    /// `true` for a leaky bucket that delays (not `nodelay`): its admitted decisions carry a delay.
    pub fn delays(&self) -> bool {
        matches!(self.params, Parameters::LeakyBucket { delay: Some(_), .. })
    }

    /// The longest silence of a key over which every decision stays exact (ns); after a longer
    /// one, a decision may be stricter (never looser). See the layout tables in the crate docs.
    pub fn idle_horizon_ns(&self) -> u128 {
        self.algorithm.idle_horizon_ns()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_display_round_trips() {
        for (input, canonical) in [
            ("token-bucket capacity=10 rate=5/s", "token-bucket capacity=10 rate=5/s"),
            ("gcra rate=5/1s burst=10", "token-bucket capacity=10 rate=5/s"),
            (
                "token-bucket every=1000ms refill=2 capacity=4",
                "token-bucket capacity=4 refill=2 every=1s",
            ),
            ("leaky-bucket rate=10r/s", "leaky-bucket rate=10r/s burst=0"),
            ("leaky-bucket rate=30r/m burst=5 nodelay", "leaky-bucket rate=30r/m burst=5 nodelay"),
            (
                "leaky-bucket rate=3/250ms burst=5 delay=2 compat=nginx",
                "leaky-bucket rate=3/250ms burst=5 delay=2 compat=nginx",
            ),
            (
                "fixed-window limit=3 window=60s align=first",
                "fixed-window limit=3 window=1m align=first",
            ),
            ("fixed-window limit=3 window=90s align=clock", "fixed-window limit=3 window=90s"),
            ("sliding-window limit=100 window=1500ms", "sliding-window limit=100 window=1500ms"),
            ("sliding-log limit=100 window=24h", "sliding-log limit=100 window=1d"),
            ("sliding-log dry-run limit=1 window=1s", "sliding-log limit=1 window=1s dry-run"),
            (
                "leaky-bucket dry-run rate=1r/s nodelay",
                "leaky-bucket rate=1r/s burst=0 nodelay dry-run",
            ),
        ] {
            let p: Policy = input.parse().unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(p.to_string(), canonical);
            assert_eq!(canonical.parse::<Policy>().unwrap(), p);
        }
    }

    #[test]
    fn dry_run_is_a_flag_of_every_algorithm_once() {
        let e = "fixed-window limit=1 window=1s dry-run dry-run".parse::<Policy>().unwrap_err();
        assert_eq!((e.token(), e.expected()), ("dry-run", "`dry-run` only once"));
        let e = "fixed-window limit=1 window=1s dryrun".parse::<Policy>().unwrap_err();
        assert_eq!(e.token(), "dryrun");
        assert!(e.expected().contains("dry-run"), "{e}");
        let e = "leaky-bucket rate=1r/s dry-run=yes".parse::<Policy>().unwrap_err();
        assert_eq!(e.token(), "dry-run=yes");
        assert!(!"gcra burst=1 rate=1/s".parse::<Policy>().unwrap().is_dry_run());
        assert!("gcra burst=1 rate=1/s dry-run".parse::<Policy>().unwrap().is_dry_run());
    }

    /// A policy built from parameters is the policy their canonical text parses to, and an
    /// error the same error: over counts and durations at and around every bound.
    #[test]
    fn parameters_build_what_their_text_parses_to() {
        use crate::algorithms::testing::Rng;
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let counts = [0, 1, 2, 7, 100, 255, 256, 65_535, 65_536, 1 << 24, u32::MAX - 1, u32::MAX];
        let ns = [
            0,
            1,
            999,
            1_000_000,
            1_000_000_000,
            60_000_000_000,
            86_400_000_000_000,
            1 << 40,
            MAX_NS - 1,
            MAX_NS,
            MAX_NS + 1,
            u64::MAX,
        ];
        let (mut built, mut refused) = (0, 0);
        for _ in 0..20_000 {
            let mut c = || counts[rng.below(counts.len() as u64) as usize];
            let (a, b, d) = (c(), c(), c());
            let t = ns[rng.below(ns.len() as u64) as usize];
            let flag = rng.below(2) == 1;
            let params = match rng.below(6) {
                0 => Parameters::TokenBucket { capacity: a, count: b, period_ns: t },
                1 => Parameters::DiscreteFill { capacity: a, refill: b, every_ns: t },
                2 => Parameters::LeakyBucket {
                    count: a,
                    period_ns: t,
                    burst: b,
                    delay: flag.then_some(d),
                    nginx: rng.below(2) == 1,
                },
                3 => Parameters::FixedWindow { limit: a, window_ns: t, align_first: flag },
                4 => Parameters::SlidingWindow { limit: a, window_ns: t },
                _ => Parameters::SlidingLog { limit: a, window_ns: t },
            };
            let text = text::Canonical { params: &params, per_request: false }.to_string();
            match (Policy::new(params), text.parse::<Policy>()) {
                (Ok(p), Ok(q)) => {
                    assert_eq!(p, q, "{text}");
                    assert_eq!(p.parameters(), params);
                    assert_eq!(p.to_string(), text);
                    built += 1;
                }
                (Err(e), Err(f)) => {
                    assert_eq!(e, f, "{text}");
                    refused += 1;
                }
                (p, q) => panic!("{text}: from parameters {p:?}, from text {q:?}"),
            }
        }
        assert!(built > 1_000 && refused > 1_000, "{built} built, {refused} refused");
    }
}
