//! The trace format of `SEMANTICS.md`: `t_ns,key[,cost]` per line.
//!
//! Public for the fuzz target of the trace reader; not a stable API.

use std::fmt;

/// The largest timestamp, `2^63 - 1` ns.
const MAX_T: u64 = i64::MAX as u64;

/// One request of a trace.
#[derive(Debug, PartialEq, Eq)]
pub struct Request<'a> {
    /// Nanoseconds since the trace's start.
    pub t: u64,
    /// The key's bytes.
    pub key: &'a [u8],
    /// The cost, 1 by default.
    pub cost: u32,
}

/// Why a line is not a request.
#[derive(Debug, PartialEq, Eq)]
pub enum LineError {
    /// Not an integer from 0 to 2^63-1.
    Time(String),
    /// Empty, or a character outside `[A-Za-z0-9_.:-]`.
    Key(String),
    /// Not an integer from 1 to 2^32-1.
    Cost(String),
    /// Not 2 or 3 comma-separated fields.
    Fields(usize),
    /// Earlier than the previous line.
    Decreasing {
        /// This line's timestamp.
        t: u64,
        /// The previous line's.
        previous: u64,
    },
}

impl fmt::Display for LineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LineError::Time(s) => {
                write!(f, "bad timestamp `{s}`: expected an integer from 0 to 2^63-1 (ns)")
            }
            LineError::Key(s) if s.is_empty() => f.write_str("empty key"),
            LineError::Key(s) => {
                write!(f, "bad key `{s}`: expected characters from A-Z a-z 0-9 _ . : -")
            }
            LineError::Cost(s) => {
                write!(f, "bad cost `{s}`: expected an integer from 1 to 4294967295")
            }
            LineError::Fields(n) => write!(
                f,
                "found {n} field{}: expected `t_ns,key` or `t_ns,key,cost` (no spaces, nothing \
                 after)",
                if *n == 1 { "" } else { "s" }
            ),
            LineError::Decreasing { t, previous } => {
                write!(f, "timestamp {t} is earlier than the previous line's {previous}")
            }
        }
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

fn integer(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() || !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    bytes.iter().try_fold(0u64, |n, &b| n.checked_mul(10)?.checked_add(u64::from(b - b'0')))
}

fn key_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-')
}

/// Parse one line (without its `\n`). `Ok(None)` for a blank line.
pub fn parse_line(line: &[u8]) -> Result<Option<Request<'_>>, LineError> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.is_empty() {
        return Ok(None);
    }
    let fields: Vec<&[u8]> = line.split(|&b| b == b',').collect();
    if !(2..=3).contains(&fields.len()) {
        return Err(LineError::Fields(fields.len()));
    }
    let t = integer(fields[0])
        .filter(|&t| t <= MAX_T)
        .ok_or_else(|| LineError::Time(shown(fields[0])))?;
    let key = fields[1];
    if key.is_empty() || !key.iter().all(|&b| key_byte(b)) {
        return Err(LineError::Key(shown(key)));
    }
    let cost = match fields.get(2) {
        None | Some([]) => 1,
        Some(c) => integer(c)
            .filter(|c| (1..=u64::from(u32::MAX)).contains(c))
            .ok_or_else(|| LineError::Cost(shown(c)))? as u32,
    };
    Ok(Some(Request { t, key, cost }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines() {
        let r = |t, key: &'static str, cost| Ok(Some(Request { t, key: key.as_bytes(), cost }));
        assert_eq!(parse_line(b"5,a"), r(5, "a", 1));
        assert_eq!(parse_line(b"5,a,"), r(5, "a", 1));
        assert_eq!(parse_line(b"5,a:b-c.d_e,7\r"), r(5, "a:b-c.d_e", 7));
        assert_eq!(parse_line(b""), Ok(None));
        assert_eq!(parse_line(b"\r"), Ok(None));
        assert!(matches!(parse_line(b"5,a,0"), Err(LineError::Cost(_))));
        assert!(matches!(parse_line(b"5,a,4294967296"), Err(LineError::Cost(_))));
        assert!(matches!(parse_line(b"9223372036854775808,a"), Err(LineError::Time(_))));
        assert!(matches!(parse_line(b"-1,a"), Err(LineError::Time(_))));
        assert!(matches!(parse_line(b"5,,1"), Err(LineError::Key(_))));
        assert!(matches!(parse_line(b"5, a"), Err(LineError::Key(_))));
        assert!(matches!(parse_line(b"5,a,1,x"), Err(LineError::Fields(4))));
        assert!(matches!(parse_line(b"5"), Err(LineError::Fields(1))));
    }
}
