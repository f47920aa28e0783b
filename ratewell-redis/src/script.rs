//! The server-side script (`decide.lua`), what it is given for each layer, and the bounds that
//! keep its arithmetic exact.
//!
//! The script computes in Lua numbers (IEEE doubles): integers are exact up to 2^53. Its header
//! comment gives the argument value by value; this module refuses, when a limiter is built, every
//! policy whose values could leave that domain, and names the bound it would break.

use std::fmt;

use ratewell::{Decision, Outcome, Parameters, Policy};

/// The decision code's body: helpers, the algorithms, `decide_one` and `batch`.
const BODY: &str = include_str!("decide.lua");

/// The decision code in the two forms a server takes: a function library (`FUNCTION LOAD`,
/// called with `FCALL`), and a script (`SCRIPT LOAD`, called with `EVALSHA`) for a server without
/// `FUNCTION`. Both are named after the script's SHA1, so that limiters of different versions
/// sharing a server each call their own.
pub(crate) struct Code {
    /// The library's source.
    pub(crate) library: String,
    /// The library's name, which is its one function's name too.
    pub(crate) function: String,
    /// The script's source.
    pub(crate) script: String,
    /// The script's SHA1 (hex).
    pub(crate) sha: String,
}

impl Code {
    pub(crate) fn get() -> &'static Code {
        static CODE: std::sync::OnceLock<Code> = std::sync::OnceLock::new();
        CODE.get_or_init(|| {
            let script = format!("{BODY}\nreturn batch(KEYS, ARGV)\n");
            let sha = redis::Script::new(&script).get_hash().to_string();
            let function = format!("ratewell_{}", &sha[..16]);
            let library = format!(
                "#!lua name={function}\n{BODY}\nredis.register_function('{function}', batch)\n"
            );
            Code { library, function, script, sha }
        })
    }
}

/// 2^51: the largest debt of a full bucket (in 1/n ns) the script accepts.
const MAX_BUCKET_UNITS: u128 = 1 << 51;
/// 2^52: the largest product of a count and a window (us), or an interval span (ns).
const MAX_PRODUCT: u128 = 1 << 52;
/// The largest nanosecond span a state may lie ahead of now (a clock stepped back) and still be
/// represented exactly: 2^52 units of 1/n ns.
const MAX_SPAN_UNITS: u64 = 1 << 52;
/// compat=nginx: the largest rate (milli-requests per second) and burst.
const MAX_NGINX_RATE: u64 = 1 << 40;
const MAX_NGINX_BURST: u64 = 1 << 30;

/// A policy the Redis backend cannot decide exactly: why, and the bound it breaks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DomainError {
    policy: String,
    reason: String,
}

impl DomainError {
    fn new(policy: &Policy, reason: impl Into<String>) -> Self {
        DomainError { policy: policy.to_string(), reason: reason.into() }
    }

    /// The policy, canonical.
    pub fn policy(&self) -> &str {
        &self.policy
    }

    /// Why the backend refuses it.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for DomainError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the Redis backend cannot decide `{}` exactly: {}", self.policy, self.reason)
    }
}

impl std::error::Error for DomainError {}

/// One layer as the script is given it: the algorithm's name and six integers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Compiled {
    /// The policy in the engine's grammar, canonical: what the module
    /// (ratewell-redis-module) decides with.
    pub(crate) text: String,
    pub(crate) algorithm: &'static str,
    pub(crate) params: [i64; 6],
    pub(crate) limit: u64,
    pub(crate) dry_run: bool,
}

