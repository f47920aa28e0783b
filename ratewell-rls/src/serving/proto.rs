//! The messages of `envoy.service.ratelimit.v3.RateLimitService`, written by hand with prost's
//! derive (no protoc at build time), field for field and tag for tag as
//! envoyproxy/data-plane-api's `rls.proto`, `ratelimit.proto` (common), `ratelimit_unit.proto`
//! and `base.proto` declare them. Only the messages the service reads or writes are here.
//!
//! ```
//! use prost::Message;
//! use ratewell_rls::proto::{Entry, RateLimitDescriptor, RateLimitRequest};
//!
//! let request = RateLimitRequest {
//!     domain: "edge".into(),
//!     descriptors: vec![RateLimitDescriptor {
//!         entries: vec![Entry { key: "remote_address".into(), value: "10.0.0.1".into() }],
//!         ..Default::default()
//!     }],
//!     hits_addend: 0,
//! };
//! let bytes = request.encode_to_vec();
//! assert_eq!(RateLimitRequest::decode(&bytes[..]).unwrap(), request);
//! ```

/// The gRPC service's name, as health checks ask for it.
pub const SERVICE_NAME: &str = "envoy.service.ratelimit.v3.RateLimitService";

/// `envoy.service.ratelimit.v3.RateLimitRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitRequest {
    /// The domain: the configuration file the descriptors are looked up in.
    #[prost(string, tag = "1")]
    pub domain: String,
    /// The descriptors, each decided (and answered) in this order.
    #[prost(message, repeated, tag = "2")]
    pub descriptors: Vec<RateLimitDescriptor>,
    /// The request's cost on every descriptor that has no `hits_addend` of its own; 0 means 1.
    #[prost(uint32, tag = "3")]
    pub hits_addend: u32,
}

/// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitDescriptor {
    /// The entries, from the most general to the most specific.
    #[prost(message, repeated, tag = "1")]
    pub entries: Vec<Entry>,
    /// A limit sent by the proxy, used instead of the configuration's.
    #[prost(message, optional, tag = "2")]
    pub limit: Option<RateLimitOverride>,
    /// This descriptor's cost (`google.protobuf.UInt64Value`), instead of the request's; 0 checks
    /// without charging.
    #[prost(message, optional, tag = "3")]
    pub hits_addend: Option<u64>,
}

/// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor.Entry`.
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct Entry {
    /// The entry's key (`remote_address`, `generic_key`, a header's descriptor key).
    #[prost(string, tag = "1")]
    pub key: String,
    /// The entry's value; may be empty.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor.RateLimitOverride`.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct RateLimitOverride {
    /// The limit's requests per unit.
    #[prost(uint32, tag = "1")]
    pub requests_per_unit: u32,
    /// The unit, an `envoy.type.v3.RateLimitUnit` (the response's [`Unit`] numbers, without
    /// `WEEK`).
    #[prost(int32, tag = "2")]
    pub unit: i32,
}

/// `envoy.service.ratelimit.v3.RateLimitResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitResponse {
    /// OVER_LIMIT if any descriptor is over its limit (see the crate's docs for shadow and
    /// quota modes), else OK.
    #[prost(enumeration = "Code", tag = "1")]
    pub overall_code: i32,
    /// One status per request descriptor, in the request's order.
    #[prost(message, repeated, tag = "2")]
    pub statuses: Vec<DescriptorStatus>,
    /// Headers for the proxy to add to the response to its client.
    #[prost(message, repeated, tag = "3")]
    pub response_headers_to_add: Vec<HeaderValue>,
    /// Headers for the proxy to add to the request it forwards.
    #[prost(message, repeated, tag = "4")]
    pub request_headers_to_add: Vec<HeaderValue>,
    /// The body of the proxy's local reply when the request is over the limit.
    #[prost(bytes = "vec", tag = "5")]
    pub raw_body: Vec<u8>,
    /// Metadata the proxy stores under its rate limit filter's namespace.
    #[prost(message, optional, tag = "6")]
    pub dynamic_metadata: Option<prost_types::Struct>,
}

/// `envoy.service.ratelimit.v3.RateLimitResponse.Code`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Code {
    /// No answer (Envoy treats it as OK).
    Unknown = 0,
    /// Within the limit.
    Ok = 1,
    /// Over the limit.
    OverLimit = 2,
}

/// `envoy.service.ratelimit.v3.RateLimitResponse.RateLimit`: the limit a status was decided by.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct RateLimit {
    /// The limit's name in the configuration (`rate_limit.name`), or empty.
    #[prost(string, tag = "3")]
    pub name: String,
    /// Requests per unit.
    #[prost(uint32, tag = "1")]
    pub requests_per_unit: u32,
    /// The unit.
    #[prost(enumeration = "Unit", tag = "2")]
    pub unit: i32,
}

/// `envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Unit {
    /// No unit.
    Unknown = 0,
    /// One second.
    Second = 1,
    /// One minute.
    Minute = 2,
    /// One hour.
    Hour = 3,
    /// One day.
    Day = 4,
    /// Thirty days (envoyproxy/ratelimit's month).
    Month = 5,
    /// 365 days (envoyproxy/ratelimit's year).
    Year = 6,
    /// Seven days.
    Week = 7,
}

