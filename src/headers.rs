//! Rendering decisions as HTTP field values, as plain strings (no HTTP dependency).
//!
//! - `Retry-After` (RFC 9110 §10.2.3): whole seconds, rounded up, so a client that waits that long
//!   is admitted.
//! - `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers, revisions 08 and
//!   later): Structured Field lists of one item, the policy's name as a string, with parameters
//!   `q` (quota) and `w` (window, whole seconds) for the policy, chosen so that `q / w` is the
//!   policy's long-run rate exactly, and `r` (remaining quota) and `t` (seconds until additional
//!   quota is made available, the draft's definition: the next token, the window's end, the
//!   oldest logged request's expiry; absent when the key is full) for the current state. On a
//!   rejection `t` is never later than `Retry-After`, as the draft asks.
//!
//! Every integer is at most 999,999,999,999,999, the largest Structured Field Integer.

use crate::decision::Decision;
use crate::policy::Policy;

const NS_PER_S: u64 = 1_000_000_000;
/// The largest Structured Field Integer (RFC 9651 §3.3.1: at most 15 digits).
const MAX_SF_INTEGER: u64 = 999_999_999_999_999;

fn seconds_up(ns: u64) -> u64 {
    ns.div_ceil(NS_PER_S)
}

/// A Structured Field string: printable ASCII with `"` and `\` escaped; anything else is dropped.
fn sf_string(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 2);
    push_sf_string(name, &mut out);
    out
}

/// [`sf_string`] appended to `out`.
fn push_sf_string(name: &str, out: &mut String) {
    out.push('"');
    for c in name.chars().filter(|c| (' '..='~').contains(c)) {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
}

/// `n` in decimal appended to `out` (no formatter machinery: a field is written per request).
fn push_integer(mut n: u64, out: &mut String) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    // One append, not one per digit: every byte is an ASCII digit.
    out.push_str(std::str::from_utf8(&digits[i..]).unwrap_or_default());
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
    /// `"name";r=<remaining>;t=<seconds until more quota>` (`t` rounded up, and absent when the
    /// key is full: no more quota is to come). On a rejection, `t` is never later than
    /// [`retry_after_header`](Self::retry_after_header).
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{Limiter, ManualClock, Policy};
    ///
    /// let limiter = Limiter::with_clock(&"fixed-window limit=10 window=1m".parse::<Policy>()?, ManualClock::new(0));
    /// assert_eq!(limiter.peek_n(1).ratelimit_field("default"), r#""default";r=10"#);
    /// assert_eq!(limiter.check().ratelimit_field("default"), r#""default";r=9;t=60"#);
    ///
    /// // A bucket refills a token at a time: `t` is the next token, not a full bucket.
    /// let limiter = Limiter::with_clock(&"token-bucket capacity=20 rate=10/s".parse::<Policy>()?, ManualClock::new(0));
    /// let d = limiter.check_n(20);
    /// assert_eq!(d.ratelimit_field("api"), r#""api";r=0;t=1"#);
    /// # Ok::<(), ratewell::PolicyError>(())
    /// ```
    pub fn ratelimit_field(&self, name: &str) -> String {
        let mut field = String::new();
        self.write_ratelimit_field(name, &mut field);
        field
    }

    /// [`ratelimit_field`](Self::ratelimit_field) appended to `out` (a buffer kept or sized by
    /// the caller: no allocation of its own).
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{Limiter, ManualClock, Policy};
    ///
    /// let limiter = Limiter::with_clock(&"fixed-window limit=10 window=1m".parse::<Policy>()?, ManualClock::new(0));
    /// let mut field = String::from("x, ");
    /// limiter.check().write_ratelimit_field("api", &mut field);
    /// assert_eq!(field, r#"x, "api";r=9;t=60"#);
    /// # Ok::<(), ratewell::PolicyError>(())
    /// ```
    pub fn write_ratelimit_field(&self, name: &str, out: &mut String) {
        push_sf_string(name, out);
        out.push_str(";r=");
        push_integer(self.remaining().min(MAX_SF_INTEGER), out);
        if let Some(ns) = self.replenish_after_ns() {
            out.push_str(";t=");
            push_integer(seconds_up(ns).min(MAX_SF_INTEGER), out);
        }
    }
}

impl Policy {
    /// The `RateLimit-Policy` field value for this policy named `name`: `"name";q=<quota>;w=<s>`
    /// with `q / w` equal to the policy's long-run rate (a bucket's refill rate, a window's
    /// limit per window): the policy's own limit and window when the window is whole seconds
    /// (for a bucket, the time an empty bucket takes to refill), else the rate in lowest terms
    /// (`5 per 250ms` is `q=20;w=1`, `7 per 1500ms` is `q=14;w=3`). A rate whose lowest terms need
    /// more than 15 digits is rounded: `w` the window in whole seconds (at least 1), `q` the
    /// quota of that window rounded down.
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::Policy;
    ///
    /// let p: Policy = "token-bucket capacity=100 rate=10/s".parse()?;
    /// assert_eq!(p.ratelimit_policy_field("api"), r#""api";q=100;w=10"#);
    /// let p: Policy = "token-bucket capacity=1 rate=100/s".parse()?;
    /// assert_eq!(p.ratelimit_policy_field("api"), r#""api";q=100;w=1"#);
    /// let p: Policy = "fixed-window limit=5 window=250ms".parse()?;
    /// assert_eq!(p.ratelimit_policy_field("api"), r#""api";q=20;w=1"#);
    /// # Ok::<(), ratewell::PolicyError>(())
    /// ```
    pub fn ratelimit_policy_field(&self, name: &str) -> String {
        let (q, w) = self.quota_and_window();
        format!("{};q={q};w={w}", sf_string(name))
    }

    /// `(q, w)` of `RateLimit-Policy`: see [`ratelimit_policy_field`](Self::ratelimit_policy_field).
    fn quota_and_window(&self) -> (u64, u64) {
        let (count, period) = self.long_run_rate();
        let ns = u128::from(NS_PER_S);
        let max = u128::from(MAX_SF_INTEGER);
        let (limit, window) = (u128::from(self.limit()), u128::from(self.window_ns()));
        // The policy's own figures, when they state the rate exactly in whole seconds.
        if window > 0 && window % ns == 0 && limit * period == count * window && limit <= max {
            return (limit as u64, (window / ns) as u64);
        }
        // The rate in lowest terms: count * 10^9 / period per second.
        let (per_s, seconds) = (count * ns, period);
        let g = gcd(per_s, seconds);
        let (q, w) = (per_s / g, seconds / g);
        if q <= max && w <= max {
            return (q as u64, w as u64);
        }
        let w = window.div_ceil(ns).clamp(1, max);
        let q = (count * ns * w / period.max(1)).min(max);
        (q as u64, w as u64)
    }
}

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a.max(1)
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
