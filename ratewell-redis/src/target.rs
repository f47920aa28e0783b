//! Where a limiter connects: one server, a cluster, or the primary that Redis Sentinel names;
//! with TLS ([`Tls`], feature `tls`) on any of them; and which of redis-rs's errors say that a
//! connection failed, or that its TLS did.

use std::time::Duration;

use redis::{ErrorKind, RedisError, Value};

use crate::error::Error;

/// TLS to the server (and to the sentinels), with the `tls` feature: rustls, its `ring`
/// provider.
///
/// ```
/// # #[cfg(feature = "tls")] {
/// use ratewell_redis::{RedisLimiter, Tls};
///
/// let ca = b"-----BEGIN CERTIFICATE-----\n...".to_vec();
/// let builder = RedisLimiter::builder("rediss://redis.internal:6380")
///     .tls(Tls { ca: Some(ca), ..Tls::default() });
/// # drop(builder); }
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tls {
    /// The certificates (PEM) the server's chain must lead to; `None`: the system's roots.
    pub ca: Option<Vec<u8>>,
    /// A client certificate chain and its key (PEM), for a server that asks for one
    /// (`tls-auth-clients yes`).
    pub client: Option<(Vec<u8>, Vec<u8>)>,
    /// Verify the chain against [`ca`](Self::ca) but not the server's name (envoyproxy/ratelimit's
    /// `REDIS_TLS_SKIP_HOSTNAME_VERIFICATION`): for servers reached by an address their
    /// certificate does not name.
    pub skip_hostname_verification: bool,
}

/// A primary that Redis Sentinel names ([`RedisLimiter::sentinel_builder`](crate::RedisLimiter::sentinel_builder)).
///
/// ```
/// use ratewell_redis::Sentinel;
///
/// let sentinel = Sentinel {
///     name: "mymaster".into(),
///     // A sentinel's own password goes in its URL.
///     sentinels: vec!["redis://:sentinel-pw@10.0.0.5:26379".into(), "redis://10.0.0.6:26379".into()],
///     username: None,
///     password: Some("primary-pw".into()),
/// };
/// assert_eq!(sentinel.sentinels.len(), 2);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sentinel {
    /// The name the sentinels monitor the primary under (`sentinel monitor NAME ...`).
    pub name: String,
    /// The sentinels' URLs, asked in order.
    pub sentinels: Vec<String>,
    /// The primary's ACL user (`None`: the default user).
    pub username: Option<String>,
    /// The primary's password.
    pub password: Option<String>,
}

/// Where the limiter connects.
#[derive(Clone, Debug)]
pub(crate) enum Target {
    Single(String),
    Cluster(Vec<String>),
    Sentinel(Sentinel),
}

/// `url` with the `rediss` scheme where TLS is asked for and the URL says `redis`.
pub(crate) fn with_scheme(url: &str, tls: bool) -> String {
    match url.strip_prefix("redis://") {
        Some(rest) if tls => format!("rediss://{rest}"),
        _ => url.to_owned(),
    }
}

/// A client of `url`, with `tls` when given.
pub(crate) fn open_client(url: &str, tls: Option<&Tls>) -> Result<redis::Client, Error> {
    let bad = |e: RedisError| Error::Url(e.to_string());
    let Some(tls) = tls else { return redis::Client::open(url).map_err(bad) };
    open_tls(&with_scheme(url, true), tls)
}

/// The certificates redis-rs builds its rustls configuration from, with the provider it builds
/// with installed (one the application installed already is kept).
#[cfg(feature = "tls")]
fn certificates(tls: &Tls) -> redis::TlsCertificates {
    let _ = rustls::crypto::ring::default_provider().install_default();
    redis::TlsCertificates {
        client_tls: tls.client.as_ref().map(|(cert, key)| redis::ClientTlsConfig {
            client_cert: cert.clone(),
            client_key: key.clone(),
        }),
        root_cert: tls.ca.clone(),
    }
}

