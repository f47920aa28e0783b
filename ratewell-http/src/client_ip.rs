//! The client's address: the connection's peer, or the address a trusted proxy forwarded.
//!
//! A forwarding header (`X-Forwarded-For`, or RFC 7239's `Forwarded`) is a list that every proxy
//! on the way appends its own peer to. The client writes the list's start itself, so only the
//! entries appended by proxies one trusts mean anything: the client is the rightmost entry that is
//! not itself a trusted proxy. Reading the leftmost entry (as many extractors do) lets any client
//! pick its own key and so escape its limit.
//!
//! - The header is read only when the peer is a trusted proxy. From any other peer it is ignored
//!   (and counted as [`Metrics::forwarded_untrusted`](crate::Metrics)).
//! - Entries are read from the right, across every line of the header in order, past trusted
//!   addresses, up to the first one that is not trusted: that is the client. If every entry is
//!   trusted, the leftmost is the client (a request from inside the trusted network); with no
//!   header at all, the peer is.
//! - If an entry on the way cannot be used (not an address: empty, `unknown`, an RFC 7239
//!   obfuscated identifier, bad syntax, bytes that are not ASCII), or the header's lines together
//!   exceed [`TrustedProxies::max_header_bytes`] (no chain of real proxies writes that much), the
//!   key is the peer and the request is counted as [`Metrics::forwarded_malformed`](crate::Metrics).
//! - An address may carry a port (`192.0.2.1:8080`, `[2001:db8::1]:443`) and an IPv6 zone
//!   (`fe80::1%eth0`, in `Forwarded` as `%25`): both are dropped. IPv4-mapped IPv6 addresses are
//!   IPv4.

use std::net::{IpAddr, Ipv6Addr};

use http::HeaderMap;
use http::header::{FORWARDED, HeaderName};
use ipnet::IpNet;

/// The header a trusted proxy writes the client's address into.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2` (nginx, HAProxy, most load balancers).
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client;proto=https, for="[2001:db8::1]:4711"`.
    Forwarded,
}

/// The proxies whose forwarding header is believed, and how it is read.
///
/// Only one header is read: the one the proxies write. Reading both would let a client send the
/// one the proxy does not overwrite.
///
/// # Examples
///
/// ```
/// use ratewell_http::{ForwardedHeader, TrustedProxies};
///
/// let proxies = TrustedProxies::new(["10.0.0.0/8", "2001:db8:ffff::/48"])?
///     .header(ForwardedHeader::Forwarded)
///     .max_header_bytes(4096);
/// assert!(proxies.contains("10.1.2.3".parse().unwrap()));
/// assert!(!proxies.contains("192.0.2.1".parse().unwrap()));
/// # Ok::<(), ratewell_http::BuildError>(())
/// ```
#[derive(Clone, Debug)]
pub struct TrustedProxies {
    nets: Vec<IpNet>,
    header: ForwardedHeader,
    max_bytes: usize,
}

/// The default bound on a forwarding header's bytes (every line together).
pub const DEFAULT_MAX_FORWARDED_BYTES: usize = 2048;
/// The most entries of one `Forwarded` header examined; a longer list is malformed.
const MAX_FORWARDED_ELEMENTS: usize = 64;

impl Default for TrustedProxies {
    fn default() -> Self {
        TrustedProxies {
            nets: Vec::new(),
            header: ForwardedHeader::default(),
            max_bytes: DEFAULT_MAX_FORWARDED_BYTES,
        }
    }
}

impl TrustedProxies {
    /// No trusted proxy: the peer address is always the client's.
    pub fn none() -> Self {
        Self::default()
    }

