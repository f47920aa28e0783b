//! Access logs as traces: nginx's `log_format` (and its predefined `combined`), Envoy's access
//! log format (and its default) and JSON lines, read line by line into requests of a time, a
//! key and a cost.
//!
//! Public for the fuzz targets of the readers; not a stable API.

use std::fmt;

use crate::trace::{integer, shown};

/// Envoy's default access log format (its `%START_TIME%` written as `2016-04-15T20:17:00.310Z`).
pub const ENVOY_DEFAULT: &str = concat!(
    r#"[%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%" "#,
    r#"%RESPONSE_CODE% %RESPONSE_FLAGS% %BYTES_RECEIVED% %BYTES_SENT% %DURATION% "#,
    r#"%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% "%REQ(X-FORWARDED-FOR)%" "%REQ(USER-AGENT)%" "#,
    r#""%REQ(X-REQUEST-ID)%" "%REQ(:AUTHORITY)%" "%UPSTREAM_HOST%""#
);

/// nginx's predefined `combined` format.
pub const COMBINED: &str = r#"$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer" "$http_user_agent""#;

/// The variables of nginx's http modules a `log_format` may name (besides the prefixed ones of
/// [`PREFIXES`]).
const VARIABLES: &[&str] = &[
    "arg",
    "args",
    "binary_remote_addr",
    "body_bytes_sent",
    "bytes_sent",
    "connection",
    "connection_requests",
    "connection_time",
    "connections_active",
    "connections_reading",
    "connections_waiting",
    "connections_writing",
    "content_length",
    "content_type",
    "document_root",
    "document_uri",
    "gzip_ratio",
    "host",
    "hostname",
    "https",
    "is_args",
    "limit_rate",
    "limit_req_status",
    "msec",
    "nginx_version",
    "pid",
    "pipe",
    "proxy_add_x_forwarded_for",
    "proxy_host",
    "proxy_port",
    "proxy_protocol_addr",
    "proxy_protocol_port",
    "query_string",
    "realpath_root",
    "remote_addr",
    "remote_port",
    "remote_user",
    "request",
    "request_body",
    "request_completion",
    "request_filename",
    "request_id",
    "request_length",
    "request_method",
    "request_time",
    "request_uri",
    "scheme",
    "server_addr",
    "server_name",
    "server_port",
    "server_protocol",
    "ssl_cipher",
    "ssl_protocol",
    "ssl_server_name",
    "status",
    "tcpinfo_rtt",
    "tcpinfo_rttvar",
    "tcpinfo_snd_cwnd",
    "tcpinfo_rcv_space",
    "time_iso8601",
    "time_local",
    "uri",
    "upstream_addr",
    "upstream_bytes_received",
    "upstream_bytes_sent",
    "upstream_cache_status",
    "upstream_connect_time",
    "upstream_header_time",
    "upstream_response_length",
    "upstream_response_time",
    "upstream_status",
    "ratewell_status",
    "ratewell_remaining",
    "ratewell_retry_after",
];

/// Prefixes of nginx's variable families (`$http_x_api_key`, `$arg_page`, ...).
const PREFIXES: &[&str] = &[
    "arg_",
    "cookie_",
    "http_",
    "sent_http_",
    "sent_trailer_",
    "upstream_http_",
    "upstream_cookie_",
    "upstream_trailer_",
];

/// Which variable gives a line's time, and how it is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeKind {
    /// `$msec`: seconds since the epoch with milliseconds, `1712345678.123`.
    Msec,
    /// `$time_iso8601`: `2024-04-05T10:11:12+00:00`.
    Iso8601,
    /// `$time_local`: `05/Apr/2024:10:11:12 +0000`.
    Local,
}

impl TimeKind {
    /// The resolution the variable writes, in ns.
    pub fn resolution_ns(self) -> u64 {
        match self {
            TimeKind::Msec => 1_000_000,
            TimeKind::Iso8601 | TimeKind::Local => 1_000_000_000,
        }
    }
}

/// A piece of a format: bytes written as they are, or a variable's value.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Piece {
    Literal(Vec<u8>),
    Variable(String),
}

/// Whose format strings: nginx's `$name`, or Envoy's `%COMMAND%` and `%COMMAND(arg)%`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dialect {
    Nginx,
    Envoy,
}

/// Split a format string into literals and variables.
fn pieces(format: &str, what: &str, dialect: Dialect) -> Result<Vec<Piece>, String> {
    match dialect {
        Dialect::Nginx => nginx_pieces(format, what),
        Dialect::Envoy => envoy_pieces(format, what),
    }
}