#[cfg(feature = "tls")]
fn open_tls(url: &str, tls: &Tls) -> Result<redis::Client, Error> {
    if url.starts_with("unix:") || url.starts_with("redis+unix:") {
        return Err(Error::Tls("TLS to Redis needs a TCP address, not a unix socket".into()));
    }
    let client = redis::Client::build_with_tls(url, certificates(tls))
        .map_err(|e| Error::Tls(e.to_string()))?;
    if !tls.skip_hostname_verification {
        return Ok(client);
    }
    let info = client.get_connection_info().clone();
    let mut addr = info.addr().clone();
    addr.set_danger_accept_invalid_hostnames(true);
    redis::Client::open(info.set_addr(addr)).map_err(|e| Error::Tls(e.to_string()))
}

/// A cluster's client builder with `tls`'s certificates (its nodes' URLs in the `rediss`
/// scheme).
#[cfg(feature = "tls")]
pub(crate) fn cluster_tls(
    builder: redis::cluster::ClusterClientBuilder,
    tls: &Tls,
) -> Result<redis::cluster::ClusterClientBuilder, Error> {
    if tls.skip_hostname_verification {
        return Err(Error::Tls(
            "skipping only the hostname's verification is not supported on a cluster".into(),
        ));
    }
    Ok(builder.certs(certificates(tls)))
}

#[cfg(not(feature = "tls"))]
fn open_tls(_url: &str, _tls: &Tls) -> Result<redis::Client, Error> {
    Err(without_tls())
}

#[cfg(not(feature = "tls"))]
pub(crate) fn cluster_tls(
    _builder: redis::cluster::ClusterClientBuilder,
    _tls: &Tls,
) -> Result<redis::cluster::ClusterClientBuilder, Error> {
    Err(without_tls())
}

#[cfg(not(feature = "tls"))]
fn without_tls() -> Error {
    Error::Tls("ratewell-redis was built without its `tls` feature".into())
}

/// Whether `e` says the connection failed (an I/O error, a connection dropped or refused, a
/// timeout): a server that is down or out of reach, which a reconnect may mend.
pub(crate) fn is_connection_error(e: &RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() || e.is_timeout()
}

/// Whether `e` is a TLS failure: a certificate refused on either side, a handshake that failed.
/// Not a server that is down: a configuration to fix, so a limiter is not built on it.
pub(crate) fn is_tls_error(e: &RedisError) -> bool {
    let text = e.to_string().to_ascii_lowercase();
    e.is_io_error()
        && ["certificate", "received fatal alert", "handshake", "tls"]
            .iter()
            .any(|w| text.contains(w))
}

/// The URL of `host:port` with the primary's credentials, in the scheme of the sentinels'.
fn primary_url(target: &Sentinel, host: &str, port: u16, tls: bool) -> String {
    let userinfo = match (&target.username, &target.password) {
        (Some(u), Some(p)) => format!("{}:{}@", escape(u), escape(p)),
        (None, Some(p)) => format!(":{}@", escape(p)),
        _ => String::new(),
    };
    let host = if host.contains(':') { format!("[{host}]") } else { host.to_owned() };
    let scheme = if tls { "rediss" } else { "redis" };
    format!("{scheme}://{userinfo}{host}:{port}")
}

