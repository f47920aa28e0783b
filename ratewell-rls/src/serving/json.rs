//! The JSON form of the request and response (`POST /json`), as protobuf's JSON mapping writes
//! them (the Go service's `protojson`): field names in lowerCamelCase (the proto names are read
//! too), enums by name, zero values left out, durations as `"26s"`.
//!
//! ```
//! use ratewell_rls::json;
//!
//! let request = json::request(br#"{"domain": "edge", "descriptors": [{"entries": [{"key": "k", "value": "v"}]}], "hitsAddend": 2}"#)?;
//! assert_eq!((request.domain.as_str(), request.hits_addend), ("edge", 2));
//! # Ok::<(), String>(())
//! ```

use serde_json::{Map, Value, json};

use crate::serving::proto::{
    Code, DescriptorStatus, Entry, RateLimitDescriptor, RateLimitOverride, RateLimitRequest,
    RateLimitResponse, Unit,
};

fn field<'a>(object: &'a Map<String, Value>, camel: &str, snake: &str) -> Option<&'a Value> {
    object.get(camel).or_else(|| object.get(snake)).filter(|v| !v.is_null())
}

fn string(value: Option<&Value>, what: &str) -> Result<String, String> {
    match value {
        None => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(format!("{what}: a string, not {other}")),
    }
}

/// An unsigned integer: a JSON number, or a string of digits (64-bit values are strings in
/// protobuf's JSON).
fn unsigned(value: Option<&Value>, what: &str, max: u64) -> Result<u64, String> {
    let n = match value {
        None => return Ok(0),
        Some(Value::Number(n)) => n.as_u64(),
        Some(Value::String(s)) => s.parse().ok(),
        Some(_) => None,
    };
    n.filter(|&n| n <= max).ok_or_else(|| format!("{what}: an integer from 0 to {max}"))
}

fn object<'a>(value: &'a Value, what: &str) -> Result<&'a Map<String, Value>, String> {
    value.as_object().ok_or_else(|| format!("{what}: an object"))
}

fn list<'a>(value: Option<&'a Value>, what: &str) -> Result<&'a [Value], String> {
    match value {
        None => Ok(&[]),
        Some(Value::Array(items)) => Ok(items),
        Some(_) => Err(format!("{what}: a list")),
    }
}

fn unit(value: Option<&Value>) -> Result<i32, String> {
    match value {
        None => Ok(0),
        Some(Value::String(name)) => Unit::from_name(name)
            .filter(|u| *u != Unit::Week)
            .map(|u| u as i32)
            .ok_or_else(|| format!("limit.unit: no unit {name}")),
        Some(Value::Number(n)) => n
            .as_i64()
            .filter(|n| (0..=6).contains(n))
            .map(|n| n as i32)
            .ok_or_else(|| format!("limit.unit: no unit {n}")),
        Some(other) => Err(format!("limit.unit: a unit name, not {other}")),
    }
}

/// Read a request from its JSON form; the error says what does not parse.
pub fn request(body: &[u8]) -> Result<RateLimitRequest, String> {
    let value: Value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    let root = object(&value, "the request")?;
    let mut request = RateLimitRequest {
        domain: string(field(root, "domain", "domain"), "domain")?,
        hits_addend: unsigned(
            field(root, "hitsAddend", "hits_addend"),
            "hitsAddend",
            u32::MAX.into(),
        )? as u32,
        descriptors: Vec::new(),
    };
    for d in list(field(root, "descriptors", "descriptors"), "descriptors")? {
        let d = object(d, "a descriptor")?;
        let mut descriptor = RateLimitDescriptor::default();
        for e in list(field(d, "entries", "entries"), "entries")? {
            let e = object(e, "an entry")?;
            descriptor.entries.push(Entry {
                key: string(field(e, "key", "key"), "key")?,
                value: string(field(e, "value", "value"), "value")?,
            });
        }
        if let Some(limit) = field(d, "limit", "limit") {
            let limit = object(limit, "limit")?;
            descriptor.limit = Some(RateLimitOverride {
                requests_per_unit: unsigned(
                    field(limit, "requestsPerUnit", "requests_per_unit"),
                    "limit.requestsPerUnit",
                    u32::MAX.into(),
                )? as u32,
                unit: unit(field(limit, "unit", "unit"))?,
            });
        }
        if let Some(hits) = field(d, "hitsAddend", "hits_addend") {
            // A `google.protobuf.UInt64Value`: the number itself.
            descriptor.hits_addend = Some(unsigned(Some(hits), "hitsAddend", u64::MAX)?);
        }
        request.descriptors.push(descriptor);
    }
    Ok(request)
}

