//! The messages of the xDS configuration stream, written by hand with prost's derive (no protoc
//! at build time), field for field and tag for tag as the published `.proto` files declare them:
//!
//! - `envoy/service/discovery/v3/discovery.proto`: [`DiscoveryRequest`], [`DiscoveryResponse`];
//! - `envoy/config/core/v3/base.proto`: [`Node`] (its `id`, `cluster` and `metadata`);
//! - `google/rpc/status.proto`: [`Status`];
//! - `ratelimit/config/ratelimit/v3/rls_conf.proto` (go-control-plane): [`RateLimitConfig`],
//!   [`RateLimitDescriptor`], [`RateLimitPolicy`], [`RateLimitReplace`], [`RateLimitUnit`].
//!
//! Only the fields the client reads or writes are declared; prost skips the others on decode
//! (`DiscoveryResponse.control_plane`, `resource_errors`, `Node.locality`, ...).
//!
//! ```
//! use prost::Message;
//! use ratewell_rls::xds_proto::{RateLimitConfig, RATE_LIMIT_CONFIG_TYPE_URL};
//!
//! let config = RateLimitConfig { name: "edge".into(), domain: "edge".into(), descriptors: vec![] };
//! let any = prost_types::Any {
//!     type_url: RATE_LIMIT_CONFIG_TYPE_URL.into(),
//!     value: config.encode_to_vec(),
//! };
//! assert_eq!(RateLimitConfig::decode(&any.value[..]).unwrap(), config);
//! ```

/// The type of the resources the client asks for (go-control-plane's
/// `resource.RateLimitConfigType`).
pub const RATE_LIMIT_CONFIG_TYPE_URL: &str =
    "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// `envoy.service.discovery.v3.DiscoveryRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DiscoveryRequest {
    /// The version last acknowledged (empty before the first).
    #[prost(string, tag = "1")]
    pub version_info: String,
    /// The client's node.
    #[prost(message, optional, tag = "2")]
    pub node: Option<Node>,
    /// The resources asked for by name (none: all of them).
    #[prost(string, repeated, tag = "3")]
    pub resource_names: Vec<String>,
    /// The resources' type.
    #[prost(string, tag = "4")]
    pub type_url: String,
    /// The nonce of the response this request answers (empty on a stream's first request).
    #[prost(string, tag = "5")]
    pub response_nonce: String,
    /// Why the response this request answers was refused (absent: accepted).
    #[prost(message, optional, tag = "6")]
    pub error_detail: Option<Status>,
}

/// `envoy.service.discovery.v3.DiscoveryResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DiscoveryResponse {
    /// The version of the resources.
    #[prost(string, tag = "1")]
    pub version_info: String,
    /// The resources: all of them (state of the world).
    #[prost(message, repeated, tag = "2")]
    pub resources: Vec<prost_types::Any>,
    /// Whether the response is a canary.
    #[prost(bool, tag = "3")]
    pub canary: bool,
    /// The resources' type.
    #[prost(string, tag = "4")]
    pub type_url: String,
    /// The nonce the answering request carries.
    #[prost(string, tag = "5")]
    pub nonce: String,
}

/// `envoy.config.core.v3.Node`: the fields the client sends.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Node {
    /// The node's id (`CONFIG_GRPC_XDS_NODE_ID`): the control plane's snapshot key.
    #[prost(string, tag = "1")]
    pub id: String,
    /// The node's cluster.
    #[prost(string, tag = "2")]
    pub cluster: String,
    /// The node's metadata (`CONFIG_GRPC_XDS_NODE_METADATA`).
    #[prost(message, optional, tag = "3")]
    pub metadata: Option<prost_types::Struct>,
}

/// `google.rpc.Status`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Status {
    /// A `google.rpc.Code`.
    #[prost(int32, tag = "1")]
    pub code: i32,
    /// What went wrong.
    #[prost(string, tag = "2")]
    pub message: String,
    /// Details.
    #[prost(message, repeated, tag = "3")]
    pub details: Vec<prost_types::Any>,
}

/// `ratelimit.config.ratelimit.v3.RateLimitConfig`: one domain's configuration (one YAML file's
/// worth).
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitConfig {
    /// The configuration's name (the file name in its errors).
    #[prost(string, tag = "1")]
    pub name: String,
    /// The domain.
    #[prost(string, tag = "2")]
    pub domain: String,
    /// The descriptors.
    #[prost(message, repeated, tag = "3")]
    pub descriptors: Vec<RateLimitDescriptor>,
}

