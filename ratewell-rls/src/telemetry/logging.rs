//! The service's log lines on standard error: plain text (`ratewell-rls info: ...`), or with
//! `LOG_FORMAT=json` one JSON object a line with the field names of the Go service's logrus
//! formatter (`@message`, `@timestamp` in RFC 3339 with nanoseconds, UTC, and `level`), keys in
//! logrus's order, so that a log pipeline reading the Go service's lines reads these.
//!
//! ```
//! let line = ratewell_rls::logging::line(true, "info", "loaded \"a\"", 0);
//! assert_eq!(line, r#"{"@message":"loaded \"a\"","@timestamp":"1970-01-01T00:00:00Z","level":"info"}"#);
//! assert_eq!(ratewell_rls::logging::line(false, "warn", "x", 0), "ratewell-rls warn: x");
//! ```

use std::time::{SystemTime, UNIX_EPOCH};

/// How much the service logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    /// Every configuration load and request error.
    Debug,
    /// Configuration loads.
    Info,
    /// Refused configurations and startup notices.
    Warn,
    /// Errors only.
    Error,
}

/// Where the service's lines go and how many: `LOG_FORMAT=json` and `LOG_LEVEL`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Logger {
    /// One JSON object a line rather than plain text.
    pub(crate) json: bool,
    /// The least level written.
    pub(crate) level: LogLevel,
}

impl Logger {
    /// Write `message` at `level` if the least level lets it through.
    pub(crate) fn log(&self, level: LogLevel, message: impl std::fmt::Display) {
        if level >= self.level {
            let tag = match level {
                LogLevel::Debug => "debug",
                LogLevel::Info => "info",
                LogLevel::Warn => "warn",
                LogLevel::Error => "error",
            };
            emit(self.json, tag, &message.to_string());
        }
    }
}

/// One line: `message` at `level` (`debug`, `info`, `warn`, `error`), at `unix_ns` nanoseconds
/// since the Unix epoch, as plain text or as JSON.
pub fn line(json: bool, level: &str, message: &str, unix_ns: u128) -> String {
    if !json {
        return format!("ratewell-rls {level}: {message}");
    }
    let message = serde_json::Value::String(message.to_owned());
    let level = serde_json::Value::String(level.to_owned());
    format!(r#"{{"@message":{message},"@timestamp":"{}","level":{level}}}"#, rfc3339(unix_ns))
}

/// Write `message` at `level` to standard error, now.
pub fn emit(json: bool, level: &str, message: &str) {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    eprintln!("{}", line(json, level, message, now));
}

/// `unix_ns` as RFC 3339 in UTC, the fraction's trailing zeros dropped (Go's `RFC3339Nano`).
fn rfc3339(unix_ns: u128) -> String {
    let secs = (unix_ns / 1_000_000_000) as i64;
    let nanos = (unix_ns % 1_000_000_000) as u32;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil(days);
    let (hh, mm, ss) = (rem / 3_600, rem % 3_600 / 60, rem % 60);
    let mut out = format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}");
    if nanos > 0 {
        let fraction = format!("{nanos:09}");
        out.push('.');
        out.push_str(fraction.trim_end_matches('0'));
    }
    out.push('Z');
    out
}

/// The proleptic Gregorian date of `days` since 1970-01-01 (Howard Hinnant's `civil_from_days`).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_as_go_writes_them() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        // 2026-12-03T15:40:05.1234Z
        let t = 1_796_312_405u128 * 1_000_000_000 + 123_400_000;
        assert_eq!(rfc3339(t), "2026-12-03T15:40:05.1234Z");
        // A leap day.
        assert_eq!(rfc3339(951_782_400 * 1_000_000_000), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_709_164_799_999_999_999), "2024-02-28T23:59:59.999999999Z");
    }

    #[test]
    fn json_lines_escape_the_message() {
        let l = line(true, "error", "a\nb \u{1}", 1_000_000_000);
        let v: serde_json::Value = serde_json::from_str(&l).unwrap();
        assert_eq!(v["@message"], "a\nb \u{1}");
        assert_eq!(v["@timestamp"], "1970-01-01T00:00:01Z");
        assert_eq!(v["level"], "error");
    }
}