/// Envoy's format: `%COMMAND%` or `%COMMAND(argument)%` (upper-case commands; `%%` is a `%`).
fn envoy_pieces(format: &str, what: &str) -> Result<Vec<Piece>, String> {
    let bytes = format.as_bytes();
    let (mut pieces, mut literal, mut i) = (Vec::new(), Vec::new(), 0);
    while i < bytes.len() {
        if bytes[i] != b'%' {
            literal.push(bytes[i]);
            i += 1;
            continue;
        }
        if bytes.get(i + 1) == Some(&b'%') {
            literal.push(b'%');
            i += 2;
            continue;
        }
        // The command, then an argument in parentheses (which may hold a `%`), then `%`.
        let command_len = bytes[i + 1..]
            .iter()
            .take_while(|&&b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
            .count();
        let mut end = i + 1 + command_len;
        if bytes.get(end) == Some(&b'(') {
            end += bytes[end..]
                .iter()
                .position(|&b| b == b')')
                .ok_or_else(|| format!("{what}: a `(` at byte {end} without its `)`"))?
                + 1;
        }
        if command_len == 0 || bytes.get(end) != Some(&b'%') {
            let shown: String = format[i..].chars().take(24).collect();
            return Err(match bytes[i + 1..].iter().position(|&b| b == b'%') {
                None => format!("{what}: a `%` at byte {i} without its closing `%`"),
                Some(_) => format!(
                    "{what}: `{shown}` is not an Envoy command (%COMMAND% or %COMMAND(ARG)%)"
                ),
            });
        }
        let name = &format[i + 1..end];
        let len = end - i - 1;
        let command = &format[i + 1..i + 1 + command_len];
        if command == "START_TIME" && name != "START_TIME" {
            return Err(format!(
                "{what}: %{name}%: a start time of another format than the default is not read"
            ));
        }
        if !literal.is_empty() {
            pieces.push(Piece::Literal(std::mem::take(&mut literal)));
        }
        if matches!(pieces.last(), Some(Piece::Variable(_))) {
            return Err(format!(
                "{what}: %{name}% follows another command with nothing between: where one ends \
                 cannot be told"
            ));
        }
        pieces.push(Piece::Variable(name.to_string()));
        i += len + 2;
    }
    if !literal.is_empty() {
        pieces.push(Piece::Literal(literal));
    }
    Ok(pieces)
}

/// nginx's format: literals and variables (`$name` or `${name}`).
fn nginx_pieces(format: &str, what: &str) -> Result<Vec<Piece>, String> {
    let bytes = format.as_bytes();
    let (mut pieces, mut literal, mut i) = (Vec::new(), Vec::new(), 0);
    let name_byte = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    while i < bytes.len() {
        if bytes[i] != b'$' {
            literal.push(bytes[i]);
            i += 1;
            continue;
        }
        let (start, end, next) = if bytes.get(i + 1) == Some(&b'{') {
            let close = bytes[i + 2..]
                .iter()
                .position(|&b| b == b'}')
                .ok_or_else(|| format!("{what}: `${{` without its `}}`"))?;
            (i + 2, i + 2 + close, i + 3 + close)
        } else {
            let len = bytes[i + 1..].iter().take_while(|&&b| name_byte(b)).count();
            (i + 1, i + 1 + len, i + 1 + len)
        };
        let name = &format[start..end];
        if name.is_empty() || !name.bytes().all(name_byte) {
            return Err(format!("{what}: `$` without a variable's name at byte {i}"));
        }
        if !VARIABLES.contains(&name) && !PREFIXES.iter().any(|p| name.starts_with(p)) {
            return Err(format!("{what}: unknown variable ${name}"));
        }
        if !literal.is_empty() {
            pieces.push(Piece::Literal(std::mem::take(&mut literal)));
        }
        if matches!(pieces.last(), Some(Piece::Variable(_))) {
            return Err(format!(
                "{what}: ${name} follows another variable with nothing between: where one ends \
                 cannot be told"
            ));
        }
        pieces.push(Piece::Variable(name.to_string()));
        i = next;
    }
    if !literal.is_empty() {
        pieces.push(Piece::Literal(literal));
    }
    Ok(pieces)
}

/// How a line is read: its format, where the time, the key's parts and the cost are.
#[derive(Clone, Debug)]
pub struct Template {
    pieces: Vec<Piece>,
    /// Index in `pieces` of the time's variable, and how it is written.
    time: (usize, TimeKind),
    /// The key: literals, and indices in `pieces` of variables.
    key: Vec<KeyPart>,
    cost: Option<usize>,
}

#[derive(Clone, Debug)]
enum KeyPart {
    Literal(Vec<u8>),
    Field(usize),
}

/// Why a line is not a request.
#[derive(Debug, PartialEq, Eq)]
pub enum LineError {
    /// The line does not have the format's text where it should.
    Shape {
        /// The text expected.
        expected: String,
        /// At this byte of the line.
        at: usize,
    },
    /// The time field does not read as its variable writes.
    Time(String),
    /// The cost field is not an integer from 0 to 2^32-1.
    Cost(String),
    /// Every part of the key is empty (`-` counts as empty, as nginx writes it).
    EmptyKey,
}

impl fmt::Display for LineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LineError::Shape { expected, at } => {
                write!(f, "not the format: expected `{expected}` at byte {at}")
            }
            LineError::Time(s) => write!(f, "bad time `{s}`"),
            LineError::Cost(s) => write!(f, "bad cost `{s}`: expected an integer from 0 to 2^32-1"),
            LineError::EmptyKey => f.write_str("empty key"),
        }
    }
}

