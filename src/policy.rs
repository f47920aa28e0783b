//! The policy grammar of `docs/SEMANTICS.md`: `ALGORITHM key=value ...`, parsed with [`FromStr`] and
//! printed canonically with [`Display`](fmt::Display).

use std::fmt;
use std::str::FromStr;

use crate::algorithms::{
    Algorithm, Invalid, discrete::Discrete, fixed::Align, fixed::Fixed, gcra::Gcra, leaky::Leaky,
    nginx::Nginx, sliding::Sliding, sliding_log::SlidingLog,
};

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
    spec: Spec,
    /// The `dry-run` flag: decide and account as when enforcing, but never reject (honoured by
    /// [`LayeredLimiter`](crate::LayeredLimiter) and `ratewell replay`).
    dry_run: bool,
    pub(crate) algorithm: Algorithm,
}

impl PartialEq for Policy {
    fn eq(&self, other: &Self) -> bool {
        self.spec == other.spec && self.dry_run == other.dry_run
    }
}

impl Eq for Policy {}

/// The parameters as written (the canonical form prints them back).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Spec {
    TokenBucket { capacity: u32, rate: Rate },
    Discrete { capacity: u32, refill: u32, every: u64 },
    Leaky { rate: Rate, burst: u32, delay: Option<u32>, nginx: bool },
    Fixed { limit: u32, window: u64, align: Align },
    Sliding { limit: u32, window: u64 },
    Log { limit: u32, window: u64 },
}

/// `count` per `period` ns, exactly; `nginx` remembers the `r/s` spelling for display.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Rate {
    count: u32,
    period: u64,
    nginx: bool,
}

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

const ALGORITHMS: &str =
    "an algorithm: token-bucket, gcra, leaky-bucket, fixed-window, sliding-window or sliding-log";
/// The flag that makes a policy advisory: see [`Policy::is_dry_run`].
const DRY_RUN: &str = "dry-run";
const COUNT: &str = "a whole number from 1 to 4294967295";
const COUNT0: &str = "a whole number from 0 to 4294967295";
const DURATION: &str =
    "a duration above zero: an integer and a unit (ns, us, ms, s, m, h, d), at most 2^63-1 ns";
const RATE: &str = "a rate: N/s, N/m, N/h, N/d, N/<duration> (e.g. 5/250ms), Nr/s or Nr/m, \
                    with N from 1 to 4294967295";

/// The `key=value` tokens of one policy, each taken at most once.
struct Params<'a> {
    algorithm: &'a str,
    pairs: Vec<(&'a str, &'a str, &'a str)>,
    flags: Vec<&'a str>,
}

impl<'a> Params<'a> {
    fn parse(s: &'a str) -> Result<Self, PolicyError> {
        let mut tokens = s.split_whitespace();
        let algorithm = tokens.next().ok_or_else(|| PolicyError::new("", ALGORITHMS))?;
        let mut pairs: Vec<(&str, &str, &str)> = Vec::new();
        let mut flags = Vec::new();
        for token in tokens {
            match token.split_once('=') {
                Some((key, value)) => {
                    if key.is_empty() {
                        return Err(PolicyError::new(token, "a key before `=`"));
                    }
                    if pairs.iter().any(|&(k, _, _)| k == key) {
                        return Err(PolicyError::new(token, format!("`{key}=` only once")));
                    }
                    pairs.push((key, value, token));
                }
                None => {
                    if flags.contains(&token) {
                        return Err(PolicyError::new(token, format!("`{token}` only once")));
                    }
                    flags.push(token);
                }
            }
        }
        Ok(Params { algorithm, pairs, flags })
    }

    /// Reject every key and flag not in the lists.
    fn only(&self, keys: &[&str], flags: &[&str]) -> Result<(), PolicyError> {
        let flags: Vec<&str> = flags.iter().copied().chain([DRY_RUN]).collect();
        for &(key, _, token) in &self.pairs {
            if !keys.contains(&key) {
                let what = format!("one of the keys of {}: {}", self.algorithm, list(keys, "="));
                return Err(PolicyError::new(token, what));
            }
        }
        for &flag in &self.flags {
            if !flags.contains(&flag) {
                let what = format!(
                    "key=value (one of {}) or the flag {}",
                    list(keys, "="),
                    flags.join(" or ")
                );
                return Err(PolicyError::new(flag, what));
            }
        }
        Ok(())
    }

    fn get(&self, key: &str) -> Option<(&'a str, &'a str)> {
        self.pairs.iter().find(|&&(k, _, _)| k == key).map(|&(_, v, t)| (v, t))
    }

