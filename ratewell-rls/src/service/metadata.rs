//! `RESPONSE_DYNAMIC_METADATA`: the request and the metadata of the rules that passed, as
//! envoyproxy/ratelimit's `ratelimitToMetadata` builds them (Envoy stores them under the
//! filter's namespace, `envoy.filters.http.ratelimit`).

use std::collections::BTreeMap;

use prost_types::value::Kind;
use prost_types::{ListValue, Struct, Value};

use crate::configuration::config::RateLimit;
use crate::serving::proto::{RateLimitDescriptor, RateLimitRequest, Unit};

fn string(s: impl Into<String>) -> Value {
    Value { kind: Some(Kind::StringValue(s.into())) }
}

fn number(n: f64) -> Value {
    Value { kind: Some(Kind::NumberValue(n)) }
}

/// `{domain, descriptors: [{entries: ["k=v"], limit?, hitsAddend?}], hitsAddend?, metadata?}`:
/// `metadata` merges the `metadata` of the rules of the descriptors in `passed` (indices into
/// the request's descriptors, `limits` in the same order), the first value of a key winning and
/// nested maps merged.
pub(crate) fn of(
    request: &RateLimitRequest,
    passed: &[usize],
    limits: &[Option<&RateLimit>],
) -> Struct {
    let mut fields = BTreeMap::new();
    fields.insert("domain".to_owned(), string(request.domain.clone()));
    let descriptors =
        request.descriptors.iter().map(|d| Value { kind: Some(Kind::StructValue(descriptor(d))) });
    fields.insert(
        "descriptors".to_owned(),
        Value { kind: Some(Kind::ListValue(ListValue { values: descriptors.collect() })) },
    );
    if request.hits_addend != 0 {
        fields.insert("hitsAddend".to_owned(), number(f64::from(request.hits_addend)));
    }
    let mut merged = Struct::default();
    for &i in passed {
        if let Some(Some(limit)) = limits.get(i) {
            if let Some(metadata) = &limit.metadata {
                merge(&mut merged, metadata);
            }
        }
    }
    if !merged.fields.is_empty() {
        fields.insert("metadata".to_owned(), Value { kind: Some(Kind::StructValue(merged)) });
    }
    Struct { fields }
}

fn descriptor(d: &RateLimitDescriptor) -> Struct {
    let mut fields = BTreeMap::new();
    let entries = d.entries.iter().map(|e| string(format!("{}={}", e.key, e.value)));
    fields.insert(
        "entries".to_owned(),
        Value { kind: Some(Kind::ListValue(ListValue { values: entries.collect() })) },
    );
    if let Some(limit) = &d.limit {
        let unit = Unit::try_from(limit.unit).map_or("UNKNOWN", Unit::name);
        fields.insert(
            "limit".to_owned(),
            string(format!("requests_per_unit:{} unit:{unit}", limit.requests_per_unit)),
        );
    }
    if let Some(hits) = d.hits_addend {
        fields.insert("hitsAddend".to_owned(), number(hits as f64));
    }
    Struct { fields }
}

/// Add `src`'s fields to `dest`: a key `dest` has keeps its value, except that two maps merge.
fn merge(dest: &mut Struct, src: &Struct) {
    for (k, v) in &src.fields {
        match dest.fields.get_mut(k) {
            Some(Value { kind: Some(Kind::StructValue(d)) }) => {
                if let Some(Kind::StructValue(s)) = &v.kind {
                    merge(d, s);
                }
            }
            Some(_) => {}
            None => {
                dest.fields.insert(k.clone(), v.clone());
            }
        }
    }
}