impl Unit {
    /// The unit named `name` in the configuration (`second`, `MINUTE`, ...: case does not
    /// matter), as envoyproxy/ratelimit reads it; `UNKNOWN` is a name too.
    pub fn from_name(name: &str) -> Option<Unit> {
        Some(match name.to_ascii_uppercase().as_str() {
            "UNKNOWN" => Unit::Unknown,
            "SECOND" => Unit::Second,
            "MINUTE" => Unit::Minute,
            "HOUR" => Unit::Hour,
            "DAY" => Unit::Day,
            "MONTH" => Unit::Month,
            "YEAR" => Unit::Year,
            "WEEK" => Unit::Week,
            _ => return None,
        })
    }

    /// The unit's name as the protocol spells it (`SECOND`).
    pub fn name(self) -> &'static str {
        match self {
            Unit::Unknown => "UNKNOWN",
            Unit::Second => "SECOND",
            Unit::Minute => "MINUTE",
            Unit::Hour => "HOUR",
            Unit::Day => "DAY",
            Unit::Month => "MONTH",
            Unit::Year => "YEAR",
            Unit::Week => "WEEK",
        }
    }

    /// The unit's length in seconds (envoyproxy/ratelimit's divider: a month is 30 days, a
    /// year 365); `None` for [`Unit::Unknown`].
    pub fn seconds(self) -> Option<u64> {
        Some(match self {
            Unit::Unknown => return None,
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 604_800,
            Unit::Month => 2_592_000,
            Unit::Year => 31_536_000,
        })
    }
}

/// `envoy.service.ratelimit.v3.RateLimitResponse.DescriptorStatus`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DescriptorStatus {
    /// This descriptor's answer.
    #[prost(enumeration = "Code", tag = "1")]
    pub code: i32,
    /// The limit it was decided by (absent when none applies).
    #[prost(message, optional, tag = "2")]
    pub current_limit: Option<RateLimit>,
    /// What remains of the limit in the current window.
    #[prost(uint32, tag = "3")]
    pub limit_remaining: u32,
    /// The time until the window ends.
    #[prost(message, optional, tag = "4")]
    pub duration_until_reset: Option<prost_types::Duration>,
}

/// `envoy.config.core.v3.HeaderValue`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct HeaderValue {
    /// The header's name.
    #[prost(string, tag = "1")]
    pub key: String,
    /// The header's value.
    #[prost(string, tag = "2")]
    pub value: String,
    /// The value as bytes (used instead of `value` when not empty).
    #[prost(bytes = "vec", tag = "3")]
    pub raw_value: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    /// The tags on the wire, byte by byte, as protoc's encoding of the same values gives them.
    #[test]
    fn request_bytes() {
        let request = RateLimitRequest {
            domain: "d".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry { key: "k".into(), value: "v".into() }],
                limit: Some(RateLimitOverride { requests_per_unit: 5, unit: 2 }),
                hits_addend: Some(0),
            }],
            hits_addend: 3,
        };
        let expected = [
            0x0a, 1, b'd', // domain = 1
            0x12, 16, // descriptors = 2, 16 bytes
            0x0a, 6, 0x0a, 1, b'k', 0x12, 1, b'v', // entries = 1 {key = 1, value = 2}
            0x12, 4, 0x08, 5, 0x10, 2, // limit = 2 {requests_per_unit = 1, unit = 2}
            0x1a, 0, // hits_addend = 3, UInt64Value{0}: present, empty
            0x18, 3, // hits_addend = 3
        ];
        assert_eq!(request.encode_to_vec(), expected);
        assert_eq!(RateLimitRequest::decode(&expected[..]).unwrap(), request);
    }

    #[test]
    fn response_bytes() {
        let response = RateLimitResponse {
            overall_code: Code::OverLimit as i32,
            statuses: vec![DescriptorStatus {
                code: Code::OverLimit as i32,
                current_limit: Some(RateLimit {
                    name: "n".into(),
                    requests_per_unit: 10,
                    unit: Unit::Week as i32,
                }),
                limit_remaining: 0,
                duration_until_reset: Some(prost_types::Duration { seconds: 7, nanos: 0 }),
            }],
            response_headers_to_add: vec![HeaderValue {
                key: "a".into(),
                value: "b".into(),
                raw_value: vec![],
            }],
            ..Default::default()
        };
        let expected = [
            0x08, 2, // overall_code = 1
            0x12, 15, // statuses = 2
            0x08, 2, // code = 1
            0x12, 7, 0x08, 10, 0x10, 7, 0x1a, 1,
            b'n', // current_limit = 2 {rpu, unit, name = 3}
            0x22, 2, 0x08, 7, // duration_until_reset = 4 {seconds = 1}
            0x1a, 6, 0x0a, 1, b'a', 0x12, 1, b'b', // response_headers_to_add = 3
        ];
        assert_eq!(response.encode_to_vec(), expected);
    }

    #[test]
    fn units() {
        for unit in [
            Unit::Unknown,
            Unit::Second,
            Unit::Minute,
            Unit::Hour,
            Unit::Day,
            Unit::Week,
            Unit::Month,
            Unit::Year,
        ] {
            assert_eq!(Unit::from_name(&unit.name().to_lowercase()), Some(unit));
        }
        assert_eq!(Unit::from_name("fortnight"), None);
        assert_eq!(Unit::Week.seconds(), Some(7 * 86_400));
        assert_eq!(Unit::Unknown.seconds(), None);
    }
}