/// A layer as the limiter keeps it: its name, policy, and the script's arguments for it.
pub(crate) struct LayerSpec {
    pub(crate) name: String,
    pub(crate) policy: Policy,
    pub(crate) compiled: Compiled,
    pub(crate) args: Vec<String>,
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Whole microseconds of `ns`, or an error naming `what`.
fn whole_us(policy: &Policy, ns: u64, what: &str) -> Result<u64, DomainError> {
    if !ns.is_multiple_of(1_000) {
        return Err(DomainError::new(
            policy,
            format!(
                "the {what} ({ns} ns) must be a whole number of microseconds, the backend's resolution"
            ),
        ));
    }
    Ok(ns / 1_000)
}

impl Compiled {
    pub(crate) fn new(policy: &Policy) -> Result<Self, DomainError> {
        let limit = policy.limit();
        let dry_run = policy.is_dry_run();
        let too_big = |what: String| Err(DomainError::new(policy, what));
        let (algorithm, params): (&'static str, [i64; 6]) = match policy.parameters() {
            Parameters::TokenBucket { capacity, count, period_ns } => {
                let g = gcd(u64::from(count), period_ns);
                let (n, d) = (u64::from(count) / g, period_ns / g);
                if u128::from(capacity) * u128::from(d) > MAX_BUCKET_UNITS {
                    return too_big(format!(
                        "a full bucket must refill within 2^51/{n} ns (~{} days); {capacity} tokens at \
                         {count} per {period_ns} ns take longer",
                        (MAX_BUCKET_UNITS / u128::from(n)) / 86_400_000_000_000
                    ));
                }
                ("gcra", [i64::from(capacity), n as i64, d as i64, 0, MAX_SPAN_UNITS as i64, 0])
            }
            Parameters::LeakyBucket { count, period_ns, burst, delay, nginx: false } => {
                let g = gcd(u64::from(count), period_ns);
                let (n, d) = (u64::from(count) / g, period_ns / g);
                if (u128::from(burst) + 1) * u128::from(d) > MAX_BUCKET_UNITS {
                    return too_big(format!(
                        "burst + 1 requests must leak within 2^51/{n} ns (~{} days)",
                        (MAX_BUCKET_UNITS / u128::from(n)) / 86_400_000_000_000
                    ));
                }
                // A delay beyond the bucket's size delays nothing: clamped, the product with
                // `d` stays within the bucket's bound.
                let delay = delay.map_or(-1, |free| i64::from(free.min(burst.saturating_add(1))));
                ("leaky", [i64::from(burst), n as i64, d as i64, delay, MAX_SPAN_UNITS as i64, 0])
            }
            Parameters::LeakyBucket { count, period_ns, burst, delay, nginx: true } => {
                // nginx's own rounding, as the engine computes it.
                let rate = u128::from(count) * 1_000 * 1_000_000_000 / u128::from(period_ns);
                if rate == 0 || rate > u128::from(MAX_NGINX_RATE) {
                    return too_big(format!(
                        "under compat=nginx the rate must be 1 to 2^40 milli-requests per second (this \
                         one is {rate})"
                    ));
                }
                if u64::from(burst) > MAX_NGINX_BURST {
                    return too_big("under compat=nginx the burst must be at most 2^30".into());
                }
                let rate = rate as u64;
                // Beyond this many ms since `last`, any excess has leaked with the free request.
                let full_ms = ((u64::from(burst) + 1) * 1_000_000).div_ceil(rate) + 1;
                let delay = delay.map_or(-1, |free| i64::from(free.min(burst.saturating_add(1))));
                ("nginx", [rate as i64, i64::from(burst), delay, full_ms as i64, 0, 0])
            }
            Parameters::DiscreteFill { capacity, refill, every_ns } => {
                let every = whole_us(policy, every_ns, "fill interval")?;
                let fills = u128::from(capacity.div_ceil(refill)) + 1;
                if fills * u128::from(every_ns) > MAX_PRODUCT {
                    return too_big(
                        "filling an empty bucket must take under 2^52 ns (52 days)".to_string(),
                    );
                }
                ("discrete", [i64::from(capacity), i64::from(refill), every as i64, 0, 0, 0])
            }
            Parameters::FixedWindow { limit, window_ns, align_first } => {
                let w = whole_us(policy, window_ns, "window")?;
                if u128::from(window_ns) > MAX_PRODUCT {
                    return too_big("the window must be under 2^52 ns (52 days)".to_string());
                }
                ("fixed", [i64::from(limit), w as i64, i64::from(align_first), 0, 0, 0])
            }
            Parameters::SlidingWindow { limit, window_ns } => {
                let w = whole_us(policy, window_ns, "window")?;
                // The counts' products with the window are divided exactly at any size
                // (`muldiv` in the script); the window itself bounds the spans.
                if u128::from(window_ns) > MAX_PRODUCT {
                    return too_big("the window must be under 2^52 ns (52 days)".to_string());
                }
                ("sliding", [i64::from(limit), w as i64, 0, 0, 0, 0])
            }
            Parameters::SlidingLog { limit, window_ns } => {
                let w = whole_us(policy, window_ns, "window")?;
                if u128::from(window_ns) > MAX_PRODUCT {
                    return too_big("the window must be under 2^52 ns (52 days)".to_string());
                }
                ("log", [i64::from(limit), w as i64, 0, 0, 0, 0])
            }
            other => return too_big(format!("no script decides {other:?}")),
        };
        Ok(Compiled { text: policy.to_string(), algorithm, params, limit, dry_run })
    }