/// A line read: the time in ns since the epoch, the key (in the caller's buffer) and the cost.
#[derive(Debug, PartialEq, Eq)]
pub struct Line {
    pub t: u64,
    pub cost: u32,
}

impl Template {
    /// An nginx `log_format` string, the key (variables of the format, with any text between,
    /// e.g. `$http_x_api_key $uri`) and the cost's variable, if any.
    pub fn nginx(format: &str, key: &str, cost: Option<&str>) -> Result<Template, String> {
        Template::new(format, key, cost, Dialect::Nginx)
    }

    /// An Envoy access log format (its time `%START_TIME%`, in Envoy's default format), the
    /// key (commands of the format with any text between, e.g. `%REQ(X-FORWARDED-FOR)%`) and
    /// the cost's command, if any.
    pub fn envoy(format: &str, key: &str, cost: Option<&str>) -> Result<Template, String> {
        Template::new(format, key, cost, Dialect::Envoy)
    }

    fn new(
        format: &str,
        key: &str,
        cost: Option<&str>,
        dialect: Dialect,
    ) -> Result<Template, String> {
        let pieces = pieces(format, "--log-format", dialect)?;
        let find =
            |name: &str| pieces.iter().position(|p| matches!(p, Piece::Variable(v) if v == name));
        let time = match dialect {
            Dialect::Nginx => [
                ("msec", TimeKind::Msec),
                ("time_iso8601", TimeKind::Iso8601),
                ("time_local", TimeKind::Local),
            ]
            .into_iter()
            .find_map(|(name, kind)| find(name).map(|i| (i, kind)))
            .ok_or("--log-format: no time: it names none of $msec, $time_iso8601, $time_local")?,
            Dialect::Envoy => find("START_TIME")
                .map(|i| (i, TimeKind::Iso8601))
                .ok_or("--log-format: no time: it has no %START_TIME%")?,
        };
        let mut parts = Vec::new();
        for piece in self::pieces(key, "--key", dialect)? {
            parts.push(match piece {
                Piece::Literal(l) => KeyPart::Literal(l),
                Piece::Variable(v) => KeyPart::Field(find(&v).ok_or_else(|| {
                    format!("--key: {} is not in the log's format", spelled(&v, dialect))
                })?),
            });
        }
        if !parts.iter().any(|p| matches!(p, KeyPart::Field(_))) {
            return Err("--key: no variable: name the log's fields the key is made of".into());
        }
        let cost = match cost {
            None => None,
            Some(c) => {
                let name = match dialect {
                    Dialect::Nginx => c.strip_prefix('$').unwrap_or(c),
                    Dialect::Envoy => c.trim_matches('%'),
                };
                Some(find(name).ok_or_else(|| {
                    format!("--cost: {} is not in the log's format", spelled(name, dialect))
                })?)
            }
        };
        Ok(Template { pieces, time, key: parts, cost })
    }

    /// How the time is written.
    pub fn time_kind(&self) -> TimeKind {
        self.time.1
    }

