//! The bytes the function library (`ratewell-redis/src/decide.lua`) stores and passes, read and
//! written here byte for byte: a state, a receipt, a sliding log's entry, a number argument.

/// A state as `encode` in `decide.lua` writes it: one byte, the count of integers (1 to 3), then
/// each integer as a little-endian double.
pub(crate) fn encode(values: &[i64], out: &mut Vec<u8>) {
    out.clear();
    out.reserve(1 + 8 * values.len());
    out.push(values.len() as u8);
    for &v in values {
        out.extend_from_slice(&(v as f64).to_le_bytes());
    }
}

/// `v` when it is an integer that a double holds exactly (below 2^53 in magnitude).
fn exact(v: f64) -> Option<i64> {
    (v.fract() == 0.0 && v.abs() < 9_007_199_254_740_992.0).then_some(v as i64)
}

/// A state as `parse` in `decide.lua` reads it: the binary form, or decimal text of one to three
/// integers separated by single spaces (what earlier versions stored, and the sliding log's
/// entries). `None` for anything else.
pub(crate) fn parse(raw: &[u8]) -> Option<([i64; 3], usize)> {
    let mut out = [0i64; 3];
    match raw.first() {
        Some(&k @ 1..=3) => {
            let k = usize::from(k);
            if raw.len() != 1 + 8 * k {
                return None;
            }
            for (i, chunk) in raw[1..].chunks_exact(8).enumerate() {
                out[i] = exact(f64::from_le_bytes(chunk.try_into().ok()?))?;
            }
            Some((out, k))
        }
        _ => {
            let text = std::str::from_utf8(raw).ok()?;
            let mut n = 0;
            for part in text.split(' ') {
                if n == 3 {
                    return None;
                }
                out[n] = integer(part.as_bytes())?;
                n += 1;
            }
            Some((out, n))
        }
    }
}

/// A decimal integer, `-?[0-9]+`, within 2^53 in magnitude.
pub(crate) fn integer(s: &[u8]) -> Option<i64> {
    let (neg, digits) = match s.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, s),
    };
    if digits.is_empty() || digits.len() > 16 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let v = digits.iter().fold(0i64, |acc, d| acc * 10 + i64::from(d - b'0'));
    (v <= 1 << 53).then_some(if neg { -v } else { v })
}

/// A receipt split as `split_receipt` in `decide.lua` splits it: the state a charge stored, the
/// state it replaced (after a `|`), and whether the second was there.
pub(crate) fn split_receipt(r: &[u8]) -> (&[u8], &[u8], bool) {
    if let Some(&k @ 1..=3) = r.first() {
        let len = 1 + 8 * usize::from(k);
        if r.get(len) == Some(&b'|') {
            return (&r[..len], &r[len + 1..], true);
        }
        return (&r[..len.min(r.len())], &[], false);
    }
    match r.iter().position(|&b| b == b'|') {
        Some(bar) => (&r[..bar], &r[bar + 1..], true),
        None => (r, &[], false),
    }
}

/// `a b` or `a` in decimal, as `fmt` in `decide.lua` writes them.
pub(crate) fn decimal(values: &[i64]) -> Vec<u8> {
    let mut s = String::new();
    for (i, v) in values.iter().enumerate() {
        if i > 0 {
            s.push(' ');
        }
        s.push_str(&v.to_string());
    }
    s.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_in_both_forms() {
        let mut buf = Vec::new();
        for values in [&[5i64][..], &[-3, 1 << 52], &[0, 7, 1_700_000_000_000_000]] {
            encode(values, &mut buf);
            assert_eq!(buf.len(), 1 + 8 * values.len());
            let (got, n) = parse(&buf).unwrap();
            assert_eq!(&got[..n], values);
            let (got, n) = parse(&decimal(values)).unwrap();
            assert_eq!(&got[..n], values);
        }
        for bad in [&b""[..], b"x", b"1 2 3 4", b"1  2", b"--1", b"\x02\0\0", b"1.5", b" 1"] {
            assert!(parse(bad).is_none(), "{bad:?}");
        }
        // A double that is not an integer, or beyond 2^53.
        let mut raw = vec![1u8];
        raw.extend_from_slice(&0.5f64.to_le_bytes());
        assert!(parse(&raw).is_none());
        raw.truncate(1);
        raw.extend_from_slice(&1e17f64.to_le_bytes());
        assert!(parse(&raw).is_none());
    }

    #[test]
    fn receipts_split_as_the_script_splits_them() {
        let mut after = Vec::new();
        encode(&[1, 2], &mut after);
        let mut r = after.clone();
        r.push(b'|');
        assert_eq!(split_receipt(&r), (&after[..], &b""[..], true));
        r.extend_from_slice(b"3 4");
        assert_eq!(split_receipt(&r), (&after[..], &b"3 4"[..], true));
        assert_eq!(split_receipt(&after), (&after[..], &b""[..], false));
        assert_eq!(split_receipt(b"12|"), (&b"12"[..], &b""[..], true));
        assert_eq!(split_receipt(b"12"), (&b"12"[..], &b""[..], false));
        // Truncated binary: never out of bounds.
        assert_eq!(split_receipt(&[3, 0]), (&[3u8, 0][..], &b""[..], false));
    }
}