/// `ratelimit.config.ratelimit.v3.RateLimitDescriptor`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitDescriptor {
    /// The key.
    #[prost(string, tag = "1")]
    pub key: String,
    /// The value (empty: any value).
    #[prost(string, tag = "2")]
    pub value: String,
    /// The limit.
    #[prost(message, optional, tag = "3")]
    pub rate_limit: Option<RateLimitPolicy>,
    /// The nested descriptors.
    #[prost(message, repeated, tag = "4")]
    pub descriptors: Vec<RateLimitDescriptor>,
    /// Shadow mode.
    #[prost(bool, tag = "5")]
    pub shadow_mode: bool,
    /// Detailed metrics.
    #[prost(bool, tag = "6")]
    pub detailed_metric: bool,
    /// Quota mode.
    #[prost(bool, tag = "7")]
    pub quota_mode: bool,
    /// Free-form metadata, returned with the matched limit.
    #[prost(message, optional, tag = "8")]
    pub metadata: Option<prost_types::Struct>,
}

/// `ratelimit.config.ratelimit.v3.RateLimitPolicy`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitPolicy {
    /// The unit, a [`RateLimitUnit`] (any number on the wire).
    #[prost(enumeration = "RateLimitUnit", tag = "1")]
    pub unit: i32,
    /// Requests per unit.
    #[prost(uint32, tag = "2")]
    pub requests_per_unit: u32,
    /// No limit.
    #[prost(bool, tag = "3")]
    pub unlimited: bool,
    /// The limit's name.
    #[prost(string, tag = "4")]
    pub name: String,
    /// The named limits this one replaces.
    #[prost(message, repeated, tag = "5")]
    pub replaces: Vec<RateLimitReplace>,
}

/// `ratelimit.config.ratelimit.v3.RateLimitReplace`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct RateLimitReplace {
    /// The replaced limit's name.
    #[prost(string, tag = "1")]
    pub name: String,
}

/// `ratelimit.config.ratelimit.v3.RateLimitUnit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum RateLimitUnit {
    /// No unit (the default: what an unlimited policy carries).
    Unknown = 0,
    /// One second.
    Second = 1,
    /// One minute.
    Minute = 2,
    /// One hour.
    Hour = 3,
    /// One day.
    Day = 4,
    /// A month.
    Month = 5,
    /// A year.
    Year = 6,
    /// A week.
    Week = 7,
}

