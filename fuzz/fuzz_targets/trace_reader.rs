#![no_main]
//! The trace reader never panics, and every line it accepts prints back to an equal request.
use libfuzzer_sys::fuzz_target;
use ratewell_cli::trace::parse_line;

fuzz_target!(|data: &[u8]| {
    for line in data.split(|&b| b == b'\n') {
        match parse_line(line) {
            Ok(Some(r)) => {
                let mut again = format!("{},", r.t).into_bytes();
                again.extend_from_slice(r.key);
                again.extend_from_slice(format!(",{}", r.cost).as_bytes());
                assert_eq!(parse_line(&again).unwrap(), Some(r));
            }
            Ok(None) => assert!(line.is_empty() || line == b"\r"),
            Err(e) => {
                let _ = e.to_string();
            }
        }
    }
});