fn escape(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Ask the sentinels, in order, which server is `target`'s primary, and check that it says so
/// itself (`ROLE`): its address and a client for it. A sentinel that cannot be reached, knows
/// no such primary, or names a server that is not (yet) primary, is passed over.
///
/// Errors: every sentinel unreachable (a connection error: the limiter starts down and keeps
/// asking), or one that refuses this client (a wrong `REDIS_SENTINEL_AUTH`, a certificate): that
/// error, which no retry mends.
pub(crate) async fn resolve_primary(
    target: &Sentinel,
    tls: Option<&Tls>,
    timeout: Duration,
) -> Result<(String, redis::Client), RedisError> {
    let wait = timeout.max(Duration::from_millis(200));
    let mut last: Option<RedisError> = None;
    let mut fatal: Option<RedisError> = None;
    let io =
        |what: String| RedisError::from(std::io::Error::new(std::io::ErrorKind::NotFound, what));
    for sentinel in &target.sentinels {
        let client = match open_client(sentinel, tls) {
            Ok(c) => c,
            Err(e) => {
                return Err(RedisError::from((
                    ErrorKind::InvalidClientConfig,
                    "sentinel",
                    e.to_string(),
                )));
            }
        };
        let asked = async {
            let mut conn = client.get_multiplexed_async_connection().await?;
            let reply: Value = redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(&target.name)
                .query_async(&mut conn)
                .await?;
            Ok::<Value, RedisError>(reply)
        };
        let reply = match tokio::time::timeout(wait, asked).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(e)) => {
                if !is_connection_error(&e) || is_tls_error(&e) {
                    fatal.get_or_insert(refused_by(&format!("sentinel {}", redact(sentinel)), &e));
                } else {
                    last = Some(e);
                }
                continue;
            }
            Err(_) => {
                last = Some(io(format!(
                    "sentinel {} did not answer within {wait:?}",
                    redact(sentinel)
                )));
                continue;
            }
        };
        let (host, port) = match redis::from_redis_value::<Option<(String, u16)>>(reply) {
            Ok(Some(addr)) => addr,
            _ => {
                last = Some(io(format!(
                    "sentinel {} knows no primary named {}",
                    redact(sentinel),
                    target.name
                )));
                continue;
            }
        };
        let url = primary_url(target, &host, port, tls.is_some());
        let primary = match open_client(&url, tls) {
            Ok(c) => c,
            Err(e) => {
                return Err(RedisError::from((
                    ErrorKind::InvalidClientConfig,
                    "primary",
                    e.to_string(),
                )));
            }
        };
        let role = async {
            let mut conn = primary.get_multiplexed_async_connection().await?;
            let role: Value = redis::cmd("ROLE").query_async(&mut conn).await?;
            Ok::<Value, RedisError>(role)
        };
        match tokio::time::timeout(wait, role).await {
            Ok(Ok(Value::Array(parts))) if is_master(parts.first()) => {
                return Ok((format!("{host}:{port}"), primary));
            }
            Ok(Ok(_)) => {
                last = Some(io(format!(
                    "{host}:{port}, named primary of {} by sentinel {}, is not primary",
                    target.name,
                    redact(sentinel)
                )));
            }
            Ok(Err(e)) if !is_connection_error(&e) || is_tls_error(&e) => {
                let named =
                    format!("the primary {host}:{port} (named by sentinel {})", redact(sentinel));
                fatal.get_or_insert(refused_by(&named, &e));
            }
            Ok(Err(e)) => last = Some(e),
            Err(_) => last = Some(io(format!("{host}:{port} did not answer within {wait:?}"))),
        }
    }
    Err(fatal.or(last).unwrap_or_else(|| io("no sentinel given".into())))
}

/// `e`, of the same kind (so still telling a connection error from a refusal), saying which
/// server it came from: a sentinel and the primary may each refuse a password.
fn refused_by(server: &str, e: &RedisError) -> RedisError {
    if e.is_io_error() {
        let kind = std::io::ErrorKind::InvalidData;
        return RedisError::from(std::io::Error::new(kind, format!("{server}: {e}")));
    }
    RedisError::from((e.kind(), "refused", format!("{server}: {e}")))
}

fn is_master(role: Option<&Value>) -> bool {
    match role {
        Some(Value::BulkString(b)) => b == b"master",
        Some(Value::SimpleString(s)) => s == "master",
        _ => false,
    }
}

/// A URL without its password, for a message.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn primary_urls_carry_the_primarys_credentials() {
        let t = Sentinel {
            name: "m".into(),
            sentinels: vec![],
            username: Some("u".into()),
            password: Some("p@ss".into()),
        };
        assert_eq!(primary_url(&t, "10.0.0.1", 6379, false), "redis://u:p%40ss@10.0.0.1:6379");
        assert_eq!(primary_url(&t, "::1", 6380, true), "rediss://u:p%40ss@[::1]:6380");
        let t = Sentinel { username: None, password: None, ..t };
        assert_eq!(primary_url(&t, "h", 1, false), "redis://h:1");
        assert_eq!(redact("redis://:pw@h:1"), "redis://***@h:1");
        assert_eq!(with_scheme("redis://h:1", true), "rediss://h:1");
        assert_eq!(with_scheme("redis://h:1", false), "redis://h:1");
    }
}
