//! Access logs as traces: nginx's `log_format` (and its predefined `combined`), read line by
//! line into requests of a time, a key and a cost.
//!
//! Public for the fuzz targets of the readers; not a stable API.

use std::fmt;

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

/// Split an nginx format string into literals and variables (`$name` or `${name}`).
fn pieces(format: &str, what: &str) -> Result<Vec<Piece>, String> {
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
        let pieces = pieces(format, "--log-format")?;
        let find =
            |name: &str| pieces.iter().position(|p| matches!(p, Piece::Variable(v) if v == name));
        let time = [
            ("msec", TimeKind::Msec),
            ("time_iso8601", TimeKind::Iso8601),
            ("time_local", TimeKind::Local),
        ]
        .into_iter()
        .find_map(|(name, kind)| find(name).map(|i| (i, kind)))
        .ok_or("--log-format: no time: it names none of $msec, $time_iso8601, $time_local")?;
        let mut parts = Vec::new();
        for piece in self::pieces(key, "--key")? {
            parts.push(match piece {
                Piece::Literal(l) => KeyPart::Literal(l),
                Piece::Variable(v) => KeyPart::Field(
                    find(&v).ok_or_else(|| format!("--key: ${v} is not in the log's format"))?,
                ),
            });
        }
        if !parts.iter().any(|p| matches!(p, KeyPart::Field(_))) {
            return Err("--key: no variable: name the log's fields the key is made of".into());
        }
        let cost = match cost {
            None => None,
            Some(c) => {
                let name = c.strip_prefix('$').unwrap_or(c);
                Some(
                    find(name)
                        .ok_or_else(|| format!("--cost: ${name} is not in the log's format"))?,
                )
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

fn shown(bytes: &[u8]) -> String {
    let s = String::from_utf8_lossy(bytes);
    if s.chars().count() > 40 {
        format!("{}…", s.chars().take(40).collect::<String>())
    } else {
        s.into()
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

/// ASCII digits only, fitting a `u64`.
fn integer(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() || !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    bytes.iter().try_fold(0u64, |n, &b| n.checked_mul(10)?.checked_add(u64::from(b - b'0')))
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