    fn has_flag(&self, flag: &str) -> bool {
        self.flags.contains(&flag)
    }

    fn required<T>(
        &self,
        key: &str,
        parse: impl Fn(&str, &str) -> Result<T, PolicyError>,
        what: &str,
    ) -> Result<T, PolicyError> {
        match self.get(key) {
            Some((value, token)) => parse(value, token),
            None => Err(PolicyError::new(self.algorithm, format!("{key}=<{what}>"))),
        }
    }

    fn optional<T>(
        &self,
        key: &str,
        parse: impl Fn(&str, &str) -> Result<T, PolicyError>,
    ) -> Result<Option<T>, PolicyError> {
        self.get(key).map(|(value, token)| parse(value, token)).transpose()
    }

    /// The token of `key=` (for errors found after parsing), or the algorithm name.
    fn token_of(&self, key: &str) -> &'a str {
        self.get(key).map_or(self.algorithm, |(_, token)| token)
    }
}

fn list(keys: &[&str], suffix: &str) -> String {
    keys.iter().map(|k| format!("{k}{suffix}")).collect::<Vec<_>>().join(", ")
}

fn count(value: &str, token: &str) -> Result<u32, PolicyError> {
    match digits(value) {
        Some(n) if (1..=u64::from(u32::MAX)).contains(&n) => Ok(n as u32),
        _ => Err(PolicyError::new(token, COUNT)),
    }
}

fn count0(value: &str, token: &str) -> Result<u32, PolicyError> {
    match digits(value) {
        Some(n) if n <= u64::from(u32::MAX) => Ok(n as u32),
        _ => Err(PolicyError::new(token, COUNT0)),
    }
}

/// A plain decimal integer (ASCII digits only, no sign), or `None` (also on overflow).
fn digits(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

const UNITS: [(&str, u64); 7] = [
    ("ns", 1),
    ("us", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
    ("d", 86_400_000_000_000),
];

fn unit(s: &str) -> Option<u64> {
    UNITS.iter().find(|&&(name, _)| name == s).map(|&(_, ns)| ns)
}

/// `<integer><unit>` in ns, above zero and at most 2^63-1.
fn duration_ns(s: &str) -> Option<u64> {
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let n = digits(&s[..split])?;
    let ns = n.checked_mul(unit(&s[split..])?)?;
    (1..=MAX_NS).contains(&ns).then_some(ns)
}

fn duration(value: &str, token: &str) -> Result<u64, PolicyError> {
    duration_ns(value).ok_or_else(|| PolicyError::new(token, DURATION))
}

fn rate(value: &str, token: &str) -> Result<Rate, PolicyError> {
    let bad = || PolicyError::new(token, RATE);
    let (n, per) = value.split_once('/').ok_or_else(bad)?;
    let (n, nginx) = match n.strip_suffix('r') {
        Some(n) => (n, true),
        None => (n, false),
    };
    let count = match digits(n) {
        Some(c) if (1..=u64::from(u32::MAX)).contains(&c) => c as u32,
        _ => return Err(bad()),
    };
    let period = if nginx {
        match per {
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            _ => return Err(bad()),
        }
    } else {
        match per {
            "s" | "m" | "h" | "d" => unit(per).ok_or_else(bad)?,
            _ => duration_ns(per).ok_or_else(bad)?,
        }
    };
    Ok(Rate { count, period, nginx })
}

fn align(value: &str, token: &str) -> Result<Align, PolicyError> {
    match value {
        "clock" => Ok(Align::Clock),
        "first" => Ok(Align::First),
        _ => Err(PolicyError::new(token, "align=clock or align=first")),
    }
}

fn compat(value: &str, token: &str) -> Result<bool, PolicyError> {
    match value {
        "nginx" => Ok(true),
        _ => Err(PolicyError::new(token, "compat=nginx")),
    }
}

struct DisplayNs(u64);

impl fmt::Display for DisplayNs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let &(name, ns) =
            UNITS.iter().rev().find(|&&(_, ns)| self.0.is_multiple_of(ns)).unwrap_or(&UNITS[0]);
        write!(f, "{}{}", self.0 / ns, name)
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.nginx {
            let per = if self.period == 1_000_000_000 { "s" } else { "m" };
            return write!(f, "{}r/{per}", self.count);
        }
        match UNITS[3..].iter().find(|&&(_, ns)| ns == self.period) {
            Some((name, _)) => write!(f, "{}/{name}", self.count),
            None => write!(f, "{}/{}", self.count, DisplayNs(self.period)),
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.spec, f)?;
        if self.dry_run {
            write!(f, " {DRY_RUN}")?;
        }
        Ok(())
    }
}

