//! envoyproxy/ratelimit's configuration: one YAML file per domain, read, checked and matched
//! as that service reads, checks and matches it (its `src/config/config_impl.go`).
//!
//! ```
//! use ratewell_rls::config::{ConfigFile, RateLimitConfig};
//! use ratewell_rls::proto::{Entry, RateLimitDescriptor, Unit};
//!
//! let file = ConfigFile::parse(
//!     "edge.yaml",
//!     "
//! domain: edge
//! descriptors:
//!   - key: remote_address
//!     rate_limit: {unit: second, requests_per_unit: 10}
//! ",
//! )?;
//! let config = RateLimitConfig::new(&[file], false)?;
//! let descriptor = RateLimitDescriptor {
//!     entries: vec![Entry { key: "remote_address".into(), value: "10.0.0.1".into() }],
//!     ..Default::default()
//! };
//! let limit = config.get_limit("edge", &descriptor).expect("the key-only rule matches");
//! assert_eq!((limit.requests_per_unit, limit.unit), (10, Unit::Second));
//! assert_eq!(limit.full_key, "edge.remote_address");
//! # Ok::<(), ratewell_rls::config::ConfigError>(())
//! ```
//!
//! # Checks, in envoyproxy/ratelimit's order and words
//!
//! A file is first read as plain YAML and every mapping key checked (`config error, unknown key
//! 'ratelimit'`, `config error, key is not of type string: 0.25`, `config error, yaml file
//! contains list of type other than map: a`, `error checking config`), then read into the
//! configuration's shape, then loaded (`config file cannot have empty domain`, `duplicate domain
//! 'd' in config file`, `descriptor has empty key`, `duplicate descriptor composite key
//! 'd.k_v'`, `invalid rate limit unit 'foo'`, `should not specify rate limit unit when
//! unlimited`, `should not have an empty replaces entry`, `replaces should not contain name of
//! same descriptor`, `share_threshold can only be used with wildcard values ...`). Every error is
//! prefixed with the file's name, as there. The YAML library's own messages (a syntax error, a
//! value of the wrong type, YAML nested deeper than 128, which is 64 levels of descriptors) are this crate's YAML library's, not Go's
//! `yaml.v2`'s.

mod limits;
mod yaml;

pub use limits::{MoreLimit, RateLimit, RateLimitConfig};
pub use yaml::{ConfigError, ConfigFile};

#[cfg(test)]
mod tests;