    /// The layer's two script arguments: the policy as one ('algorithm p1 .. p6', parsed once
    /// by the server and kept) and the mode.
    pub(crate) fn push_args(&self, args: &mut Vec<String>) {
        args.push(self.policy_arg());
        args.push(if self.dry_run { "1" } else { "0" }.to_string());
    }

    /// The policy as the decision code takes it: 'algorithm p1 p2 p3 p4 p5 p6|policy', the
    /// script's integers, then the engine's text, which the module decides with.
    pub(crate) fn policy_arg(&self) -> String {
        let mut s = self.algorithm.to_string();
        for p in self.params {
            s.push(' ');
            s.push_str(&p.to_string());
        }
        s.push('|');
        s.push_str(&self.text);
        s
    }

    /// The decision a layer's six reply fields describe.
    pub(crate) fn decision(&self, fields: &[i64; 5]) -> Decision {
        let [outcome, remaining, reset, wait, replenish] = *fields;
        let outcome = match outcome {
            0 => Outcome::Admitted,
            1 => Outcome::Rejected,
            _ => Outcome::Impossible,
        };
        let ns = |v: i64| u64::try_from(v).unwrap_or(0);
        let replenish = (replenish > 0).then(|| ns(replenish));
        Decision::from_parts(outcome, self.limit, ns(remaining), ns(reset), ns(wait), replenish)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compile(spec: &str) -> Result<Compiled, DomainError> {
        Compiled::new(&spec.parse().unwrap())
    }

    #[test]
    fn every_algorithm_compiles_within_the_domain() {
        for spec in [
            "token-bucket capacity=10 rate=7/s",
            "token-bucket capacity=4 refill=2 every=1s",
            "leaky-bucket rate=10r/s burst=5 delay=2",
            "leaky-bucket rate=3/250ms burst=5 delay=2 compat=nginx",
            "fixed-window limit=3 window=1m align=first",
            "sliding-window limit=100 window=1500ms",
            "sliding-log limit=100 window=1d",
        ] {
            compile(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
        }
    }

    #[test]
    fn the_policy_argument_carries_the_engine_text_exactly() {
        for spec in [
            "token-bucket capacity=10 rate=7/s",
            "leaky-bucket rate=3/250ms burst=5 delay=2 compat=nginx",
            "fixed-window limit=3 window=1m align=first dry-run",
        ] {
            let policy: Policy = spec.parse().unwrap();
            let arg = compile(spec).unwrap().policy_arg();
            let (_, text) = arg.split_once('|').unwrap();
            // The module parses it back: the same policy.
            assert_eq!(text.parse::<Policy>().unwrap(), policy, "{arg}");
        }
    }

    #[test]
    fn outside_the_domain_is_an_error_that_says_why() {
        let e = compile("token-bucket capacity=100000000 rate=1/s").unwrap_err();
        assert!(e.reason().contains("refill"), "{e}");
        let e = compile("fixed-window limit=3 window=1500ns").unwrap_err();
        assert!(e.reason().contains("microseconds"), "{e}");
        let e = compile("sliding-window limit=60000 window=60d").unwrap_err();
        assert!(e.reason().contains("52 days"), "{e}");
        compile("sliding-window limit=100000 window=1d").unwrap();
        compile("sliding-window limit=16777215 window=52d").unwrap();
        let e = compile("token-bucket capacity=2 refill=1 every=30d").unwrap_err();
        assert!(e.reason().contains("52 days"), "{e}");
    }
}