    /// Read one line (without its line end) into `key` (cleared first); `spans` is scratch.
    pub fn parse(
        &self,
        line: &[u8],
        spans: &mut Vec<(usize, usize)>,
        key: &mut Vec<u8>,
    ) -> Result<Line, LineError> {
        spans.clear();
        let mut at = 0;
        for (i, piece) in self.pieces.iter().enumerate() {
            match piece {
                Piece::Literal(l) => {
                    if !line[at..].starts_with(l) {
                        return Err(LineError::Shape { expected: shown(l), at });
                    }
                    spans.push((at, at + l.len()));
                    at += l.len();
                }
                Piece::Variable(_) => {
                    // A value ends where the next literal is first found (nginx escapes `"` and
                    // control bytes in values, so a quote-delimited value holds no quote).
                    let end = match self.pieces.get(i + 1) {
                        Some(Piece::Literal(next)) => find(&line[at..], next)
                            .map(|n| at + n)
                            .ok_or_else(|| LineError::Shape { expected: shown(next), at })?,
                        _ => line.len(),
                    };
                    spans.push((at, end));
                    at = end;
                }
            }
        }
        if at != line.len() {
            return Err(LineError::Shape { expected: "the line's end".into(), at });
        }
        let field = |i: usize| &line[spans[i].0..spans[i].1];
        let time = field(self.time.0);
        let t = match self.time.1 {
            TimeKind::Msec => msec(time),
            TimeKind::Iso8601 => iso8601(time),
            TimeKind::Local => local(time),
        }
        .ok_or_else(|| LineError::Time(shown(time)))?;
        let cost = match self.cost {
            None => 1,
            Some(i) => {
                let c = field(i);
                // nginx writes `-` for a value it does not have (a byte count of 0 is `0`).
                if c == b"-" {
                    1
                } else {
                    integer(c)
                        .filter(|&n| n <= u64::from(u32::MAX))
                        .ok_or_else(|| LineError::Cost(shown(c)))?
                        .max(1) as u32
                }
            }
        };
        key.clear();
        let mut any = false;
        for part in &self.key {
            match part {
                KeyPart::Literal(l) => key.extend_from_slice(l),
                KeyPart::Field(i) => {
                    let v = field(*i);
                    if !v.is_empty() && v != b"-" {
                        any = true;
                    }
                    key.extend_from_slice(v);
                }
            }
        }
        if !any {
            return Err(LineError::EmptyKey);
        }
        Ok(Line { t, cost })
    }
}

/// A variable as its dialect writes it.
fn spelled(name: &str, dialect: Dialect) -> String {
    match dialect {
        Dialect::Nginx => format!("${name}"),
        Dialect::Envoy => format!("%{name}%"),
    }
}

/// How a JSON line's time field is written: a string (RFC 3339), or a number of these units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JsonTime {
    /// An RFC 3339 string, `2024-04-05T10:11:12.310Z`.
    Rfc3339,
    /// A number (fractions allowed) of seconds, milliseconds, microseconds or nanoseconds.
    Units(u64),
}

/// How JSON lines are read: the time's field, the key's fields (with text between) and the
/// cost's field. A field is a top-level name, or a path of names through objects (`a.b`).
#[derive(Clone, Debug)]
pub struct JsonTemplate {
    time: (String, JsonTime),
    key: Vec<JsonKeyPart>,
    cost: Option<String>,
}

#[derive(Clone, Debug)]
enum JsonKeyPart {
    Literal(String),
    Field(String),
}

