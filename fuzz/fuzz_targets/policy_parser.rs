#![no_main]
//! The policy parser never panics, and a parsed policy's canonical form parses back equal (and
//! prints the same).
use libfuzzer_sys::fuzz_target;
use ratewell::Policy;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match text.parse::<Policy>() {
        Ok(policy) => {
            let canonical = policy.to_string();
            let again: Policy = canonical.parse().unwrap_or_else(|e| panic!("{canonical:?}: {e}"));
            assert_eq!(again, policy, "{text:?} -> {canonical:?}");
            assert_eq!(again.to_string(), canonical);
        }
        Err(e) => {
            // The message names a token of the input (or says the policy is empty).
            assert!(e.token().is_empty() || text.contains(e.token()), "{text:?}: {e}");
            let _ = e.to_string();
        }
    }
});
