//! The policy grammar of `docs/SEMANTICS.md` as text: `ALGORITHM key=value ...` read into
//! [`Parameters`] ([`FromStr`] for [`Policy`]) and written back canonically ([`Display`]).

use std::fmt;
use std::str::FromStr;

use super::{MAX_NS, Parameters, Policy, PolicyError};

pub(super) const ALGORITHMS: &str =
    "an algorithm: token-bucket, gcra, leaky-bucket, fixed-window, sliding-window or sliding-log";
/// The flag that makes a policy advisory: see [`Policy::is_dry_run`].
const DRY_RUN: &str = "dry-run";
pub(super) const COUNT: &str = "a whole number from 1 to 4294967295";
const COUNT0: &str = "a whole number from 0 to 4294967295";
pub(super) const DURATION: &str =
    "a duration above zero: an integer and a unit (ns, us, ms, s, m, h, d), at most 2^63-1 ns";
pub(super) const RATE: &str = "a rate: N/s, N/m, N/h, N/d, N/<duration> (e.g. 5/250ms), Nr/s or Nr/m, \
                    with N from 1 to 4294967295";

/// `count` per `period` ns, exactly; `per_request` remembers the `r/s` spelling for display.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Rate {
    count: u32,
    period: u64,
    per_request: bool,
}

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
    Ok(Rate { count, period, per_request: nginx })
}

/// `align=first`: `true`.
fn align(value: &str, token: &str) -> Result<bool, PolicyError> {
    match value {
        "clock" => Ok(false),
        "first" => Ok(true),
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
        if self.0 == 0 {
            return f.write_str("0ns");
        }
        let &(name, ns) =
            UNITS.iter().rev().find(|&&(_, ns)| self.0.is_multiple_of(ns)).unwrap_or(&UNITS[0]);
        write!(f, "{}{}", self.0 / ns, name)
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.per_request {
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
        let text = Canonical { params: &self.params, per_request: self.per_request };
        fmt::Display::fmt(&text, f)?;
        if self.dry_run {
            write!(f, " {DRY_RUN}")?;
        }
        Ok(())
    }
}

/// The canonical text of the parameters, as a [`Policy`] of them prints (without its flags).
///
/// ```
/// use ratewell::Parameters;
///
/// let p = Parameters::SlidingLog { limit: 100, window_ns: 60_000_000_000 };
/// assert_eq!(p.to_string(), "sliding-log limit=100 window=1m");
/// ```
impl fmt::Display for Parameters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&Canonical { params: self, per_request: false }, f)
    }
}

/// The canonical text of an algorithm and its parameters (without flags).
pub(super) struct Canonical<'a> {
    pub(super) params: &'a Parameters,
    /// A rate written `Nr/s` or `Nr/m`.
    pub(super) per_request: bool,
}

impl fmt::Display for Canonical<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rate = |count, period| Rate { count, period, per_request: self.per_request };
        match *self.params {
            Parameters::TokenBucket { capacity, count, period_ns } => {
                write!(f, "token-bucket capacity={capacity} rate={}", rate(count, period_ns))?
            }
            Parameters::DiscreteFill { capacity, refill, every_ns } => write!(
                f,
                "token-bucket capacity={capacity} refill={refill} every={}",
                DisplayNs(every_ns)
            )?,
            Parameters::LeakyBucket { count, period_ns, burst, delay, nginx } => {
                write!(f, "leaky-bucket rate={} burst={burst}", rate(count, period_ns))?;
                match delay {
                    None => f.write_str(" nodelay")?,
                    Some(0) => {}
                    Some(d) => write!(f, " delay={d}")?,
                }
                if nginx {
                    f.write_str(" compat=nginx")?;
                }
            }
            Parameters::FixedWindow { limit, window_ns, align_first } => {
                write!(f, "fixed-window limit={limit} window={}", DisplayNs(window_ns))?;
                if align_first {
                    f.write_str(" align=first")?;
                }
            }
            Parameters::SlidingWindow { limit, window_ns } => {
                write!(f, "sliding-window limit={limit} window={}", DisplayNs(window_ns))?
            }
            Parameters::SlidingLog { limit, window_ns } => {
                write!(f, "sliding-log limit={limit} window={}", DisplayNs(window_ns))?
            }
        }
        Ok(())
    }
}

impl FromStr for Policy {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let p = Params::parse(s)?;
        let mut per_request = false;
        let mut rate_of = |value: &str, token: &str| {
            let r = rate(value, token)?;
            per_request = r.per_request;
            Ok::<_, PolicyError>((r.count, r.period))
        };
        let params = match p.algorithm {
            "token-bucket" => {
                p.only(&["capacity", "rate", "refill", "every"], &[])?;
                let capacity = p.required("capacity", count, "count")?;
                match (p.get("rate"), p.get("refill"), p.get("every")) {
                    (Some((value, token)), None, None) => {
                        let (count, period_ns) = rate_of(value, token)?;
                        Parameters::TokenBucket { capacity, count, period_ns }
                    }
                    (None, Some(_), Some(_)) => Parameters::DiscreteFill {
                        capacity,
                        refill: p.required("refill", count, "count")?,
                        every_ns: p.required("every", duration, "duration")?,
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
                let capacity = p.required("burst", count, "count")?;
                let (count, period_ns) = match p.get("rate") {
                    Some((value, token)) => rate_of(value, token)?,
                    None => return Err(PolicyError::new(p.algorithm, "rate=<rate>")),
                };
                Parameters::TokenBucket { capacity, count, period_ns }
            }
            "leaky-bucket" => {
                p.only(&["rate", "burst", "delay", "compat"], &["nodelay"])?;
                let (count, period_ns) = match p.get("rate") {
                    Some((value, token)) => rate_of(value, token)?,
                    None => return Err(PolicyError::new(p.algorithm, "rate=<rate>")),
                };
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
                Parameters::LeakyBucket { count, period_ns, burst, delay, nginx }
            }
            "fixed-window" => {
                p.only(&["limit", "window", "align"], &[])?;
                Parameters::FixedWindow {
                    limit: p.required("limit", count, "count")?,
                    window_ns: p.required("window", duration, "duration")?,
                    align_first: p.optional("align", align)?.unwrap_or(false),
                }
            }
            "sliding-window" => {
                p.only(&["limit", "window"], &[])?;
                Parameters::SlidingWindow {
                    limit: p.required("limit", count, "count")?,
                    window_ns: p.required("window", duration, "duration")?,
                }
            }
            "sliding-log" => {
                p.only(&["limit", "window"], &[])?;
                Parameters::SlidingLog {
                    limit: p.required("limit", count, "count")?,
                    window_ns: p.required("window", duration, "duration")?,
                }
            }
            other => return Err(PolicyError::new(other, ALGORITHMS)),
        };
        let algorithm =
            super::compile(&params).map_err(|e| PolicyError::new(p.token_of(e.key), e.expected))?;
        Ok(Policy { params, per_request, dry_run: p.has_flag(DRY_RUN), algorithm })
    }
}

/// The token `key=value` of the canonical text of `params`, or the algorithm's name where the
/// text omits the key: what an error about `key` names, as parsing the text would.
pub(super) fn token_of(params: &Parameters, key: &str) -> String {
    let text = Canonical { params, per_request: false }.to_string();
    let mut tokens = text.split_whitespace();
    let name = tokens.next().unwrap_or_default().to_string();
    tokens.find(|t| t.split_once('=').is_some_and(|(k, _)| k == key)).map_or(name, str::to_string)
}
