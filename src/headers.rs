//! Rendering decisions as HTTP field values, as plain strings (no HTTP dependency).
//!
//! - `Retry-After` (RFC 9110 §10.2.3): whole seconds, rounded up, so a client that waits that long
//!   is admitted.
//! - `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers, revisions 08 and
//!   later): Structured Field lists of one item, the policy's name as a string, with parameters
//!   `q` (quota) and `w` (window, seconds) for the policy, `r` (remaining quota) and `t` (seconds
//!   until the quota is fully restored) for the current state.

use crate::decision::Decision;
use crate::policy::Policy;

const NS_PER_S: u64 = 1_000_000_000;

fn seconds_up(ns: u64) -> u64 {
    ns.div_ceil(NS_PER_S)
}

/// A Structured Field string: printable ASCII with `"` and `\` escaped; anything else is dropped.
fn sf_string(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 2);
    out.push('"');
    for c in name.chars().filter(|c| (' '..='~').contains(c)) {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

impl Decision {
    /// The `Retry-After` value for a rejection: seconds, rounded up. `None` when admitted or
    /// impossible (waiting cannot help an impossible request).
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{Limiter, ManualClock, Policy};
    ///
    /// let limiter = Limiter::with_clock(&"fixed-window limit=1 window=90s".parse::<Policy>()?, ManualClock::new(500_000_000));
    /// assert_eq!(limiter.check().retry_after_header(), None);
    /// assert_eq!(limiter.check().retry_after_header().as_deref(), Some("90"));
    /// # Ok::<(), ratewell::PolicyError>(())
    /// ```
    pub fn retry_after_header(&self) -> Option<String> {
        self.retry_after_ns().map(|ns| seconds_up(ns).to_string())
    }

    /// The `RateLimit` field value for this decision under the policy named `name`:
    /// `"name";r=<remaining>;t=<seconds until full>`.
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{Limiter, ManualClock, Policy};
    ///
    /// let limiter = Limiter::with_clock(&"fixed-window limit=10 window=1m".parse::<Policy>()?, ManualClock::new(0));
    /// assert_eq!(limiter.check().ratelimit_field("default"), r#""default";r=9;t=60"#);
    /// # Ok::<(), ratewell::PolicyError>(())
    /// ```
    pub fn ratelimit_field(&self, name: &str) -> String {
        format!(
            "{};r={};t={}",
            sf_string(name),
            self.remaining(),
            seconds_up(self.reset_after_ns())
        )
    }
}

impl Policy {
    /// The `RateLimit-Policy` field value for this policy named `name`:
    /// `"name";q=<limit>;w=<seconds>`, where `w` is the window, or for buckets the time an empty
    /// bucket takes to refill completely (rounded up, at least 1).
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::Policy;
    ///
    /// let p: Policy = "token-bucket capacity=100 rate=10/s".parse()?;
    /// assert_eq!(p.ratelimit_policy_field("api"), r#""api";q=100;w=10"#);
    /// # Ok::<(), ratewell::PolicyError>(())
    /// ```
    pub fn ratelimit_policy_field(&self, name: &str) -> String {
        let w = seconds_up(self.window_ns()).max(1);
        format!("{};q={};w={}", sf_string(name), self.limit(), w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_escaped() {
        assert_eq!(sf_string(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(sf_string("é"), r#""""#);
    }

    #[test]
    fn seconds_round_up() {
        assert_eq!(seconds_up(0), 0);
        assert_eq!(seconds_up(1), 1);
        assert_eq!(seconds_up(NS_PER_S), 1);
        assert_eq!(seconds_up(NS_PER_S + 1), 2);
    }
}
