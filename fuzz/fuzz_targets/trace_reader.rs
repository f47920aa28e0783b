#![no_main]
//! The trace reader never panics, every line it accepts prints back to an equal request, and the
//! streaming `Reader` (what `replay` and `compare` use) yields exactly the lines' requests, in
//! order, stopping at the first bad line or timestamp going back, with that line's number.
use libfuzzer_sys::fuzz_target;
use ratewell_cli::trace::{LineError, ReadError, Reader, parse_line};

fuzz_target!(|data: &[u8]| {
    let mut reader = Reader::new(data);
    let mut previous = 0;
    for (i, line) in data.split(|&b| b == b'\n').enumerate() {
        let number = i as u64 + 1;
        match parse_line(line) {
            Ok(Some(r)) => {
                let mut again = format!("{},", r.t).into_bytes();
                again.extend_from_slice(r.key);
                again.extend_from_slice(format!(",{}", r.cost).as_bytes());
                assert_eq!(parse_line(&again).unwrap().as_ref(), Some(&r));
                if r.t < previous {
                    match reader.next() {
                        Err(ReadError::Line {
                            number: n,
                            error: LineError::Decreasing { t, .. },
                        }) => {
                            assert_eq!((n, t), (number, r.t));
                        }
                        other => {
                            panic!("line {number} goes back in time, the reader said {other:?}")
                        }
                    }
                    return;
                }
                previous = r.t;
                assert_eq!(reader.next().unwrap().as_ref(), Some(&r), "line {number}");
            }
            Ok(None) => assert!(line.is_empty() || line == b"\r"),
            Err(e) => {
                let _ = e.to_string();
                match reader.next() {
                    Err(ReadError::Line { number: n, error }) => {
                        assert_eq!((n, error), (number, e))
                    }
                    other => panic!("line {number} is bad ({e}), the reader said {other:?}"),
                }
                return;
            }
        }
    }
    assert!(matches!(reader.next(), Ok(None)));
});