impl fmt::Display for Spec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Spec::TokenBucket { capacity, rate } => {
                write!(f, "token-bucket capacity={capacity} rate={rate}")
            }
            Spec::Discrete { capacity, refill, every } => {
                write!(
                    f,
                    "token-bucket capacity={capacity} refill={refill} every={}",
                    DisplayNs(*every)
                )
            }
            Spec::Leaky { rate, burst, delay, nginx } => {
                write!(f, "leaky-bucket rate={rate} burst={burst}")?;
                match delay {
                    None => f.write_str(" nodelay")?,
                    Some(0) => {}
                    Some(d) => write!(f, " delay={d}")?,
                }
                if *nginx {
                    f.write_str(" compat=nginx")?;
                }
                Ok(())
            }
            Spec::Fixed { limit, window, align } => {
                write!(f, "fixed-window limit={limit} window={}", DisplayNs(*window))?;
                if *align == Align::First {
                    f.write_str(" align=first")?;
                }
                Ok(())
            }
            Spec::Sliding { limit, window } => {
                write!(f, "sliding-window limit={limit} window={}", DisplayNs(*window))
            }
            Spec::Log { limit, window } => {
                write!(f, "sliding-log limit={limit} window={}", DisplayNs(*window))
            }
        }
    }
}

impl FromStr for Policy {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let p = Params::parse(s)?;
        let spec = match p.algorithm {
            "token-bucket" => {
                p.only(&["capacity", "rate", "refill", "every"], &[])?;
                let capacity = p.required("capacity", count, "count")?;
                match (p.get("rate"), p.get("refill"), p.get("every")) {
                    (Some((value, token)), None, None) => {
                        Spec::TokenBucket { capacity, rate: rate(value, token)? }
                    }
                    (None, Some(_), Some(_)) => Spec::Discrete {
                        capacity,
                        refill: p.required("refill", count, "count")?,
                        every: p.required("every", duration, "duration")?,
                    },
                    (Some(_), _, _) => {
                        let token =
                            p.token_of(if p.get("refill").is_some() { "refill" } else { "every" });
                        return Err(PolicyError::new(
                            token,
                            "either rate= (continuous refill) or refill= and every= (discrete \
                             fill), not both",
                        ));
                    }
                    (None, None, _) | (None, _, None) => {
                        return Err(PolicyError::new(
                            p.algorithm,
                            "rate=<rate>, or refill=<count> and every=<duration>",
                        ));
                    }
                }
            }
            "gcra" => {
                p.only(&["burst", "rate"], &[])?;
                Spec::TokenBucket {
                    capacity: p.required("burst", count, "count")?,
                    rate: p.required("rate", rate, "rate")?,
                }
            }
            "leaky-bucket" => {
                p.only(&["rate", "burst", "delay", "compat"], &["nodelay"])?;
                let rate = p.required("rate", rate, "rate")?;
                let burst = p.optional("burst", count0)?.unwrap_or(0);
                let delay = p.optional("delay", count0)?;
                let nodelay = p.has_flag("nodelay");
                if nodelay && delay.is_some() {
                    return Err(PolicyError::new(
                        p.token_of("delay"),
                        "either nodelay or delay=<count>, not both",
                    ));
                }
                let delay = if nodelay { None } else { Some(delay.unwrap_or(0)) };
                let nginx = p.optional("compat", compat)?.unwrap_or(false);
                Spec::Leaky { rate, burst, delay, nginx }
            }
            "fixed-window" => {
                p.only(&["limit", "window", "align"], &[])?;
                Spec::Fixed {
                    limit: p.required("limit", count, "count")?,
                    window: p.required("window", duration, "duration")?,
                    align: p.optional("align", align)?.unwrap_or(Align::Clock),
                }
            }
            "sliding-window" => {
                p.only(&["limit", "window"], &[])?;
                Spec::Sliding {
                    limit: p.required("limit", count, "count")?,
                    window: p.required("window", duration, "duration")?,
                }
            }
            "sliding-log" => {
                p.only(&["limit", "window"], &[])?;
                Spec::Log {
                    limit: p.required("limit", count, "count")?,
                    window: p.required("window", duration, "duration")?,
                }
            }
            other => return Err(PolicyError::new(other, ALGORITHMS)),
        };
        let algorithm =
            compile(&spec).map_err(|e| PolicyError::new(p.token_of(e.key), e.expected))?;
        Ok(Policy { spec, dry_run: p.has_flag(DRY_RUN), algorithm })
    }
}