impl RateLimitUnit {
    /// The unit number `unit` as Go's generated `RateLimitUnit.String()` prints it: the value's
    /// name (`SECOND`), or the number itself for a number the enum does not declare (`42`).
    pub fn go_name(unit: i32) -> String {
        let name = match RateLimitUnit::try_from(unit) {
            Ok(RateLimitUnit::Unknown) => "UNKNOWN",
            Ok(RateLimitUnit::Second) => "SECOND",
            Ok(RateLimitUnit::Minute) => "MINUTE",
            Ok(RateLimitUnit::Hour) => "HOUR",
            Ok(RateLimitUnit::Day) => "DAY",
            Ok(RateLimitUnit::Month) => "MONTH",
            Ok(RateLimitUnit::Year) => "YEAR",
            Ok(RateLimitUnit::Week) => "WEEK",
            Err(_) => return unit.to_string(),
        };
        name.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    fn string_value(s: &str) -> prost_types::Value {
        prost_types::Value { kind: Some(prost_types::value::Kind::StringValue(s.into())) }
    }

    /// The tags on the wire, byte by byte, as protoc's encoding of the same values gives them.
    #[test]
    fn request_bytes() {
        let request = DiscoveryRequest {
            version_info: "v1".into(),
            node: Some(Node {
                id: "n".into(),
                cluster: "c".into(),
                metadata: Some(prost_types::Struct {
                    fields: [("k".to_owned(), string_value("v"))].into(),
                }),
            }),
            resource_names: vec!["r".into()],
            type_url: "t".into(),
            response_nonce: "x".into(),
            error_detail: Some(Status { code: 3, message: "m".into(), details: vec![] }),
        };
        let expected = [
            0x0a, 2, b'v', b'1', // version_info = 1
            0x12, 18, // node = 2
            0x0a, 1, b'n', // id = 1
            0x12, 1, b'c', // cluster = 2
            0x1a, 10, // metadata = 3 (Struct)
            0x0a, 8, // fields = 1, one map entry
            0x0a, 1, b'k', // key = 1
            0x12, 3, 0x1a, 1, b'v', // value = 2 (Value { string_value = 3 })
            0x1a, 1, b'r', // resource_names = 3
            0x22, 1, b't', // type_url = 4
            0x2a, 1, b'x', // response_nonce = 5
            0x32, 5, 0x08, 3, 0x12, 1, b'm', // error_detail = 6 {code = 1, message = 2}
        ];
        assert_eq!(request.encode_to_vec(), expected);
        assert_eq!(DiscoveryRequest::decode(&expected[..]).unwrap(), request);
    }

    #[test]
    fn an_empty_error_detail_is_still_present() {
        let nack = DiscoveryRequest {
            error_detail: Some(Status::default()),
            ..DiscoveryRequest::default()
        };
        assert_eq!(nack.encode_to_vec(), [0x32, 0]);
    }

    #[test]
    fn response_bytes() {
        let response = DiscoveryResponse {
            version_info: "1".into(),
            resources: vec![prost_types::Any { type_url: "u".into(), value: vec![0x0a, 1, b'n'] }],
            canary: true,
            type_url: "t".into(),
            nonce: "z".into(),
        };
        let expected = [
            0x0a, 1, b'1', // version_info = 1
            0x12, 8, // resources = 2 (Any)
            0x0a, 1, b'u', // type_url = 1
            0x12, 3, 0x0a, 1, b'n', // value = 2
            0x18, 1, // canary = 3
            0x22, 1, b't', // type_url = 4
            0x2a, 1, b'z', // nonce = 5
        ];
        assert_eq!(response.encode_to_vec(), expected);
        // control_plane = 6 (ControlPlane { identifier = 1 }) is skipped.
        let with_control_plane = [&expected[..], &[0x32, 3, 0x0a, 1, b'i']].concat();
        assert_eq!(DiscoveryResponse::decode(&with_control_plane[..]).unwrap(), response);
    }

    #[test]
    fn rate_limit_config_bytes() {
        let config = RateLimitConfig {
            name: "a".into(),
            domain: "d".into(),
            descriptors: vec![RateLimitDescriptor {
                key: "k".into(),
                value: "v".into(),
                rate_limit: Some(RateLimitPolicy {
                    unit: RateLimitUnit::Week as i32,
                    requests_per_unit: 300,
                    unlimited: true,
                    name: "p".into(),
                    replaces: vec![RateLimitReplace { name: "q".into() }],
                }),
                descriptors: vec![RateLimitDescriptor { key: "c".into(), ..Default::default() }],
                shadow_mode: true,
                detailed_metric: true,
                quota_mode: true,
                metadata: Some(prost_types::Struct {
                    fields: [(
                        "m".to_owned(),
                        prost_types::Value {
                            kind: Some(prost_types::value::Kind::BoolValue(true)),
                        },
                    )]
                    .into(),
                }),
            }],
        };
        let expected = [
            0x0a, 1, b'a', // name = 1
            0x12, 1, b'd', // domain = 2
            0x1a, 45, // descriptors = 3
            0x0a, 1, b'k', // key = 1
            0x12, 1, b'v', // value = 2
            0x1a, 15, // rate_limit = 3
            0x08, 7, // unit = 1 (WEEK = 7)
            0x10, 0xac, 0x02, // requests_per_unit = 2 (300)
            0x18, 1, // unlimited = 3
            0x22, 1, b'p', // name = 4
            0x2a, 3, 0x0a, 1, b'q', // replaces = 5 {name = 1}
            0x22, 3, 0x0a, 1, b'c', // descriptors = 4 {key = 1}
            0x28, 1, // shadow_mode = 5
            0x30, 1, // detailed_metric = 6
            0x38, 1, // quota_mode = 7
            0x42, 9, 0x0a, 7, 0x0a, 1, b'm', 0x12, 2, 0x20,
            1, // metadata = 8 {"m": bool_value = 4}
        ];
        assert_eq!(config.encode_to_vec(), expected);
        assert_eq!(RateLimitConfig::decode(&expected[..]).unwrap(), config);
    }

    #[test]
    fn unit_numbers_and_go_names() {
        let units = [
            (RateLimitUnit::Unknown, 0, "UNKNOWN"),
            (RateLimitUnit::Second, 1, "SECOND"),
            (RateLimitUnit::Minute, 2, "MINUTE"),
            (RateLimitUnit::Hour, 3, "HOUR"),
            (RateLimitUnit::Day, 4, "DAY"),
            (RateLimitUnit::Month, 5, "MONTH"),
            (RateLimitUnit::Year, 6, "YEAR"),
            (RateLimitUnit::Week, 7, "WEEK"),
        ];
        for (unit, number, name) in units {
            assert_eq!(unit as i32, number);
            assert_eq!(RateLimitUnit::go_name(number), name);
        }
        assert_eq!(RateLimitUnit::go_name(42), "42");
        assert_eq!(RateLimitUnit::go_name(-1), "-1");
    }
}