    /// Proxies in these networks (`10.0.0.0/8`, `::1/128`, or a bare address for one host),
    /// writing `X-Forwarded-For`.
    pub fn new<I, S>(networks: I) -> Result<Self, crate::BuildError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut proxies = Self::default();
        for net in networks {
            proxies.nets.push(parse_net(net.as_ref())?);
        }
        Ok(proxies)
    }

    /// The header the proxies write (`X-Forwarded-For` unless set).
    pub fn header(mut self, header: ForwardedHeader) -> Self {
        self.header = header;
        self
    }

    /// The most bytes the header may hold, every line together
    /// ([`DEFAULT_MAX_FORWARDED_BYTES`] unless set); a longer header is malformed.
    pub fn max_header_bytes(mut self, bytes: usize) -> Self {
        self.max_bytes = bytes;
        self
    }

    /// Whether `ip` is a trusted proxy.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.nets.iter().any(|net| net.contains(&ip))
    }

    /// The header's name, borrowed: a custom name made on each call is a `Bytes` to make and
    /// drop on every request.
    fn header_name(&self) -> &'static HeaderName {
        static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
        static FORWARDED_NAME: HeaderName = FORWARDED;
        match self.header {
            ForwardedHeader::XForwardedFor => &X_FORWARDED_FOR,
            ForwardedHeader::Forwarded => &FORWARDED_NAME,
        }
    }

    /// Whether any proxy is trusted.
    #[inline]
    pub(crate) fn any(&self) -> bool {
        !self.nets.is_empty()
    }

    /// Whether `headers` carry the forwarding header.
    #[inline]
    pub(crate) fn sent_by(&self, headers: &HeaderMap) -> bool {
        headers.contains_key(self.header_name())
    }

    /// The client of a request from `peer` with these headers.
    #[inline]
    pub(crate) fn resolve(&self, peer: IpAddr, headers: &HeaderMap) -> Resolved {
        let peer = peer.to_canonical();
        if self.nets.is_empty() {
            // No proxy is trusted: a forwarding header is only counted.
            return if headers.contains_key(self.header_name()) {
                Resolved::Untrusted(peer)
            } else {
                Resolved::Peer(peer)
            };
        }
        self.resolve_trusted(peer, headers)
    }

    fn resolve_trusted(&self, peer: IpAddr, headers: &HeaderMap) -> Resolved {
        let name = self.header_name();
        if !self.contains(peer) {
            return if headers.contains_key(name) {
                Resolved::Untrusted(peer)
            } else {
                Resolved::Peer(peer)
            };
        }
        let mut bytes = 0usize;
        let mut lines = 0usize;
        for value in headers.get_all(name) {
            bytes = bytes.saturating_add(value.len());
            lines += 1;
        }
        if lines == 0 {
            return Resolved::Peer(peer);
        }
        if bytes > self.max_bytes {
            return Resolved::Malformed(peer);
        }
        let found = match self.header {
            ForwardedHeader::XForwardedFor => self.walk_x_forwarded_for(headers, name),
            ForwardedHeader::Forwarded => self.walk_forwarded(headers, name),
        };
        match found {
            Some(ip) => Resolved::Forwarded(ip),
            None => Resolved::Malformed(peer),
        }
    }

    /// The rightmost untrusted address of `X-Forwarded-For`, or the leftmost if all are trusted;
    /// `None` if an entry on the way is not an address.
    fn walk_x_forwarded_for(&self, headers: &HeaderMap, name: &HeaderName) -> Option<IpAddr> {
        let mut leftmost = None;
        for value in headers.get_all(name).iter().rev() {
            for entry in value.as_bytes().rsplit(|&b| b == b',') {
                let ip = parse_node(trim(entry), false)?;
                if !self.contains(ip) {
                    return Some(ip);
                }
                leftmost = Some(ip);
            }
        }
        leftmost
    }

    /// As [`walk_x_forwarded_for`](Self::walk_x_forwarded_for), over the `for=` of each element
    /// of `Forwarded`.
    fn walk_forwarded(&self, headers: &HeaderMap, name: &HeaderName) -> Option<IpAddr> {
        // Quoted strings may hold commas, so the elements are split from the left.
        let mut nodes: [Option<IpAddr>; MAX_FORWARDED_ELEMENTS] = [None; MAX_FORWARDED_ELEMENTS];
        let mut n = 0;
        for value in headers.get_all(name) {
            let mut rest = value.as_bytes();
            loop {
                let (element, more) = split_element(rest)?;
                if n == MAX_FORWARDED_ELEMENTS {
                    return None;
                }
                // An element without `for=`, or one that is not an address: unusable, but only
                // if the walk reaches it.
                nodes[n] = forwarded_for(element);
                n += 1;
                match more {
                    Some(next) => rest = next,
                    None => break,
                }
            }
        }
        let mut leftmost = None;
        for node in nodes[..n].iter().rev() {
            let ip = (*node)?;
            if !self.contains(ip) {
                return Some(ip);
            }
            leftmost = Some(ip);
        }
        leftmost
    }
}

