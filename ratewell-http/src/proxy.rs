//! The command line of the two example proxies, ratewell-tower's and ratewell-pingora's: one
//! parser ([`ProxyArgs::parse`]) and one usage text ([`usage`]), so that the two examples take
//! the same options in the same words. Each example keeps its own server, and says which of the
//! options beyond the common ones it serves ([`Extras`]): the parser refuses the others.
//!
//! Behind the `proxy` feature; std only.
//!
//! ```
//! use ratewell_http::proxy::{ArgsError, Extras, ProxyArgs};
//!
//! let args = ["--listen", "127.0.0.1:8080", "--upstream", "127.0.0.1:9000"]
//!     .into_iter()
//!     .chain(["--policy", "token-bucket capacity=20 rate=10/s", "--dry-run"])
//!     .map(String::from);
//! let parsed = ProxyArgs::parse(args, Extras::default())?;
//! assert_eq!(parsed.listen, "127.0.0.1:8080");
//! assert_eq!(parsed.limits[0].name, "ip");
//! assert!(parsed.dry_run && parsed.headers);
//!
//! // `--help` is not an error of the user's; the caller prints `usage(extras)` and exits 0.
//! let help = ProxyArgs::parse(["--help".to_string()].into_iter(), Extras::default());
//! assert!(matches!(help, Err(ArgsError::Help)));
//! # Ok::<(), ArgsError>(())
//! ```

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::Key;

/// The options beyond the common ones that a proxy serves: [`ProxyArgs::parse`] refuses the
/// others, and [`usage`] lists only these. The default serves none of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Extras {
    /// `--metrics ADDR`: Prometheus metrics served at `http://ADDR/metrics`.
    pub metrics: bool,
    /// `--state FILE` and `--state-interval SECONDS`: the limits' keys kept across restarts.
    pub state: bool,
    /// `--pingora-limits N` and `--no-limit`: another limiter, or none, in ratewell's place, to
    /// compare against.
    pub comparison: bool,
}

/// One limit of the command line: `--policy POLICY` (the limit `ip`, keyed by `ip`) or
/// `--layer NAME:KEY:POLICY`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitArg {
    /// The limit's name (in the `RateLimit` fields, metrics and `--require`).
    pub name: String,
    /// What it keys requests by, as written: `ip`, `header=NAME`, `bearer`, `path` or `global`
    /// ([`LimitArg::key`] reads it).
    pub key: String,
    /// The policy, in ratewell's policy grammar (`token-bucket capacity=20 rate=10/s`); the
    /// limiter's builder parses it.
    pub policy: String,
}

impl LimitArg {
    /// The [`Key`] that [`LimitArg::key`](field@LimitArg::key) names, or a message for a key
    /// that is not one of `ip`, `header=NAME`, `bearer`, `path` and `global`, or a header name
    /// that is not valid.
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell_http::proxy::LimitArg;
    ///
    /// let limit = |key: &str| LimitArg { name: "l".into(), key: key.into(), policy: String::new() };
    /// assert!(limit("header=x-api-key").key().is_ok());
    /// assert!(limit("cookie").key().unwrap_err().starts_with("unknown key \"cookie\""));
    /// ```
    pub fn key(&self) -> Result<Key, String> {
        let spec = self.key.as_str();
        Ok(match spec {
            "ip" => Key::client_ip(),
            "bearer" => Key::bearer_token(),
            "path" => Key::path(),
            "global" => Key::global(),
            _ => match spec.strip_prefix("header=") {
                Some(name) => {
                    Key::try_header(name).map_err(|e| format!("key {spec:?}: {name:?}: {e}"))?
                }
                None => {
                    return Err(format!(
                        "unknown key {spec:?} (ip, header=NAME, bearer, path, global)"
                    ));
                }
            },
        })
    }
}

