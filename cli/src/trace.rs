//! The trace format of `docs/SEMANTICS.md`: `t_ns,key[,cost]` per line.
//!
//! Public for the fuzz target of the trace reader; not a stable API.

use std::fmt;
use std::io::{self, BufRead};

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
    /// Empty, or a character outside `[A-Za-z0-9_.:-]` (with key lists, `|` between keys).
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
                write!(
                    f,
                    "bad key `{s}`: expected characters from A-Z a-z 0-9 _ . : - (a layered replay: \
                     keys of those separated by |)"
                )
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

/// At most 40 characters of `bytes`, for a message.
pub(crate) fn shown(bytes: &[u8]) -> String {
    let s = String::from_utf8_lossy(bytes);
    if s.chars().count() > 40 {
        format!("{}…", s.chars().take(40).collect::<String>())
    } else {
        s.into()
    }
}

/// A decimal integer of ASCII digits only (leading zeros allowed), if it fits in a `u64`.
pub(crate) fn integer(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() {
        return None;
    }
    if bytes.len() <= 19 {
        // Below 10^19: no overflow possible.
        let mut n = 0u64;
        for &b in bytes {
            let d = b.wrapping_sub(b'0');
            if d > 9 {
                return None;
            }
            n = n * 10 + u64::from(d);
        }
        return Some(n);
    }
    if !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    bytes.iter().try_fold(0u64, |n, &b| n.checked_mul(10)?.checked_add(u64::from(b - b'0')))
}

/// What a byte is to the key field: one of [`KEY`], [`BAR`], [`COMMA`], or 0 (not allowed).
const KEY: u8 = 1;
const BAR: u8 = 2;
const COMMA: u8 = 3;
const CLASS: [u8; 256] = {
    let mut class = [0u8; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        if c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b':' | b'-') {
            class[b] = KEY;
        }
        b += 1;
    }
    class[b'|' as usize] = BAR;
    class[b',' as usize] = COMMA;
    class
};

/// A line without its `\n`.
fn content(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\n").unwrap_or(line)
}

/// Whether a line (without its `\n`) is blank: empty but for a `\r`.
fn is_blank(line: &[u8]) -> bool {
    line.is_empty() || line == b"\r"
}

/// Parse one line (without its `\n`). `Ok(None)` for a blank line.
pub fn parse_line(line: &[u8]) -> Result<Option<Request<'_>>, LineError> {
    parse(line, false)
}

/// [`parse_line`], accepting with `lists` a key field of several keys separated by `|` (each
/// non-empty): the key of a layered replay.
pub fn parse(line: &[u8], lists: bool) -> Result<Option<Request<'_>>, LineError> {
    if is_blank(line) {
        return Ok(None);
    }
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let fields = |line: &[u8]| LineError::Fields(line.iter().filter(|&&b| b == b',').count() + 1);
    let Some(first) = line.iter().position(|&b| b == b',') else { return Err(fields(line)) };
    let (time, rest) = (&line[..first], &line[first + 1..]);
    // One pass over the key: where it ends, and whether it is one key (or, with `lists`, keys
    // separated by `|`) of allowed bytes, none empty.
    let (mut valid, mut segment_empty, mut end) = (true, true, rest.len());
    for (i, &b) in rest.iter().enumerate() {
        match CLASS[usize::from(b)] {
            KEY => segment_empty = false,
            BAR if lists && !segment_empty => segment_empty = true,
            COMMA => {
                end = i;
                break;
            }
            _ => valid = false,
        }
    }
    let key = &rest[..end];
    let cost = rest.get(end + 1..);
    if cost.is_some_and(|c| c.contains(&b',')) {
        return Err(fields(line));
    }
    let t = integer(time).filter(|&t| t <= MAX_T).ok_or_else(|| LineError::Time(shown(time)))?;
    if !valid || segment_empty {
        return Err(LineError::Key(shown(key)));
    }
    let cost = match cost {
        None | Some([]) => 1,
        Some(c) => integer(c)
            .filter(|c| (1..=u64::from(u32::MAX)).contains(c))
            .ok_or_else(|| LineError::Cost(shown(c)))? as u32,
    };
    Ok(Some(Request { t, key, cost }))
}

/// Why a trace could not be read to its end.
#[derive(Debug)]
pub enum ReadError {
    /// The input failed.
    Io(io::Error),
    /// A line is not a request, or goes back in time.
    Line {
        /// Its number, from 1.
        number: u64,
        /// What is wrong with it.
        error: LineError,
    },
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::Io(e) => write!(f, "cannot read trace: {e}"),
            ReadError::Line { number, error } => write!(f, "line {number}: {error}"),
        }
    }
}