/// Where a request's client address came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Resolved {
    /// The peer, with no forwarding header to read.
    Peer(IpAddr),
    /// The peer, untrusted, sent a forwarding header (ignored).
    Untrusted(IpAddr),
    /// Read from a trusted proxy's header.
    Forwarded(IpAddr),
    /// The peer, because the trusted proxy's header was malformed or too long.
    Malformed(IpAddr),
}

impl Resolved {
    pub(crate) fn ip(self) -> IpAddr {
        match self {
            Resolved::Peer(ip)
            | Resolved::Untrusted(ip)
            | Resolved::Forwarded(ip)
            | Resolved::Malformed(ip) => ip,
        }
    }
}

fn parse_net(text: &str) -> Result<IpNet, crate::BuildError> {
    let text = text.trim();
    if let Ok(net) = text.parse::<IpNet>() {
        return Ok(net.trunc());
    }
    match text.parse::<IpAddr>() {
        Ok(ip) => Ok(IpNet::from(ip.to_canonical())),
        Err(_) => Err(crate::BuildError::TrustedProxy(text.to_owned())),
    }
}

fn trim(bytes: &[u8]) -> &[u8] {
    let start = bytes.iter().position(|&b| b != b' ' && b != b'\t').unwrap_or(bytes.len());
    let end = bytes.iter().rposition(|&b| b != b' ' && b != b'\t').map_or(start, |e| e + 1);
    &bytes[start..end.max(start)]
}

/// An address as a forwarding header writes it: `192.0.2.1`, `192.0.2.1:80`, `2001:db8::1`,
/// `[2001:db8::1]`, `[2001:db8::1]:443`, with an IPv6 zone (`%eth0`; `%25eth0` when
/// `percent_encoded_zone`, RFC 7239's form) dropped. `None` for anything else.
fn parse_node(text: &[u8], percent_encoded_zone: bool) -> Option<IpAddr> {
    // The longest address with port and zone is far below this; longer is not an address.
    if text.is_empty() || text.len() > 128 || !text.is_ascii() {
        return None;
    }
    let text = std::str::from_utf8(text).ok()?;
    let ip = if let Some(rest) = text.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        if !(after.is_empty() || after.strip_prefix(':').is_some_and(is_port)) {
            return None;
        }
        IpAddr::V6(parse_v6(inside, percent_encoded_zone)?)
    } else if text.contains(':') && text.matches(':').count() > 1 {
        // Bare IPv6 (a port cannot follow it unbracketed).
        IpAddr::V6(parse_v6(text, percent_encoded_zone)?)
    } else {
        let (host, port) = match text.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        };
        if port.is_some_and(|p| !is_port(p)) {
            return None;
        }
        IpAddr::V4(host.parse().ok()?)
    };
    Some(ip.to_canonical())
}

fn parse_v6(text: &str, percent_encoded_zone: bool) -> Option<Ipv6Addr> {
    let address = match text.split_once('%') {
        Some((address, zone)) => {
            let zone = if percent_encoded_zone { zone.strip_prefix("25")? } else { zone };
            if zone.is_empty()
                || !zone.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~".contains(&b))
            {
                return None;
            }
            address
        }
        None => text,
    };
    address.parse().ok()
}

fn is_port(text: &str) -> bool {
    text.bytes().all(|b| b.is_ascii_digit()) && text.parse::<u16>().is_ok()
}

/// The first element of a `Forwarded` list and the rest after its comma (`None` when it was the
/// last); `None` for the whole if a quoted string is not closed.
#[allow(clippy::type_complexity)]
fn split_element(bytes: &[u8]) -> Option<(&[u8], Option<&[u8]>)> {
    let mut quoted = false;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' if quoted => i += 1,
            b'"' => quoted = !quoted,
            b',' if !quoted => return Some((&bytes[..i], Some(&bytes[i + 1..]))),
            _ => {}
        }
        i += 1;
    }
    if quoted { None } else { Some((bytes, None)) }
}