/// A proxy's command line, parsed: where it listens, where it forwards, and how it limits.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ProxyArgs {
    /// `--listen ADDR`: the address to serve on (required).
    pub listen: String,
    /// `--upstream HOST:PORT`: the HTTP server requests are forwarded to (required).
    pub upstream: String,
    /// `--policy` and `--layer`, in the order given (the order the limits apply in).
    pub limits: Vec<LimitArg>,
    /// `--require NAME`: the limits whose key a request must carry (401 without it).
    pub required: Vec<String>,
    /// `--trusted-proxy CIDR`: the proxies in front whose forwarding header names the client.
    pub trusted: Vec<String>,
    /// `--forwarded`: read RFC 7239 `Forwarded` from trusted proxies, not `X-Forwarded-For`.
    pub forwarded: bool,
    /// `--dry-run`: reject nothing.
    pub dry_run: bool,
    /// The RateLimit fields on admitted responses: `true` unless `--no-headers`.
    pub headers: bool,
    /// `--metrics ADDR` ([`Extras::metrics`]).
    pub metrics: Option<String>,
    /// `--state FILE` ([`Extras::state`]).
    pub state: Option<PathBuf>,
    /// `--state-interval SECONDS` ([`Extras::state`]): between 1 ms and a day; 10 s unless given.
    pub state_interval: Duration,
    /// `--pingora-limits N` ([`Extras::comparison`]): at most `N` (positive) requests per client
    /// address per second, decided by pingora-limits' `Rate`, not ratewell.
    pub pingora_limits: Option<u64>,
    /// `--no-limit` ([`Extras::comparison`]): no limit at all.
    pub no_limit: bool,
}

/// Why [`ProxyArgs::parse`] returned no arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArgsError {
    /// `--help` or `-h`: print [`usage`] and exit successfully.
    Help,
    /// A command line that cannot run, and why (an unknown or refused option, a missing or bad
    /// value, a missing required option, options that exclude each other).
    Invalid(String),
}

