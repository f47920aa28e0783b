//! Client addresses as keys, aggregated to a network prefix.
//!
//! An IPv6 client usually controls a whole /64 (and often a /56 or /48): keyed on full addresses,
//! it could rotate through 2^64 keys and never be limited, and flush the table while at it. So
//! addresses are truncated to a prefix first: /32 for IPv4 (one address) and /64 for IPv6 by
//! default, configurable. IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`) count as IPv4.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The prefix lengths that addresses are truncated to.
///
/// # Examples
///
/// ```
/// use std::net::IpAddr;
/// use ratewell::IpPrefixes;
///
/// let prefixes = IpPrefixes::default(); // IPv4 /32, IPv6 /64
/// let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
/// let b: IpAddr = "2001:db8:1:2:bbbb::9".parse().unwrap();
/// assert_eq!(prefixes.key(a), prefixes.key(b)); // one /64, one key
/// assert_eq!(prefixes.key(a).to_string(), "2001:db8:1:2::/64");
///
/// let wide = IpPrefixes::new(24, 48).unwrap();
/// let c: IpAddr = "203.0.113.7".parse().unwrap();
/// assert_eq!(wide.key(c).to_string(), "203.0.113.0/24");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IpPrefixes {
    v4: u8,
    v6: u8,
}

impl Default for IpPrefixes {
    fn default() -> Self {
        IpPrefixes { v4: 32, v6: 64 }
    }
}

impl IpPrefixes {
    /// Prefix lengths for IPv4 (0..=32) and IPv6 (0..=128); `None` if out of range.
    pub const fn new(v4: u8, v6: u8) -> Option<Self> {
        if v4 <= 32 && v6 <= 128 { Some(IpPrefixes { v4, v6 }) } else { None }
    }

    /// The key of `ip`: its network at this prefix length.
    #[inline]
    pub fn key(&self, ip: IpAddr) -> IpKey {
        match ip.to_canonical() {
            IpAddr::V4(v4) => {
                let bits = u32::from(v4) & mask32(self.v4);
                IpKey { bits: u128::from(bits), prefix: self.v4, v6: false }
            }
            IpAddr::V6(v6) => {
                let bits = u128::from(v6) & mask128(self.v6);
                IpKey { bits, prefix: self.v6, v6: true }
            }
        }
    }
}

#[inline]
fn mask32(prefix: u8) -> u32 {
    if prefix == 0 { 0 } else { u32::MAX << (32 - u32::from(prefix)) }
}

#[inline]
fn mask128(prefix: u8) -> u128 {
    if prefix == 0 { 0 } else { u128::MAX << (128 - u32::from(prefix)) }
}

/// A network (an address truncated to a prefix), usable as a [`KeyedLimiter`](crate::KeyedLimiter)
/// key.
///
/// # Examples
///
/// ```
/// use ratewell::{IpKey, KeyedLimiter, ManualClock, Policy};
///
/// let policy: Policy = "token-bucket capacity=1 rate=1/s".parse()?;
/// let limiter = KeyedLimiter::<IpKey, _>::with_clock(&policy, 1000, ManualClock::new(0));
/// assert!(limiter.check(&IpKey::new("2001:db8::1".parse().unwrap())).is_admitted());
/// // Another address of the same /64: the same client.
/// assert!(!limiter.check(&IpKey::new("2001:db8::2".parse().unwrap())).is_admitted());
/// # Ok::<(), ratewell::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IpKey {
    bits: u128,
    prefix: u8,
    v6: bool,
}

impl IpKey {
    /// The key of `ip` under the default prefixes (IPv4 /32, IPv6 /64).
    pub fn new(ip: IpAddr) -> Self {
        IpPrefixes::default().key(ip)
    }

    /// The network's address in 128 bits, host bits zero: an IPv6 network as it is, an IPv4
    /// network in its IPv4-mapped form (`::ffff:a.b.c.d`). Two keys made with the same prefixes
    /// are equal exactly when their bits are: one `u128` to hash where the key's derived `Hash`
    /// writes three fields.
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{IpKey, IpPrefixes};
    ///
    /// let key = IpKey::new("192.0.2.7".parse().unwrap());
    /// assert_eq!(key.to_bits(), 0xffff_c000_0207);
    /// let net = IpPrefixes::new(32, 48).unwrap().key("2001:db8:1:2::1".parse().unwrap());
    /// assert_eq!(net.to_bits(), 0x2001_0db8_0001_u128 << 80);
    /// ```
    #[inline]
    pub fn to_bits(&self) -> u128 {
        if self.v6 { self.bits } else { 0xffff_0000_0000 | self.bits }
    }
}

impl fmt::Display for IpKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.v6 {
            write!(f, "{}/{}", Ipv6Addr::from(self.bits), self.prefix)
        } else {
            write!(f, "{}/{}", Ipv4Addr::from(self.bits as u32), self.prefix)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn mapped_v4_is_v4_and_prefixes_mask() {
        let p = IpPrefixes::default();
        assert_eq!(p.key(ip("::ffff:192.0.2.1")), p.key(ip("192.0.2.1")));
        assert_ne!(p.key(ip("192.0.2.1")), p.key(ip("192.0.2.2")));
        assert_ne!(p.key(ip("2001:db8:0:1::1")), p.key(ip("2001:db8:0:2::1")));
        let all = IpPrefixes::new(0, 0).unwrap();
        assert_eq!(all.key(ip("1.2.3.4")), all.key(ip("5.6.7.8")));
        assert_ne!(all.key(ip("1.2.3.4")), all.key(ip("::1")));
        assert!(IpPrefixes::new(33, 64).is_none());
        assert!(IpPrefixes::new(32, 129).is_none());
        assert_eq!(IpPrefixes::new(32, 128).unwrap().key(ip("::1")).to_string(), "::1/128");
    }
}
