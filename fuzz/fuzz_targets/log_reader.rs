#![no_main]
//! The access-log readers never panic on any line, and what they accept is whole: a combined
//! line rebuilt from what was read reads back to the same request.
use libfuzzer_sys::fuzz_target;
use ratewell_cli::logs::{COMBINED, ENVOY_DEFAULT, JsonTemplate, LogFormat, Template};

fuzz_target!(|data: &[u8]| {
    let formats = [
        LogFormat::Text(
            Template::nginx(COMBINED, "$remote_addr", Some("$body_bytes_sent")).unwrap(),
        ),
        LogFormat::Text(
            Template::nginx("$msec|$http_x_key|$uri", "$http_x_key|$uri", None).unwrap(),
        ),
        LogFormat::Text(Template::envoy(ENVOY_DEFAULT, "%REQ(X-FORWARDED-FOR)%", None).unwrap()),
        LogFormat::Json(JsonTemplate::new("ts", "ms", "$ip ${a.b}", Some("$n")).unwrap()),
        LogFormat::Json(JsonTemplate::new("time", "rfc3339", "$ip", None).unwrap()),
    ];
    let (mut spans, mut key) = (Vec::new(), Vec::new());
    for line in data.split(|&b| b == b'\n') {
        for format in &formats {
            if let Ok(read) = format.parse(line, &mut spans, &mut key) {
                assert!(read.t <= i64::MAX as u64 && read.cost >= 1);
                assert!(!key.is_empty());
            }
            if let Err(e) = format.parse(line, &mut spans, &mut key) {
                let _ = e.to_string();
            }
        }
        // The `$msec|key|uri` format: a line rebuilt from a request read reads back the same.
        let [_, msec, ..] = &formats;
        if let Ok(read) = msec.parse(line, &mut spans, &mut key) {
            // The key's value has no `|` (it ends at the first), so the key's first `|` is the
            // one between its two values.
            let (k, uri) = key.split_at(key.iter().position(|&b| b == b'|').unwrap());
            let mut again =
                format!("{}.{:09}|", read.t / 1_000_000_000, read.t % 1_000_000_000).into_bytes();
            again.extend_from_slice(k);
            again.extend_from_slice(uri);
            let mut key2 = Vec::new();
            let back = msec.parse(&again, &mut spans, &mut key2).unwrap();
            assert_eq!((back, &key2), (read, &key));
        }
    }
});
