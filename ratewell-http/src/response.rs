//! The layer's own answers: a rejection, an impossible request, a missing key; over HTTP as
//! problem details (RFC 9457), over gRPC as a trailers-only response with `grpc-status`. And the
//! names of the `RateLimit-Policy` and `RateLimit` fields they carry (as admitted responses do).

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderName, RETRY_AFTER};
use http::{HeaderMap, HeaderValue, Response, StatusCode};

/// The `RateLimit-Policy` field name.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// The `RateLimit` field name.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// The problem type of draft-ietf-httpapi-ratelimit-headers for a request over its quota.
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";
const QUOTA_EXCEEDED_TITLE: &str =
    "Request cannot be satisfied as assigned quota has been exceeded";

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
/// gRPC's retry pushback (gRFC A6): milliseconds to wait before a retry; negative: do not retry.
const GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");
/// RESOURCE_EXHAUSTED.
const GRPC_RESOURCE_EXHAUSTED: u8 = 8;

/// The limiter's own answer to a request (a rejection, an impossible request, a missing
/// key): its status, headers and body, for the adapter to send.
#[derive(Debug)]
pub struct Ready {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Ready {
    /// The status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The headers (`Retry-After`, `RateLimit-Policy`, `RateLimit`, the content type; over
    /// gRPC `grpc-status` and the pushback).
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// The body (problem details; empty over gRPC).
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// Status, headers and body.
    pub fn into_parts(self) -> (StatusCode, HeaderMap, Bytes) {
        (self.status, self.headers, self.body)
    }

    /// As an `http` response.
    pub fn into_response(self) -> Response<Bytes> {
        let mut response = Response::new(self.body);
        *response.status_mut() = self.status;
        *response.headers_mut() = self.headers;
        response
    }
}

/// The request is gRPC (its content type is `application/grpc` or `application/grpc+...`).
fn grpc_content_type(request: &HeaderMap) -> Option<&HeaderValue> {
    request.get(CONTENT_TYPE).filter(|v| {
        let v = v.as_bytes();
        v.len() >= 16
            && v[..16].eq_ignore_ascii_case(b"application/grpc")
            && matches!(v.get(16), None | Some(b'+' | b';'))
    })
}

/// A JSON string of printable ASCII (limit names are).
fn json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (' '..='~').contains(&c) => out.push(c),
            _ => {}
        }
    }
    out.push('"');
}

fn problem(status: StatusCode, kind: &str, title: &str, names: &[&str], detail: &str) -> Bytes {
    let mut body = String::with_capacity(256);
    body.push_str("{\"type\":");
    json_string(&mut body, kind);
    body.push_str(",\"title\":");
    json_string(&mut body, title);
    body.push_str(&format!(",\"status\":{}", status.as_u16()));
    if !detail.is_empty() {
        body.push_str(",\"detail\":");
        json_string(&mut body, detail);
    }
    if !names.is_empty() {
        body.push_str(",\"violated-policies\":[");
        for (i, name) in names.iter().enumerate() {
            if i > 0 {
                body.push(',');
            }
            json_string(&mut body, name);
        }
        body.push(']');
    }
    body.push_str("}\n");
    Bytes::from(body)
}

fn http_problem(status: StatusCode, mut headers: HeaderMap, body: Bytes) -> Ready {
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
    Ready { status, headers, body }
}

fn grpc(content_type: &HeaderValue, code: u8, message: &str, mut headers: HeaderMap) -> Ready {
    headers.insert(CONTENT_TYPE, content_type.clone());
    headers.insert(GRPC_STATUS, HeaderValue::from(u16::from(code)));
    // grpc-message is percent-encoded; the messages here are printable ASCII without `%`.
    if let Ok(message) = HeaderValue::from_str(&message.replace('%', "%25")) {
        headers.insert(GRPC_MESSAGE, message);
    }
    Ready { status: StatusCode::OK, headers, body: Bytes::new() }
}

fn rate_headers(policy: HeaderValue, field: Option<HeaderValue>) -> HeaderMap {
    let mut headers = HeaderMap::with_capacity(6);
    headers.insert(RATELIMIT_POLICY, policy);
    if let Some(field) = field {
        headers.insert(RATELIMIT, field);
    }
    headers
}