impl JsonTemplate {
    /// `time_field`, written as `unit` (`rfc3339`, `s`, `ms`, `us` or `ns`); the key, fields as
    /// `$name` or `${any.name}` with any text between; the cost's field.
    pub fn new(
        time_field: &str,
        unit: &str,
        key: &str,
        cost: Option<&str>,
    ) -> Result<JsonTemplate, String> {
        let unit = match unit {
            "rfc3339" => JsonTime::Rfc3339,
            "s" => JsonTime::Units(1_000_000_000),
            "ms" => JsonTime::Units(1_000_000),
            "us" => JsonTime::Units(1_000),
            "ns" => JsonTime::Units(1),
            other => {
                return Err(format!("--time-unit {other}: expected rfc3339, s, ms, us or ns"));
            }
        };
        let (mut parts, mut literal, mut rest) = (Vec::new(), String::new(), key);
        while let Some(c) = rest.chars().next() {
            if c != '$' {
                literal.push(c);
                rest = &rest[c.len_utf8()..];
                continue;
            }
            let (name, after) = if let Some(inner) = rest.strip_prefix("${") {
                let close = inner.find('}').ok_or("--key: `${` without its `}`")?;
                (&inner[..close], &inner[close + 1..])
            } else {
                let inner = &rest[1..];
                let len = inner
                    .find(|c: char| {
                        !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '@'))
                    })
                    .unwrap_or(inner.len());
                (&inner[..len], &inner[len..])
            };
            if name.is_empty() {
                return Err("--key: `$` without a field's name".into());
            }
            if !literal.is_empty() {
                parts.push(JsonKeyPart::Literal(std::mem::take(&mut literal)));
            }
            parts.push(JsonKeyPart::Field(name.to_string()));
            rest = after;
        }
        if !literal.is_empty() {
            parts.push(JsonKeyPart::Literal(literal));
        }
        if !parts.iter().any(|p| matches!(p, JsonKeyPart::Field(_))) {
            return Err("--key: no field: name the fields the key is made of ($name)".into());
        }
        let cost = cost.map(|c| c.trim_start_matches('$').trim_matches(['{', '}']).to_string());
        Ok(JsonTemplate { time: (time_field.to_string(), unit), key: parts, cost })
    }

    /// Read one line into `key` (cleared first).
    pub fn parse(&self, line: &[u8], key: &mut Vec<u8>) -> Result<Line, LineError> {
        let value: serde_json::Value = serde_json::from_slice(line).map_err(|e| {
            LineError::Shape { expected: format!("a JSON object ({e})"), at: e.column() }
        })?;
        if !value.is_object() {
            return Err(LineError::Shape { expected: "a JSON object".into(), at: 0 });
        }
        let time = field(&value, &self.time.0).ok_or_else(|| LineError::Shape {
            expected: format!("a field `{}`", self.time.0),
            at: 0,
        })?;
        let t = match (self.time.1, time) {
            (JsonTime::Rfc3339, serde_json::Value::String(s)) => iso8601(s.as_bytes()),
            (JsonTime::Units(unit), serde_json::Value::Number(n)) => {
                units(n.to_string().as_bytes(), unit)
            }
            _ => None,
        }
        .ok_or_else(|| LineError::Time(shown(time.to_string().as_bytes())))?;
        let cost = match self.cost.as_deref().and_then(|c| field(&value, c)) {
            None | Some(serde_json::Value::Null) => 1,
            Some(c) => c
                .as_u64()
                .filter(|&n| n <= u64::from(u32::MAX))
                .ok_or_else(|| LineError::Cost(shown(c.to_string().as_bytes())))?
                .max(1) as u32,
        };
        key.clear();
        let mut any = false;
        for part in &self.key {
            match part {
                JsonKeyPart::Literal(l) => key.extend_from_slice(l.as_bytes()),
                JsonKeyPart::Field(name) => match field(&value, name) {
                    None | Some(serde_json::Value::Null) => {}
                    Some(serde_json::Value::String(s)) => {
                        any |= !s.is_empty() && s != "-";
                        key.extend_from_slice(s.as_bytes());
                    }
                    Some(other) => {
                        any = true;
                        key.extend_from_slice(other.to_string().as_bytes());
                    }
                },
            }
        }
        if !any {
            return Err(LineError::EmptyKey);
        }
        Ok(Line { t, cost })
    }
}

/// A field by its name, or by a path of names through objects (`a.b.c`).
fn field<'a>(value: &'a serde_json::Value, name: &str) -> Option<&'a serde_json::Value> {
    if let Some(v) = value.get(name) {
        return Some(v);
    }
    name.split('.').try_fold(value, |v, part| v.get(part))
}

/// A JSON number's text of `unit` ns each (`1712311872.31`, `1712311872310`), exactly.
fn units(text: &[u8], unit: u64) -> Option<u64> {
    let (whole, frac) = match text.iter().position(|&b| b == b'.') {
        Some(dot) => (&text[..dot], &text[dot + 1..]),
        None => (text, &b""[..]),
    };
    let digits = unit.ilog10() as usize;
    if frac.len() > digits && frac[digits..].iter().any(|&b| b != b'0') {
        return None;
    }
    let frac = &frac[..frac.len().min(digits)];
    let frac_ns =
        if frac.is_empty() { 0 } else { integer(frac)? * 10u64.pow((digits - frac.len()) as u32) };
    integer(whole)?.checked_mul(unit)?.checked_add(frac_ns).filter(|&t| t <= i64::MAX as u64)
}

/// An access log's lines, in one of the formats read.
#[derive(Clone, Debug)]
pub enum LogFormat {
    /// nginx's or Envoy's text formats.
    Text(Template),
    /// JSON objects, one a line.
    Json(JsonTemplate),
}

impl LogFormat {
    /// Read one line (without its line end) into `key`; `spans` is scratch.
    pub fn parse(
        &self,
        line: &[u8],
        spans: &mut Vec<(usize, usize)>,
        key: &mut Vec<u8>,
    ) -> Result<Line, LineError> {
        match self {
            LogFormat::Text(t) => t.parse(line, spans, key),
            LogFormat::Json(j) => j.parse(line, key),
        }
    }
}