/// The address of an element's `for=` parameter (`None` if absent, repeated, an obfuscated
/// identifier, `unknown`, or bad syntax).
fn forwarded_for(element: &[u8]) -> Option<IpAddr> {
    let mut found = None;
    let mut rest = element;
    loop {
        // One `name=value` pair up to the next `;` outside quotes.
        let mut quoted = false;
        let mut end = rest.len();
        let mut i = 0;
        while i < rest.len() {
            match rest[i] {
                b'\\' if quoted => i += 1,
                b'"' => quoted = !quoted,
                b';' if !quoted => {
                    end = i;
                    break;
                }
                _ => {}
            }
            i += 1;
        }
        let pair = trim(&rest[..end]);
        if !pair.is_empty() {
            let eq = pair.iter().position(|&b| b == b'=')?;
            let (name, value) = (trim(&pair[..eq]), trim(&pair[eq + 1..]));
            if name.eq_ignore_ascii_case(b"for") {
                if found.is_some() {
                    return None;
                }
                let value = unquote(value)?;
                found = Some(parse_node(&value, true)?);
            }
        }
        if end >= rest.len() {
            return found;
        }
        rest = &rest[end + 1..];
    }
}

/// A token as it is, or a quoted string with its escapes resolved (at most 128 bytes).
fn unquote(value: &[u8]) -> Option<Vec<u8>> {
    let Some(inner) = value.strip_prefix(b"\"") else {
        return Some(value.to_vec());
    };
    let inner = inner.strip_suffix(b"\"")?;
    let mut out = Vec::with_capacity(inner.len());
    let mut bytes = inner.iter();
    while let Some(&b) = bytes.next() {
        match b {
            b'\\' => out.push(*bytes.next()?),
            b'"' => return None,
            _ => out.push(b),
        }
        if out.len() > 128 {
            return None;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn headers(name: &str, values: &[&[u8]]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for v in values {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_bytes(v).unwrap(),
            );
        }
        map
    }

    fn proxies() -> TrustedProxies {
        TrustedProxies::new(["10.0.0.0/8", "2001:db8:ffff::/48"]).unwrap()
    }

    #[test]
    fn untrusted_peer_is_the_client() {
        let h = headers("x-forwarded-for", &[b"203.0.113.9"]);
        assert_eq!(proxies().resolve(ip("192.0.2.1"), &h), Resolved::Untrusted(ip("192.0.2.1")));
        assert_eq!(
            proxies().resolve(ip("192.0.2.1"), &HeaderMap::new()),
            Resolved::Peer(ip("192.0.2.1"))
        );
    }

    #[test]
    fn rightmost_untrusted_across_lines() {
        let h = headers("x-forwarded-for", &[b"1.1.1.1, 203.0.113.9", b"10.0.0.7 , 10.0.0.8"]);
        assert_eq!(proxies().resolve(ip("10.0.0.1"), &h), Resolved::Forwarded(ip("203.0.113.9")));
        let all = headers("x-forwarded-for", &[b"10.9.9.9, 10.0.0.7"]);
        assert_eq!(proxies().resolve(ip("10.0.0.1"), &all), Resolved::Forwarded(ip("10.9.9.9")));
    }

    #[test]
    fn entries_with_ports_zones_and_mapped_addresses() {
        for (entry, want) in [
            (&b"203.0.113.9:8080"[..], "203.0.113.9"),
            (b"[2001:db8::1]:443", "2001:db8::1"),
            (b"[2001:db8::1]", "2001:db8::1"),
            (b"fe80::1%eth0", "fe80::1"),
            (b"::ffff:203.0.113.9", "203.0.113.9"),
        ] {
            let h = headers("x-forwarded-for", &[entry]);
            assert_eq!(
                proxies().resolve(ip("10.0.0.1"), &h),
                Resolved::Forwarded(ip(want)),
                "{entry:?}"
            );
        }
    }

    #[test]
    fn malformed_falls_back_to_the_peer() {
        let peer = ip("10.0.0.1");
        for bad in [
            &b"203.0.113.9, nonsense"[..],
            b"203.0.113.9,",
            b"unknown",
            b"203.0.113.9:99999",
            b"[2001:db8::1",
            b"\xff\xfe",
            b"fe80::1%",
        ] {
            let h = headers("x-forwarded-for", &[bad]);
            assert_eq!(proxies().resolve(peer, &h), Resolved::Malformed(peer), "{bad:?}");
        }
        // A bad entry left of the client is never read.
        let h = headers("x-forwarded-for", &[b"garbage, 203.0.113.9"]);
        assert_eq!(proxies().resolve(peer, &h), Resolved::Forwarded(ip("203.0.113.9")));
        // Too long.
        let huge = format!("{}203.0.113.9", "1.2.3.4, ".repeat(20_000));
        let h = headers("x-forwarded-for", &[huge.as_bytes()]);
        assert_eq!(proxies().resolve(peer, &h), Resolved::Malformed(peer));
    }

    #[test]
    fn forwarded_rfc_7239() {
        let p = proxies().header(ForwardedHeader::Forwarded);
        let peer = ip("10.0.0.1");
        let h = headers(
            "forwarded",
            &[br#"for=1.1.1.1, For="[2001:db8:cafe::17]:4711";proto=https;by="x,y", for=10.0.0.3"#],
        );
        assert_eq!(p.resolve(peer, &h), Resolved::Forwarded(ip("2001:db8:cafe::17")));
        let h = headers("forwarded", &[br#"for="\1\9\2.0.2.60""#]);
        assert_eq!(p.resolve(peer, &h), Resolved::Forwarded(ip("192.0.2.60")));
        let h = headers("forwarded", &[br#"for="[fe80::1%25eth0]""#]);
        assert_eq!(p.resolve(peer, &h), Resolved::Forwarded(ip("fe80::1")));
        for bad in [
            &br#"for=_hidden"#[..],
            br#"for=unknown"#,
            br#"for="_gazonk""#,
            br#"proto=https"#,
            br#"for=1.1.1.1;for=2.2.2.2"#,
            br#"for="[2001:db8::1]"#,
            br#"for=[2001:db8::1]:80 junk"#,
        ] {
            let h = headers("forwarded", &[bad]);
            assert_eq!(
                p.resolve(peer, &h),
                Resolved::Malformed(peer),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        // The X-Forwarded-For of a Forwarded proxy is not read.
        let h = headers("x-forwarded-for", &[b"203.0.113.9"]);
        assert_eq!(p.resolve(peer, &h), Resolved::Peer(peer));
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use http::HeaderValue;
    use proptest::prelude::*;

    /// Bytes a header value may hold (no control characters but tab), biased towards the
    /// characters of forwarding headers.
    fn value() -> impl Strategy<Value = Vec<u8>> {
        let pieces = prop_oneof![
            Just(b",".to_vec()),
            Just(b";".to_vec()),
            Just(b"\"".to_vec()),
            Just(b"\\".to_vec()),
            Just(b" ".to_vec()),
            Just(b"for=".to_vec()),
            Just(b"[".to_vec()),
            Just(b"]".to_vec()),
            Just(b":".to_vec()),
            Just(b"%25".to_vec()),
            Just(b"10.0.0.1".to_vec()),
            Just(b"198.51.100.7".to_vec()),
            Just(b"2001:db8::1".to_vec()),
            Just(b"_hidden".to_vec()),
            proptest::collection::vec(prop_oneof![0x20u8..0x7f, 0x80u8..=0xff], 0..8),
        ];
        proptest::collection::vec(pieces, 0..24).prop_map(|p| p.concat())
    }

    proptest! {
        /// Any header, any peer: no panic; the client is the peer unless a trusted peer's header
        /// named another address, which is then one that is not trusted, or the leftmost.
        #[test]
        fn any_forwarding_header_resolves(
            lines in proptest::collection::vec(value(), 0..3),
            forwarded in any::<bool>(),
            trusted_peer in any::<bool>(),
        ) {
            let header = if forwarded { ForwardedHeader::Forwarded } else { ForwardedHeader::XForwardedFor };
            let proxies = TrustedProxies::new(["10.0.0.0/8"]).unwrap().header(header);
            let peer: IpAddr = if trusted_peer { "10.9.9.9" } else { "192.0.2.1" }.parse().unwrap();
            let mut headers = HeaderMap::new();
            for line in &lines {
                if let Ok(v) = HeaderValue::from_bytes(line) {
                    headers.append(proxies.header_name(), v);
                }
            }
            match proxies.resolve(peer, &headers) {
                Resolved::Peer(ip) | Resolved::Untrusted(ip) | Resolved::Malformed(ip) => prop_assert_eq!(ip, peer),
                Resolved::Forwarded(_) => prop_assert!(trusted_peer),
            }
        }
    }
}
