//! What a layer keys a request by.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::sync::Arc;

use http::header::{AUTHORIZATION, HeaderName};
use http::{Extensions, HeaderMap, Method, Uri};
use ratewell::IpKey;

/// What a [`Limit`](crate::Limit) keys a request by: each distinct key has its own budget.
///
/// # Examples
///
/// ```
/// use ratewell_http::{Key, KeyValue};
///
/// let by_ip = Key::client_ip();
/// let by_api_key = Key::header("x-api-key");
/// let by_token = Key::bearer_token();
/// let by_path = Key::path();
/// let everyone = Key::global();
/// // Any rule: here the tenant of a `/tenants/{id}/...` path, absent elsewhere.
/// let by_tenant = Key::from_fn(|req| {
///     let rest = req.uri().path().strip_prefix("/tenants/")?;
///     Some(KeyValue::from(rest.split('/').next()?))
/// });
/// ```
#[derive(Clone)]
pub struct Key(pub(crate) KeyKind);

#[derive(Clone)]
pub(crate) enum KeyKind {
    ClientIp,
    Header(HeaderName),
    Bearer,
    Path,
    Global,
    Fn(Arc<KeyFn>),
}

type KeyFn = dyn for<'a> Fn(KeyContext<'a>) -> Option<KeyValue<'a>> + Send + Sync;

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            KeyKind::ClientIp => f.write_str("Key::client_ip()"),
            KeyKind::Header(name) => write!(f, "Key::header({name:?})"),
            KeyKind::Bearer => f.write_str("Key::bearer_token()"),
            KeyKind::Path => f.write_str("Key::path()"),
            KeyKind::Global => f.write_str("Key::global()"),
            KeyKind::Fn(_) => f.write_str("Key::from_fn(..)"),
        }
    }
}

impl Key {
    /// The client's address (see [`TrustedProxies`](crate::TrustedProxies)), truncated to the
    /// builder's [`IpPrefixes`](ratewell::IpPrefixes) (IPv4 /32, IPv6 /64 unless set). Absent when the request carries no
    /// peer address.
    pub fn client_ip() -> Self {
        Key(KeyKind::ClientIp)
    }

    /// The value of the header `name` (its bytes as sent; absent when missing or empty). Repeated
    /// lines: the first.
    ///
    /// # Panics
    ///
    /// If `name` is not a valid header name (a programming error, like a bad literal); a name
    /// that comes from configuration goes through [`Key::try_header`].
    pub fn header(name: &str) -> Self {
        Key::try_header(name).expect("a valid header name")
    }

    /// [`Key::header`], or the error for a name that is not a valid header name (empty, or with
    /// a character RFC 9110 does not allow in a field name, such as a space or a colon).
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell_http::Key;
    ///
    /// assert!(Key::try_header("x-api-key").is_ok());
    /// assert!(Key::try_header("x api key").is_err());
    /// assert!(Key::try_header("").is_err());
    /// ```
    pub fn try_header(name: &str) -> Result<Self, http::header::InvalidHeaderName> {
        HeaderName::from_bytes(name.as_bytes()).map(|name| Key(KeyKind::Header(name)))
    }

    /// The token of `Authorization: Bearer <token>` (the scheme in any case); absent for any other
    /// scheme or none.
    pub fn bearer_token() -> Self {
        Key(KeyKind::Bearer)
    }

    /// The request's path (no query): each path has its own budget, shared by every client.
    pub fn path() -> Self {
        Key(KeyKind::Path)
    }

    /// One key for every request: a budget the whole service shares.
    pub fn global() -> Self {
        Key(KeyKind::Global)
    }

    /// A key computed by `f` from the request; `None` for an absent key.
    pub fn from_fn<F>(f: F) -> Self
    where
        F: for<'a> Fn(KeyContext<'a>) -> Option<KeyValue<'a>> + Send + Sync + 'static,
    {
        Key(KeyKind::Fn(Arc::new(f)))
    }

    /// What [`Key::global`] keys every request by.
    pub(crate) const GLOBAL_VALUE: KeyValue<'static> = KeyValue::U64(0);

    pub(crate) fn is_client_ip(&self) -> bool {
        matches!(self.0, KeyKind::ClientIp)
    }

    #[inline]
    pub(crate) fn is_global(&self) -> bool {
        matches!(self.0, KeyKind::Global)
    }

    pub(crate) fn needs_client_ip(&self) -> bool {
        matches!(self.0, KeyKind::ClientIp | KeyKind::Fn(_))
    }

    #[inline]
    pub(crate) fn extract<'a>(&self, cx: KeyContext<'a>) -> Option<KeyValue<'a>> {
        match &self.0 {
            KeyKind::ClientIp => cx.client.map(|c| KeyValue::Ip(c.network)),
            KeyKind::Header(name) => {
                let value = cx.headers.get(name)?.as_bytes();
                (!value.is_empty()).then_some(KeyValue::Bytes(value))
            }
            KeyKind::Bearer => {
                bearer(cx.headers.get(AUTHORIZATION)?.as_bytes()).map(KeyValue::Bytes)
            }
            KeyKind::Path => Some(KeyValue::Bytes(cx.uri.path().as_bytes())),
            KeyKind::Global => Some(Key::GLOBAL_VALUE),
            KeyKind::Fn(f) => f(cx),
        }
    }
}

fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, token) = value.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"bearer") || token.first() != Some(&b' ') {
        return None;
    }
    let token = &token[token.iter().position(|&b| b != b' ')?..];
    let end = token.iter().rposition(|&b| b != b' ').map_or(0, |e| e + 1);
    (end > 0).then(|| &token[..end])
}

/// The request as a [`Key::from_fn`] closure sees it, with the client's address resolved.
#[derive(Clone, Copy, Debug)]
pub struct KeyContext<'a> {
    method: &'a Method,
    uri: &'a Uri,
    headers: &'a HeaderMap,
    extensions: &'a Extensions,
    client: Option<&'a Client>,
}

/// A request's client: its address and the network it is keyed by.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Client {
    pub(crate) ip: IpAddr,
    pub(crate) network: IpKey,
}

impl<'a> KeyContext<'a> {
    pub(crate) fn new(head: &crate::Head<'a>, client: Option<&'a Client>) -> Self {
        KeyContext {
            method: head.method,
            uri: head.uri,
            headers: head.headers,
            extensions: head.extensions,
            client,
        }
    }

    /// The method.
    pub fn method(&self) -> &'a Method {
        self.method
    }

    /// The URI.
    pub fn uri(&self) -> &'a Uri {
        self.uri
    }

    /// The headers.
    pub fn headers(&self) -> &'a HeaderMap {
        self.headers
    }

    /// The extensions (axum's `MatchedPath`, a `ConnectInfo`, an authenticated user).
    pub fn extensions(&self) -> &'a Extensions {
        self.extensions
    }

    /// The client's address as [`Key::client_ip`] resolves it (`None` without a peer address).
    pub fn client_ip(&self) -> Option<IpAddr> {
        self.client.map(|c| c.ip)
    }

    /// The client's address truncated to the builder's prefixes, as [`Key::client_ip`] keys it.
    pub fn client_network(&self) -> Option<IpKey> {
        self.client.map(|c| c.network)
    }
}

/// A key's value: bytes borrowed from the request, a network, a number, or owned bytes.
///
/// Equal values are the same key; values of different kinds are different keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyValue<'a> {
    /// Bytes of the request (a header value, a path segment).
    Bytes(&'a [u8]),
    /// A client network.
    Ip(IpKey),
    /// A number (a user id, a tenant).
    U64(u64),
    /// Bytes computed for this request.
    Owned(Vec<u8>),
}

impl Hash for KeyValue<'_> {
    #[inline]
    fn hash<H: Hasher>(&self, state: &mut H) {
        match self {
            KeyValue::Bytes(bytes) => bytes.hash(state),
            KeyValue::Owned(bytes) => bytes.as_slice().hash(state),
            KeyValue::Ip(ip) => {
                state.write_u8(1);
                state.write_u128(ip.to_bits())
            }
            KeyValue::U64(n) => {
                state.write_u8(2);
                n.hash(state)
            }
        }
    }
}

impl<'a> From<&'a str> for KeyValue<'a> {
    fn from(s: &'a str) -> Self {
        KeyValue::Bytes(s.as_bytes())
    }
}

impl<'a> From<&'a [u8]> for KeyValue<'a> {
    fn from(b: &'a [u8]) -> Self {
        KeyValue::Bytes(b)
    }
}

impl<'a> From<&'a http::HeaderValue> for KeyValue<'a> {
    fn from(v: &'a http::HeaderValue) -> Self {
        KeyValue::Bytes(v.as_bytes())
    }
}

impl From<String> for KeyValue<'_> {
    fn from(s: String) -> Self {
        KeyValue::Owned(s.into_bytes())
    }
}

impl From<u64> for KeyValue<'_> {
    fn from(n: u64) -> Self {
        KeyValue::U64(n)
    }
}

impl From<IpKey> for KeyValue<'_> {
    fn from(ip: IpKey) -> Self {
        KeyValue::Ip(ip)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn bearer_tokens() {
        assert_eq!(bearer(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer(b"bEaReR   abc  "), Some(&b"abc"[..]));
        assert_eq!(bearer(b"Bearer "), None);
        assert_eq!(bearer(b"Bearerabc"), None);
        assert_eq!(bearer(b"Basic abc"), None);
        assert_eq!(bearer(b"Bear"), None);
    }

    #[test]
    fn borrowed_and_owned_bytes_are_one_key() {
        let s = std::collections::hash_map::RandomState::new();
        assert_eq!(s.hash_one(KeyValue::from("abc")), s.hash_one(KeyValue::from("abc".to_owned())));
        assert_ne!(
            s.hash_one(KeyValue::U64(7)),
            s.hash_one(KeyValue::Owned(7u64.to_ne_bytes().to_vec()))
        );
    }
}