impl fmt::Display for ArgsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArgsError::Help => f.write_str("help requested"),
            ArgsError::Invalid(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for ArgsError {}

impl From<String> for ArgsError {
    fn from(why: String) -> Self {
        ArgsError::Invalid(why)
    }
}

impl ProxyArgs {
    /// Parse `args` (the program's arguments, without its name: `std::env::args().skip(1)`) for a
    /// proxy that serves `extras` beyond the common options.
    ///
    /// `--help` (or `-h`) anywhere before an error gives [`ArgsError::Help`]. Any other
    /// [`ArgsError::Invalid`]: an option this proxy does not serve or does not know, one without
    /// its value, a bad `--layer`, `--state-interval` or `--pingora-limits` value, no `--listen`
    /// or `--upstream`, no limit (`--policy`, `--layer`, or with [`Extras::comparison`]
    /// `--pingora-limits` or `--no-limit`), or more than one of ratewell's limits,
    /// `--pingora-limits` and `--no-limit`. Keys and policies are checked where the limiter is
    /// built ([`LimitArg::key`], the builder), not here.
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell_http::proxy::{ArgsError, Extras, ProxyArgs};
    ///
    /// let parse = |args: &[&str], extras| ProxyArgs::parse(args.iter().map(|a| a.to_string()), extras);
    /// let base = ["--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:9000"];
    ///
    /// let layered = [&base[..], &["--layer", "key:header=x-api-key:fixed-window limit=100 window=1m"]].concat();
    /// let args = parse(&layered, Extras::default())?;
    /// assert_eq!((args.limits[0].name.as_str(), args.limits[0].key.as_str()), ("key", "header=x-api-key"));
    ///
    /// // A proxy without metrics refuses --metrics; one with them takes it.
    /// let with_metrics = [&layered[..], &["--metrics", "127.0.0.1:9090"]].concat();
    /// assert!(matches!(parse(&with_metrics, Extras::default()), Err(ArgsError::Invalid(_))));
    /// let extras = Extras { metrics: true, ..Extras::default() };
    /// assert_eq!(parse(&with_metrics, extras)?.metrics.as_deref(), Some("127.0.0.1:9090"));
    ///
    /// let Err(ArgsError::Invalid(why)) = parse(&base, Extras::default()) else { panic!() };
    /// assert_eq!(why, "give at least one --policy or --layer");
    /// # Ok::<(), ArgsError>(())
    /// ```
    pub fn parse(args: impl Iterator<Item = String>, extras: Extras) -> Result<Self, ArgsError> {
        let mut o = ProxyArgs {
            listen: String::new(),
            upstream: String::new(),
            limits: Vec::new(),
            required: Vec::new(),
            trusted: Vec::new(),
            forwarded: false,
            dry_run: false,
            headers: true,
            metrics: None,
            state: None,
            state_interval: Duration::from_secs(10),
            pingora_limits: None,
            no_limit: false,
        };
        let mut args = args;
        while let Some(arg) = args.next() {
            if !serves(extras, &arg) {
                return Err(format!("{arg} is not an option of this proxy").into());
            }
            let mut value = || args.next().ok_or(format!("{arg} needs a value"));
            match arg.as_str() {
                "--help" | "-h" => return Err(ArgsError::Help),
                "--listen" => o.listen = value()?,
                "--upstream" => o.upstream = value()?,
                "--policy" => o.limits.push(LimitArg {
                    name: "ip".into(),
                    key: "ip".into(),
                    policy: value()?,
                }),
                "--layer" => {
                    let spec = value()?;
                    let mut parts = spec.splitn(3, ':');
                    match (parts.next(), parts.next(), parts.next()) {
                        (Some(name), Some(key), Some(policy)) => o.limits.push(LimitArg {
                            name: name.into(),
                            key: key.into(),
                            policy: policy.into(),
                        }),
                        _ => {
                            return Err(
                                format!("--layer {spec:?}: expected NAME:KEY:POLICY").into()
                            );
                        }
                    }
                }
                "--require" => o.required.push(value()?),
                "--trusted-proxy" => o.trusted.push(value()?),
                "--forwarded" => o.forwarded = true,
                "--dry-run" => o.dry_run = true,
                "--no-headers" => o.headers = false,
                "--metrics" => o.metrics = Some(value()?),
                "--state" => o.state = Some(value()?.into()),
                "--state-interval" => {
                    let v = value()?;
                    let secs: f64 =
                        v.parse().map_err(|_| format!("--state-interval {v:?}: seconds"))?;
                    if !(0.001..=86_400.0).contains(&secs) {
                        return Err(format!(
                            "--state-interval {v:?}: between 0.001 and 86400 seconds"
                        )
                        .into());
                    }
                    o.state_interval = Duration::from_secs_f64(secs);
                }
                "--pingora-limits" => {
                    let v = value()?;
                    let n = v.parse::<u64>().ok().filter(|&n| n > 0);
                    o.pingora_limits =
                        Some(n.ok_or(format!("--pingora-limits {v:?}: a positive count"))?);
                }
                "--no-limit" => o.no_limit = true,
                other => return Err(format!("unknown argument {other:?}").into()),
            }
        }
        if o.listen.is_empty() || o.upstream.is_empty() {
            return Err("--listen and --upstream are required".to_string().into());
        }
        let others = usize::from(o.pingora_limits.is_some()) + usize::from(o.no_limit);
        if o.limits.is_empty() && others == 0 {
            return Err("give at least one --policy or --layer".to_string().into());
        }
        if others + usize::from(!o.limits.is_empty()) > 1 {
            return Err("--pingora-limits, --no-limit and ratewell's limits (--policy, --layer) \
                        exclude each other"
                .to_string()
                .into());
        }
        Ok(o)
    }
}

/// Every option, as [`usage`] lists them: an option's entry starts with its name at column 3.
/// (The string starts on its first line: a line continuation would drop that line's indent.)
const OPTIONS: &str = "  --listen ADDR            address to serve on (127.0.0.1:8080)
  --upstream HOST:PORT     the HTTP server requests are forwarded to
  --policy POLICY          a limit named \"ip\" per client address, in the policy grammar:
                           'token-bucket capacity=20 rate=10/s'
  --layer NAME:KEY:POLICY  a limit named NAME, keyed by KEY, one of
                             ip              the client address (IPv6 per /64)
                             header=NAME     a request header (an API key)
                             bearer          the token of 'Authorization: Bearer'
                             path            the request path
                             global          one budget for every request
                           e.g. --layer 'key:header=x-api-key:sliding-window limit=100 window=1m'
                           Limits apply in order, all or nothing.
  --require NAME           answer 401 to a request without limit NAME's key (default: skip
                           the limit for that request)
  --trusted-proxy CIDR     a proxy in front of this one whose forwarding header names the client
                           (repeatable; the client is the rightmost untrusted address)
  --forwarded              read RFC 7239 'Forwarded' from trusted proxies, not X-Forwarded-For
  --dry-run                reject nothing; headers as if enforcing
  --no-headers             no RateLimit fields on admitted responses
  --metrics ADDR           serve Prometheus metrics (text format 0.0.4) at http://ADDR/metrics
  --state FILE             keep the limits' keys across restarts: read FILE at start (if it
                           exists; one that cannot be restored is reported, and the limits start
                           empty), write it every --state-interval and on SIGTERM or SIGINT,
                           then exit
  --state-interval SECONDS how often to write --state (default 10)
  --pingora-limits N       no ratewell limit: pingora-limits' Rate, at most N requests per client
                           address per second (its example's limiter), for comparison
  --no-limit               no limit at all: the proxy alone, for comparison
";

/// Whether a proxy that serves `extras` serves `option` (every option but the extras' is served).
fn serves(extras: Extras, option: &str) -> bool {
    match option {
        "--metrics" => extras.metrics,
        "--state" | "--state-interval" => extras.state,
        "--pingora-limits" | "--no-limit" => extras.comparison,
        _ => true,
    }
}

/// The usage line and the options of a proxy that serves `extras`, for its `--help`: the caller
/// prints a line about itself before it, and what it prints when it runs after it.
///
/// # Examples
///
/// ```
/// use ratewell_http::proxy::{Extras, usage};
///
/// let text = usage(Extras { comparison: true, ..Extras::default() });
/// assert!(text.starts_with("usage: proxy --listen ADDR --upstream HOST:PORT"));
/// assert!(text.contains("\n  --trusted-proxy CIDR") && text.contains("\n  --no-limit"));
/// assert!(!text.contains("--metrics"));
/// ```
pub fn usage(extras: Extras) -> String {
    let mut words = vec![
        "--listen ADDR",
        "--upstream HOST:PORT",
        "[--policy POLICY]",
        "[--layer NAME:KEY:POLICY]...",
        "[--require NAME]...",
        "[--trusted-proxy CIDR]...",
        "[--forwarded]",
        "[--dry-run]",
        "[--no-headers]",
    ];
    if extras.metrics {
        words.push("[--metrics ADDR]");
    }
    if extras.state {
        words.push("[--state FILE [--state-interval SECONDS]]");
    }
    if extras.comparison {
        words.push("[--pingora-limits N | --no-limit]");
    }
    // The words on lines of at most 100 columns, the later ones indented under the first word.
    let mut text = String::from("usage: proxy");
    let mut column = text.len();
    for word in words {
        if column + 1 + word.len() > 100 {
            text.push_str("\n            ");
            column = 12;
        }
        text.push(' ');
        text.push_str(word);
        column += 1 + word.len();
    }
    text.push_str("\n\n");
    // Each option's entry (its line, and the indented ones after it) if the proxy serves it.
    let mut served = true;
    for line in OPTIONS.lines() {
        if let Some(entry) = line.strip_prefix("  --") {
            let name = entry.split(' ').next().unwrap_or_default();
            served = serves(extras, &format!("--{name}"));
        }
        if served {
            if extras.metrics && line.starts_with("  --dry-run ") {
                text.push_str(&line.replace("headers as if", "headers and metrics as if"));
            } else {
                text.push_str(line);
            }
            text.push('\n');
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::KeyKind;

    const ALL: Extras = Extras { metrics: true, state: true, comparison: true };

    fn parse(args: &[&str], extras: Extras) -> Result<ProxyArgs, ArgsError> {
        ProxyArgs::parse(args.iter().map(|a| a.to_string()), extras)
    }

    /// `args` after `--listen` and `--upstream`.
    fn with_base(args: &[&str], extras: Extras) -> Result<ProxyArgs, ArgsError> {
        let base = ["--listen", "127.0.0.1:8080", "--upstream", "127.0.0.1:9000"];
        parse(&[&base[..], args].concat(), extras)
    }

    fn invalid(result: Result<ProxyArgs, ArgsError>) -> String {
        match result {
            Err(ArgsError::Invalid(why)) => why,
            other => panic!("not refused: {other:?}"),
        }
    }

    const POLICY: [&str; 2] = ["--policy", "token-bucket capacity=20 rate=10/s"];

    #[test]
    fn the_defaults_of_a_minimal_command_line() {
        let args = with_base(&POLICY, Extras::default()).unwrap();
        assert_eq!(args.listen, "127.0.0.1:8080");
        assert_eq!(args.upstream, "127.0.0.1:9000");
        assert_eq!(
            args.limits,
            [LimitArg {
                name: "ip".into(),
                key: "ip".into(),
                policy: "token-bucket capacity=20 rate=10/s".into(),
            }]
        );
        assert!(args.required.is_empty() && args.trusted.is_empty());
        assert!(!args.forwarded && !args.dry_run && args.headers && !args.no_limit);
        assert_eq!((args.metrics, args.state, args.pingora_limits), (None, None, None));
        assert_eq!(args.state_interval, Duration::from_secs(10));
    }

    #[test]
    fn every_option_of_a_proxy_that_serves_them_all() {
        let args = with_base(
            &[
                "--policy",
                "fixed-window limit=3 window=1m",
                "--layer",
                "key:header=x-api-key:sliding-window limit=100 window=1m",
                "--layer",
                "everyone:global:gcra rate=1/s burst=1",
                "--require",
                "key",
                "--trusted-proxy",
                "10.0.0.0/8",
                "--trusted-proxy",
                "192.168.0.1/32",
                "--forwarded",
                "--dry-run",
                "--no-headers",
                "--metrics",
                "127.0.0.1:0",
                "--state",
                "/tmp/state.bin",
                "--state-interval",
                "0.5",
            ],
            ALL,
        )
        .unwrap();
        let limits: Vec<_> = args
            .limits
            .iter()
            .map(|l| (l.name.as_str(), l.key.as_str(), l.policy.as_str()))
            .collect();
        assert_eq!(
            limits,
            [
                ("ip", "ip", "fixed-window limit=3 window=1m"),
                ("key", "header=x-api-key", "sliding-window limit=100 window=1m"),
                ("everyone", "global", "gcra rate=1/s burst=1"),
            ]
        );
        assert_eq!(args.required, ["key"]);
        assert_eq!(args.trusted, ["10.0.0.0/8", "192.168.0.1/32"]);
        assert!(args.forwarded && args.dry_run && !args.headers);
        assert_eq!(args.metrics.as_deref(), Some("127.0.0.1:0"));
        assert_eq!(args.state, Some(PathBuf::from("/tmp/state.bin")));
        assert_eq!(args.state_interval, Duration::from_millis(500));
    }

    #[test]
    fn a_repeated_single_option_keeps_its_last_value() {
        let args = with_base(
            &[
                &POLICY[..],
                &["--listen", "0.0.0.0:1", "--metrics", "a", "--metrics", "b"],
                &["--state-interval", "1", "--state-interval", "2"],
            ]
            .concat(),
            ALL,
        )
        .unwrap();
        assert_eq!(args.listen, "0.0.0.0:1");
        assert_eq!(args.metrics.as_deref(), Some("b"));
        assert_eq!(args.state_interval, Duration::from_secs(2));
    }

    #[test]
    fn a_layer_splits_at_its_first_two_colons() {
        // The policy may hold colons; the key and the name may not.
        let args = with_base(&["--layer", "a:header=x-k:fixed-window limit=1 window=1:00"], ALL);
        let limit = &args.unwrap().limits[0];
        assert_eq!(
            (limit.name.as_str(), limit.key.as_str(), limit.policy.as_str()),
            ("a", "header=x-k", "fixed-window limit=1 window=1:00")
        );
        for spec in ["nocolon", "name:key", ""] {
            assert_eq!(
                invalid(with_base(&["--layer", spec], ALL)),
                format!("--layer {spec:?}: expected NAME:KEY:POLICY")
            );
        }
    }

    #[test]
    fn the_comparison_options() {
        let args = with_base(&["--pingora-limits", "100"], ALL).unwrap();
        assert_eq!((args.pingora_limits, args.no_limit), (Some(100), false));
        assert!(args.limits.is_empty());
        let args = with_base(&["--no-limit"], ALL).unwrap();
        assert_eq!((args.pingora_limits, args.no_limit), (None, true));
        // They exclude each other, and ratewell's limits.
        let exclusive = "--pingora-limits, --no-limit and ratewell's limits (--policy, --layer) \
                         exclude each other";
        for args in [
            &["--pingora-limits", "1", "--no-limit"][..],
            &["--no-limit", "--policy", "fixed-window limit=1 window=1s"],
            &["--pingora-limits", "1", "--layer", "a:ip:fixed-window limit=1 window=1s"],
        ] {
            assert_eq!(invalid(with_base(args, ALL)), exclusive, "{args:?}");
        }
    }

    #[test]
    fn bad_values_are_refused_with_what_was_given() {
        for (args, why) in [
            (&["--state-interval", "soon"][..], "--state-interval \"soon\": seconds"),
            (&["--state-interval", "0"], "--state-interval \"0\": between 0.001 and 86400 seconds"),
            (
                &["--state-interval", "86401"],
                "--state-interval \"86401\": between 0.001 and 86400 seconds",
            ),
            (
                &["--state-interval", "NaN"],
                "--state-interval \"NaN\": between 0.001 and 86400 seconds",
            ),
            (&["--pingora-limits", "0"], "--pingora-limits \"0\": a positive count"),
            (&["--pingora-limits", "-3"], "--pingora-limits \"-3\": a positive count"),
            (&["--pingora-limits", "many"], "--pingora-limits \"many\": a positive count"),
        ] {
            assert_eq!(invalid(with_base(&[&POLICY[..], args].concat(), ALL)), why, "{args:?}");
        }
        // The bounds themselves are good.
        let at = |v: &str| with_base(&[&POLICY[..], &["--state-interval", v]].concat(), ALL);
        assert_eq!(at("0.001").unwrap().state_interval, Duration::from_millis(1));
        assert_eq!(at("86400").unwrap().state_interval, Duration::from_secs(86_400));
    }

    #[test]
    fn an_option_without_its_value() {
        for option in [
            "--listen",
            "--upstream",
            "--policy",
            "--layer",
            "--require",
            "--trusted-proxy",
            "--metrics",
            "--state",
            "--state-interval",
            "--pingora-limits",
        ] {
            assert_eq!(
                invalid(with_base(&[&POLICY[..], &[option]].concat(), ALL)),
                format!("{option} needs a value")
            );
        }
    }

    #[test]
    fn unknown_options_and_stray_values() {
        for arg in ["--bogus", "-x", "ip", "--Listen", "--policy=fixed-window"] {
            assert_eq!(
                invalid(with_base(&[&POLICY[..], &[arg]].concat(), ALL)),
                format!("unknown argument {arg:?}")
            );
        }
    }

    #[test]
    fn extras_a_proxy_does_not_serve_are_refused() {
        for (args, without) in [
            (&["--metrics", "127.0.0.1:0"][..], Extras { metrics: false, ..ALL }),
            (&["--state", "f"], Extras { state: false, ..ALL }),
            (&["--state-interval", "1"], Extras { state: false, ..ALL }),
            (&["--no-limit"], Extras { comparison: false, ..ALL }),
            (&["--pingora-limits", "5"], Extras { comparison: false, ..ALL }),
        ] {
            // The comparison options are limits of their own.
            let line =
                if without.comparison { [&POLICY[..], args].concat() } else { args.to_vec() };
            assert!(with_base(&line, ALL).is_ok(), "{args:?}");
            // Refused, by name, by a proxy without the extra, whatever else it serves.
            let refused = format!("{} is not an option of this proxy", args[0]);
            assert_eq!(invalid(with_base(&line, without)), refused);
            assert_eq!(invalid(with_base(&line, Extras::default())), refused);
        }
        // Refused before its value is looked at.
        assert_eq!(
            invalid(parse(&["--pingora-limits"], Extras::default())),
            "--pingora-limits is not an option of this proxy"
        );
    }

    #[test]
    fn listen_upstream_and_a_limit_are_required() {
        let required = "--listen and --upstream are required";
        assert_eq!(invalid(parse(&[], ALL)), required);
        assert_eq!(invalid(parse(&["--listen", "127.0.0.1:1", "--policy", "p"], ALL)), required);
        assert_eq!(invalid(parse(&["--upstream", "127.0.0.1:1", "--policy", "p"], ALL)), required);
        // An empty value is no value.
        assert_eq!(
            invalid(parse(&["--listen", "", "--upstream", "u", "--policy", "p"], ALL)),
            required
        );
        assert_eq!(invalid(with_base(&[], ALL)), "give at least one --policy or --layer");
        // --require names a limit, but makes none.
        assert_eq!(
            invalid(with_base(&["--require", "ip"], ALL)),
            "give at least one --policy or --layer"
        );
    }

    #[test]
    fn help_wherever_it_comes_before_an_error() {
        for args in [
            &["--help"][..],
            &["-h"],
            &["--listen", "127.0.0.1:1", "--help", "--bogus"],
            // Before the command line is complete: the required options are checked at the end.
            &["--upstream", "u", "-h"],
        ] {
            assert_eq!(parse(args, Extras::default()), Err(ArgsError::Help), "{args:?}");
        }
        // After an error, the error.
        assert_eq!(invalid(parse(&["--bogus", "--help"], ALL)), "unknown argument \"--bogus\"");
        // As a value, it is the value.
        let args = with_base(&["--policy", "--help"], ALL).unwrap();
        assert_eq!(args.limits[0].policy, "--help");
        assert_eq!(ArgsError::Help.to_string(), "help requested");
        assert_eq!(ArgsError::Invalid("why".into()).to_string(), "why");
    }

    #[test]
    fn keys_as_the_layer_names_them() {
        let key = |spec: &str| {
            LimitArg { name: "n".into(), key: spec.into(), policy: String::new() }.key()
        };
        assert!(matches!(key("ip").unwrap().0, KeyKind::ClientIp));
        assert!(matches!(key("bearer").unwrap().0, KeyKind::Bearer));
        assert!(matches!(key("path").unwrap().0, KeyKind::Path));
        assert!(matches!(key("global").unwrap().0, KeyKind::Global));
        match key("header=X-Api-Key").unwrap().0 {
            KeyKind::Header(name) => assert_eq!(name, "x-api-key"),
            _ => panic!("not a header key"),
        }
        assert_eq!(
            key("cookie").unwrap_err(),
            "unknown key \"cookie\" (ip, header=NAME, bearer, path, global)"
        );
        assert_eq!(
            key("IP").unwrap_err(),
            "unknown key \"IP\" (ip, header=NAME, bearer, path, global)"
        );
        let bad = key("header=x api").unwrap_err();
        assert!(bad.starts_with("key \"header=x api\": \"x api\": "), "{bad}");
        assert!(key("header=").unwrap_err().starts_with("key \"header=\": \"\": "));
    }

    #[test]
    fn the_usage_lists_what_the_proxy_serves() {
        let plain = usage(Extras::default());
        let tower = usage(Extras { metrics: true, state: true, comparison: false });
        let pingora = usage(Extras { comparison: true, ..Extras::default() });
        for text in [&plain, &tower, &pingora, &usage(ALL)] {
            for option in [
                "--listen ADDR",
                "--upstream HOST:PORT",
                "--policy POLICY",
                "--layer NAME:KEY:POLICY",
                "--require NAME",
                "--trusted-proxy CIDR",
                "--forwarded",
                "--dry-run",
                "--no-headers",
            ] {
                // In the usage line and in the list.
                assert_eq!(text.matches(option).count(), 2, "{option} in\n{text}");
            }
            assert!(text.lines().all(|l| l.len() <= 100), "{text}");
            // Every option's entry at column 3, its other lines indented under its description.
            let list = text.split_once("\n\n").unwrap().1;
            assert!(list.starts_with("  --listen ADDR            address to serve on"), "{list}");
            for line in list.lines() {
                assert!(
                    line.starts_with("  --") || line.starts_with(&" ".repeat(27)),
                    "{line:?} in\n{text}"
                );
            }
            assert!(text.starts_with("usage: proxy --listen ADDR --upstream HOST:PORT"));
        }
        for (text, served) in [
            (&plain, [false, false, false]),
            (&tower, [true, true, false]),
            (&pingora, [false, false, true]),
        ] {
            assert_eq!(text.contains("--metrics ADDR"), served[0], "{text}");
            assert_eq!(text.contains("--state FILE"), served[1], "{text}");
            assert_eq!(text.contains("--state-interval SECONDS"), served[1], "{text}");
            assert_eq!(text.contains("--pingora-limits N"), served[2], "{text}");
            assert_eq!(text.contains("--no-limit"), served[2], "{text}");
            assert_eq!(text.contains("headers and metrics as if enforcing"), served[0]);
            assert_eq!(text.contains("headers as if enforcing"), !served[0]);
            // An entry's later lines go with it.
            assert_eq!(text.contains("\n                           then exit\n"), served[1]);
            assert_eq!(text.contains("\n                           address per second"), served[2]);
        }
        // The usage line wraps under the program's name.
        assert!(usage(ALL).lines().nth(1).unwrap().starts_with("             ["));
    }
}