/// A rejection with a wait of `wait_ns` (at least 1): `Retry-After` in whole seconds rounded up.
pub(crate) fn rejected(
    status: StatusCode,
    wait_ns: u64,
    policy: HeaderValue,
    field: Option<HeaderValue>,
    names: &[&str],
    request: &HeaderMap,
) -> Ready {
    let mut headers = rate_headers(policy, field);
    let seconds = wait_ns.div_ceil(1_000_000_000).max(1);
    headers.insert(RETRY_AFTER, HeaderValue::from(seconds));
    let ms = wait_ns.div_ceil(1_000_000).max(1);
    quota_exceeded(status, headers, names, request, Some(ms))
}

/// A request whose cost is above a limit's capacity: no `Retry-After` (waiting cannot help).
pub(crate) fn impossible(
    status: StatusCode,
    policy: HeaderValue,
    field: Option<HeaderValue>,
    names: &[&str],
    request: &HeaderMap,
) -> Ready {
    quota_exceeded(status, rate_headers(policy, field), names, request, None)
}

const IMPOSSIBLE_DETAIL: &str =
    "the request costs more than the limit's capacity: no wait admits it";

/// The answer over quota, after a wait of `retry_ms` (`None`: impossible, no wait helps):
/// gRPC's RESOURCE_EXHAUSTED with the retry pushback, or problem details.
fn quota_exceeded(
    status: StatusCode,
    mut headers: HeaderMap,
    names: &[&str],
    request: &HeaderMap,
    retry_ms: Option<u64>,
) -> Ready {
    if let Some(content_type) = grpc_content_type(request) {
        let names = names.join(", ");
        let (pushback, message) = match retry_ms {
            Some(ms) => {
                (HeaderValue::from(ms), format!("rate limited by {names}; retry after {ms} ms"))
            }
            // A negative pushback asks a gRPC client not to retry.
            None => (
                HeaderValue::from_static("-1"),
                format!("rate limited by {names}; {IMPOSSIBLE_DETAIL}"),
            ),
        };
        headers.insert(GRPC_RETRY_PUSHBACK_MS, pushback);
        return grpc(content_type, GRPC_RESOURCE_EXHAUSTED, &message, headers);
    }
    let detail = if retry_ms.is_some() { "" } else { IMPOSSIBLE_DETAIL };
    let body = problem(status, QUOTA_EXCEEDED, QUOTA_EXCEEDED_TITLE, names, detail);
    http_problem(status, headers, body)
}

/// A request without the key of a limit that requires one.
pub(crate) fn absent(status: StatusCode, name: &str, request: &HeaderMap) -> Ready {
    let detail = format!("the {name} limit requires a key this request does not carry");
    if let Some(content_type) = grpc_content_type(request) {
        // The HTTP-to-gRPC status mapping, with 400 as INVALID_ARGUMENT (a field is missing).
        let code = match status.as_u16() {
            400 => 3,
            401 => 16,
            403 => 7,
            404 => 12,
            429 => GRPC_RESOURCE_EXHAUSTED,
            502..=504 => 14,
            _ => 2,
        };
        return grpc(content_type, code, &detail, HeaderMap::new());
    }
    let title = status.canonical_reason().unwrap_or("Error");
    let body = problem(status, "about:blank", title, &[], &detail);
    http_problem(status, HeaderMap::new(), body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_content_types() {
        let mut h = HeaderMap::new();
        for (value, grpc) in [
            ("application/grpc", true),
            ("application/grpc+proto", true),
            ("Application/GRPC;charset=utf-8", true),
            ("application/grpc-web", false),
            ("application/json", false),
            ("application/gr", false),
        ] {
            h.insert(CONTENT_TYPE, HeaderValue::from_static(value));
            assert_eq!(grpc_content_type(&h).is_some(), grpc, "{value}");
        }
    }

    #[test]
    fn problem_bodies_are_json_with_escaped_names() {
        let body =
            problem(StatusCode::TOO_MANY_REQUESTS, QUOTA_EXCEEDED, "t", &["a\"b", "c\\d"], "");
        assert_eq!(
            std::str::from_utf8(&body).unwrap(),
            "{\"type\":\"https://iana.org/assignments/http-problem-types#quota-exceeded\",\"title\":\"t\",\"status\":429,\"violated-policies\":[\"a\\\"b\",\"c\\\\d\"]}\n"
        );
    }
}