fn code_name(code: i32) -> &'static str {
    match Code::try_from(code) {
        Ok(Code::Ok) => "OK",
        Ok(Code::OverLimit) => "OVER_LIMIT",
        _ => "UNKNOWN",
    }
}

fn status(s: &DescriptorStatus) -> Value {
    let mut out = Map::new();
    if s.code != 0 {
        out.insert("code".into(), json!(code_name(s.code)));
    }
    if let Some(l) = &s.current_limit {
        let mut limit = Map::new();
        if !l.name.is_empty() {
            limit.insert("name".into(), json!(l.name));
        }
        if l.requests_per_unit != 0 {
            limit.insert("requestsPerUnit".into(), json!(l.requests_per_unit));
        }
        if l.unit != 0 {
            limit
                .insert("unit".into(), json!(Unit::try_from(l.unit).map_or("UNKNOWN", Unit::name)));
        }
        out.insert("currentLimit".into(), Value::Object(limit));
    }
    if s.limit_remaining != 0 {
        out.insert("limitRemaining".into(), json!(s.limit_remaining));
    }
    if let Some(d) = &s.duration_until_reset {
        out.insert("durationUntilReset".into(), json!(format!("{}s", d.seconds)));
    }
    Value::Object(out)
}

fn proto_value(v: &prost_types::Value) -> Value {
    use prost_types::value::Kind;
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::NumberValue(n)) => json!(n),
        Some(Kind::StringValue(s)) => json!(s),
        Some(Kind::BoolValue(b)) => json!(b),
        Some(Kind::StructValue(s)) => proto_struct(s),
        Some(Kind::ListValue(l)) => Value::Array(l.values.iter().map(proto_value).collect()),
    }
}

fn proto_struct(s: &prost_types::Struct) -> Value {
    Value::Object(s.fields.iter().map(|(k, v)| (k.clone(), proto_value(v))).collect())
}

/// The JSON form of a response.
pub fn response(r: &RateLimitResponse) -> Value {
    let mut out = Map::new();
    if r.overall_code != 0 {
        out.insert("overallCode".into(), json!(code_name(r.overall_code)));
    }
    if !r.statuses.is_empty() {
        out.insert("statuses".into(), Value::Array(r.statuses.iter().map(status).collect()));
    }
    if !r.response_headers_to_add.is_empty() {
        let headers =
            r.response_headers_to_add.iter().map(|h| json!({"key": h.key, "value": h.value}));
        out.insert("responseHeadersToAdd".into(), Value::Array(headers.collect()));
    }
    if let Some(m) = &r.dynamic_metadata {
        out.insert("dynamicMetadata".into(), proto_struct(m));
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_both_names_and_refuses_what_is_not_a_request() {
        let r = request(br#"{"domain":"d","descriptors":[{"entries":[{"key":"k"}],"hits_addend":"0","limit":{"requests_per_unit":3,"unit":"MINUTE"}}]}"#).unwrap();
        assert_eq!(r.descriptors[0].hits_addend, Some(0));
        assert_eq!(
            r.descriptors[0].limit,
            Some(RateLimitOverride { requests_per_unit: 3, unit: 2 })
        );
        for bad in [
            &b"{"[..],
            b"[]",
            br#"{"domain": 3}"#,
            br#"{"hitsAddend": -1}"#,
            br#"{"hitsAddend": 4294967296}"#,
            br#"{"descriptors": {}}"#,
        ] {
            assert!(request(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }
}
