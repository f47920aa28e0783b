//! [`Error`]: why a limiter could not be built, or a call failed.

use std::fmt;

use crate::script::DomainError;

/// Why a limiter could not be built, or a call that reports errors (a trace's replay) failed.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Error {
    /// The URL does not parse as a Redis URL.
    Url(String),
    /// A policy the script cannot decide exactly.
    Domain(DomainError),
    /// The layers: none, more than [`MAX_LAYERS`](ratewell::MAX_LAYERS), a name repeated or empty, or keys that do not
    /// match them.
    Layers(String),
    /// A `Failover::Local` whose divided policy is not valid.
    Failover(String),
    /// The server answered, but not as Redis does.
    NotRedis(String),
    /// A time passed in that is not a whole number of microseconds, or beyond 2^52 us.
    Time(u64),
    /// The server did not answer within the timeout.
    Timeout,
    /// The connection failed or is down.
    Down(String),
    /// The server answered with an error, or a reply that is not the script's.
    BadReply(String),
    /// The server (or a sentinel) refused this client: a wrong or missing password or user.
    Refused(String),
    /// TLS could not be set up or was refused: a certificate or key that does not parse, a
    /// server certificate that does not verify, a client certificate the server refuses, or a
    /// build without the `tls` feature.
    Tls(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Url(e) => write!(f, "not a Redis URL: {e}"),
            Error::Domain(e) => write!(f, "{e}"),
            Error::Layers(e) => write!(f, "layers: {e}"),
            Error::Failover(e) => write!(f, "local failover: {e}"),
            Error::NotRedis(e) => write!(f, "the server does not answer as Redis does: {e}"),
            Error::Time(ns) => write!(
                f,
                "time {ns} ns: the Redis backend decides on whole microseconds below 2^52 us"
            ),
            Error::Timeout => write!(f, "the server did not answer within the timeout"),
            Error::Down(e) => write!(f, "the connection is down: {e}"),
            Error::BadReply(e) => write!(f, "unexpected reply from the server: {e}"),
            Error::Tls(e) => write!(f, "TLS: {e}"),
            Error::Refused(e) => write!(f, "the server refused this client: {e}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<DomainError> for Error {
    fn from(e: DomainError) -> Self {
        Error::Domain(e)
    }
}