/// Where `needle` (not empty) first is in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    let (&first, rest) = needle.split_first()?;
    let mut from = 0;
    while let Some(i) = hay[from..].iter().position(|&b| b == first) {
        let at = from + i;
        if hay[at + 1..].starts_with(rest) {
            return Some(at);
        }
        from = at + 1;
    }
    None
}

/// `digits` fixed-width digits.
fn fixed(bytes: &[u8], digits: usize) -> Option<u64> {
    (bytes.len() == digits).then_some(())?;
    integer(bytes)
}

/// Days since 1970-01-01 of a date of the proleptic Gregorian calendar (Howard Hinnant's
/// `days_from_civil`).
fn days(year: i64, month: u64, day: u64) -> Option<i64> {
    if !(1..=12).contains(&month) || day == 0 {
        return None;
    }
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let lengths = [31, if leap { 29 } else { 28 }, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    if day > lengths[month as usize - 1] {
        return None;
    }
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = month as i64;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + day as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    Some(era * 146_097 + doe - 719_468)
}

/// ns since the epoch of a UTC time, from 1970 on.
fn epoch_ns(days: i64, h: u64, m: u64, s: u64, offset_s: i64, frac_ns: u64) -> Option<u64> {
    if h > 23 || m > 59 || s > 60 {
        return None;
    }
    let secs = days.checked_mul(86_400)? + (h * 3600 + m * 60 + s) as i64 - offset_s;
    u64::try_from(secs)
        .ok()?
        .checked_mul(1_000_000_000)?
        .checked_add(frac_ns)
        .filter(|&t| t <= i64::MAX as u64)
}

/// `1712345678.123`: seconds, and up to 9 digits of a fraction.
fn msec(bytes: &[u8]) -> Option<u64> {
    let (secs, frac) = match bytes.iter().position(|&b| b == b'.') {
        Some(dot) => (&bytes[..dot], &bytes[dot + 1..]),
        None => (bytes, &b""[..]),
    };
    let s = integer(secs)?;
    Some(s.checked_mul(1_000_000_000)?.checked_add(fraction(frac)?)?)
        .filter(|&t| t <= i64::MAX as u64)
}

/// Up to 9 digits after a decimal point, as ns.
fn fraction(frac: &[u8]) -> Option<u64> {
    if frac.len() > 9 {
        return None;
    }
    if frac.is_empty() {
        return Some(0);
    }
    Some(integer(frac)? * 10u64.pow(9 - frac.len() as u32))
}

/// `+hhmm` or `+hh:mm` (or `Z`), as seconds east of UTC.
fn offset(bytes: &[u8]) -> Option<i64> {
    if bytes == b"Z" {
        return Some(0);
    }
    let sign = match bytes.first()? {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    let rest = &bytes[1..];
    let (h, m) = match rest.len() {
        4 => (&rest[..2], &rest[2..]),
        5 if rest[2] == b':' => (&rest[..2], &rest[3..]),
        _ => return None,
    };
    let (h, m) = (fixed(h, 2)?, fixed(m, 2)?);
    (h <= 23 && m <= 59).then(|| sign * (h * 3600 + m * 60) as i64)
}

/// `2024-04-05T10:11:12+00:00`, with an optional fraction of a second (`.310Z`).
fn iso8601(b: &[u8]) -> Option<u64> {
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || b[10] != b'T'
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let year = fixed(&b[..4], 4)? as i64;
    let d = days(year, fixed(&b[5..7], 2)?, fixed(&b[8..10], 2)?)?;
    let (h, m, s) = (fixed(&b[11..13], 2)?, fixed(&b[14..16], 2)?, fixed(&b[17..19], 2)?);
    let mut rest = &b[19..];
    let mut frac = 0;
    if let Some(after) = rest.strip_prefix(b".") {
        let n = after.iter().take_while(|b| b.is_ascii_digit()).count();
        frac = fraction(&after[..n])?;
        rest = &after[n..];
    }
    epoch_ns(d, h, m, s, offset(rest)?, frac)
}

/// `05/Apr/2024:10:11:12 +0000`.
fn local(b: &[u8]) -> Option<u64> {
    if b.len() != 26
        || b[2] != b'/'
        || b[6] != b'/'
        || b[11] != b':'
        || b[14] != b':'
        || b[17] != b':'
        || b[20] != b' '
    {
        return None;
    }
    const MONTHS: [&[u8]; 12] = [
        b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov",
        b"Dec",
    ];
    let month = MONTHS.iter().position(|&m| m == &b[3..6])? as u64 + 1;
    let d = days(fixed(&b[7..11], 4)? as i64, month, fixed(&b[..2], 2)?)?;
    let (h, m, s) = (fixed(&b[12..14], 2)?, fixed(&b[15..17], 2)?, fixed(&b[18..20], 2)?);
    epoch_ns(d, h, m, s, offset(&b[21..])?, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_as_nginx_writes_them() {
        // 2024-04-05T10:11:12Z is 1712311872 s after the epoch.
        let s = 1_712_311_872u64 * 1_000_000_000;
        assert_eq!(msec(b"1712311872.123"), Some(s + 123_000_000));
        assert_eq!(msec(b"1712311872"), Some(s));
        assert_eq!(iso8601(b"2024-04-05T10:11:12+00:00"), Some(s));
        assert_eq!(iso8601(b"2024-04-05T12:11:12+02:00"), Some(s));
        assert_eq!(iso8601(b"2024-04-05T10:11:12.310Z"), Some(s + 310_000_000));
        assert_eq!(local(b"05/Apr/2024:10:11:12 +0000"), Some(s));
        assert_eq!(local(b"05/Apr/2024:05:11:12 -0500"), Some(s));
        assert_eq!(local(b"29/Feb/2024:00:00:00 +0000"), iso8601(b"2024-02-29T00:00:00Z"));
        for bad in [
            &b"31/Apr/2024:10:11:12 +0000"[..],
            b"05/Foo/2024:10:11:12 +0000",
            b"05/Apr/2024:24:11:12 +0000",
            b"05/Apr/1969:10:11:12 +0000",
        ] {
            assert_eq!(local(bad), None, "{}", shown(bad));
        }
        assert_eq!(iso8601(b"2023-02-29T00:00:00Z"), None);
        assert_eq!(msec(b"1712311872.1234567890"), None);
        assert_eq!(msec(b"99999999999999999999"), None);
        // Every day from 1970 to 2100 against counting days one by one.
        let mut n = 0i64;
        for year in 1970..2100 {
            for month in 1..=12 {
                for day in 1..=31 {
                    if let Some(d) = days(year, month, day) {
                        assert_eq!(d, n, "{year}-{month}-{day}");
                        n += 1;
                    }
                }
            }
        }
        assert_eq!(n, days(2100, 1, 1).unwrap());
    }

    #[test]
    fn combined_lines() {
        let t = Template::nginx(COMBINED, "$remote_addr", Some("$body_bytes_sent")).unwrap();
        let (mut spans, mut key) = (Vec::new(), Vec::new());
        let line = br#"10.0.0.1 - - [05/Apr/2024:10:11:12 +0000] "GET /a?b=\x22c\x22 HTTP/1.1" 200 612 "-" "curl/8.0 (x; y)""#;
        let got = t.parse(line, &mut spans, &mut key).unwrap();
        assert_eq!(
            (got, &key[..]),
            (Line { t: 1_712_311_872_000_000_000, cost: 612 }, &b"10.0.0.1"[..])
        );
        let joined = Template::nginx(COMBINED, "$remote_addr $request", None).unwrap();
        joined.parse(line, &mut spans, &mut key).unwrap();
        assert_eq!(key, br#"10.0.0.1 GET /a?b=\x22c\x22 HTTP/1.1"#);
        let short = br#"10.0.0.1 - - [05/Apr/2024:10:11:12 +0000] "GET / HTTP/1.1" 200"#;
        assert!(matches!(t.parse(short, &mut spans, &mut key), Err(LineError::Shape { .. })));
        let bad_time = br#"10.0.0.1 - - [yesterday] "GET / HTTP/1.1" 200 0 "-" "-""#;
        assert!(matches!(t.parse(bad_time, &mut spans, &mut key), Err(LineError::Time(_))));
        let no_key = br#"- - - [05/Apr/2024:10:11:12 +0000] "GET / HTTP/1.1" 200 0 "-" "-""#;
        assert_eq!(t.parse(no_key, &mut spans, &mut key), Err(LineError::EmptyKey));
    }

    #[test]
    fn json_lines() {
        let (mut spans, mut key) = (Vec::new(), Vec::new());
        let mut read = |t: &JsonTemplate, line: &str| {
            LogFormat::Json(t.clone())
                .parse(line.as_bytes(), &mut spans, &mut key)
                .map(|l| (l, String::from_utf8(key.clone()).unwrap()))
        };
        let s = 1_712_311_872_000_000_000u64;
        let t = JsonTemplate::new("ts", "ms", "$client.ip ${user-id}", Some("$bytes")).unwrap();
        assert_eq!(
            read(&t, r#"{"ts":1712311872310,"client":{"ip":"10.0.0.1"},"user-id":7,"bytes":12}"#),
            Ok((Line { t: s + 310_000_000, cost: 12 }, "10.0.0.1 7".to_string()))
        );
        let t = JsonTemplate::new("time", "rfc3339", "$ip", None).unwrap();
        assert_eq!(
            read(&t, r#"{"time":"2024-04-05T10:11:12.5Z","ip":"a"}"#).unwrap().0.t,
            s + 500_000_000
        );
        let t = JsonTemplate::new("time", "s", "$ip", None).unwrap();
        assert_eq!(read(&t, r#"{"time":1712311872.25,"ip":"a"}"#).unwrap().0.t, s + 250_000_000);
        assert!(matches!(read(&t, r#"{"time":"x","ip":"a"}"#), Err(LineError::Time(_))));
        assert!(matches!(read(&t, r#"{"ip":"a"}"#), Err(LineError::Shape { .. })));
        assert!(matches!(read(&t, r#"{"time":1,"ip":"#), Err(LineError::Shape { .. })));
        assert!(matches!(read(&t, r#"[1,2]"#), Err(LineError::Shape { .. })));
        assert_eq!(read(&t, r#"{"time":1,"ip":null}"#), Err(LineError::EmptyKey));
        assert!(JsonTemplate::new("t", "hours", "$ip", None).unwrap_err().contains("--time-unit"));
        assert!(JsonTemplate::new("t", "s", "ip", None).unwrap_err().contains("no field"));
        assert_eq!(units(b"1.5", 1_000_000_000), Some(1_500_000_000));
        assert_eq!(units(b"1.0000000001", 1_000_000_000), None);
        assert_eq!(units(b"-1", 1), None);
        assert_eq!(units(b"1e3", 1), None);
    }

    #[test]
    fn envoy_default_lines() {
        let t =
            Template::envoy(ENVOY_DEFAULT, "%REQ(X-FORWARDED-FOR)%", Some("%BYTES_SENT%")).unwrap();
        let (mut spans, mut key) = (Vec::new(), Vec::new());
        let line = br#"[2024-04-05T10:11:12.310Z] "GET /api/v1?x=1 HTTP/1.1" 200 - 0 155 3 2 "10.0.0.7" "curl/8.0 (a b)" "4d1e7f2e-3b" "example.com" "10.1.0.4:8080""#;
        let got = t.parse(line, &mut spans, &mut key).unwrap();
        assert_eq!(
            (got, &key[..]),
            (Line { t: 1_712_311_872_310_000_000, cost: 155 }, &b"10.0.0.7"[..])
        );
        let err = |f: &str| Template::envoy(f, "%REQ(X-FORWARDED-FOR)%", None).unwrap_err();
        assert!(err("[%START_TIME(%s)%] %REQ(X-FORWARDED-FOR)%").contains("not read"));
        assert!(err("[%START_TIME%] %req(x)%").contains("not an Envoy command"));
        assert!(err("[%START_TIME%] %REQ(X-FORWARDED-FOR)").contains("without its closing"));
        assert!(err("%PROTOCOL% %REQ(X-FORWARDED-FOR)%").contains("no time"));
        assert!(
            Template::envoy(ENVOY_DEFAULT, "%DOWNSTREAM_REMOTE_ADDRESS%", None)
                .unwrap_err()
                .contains("%DOWNSTREAM_REMOTE_ADDRESS% is not in the log's format")
        );
    }

    #[test]
    fn formats_and_keys_are_checked() {
        let err = |f: &str, k: &str| Template::nginx(f, k, None).unwrap_err();
        assert!(
            err("$remote_addr $nonsense $msec", "$remote_addr")
                .contains("unknown variable $nonsense")
        );
        assert!(err("$remote_addr $status", "$remote_addr").contains("no time"));
        assert!(
            err("$remote_addr $msec", "$http_x_key")
                .contains("$http_x_key is not in the log's format")
        );
        assert!(err("$remote_addr$msec", "$remote_addr").contains("nothing between"));
        assert!(err("$remote_addr ${msec", "$remote_addr").contains("without its"));
        assert!(err("$remote_addr $msec", "key").contains("no variable"));
        let t =
            Template::nginx("${msec}|$http_x_api_key|$uri", "$http_x_api_key:$uri", None).unwrap();
        let (mut spans, mut key) = (Vec::new(), Vec::new());
        let got = t.parse(b"1712311872.5|k1|/a", &mut spans, &mut key).unwrap();
        assert_eq!((got.t, &key[..]), (1_712_311_872_500_000_000, &b"k1:/a"[..]));
    }
}