fn compile(spec: &Spec) -> Result<Algorithm, Invalid> {
    Ok(match *spec {
        Spec::TokenBucket { capacity, rate } => {
            Algorithm::Gcra(Gcra::new(capacity, u64::from(rate.count), rate.period)?)
        }
        Spec::Discrete { capacity, refill, every } => {
            Algorithm::Discrete(Discrete::new(capacity, refill, every)?)
        }
        Spec::Leaky { rate, burst, delay, nginx: false } => {
            Algorithm::Leaky(Leaky::new(u64::from(rate.count), rate.period, burst, delay)?)
        }
        Spec::Leaky { rate, burst, delay, nginx: true } => {
            Algorithm::Nginx(Nginx::new(u64::from(rate.count), rate.period, burst, delay)?)
        }
        Spec::Fixed { limit, window, align } => Algorithm::Fixed(Fixed::new(limit, window, align)?),
        Spec::Sliding { limit, window } => Algorithm::Sliding(Sliding::new(limit, window)?),
        Spec::Log { limit, window } => Algorithm::Log(SlidingLog::new(limit, window)?),
    })
}

/// A policy's parameters as written, for a store that decides the policy itself (another
/// backend): see [`Policy::parameters`]. Durations are nanoseconds; a rate is `count` per
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

impl Policy {
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
        match self.spec {
            Spec::TokenBucket { capacity, rate } => {
                Parameters::TokenBucket { capacity, count: rate.count, period_ns: rate.period }
            }
            Spec::Discrete { capacity, refill, every } => {
                Parameters::DiscreteFill { capacity, refill, every_ns: every }
            }
            Spec::Leaky { rate, burst, delay, nginx } => Parameters::LeakyBucket {
                count: rate.count,
                period_ns: rate.period,
                burst,
                delay,
                nginx,
            },
            Spec::Fixed { limit, window, align } => Parameters::FixedWindow {
                limit,
                window_ns: window,
                align_first: align == Align::First,
            },
            Spec::Sliding { limit, window } => {
                Parameters::SlidingWindow { limit, window_ns: window }
            }
            Spec::Log { limit, window } => Parameters::SlidingLog { limit, window_ns: window },
        }
    }

    /// The most this policy admits at once: the capacity, the limit, or a leaky bucket's
    /// `burst + 1`.
    pub fn limit(&self) -> u64 {
        match self.spec {
            Spec::TokenBucket { capacity, .. } | Spec::Discrete { capacity, .. } => {
                u64::from(capacity)
            }
            Spec::Leaky { burst, .. } => u64::from(burst) + 1,
            Spec::Fixed { limit, .. } | Spec::Sliding { limit, .. } | Spec::Log { limit, .. } => {
                u64::from(limit)
            }
        }
    }

    /// The span, in ns, over which [`limit`](Self::limit) applies: the window, or the time an
    /// empty bucket takes to refill completely (what `RateLimit-Policy`'s `w` reports).
    pub fn window_ns(&self) -> u64 {
        let refill = |tokens: u64, rate: Rate| {
            let ns = u128::from(tokens) * u128::from(rate.period) / u128::from(rate.count);
            u64::try_from(ns).unwrap_or(u64::MAX)
        };
        match self.spec {
            Spec::TokenBucket { capacity, rate } => refill(u64::from(capacity), rate),
            Spec::Leaky { rate, burst, .. } => refill(u64::from(burst) + 1, rate),
            Spec::Discrete { capacity, refill, every } => {
                let ns = u128::from(capacity.div_ceil(refill)) * u128::from(every);
                u64::try_from(ns).unwrap_or(u64::MAX)
            }
            Spec::Fixed { window, .. }
            | Spec::Sliding { window, .. }
            | Spec::Log { window, .. } => window,
        }
    }

    /// The long-run rate, `count` per `period` ns: a bucket's refill or leak rate (as nginx
    /// rounds it under `compat=nginx`), a window's limit per window.
    pub(crate) fn long_run_rate(&self) -> (u128, u128) {
        if let Algorithm::Nginx(n) = &self.algorithm {
            return (u128::from(n.milli_per_second()), 1_000 * 1_000_000_000);
        }
        let (count, period) = match self.spec {
            Spec::TokenBucket { rate, .. } | Spec::Leaky { rate, .. } => (rate.count, rate.period),
            Spec::Discrete { refill, every, .. } => (refill, every),
            Spec::Fixed { limit, window, .. }
            | Spec::Sliding { limit, window }
            | Spec::Log { limit, window } => (limit, window),
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
        matches!(self.spec, Spec::Leaky { delay: Some(_), .. })
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
}