/// Reads a trace line by line: skips blank lines, checks that time never goes back, and keeps
/// count of lines and bytes (for progress reports).
#[derive(Debug)]
pub struct Reader<R> {
    input: R,
    line: Vec<u8>,
    number: u64,
    bytes: u64,
    previous: u64,
    lists: bool,
}

impl<R: BufRead> Reader<R> {
    /// A reader of `input`.
    pub fn new(input: R) -> Self {
        Reader {
            input,
            line: Vec::with_capacity(128),
            number: 0,
            bytes: 0,
            previous: 0,
            lists: false,
        }
    }

    /// The same reader accepting key lists (`k1|k2`, see [`parse`]).
    pub fn with_key_lists(mut self) -> Self {
        self.lists = true;
        self
    }

    /// The next request; `None` at the end of the trace.
    #[allow(clippy::should_implement_trait)] // It lends from `self`: not an `Iterator`.
    pub fn next(&mut self) -> Result<Option<Request<'_>>, ReadError> {
        loop {
            self.line.clear();
            let n = self.input.read_until(b'\n', &mut self.line).map_err(ReadError::Io)?;
            if n == 0 {
                return Ok(None);
            }
            self.number += 1;
            self.bytes += n as u64;
            if !is_blank(content(&self.line)) {
                break;
            }
        }
        let number = self.number;
        match parse(content(&self.line), self.lists) {
            Ok(Some(request)) if request.t < self.previous => Err(ReadError::Line {
                number,
                error: LineError::Decreasing { t: request.t, previous: self.previous },
            }),
            Ok(Some(request)) => {
                self.previous = request.t;
                Ok(Some(request))
            }
            Ok(None) => unreachable!("blank lines are skipped above"),
            Err(error) => Err(ReadError::Line { number, error }),
        }
    }

    /// Lines read so far (blank ones included).
    pub fn lines(&self) -> u64 {
        self.number
    }

    /// Bytes read so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The input, read up to where the reader stopped.
    pub fn into_inner(self) -> R {
        self.input
    }
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

    /// The grammar stated plainly (split on commas, check each field): the reference that
    /// [`parse`]'s one-pass scan must agree with on every line.
    fn reference(line: &[u8], lists: bool) -> Result<Option<Request<'_>>, LineError> {
        if is_blank(line) {
            return Ok(None);
        }
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let mut split = line.split(|&b| b == b',');
        let (Some(time), Some(key), cost, None) =
            (split.next(), split.next(), split.next(), split.next())
        else {
            return Err(LineError::Fields(line.iter().filter(|&&b| b == b',').count() + 1));
        };
        let number = |f: &[u8]| {
            if f.is_empty() || !f.iter().all(u8::is_ascii_digit) {
                return None;
            }
            f.iter().try_fold(0u64, |n, &b| n.checked_mul(10)?.checked_add(u64::from(b - b'0')))
        };
        let t = number(time).filter(|&t| t <= MAX_T).ok_or_else(|| LineError::Time(shown(time)))?;
        let key_byte = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-');
        let valid = |k: &[u8]| !k.is_empty() && k.iter().all(|&b| key_byte(b));
        let ok = if lists { key.split(|&b| b == b'|').all(valid) } else { valid(key) };
        if !ok {
            return Err(LineError::Key(shown(key)));
        }
        let cost = match cost {
            None | Some([]) => 1,
            Some(c) => number(c)
                .filter(|c| (1..=u64::from(u32::MAX)).contains(c))
                .ok_or_else(|| LineError::Cost(shown(c)))? as u32,
        };
        Ok(Some(Request { t, key, cost }))
    }

    #[test]
    fn one_pass_parse_equals_the_reference() {
        // Every line of up to 5 bytes over an alphabet of the grammar's edge bytes, then random
        // longer lines mixing them with digits and long numbers.
        let alphabet: &[u8] = b"09,a|\r-\xff ";
        let mut line = Vec::new();
        let check = |line: &[u8]| {
            for lists in [false, true] {
                assert_eq!(parse(line, lists), reference(line, lists), "{:?}", shown(line));
            }
        };
        for len in 0..=5u32 {
            for mut n in 0..(alphabet.len() as u64).pow(len) {
                line.clear();
                for _ in 0..len {
                    line.push(alphabet[(n % alphabet.len() as u64) as usize]);
                    n /= alphabet.len() as u64;
                }
                check(&line);
            }
        }
        let pieces: [&[u8]; 12] = [
            b"0",
            b"7",
            b"18446744073709551615",
            b"18446744073709551616",
            b"9223372036854775807",
            b"9223372036854775808",
            b"00000000000000000000000042",
            b"4294967295",
            b"4294967296",
            b"key-1.a:b_c",
            b"|",
            b",",
        ];
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        for _ in 0..200_000 {
            line.clear();
            for _ in 0..(x % 7) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                line.extend_from_slice(pieces[(x % pieces.len() as u64) as usize]);
            }
            check(&line);
        }
    }
}
