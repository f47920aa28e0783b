#![no_main]
//! Restoring a snapshot from any bytes: an error that leaves the limiter as it was, or a limiter
//! that then decides without panicking. Three ways in: the bytes as they are; the bytes with a
//! correct checksum appended (so the fuzzer reaches the parser behind it); and a genuine
//! snapshot of every kind of limiter with some of its bytes overwritten, then resealed.
use libfuzzer_sys::fuzz_target;
use ratewell::{KeyedLimiter, Layer, LayeredLimiter, ManualClock, Policy, Resume};

/// The format's checksum (`src/snapshot.rs`).
fn checksum(bytes: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut h = (bytes.len() as u64).wrapping_mul(K) ^ 0x5241_5445_5745_4c4c;
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        h = (h ^ u64::from_le_bytes(w.try_into().unwrap())).wrapping_mul(K).rotate_left(29);
    }
    let mut tail = [0u8; 8];
    tail[..words.remainder().len()].copy_from_slice(words.remainder());
    h = (h ^ u64::from_le_bytes(tail)).wrapping_mul(K).rotate_left(29);
    h ^ (h >> 32)
}

fn reseal(mut body: Vec<u8>) -> Vec<u8> {
    let sum = checksum(&body);
    body.extend_from_slice(&sum.to_le_bytes());
    body
}

fn policy(text: &str) -> Policy {
    text.parse().unwrap()
}

fn words(clock: ManualClock) -> KeyedLimiter<u8, ManualClock> {
    let l = KeyedLimiter::with_clock(&policy("token-bucket capacity=3 rate=1/s"), 16, clock);
    l.register(&policy("sliding-window limit=4 window=1m"))
        .map(|id| {
            l.request(&9).policy(&id).cost(2).check();
            l.release(id);
        })
        .unwrap();
    l
}

fn logs(clock: ManualClock) -> KeyedLimiter<u8, ManualClock> {
    KeyedLimiter::with_clock(&policy("sliding-log limit=3 window=1s"), 16, clock)
}

fn layered() -> LayeredLimiter<ManualClock> {
    let layers = vec![
        Layer::new("a", &policy("fixed-window limit=3 window=1s")).capacity(16),
        Layer::new("b", &policy("sliding-log limit=2 window=1s")).capacity(16),
    ];
    LayeredLimiter::with_clock(layers, ManualClock::new(5)).unwrap()
}

/// A snapshot of each kind, of a limiter with some keys.
fn genuine(kind: u8) -> Vec<u8> {
    let mut bytes = Vec::new();
    match kind % 3 {
        0 => {
            let l = words(ManualClock::new(5));
            for k in 0..6u8 {
                let _ = l.request(&k).cost(1 + u32::from(k % 3)).check();
            }
            l.snapshot(&mut bytes).unwrap();
        }
        1 => {
            let l = logs(ManualClock::new(5));
            for k in 0..6u8 {
                let _ = l.request(&k).cost(1 + u32::from(k % 2)).check();
            }
            l.snapshot(&mut bytes).unwrap();
        }
        _ => {
            let l = layered();
            for k in 0..6u8 {
                let _ = l.check(&[&k, &(k / 2)], 1);
            }
            l.snapshot(&mut bytes).unwrap();
        }
    }
    bytes
}

/// Restore into each kind of limiter; whatever is restored must then decide without panicking,
/// and a refused restore must leave the limiter as it was.
fn restore_all(bytes: &[u8]) {
    for make in [words, logs] {
        let clock = ManualClock::new(5);
        let mut l = make(clock.clone());
        let before: Vec<u64> = (0..10u8).map(|k| l.request(&k).peek().remaining()).collect();
        match l.restore(bytes, Resume::SameClock) {
            Ok(_) => {
                for k in 0..10u8 {
                    let _ = l.request(&k).cost(1 + u32::from(k)).check();
                    clock.advance(300_000_000);
                    let _ = l.request(&k).cost(2).peek();
                }
                l.reclaim_fresh();
            }
            Err(e) => {
                assert!(!e.to_string().is_empty());
                let after: Vec<u64> = (0..10u8).map(|k| l.request(&k).peek().remaining()).collect();
                assert_eq!(before, after);
            }
        }
    }
    let mut l = layered();
    if l.restore_with(bytes, Resume::SameClock).is_ok() {
        for k in 0..10u8 {
            let _ = l.check(&[&k, &k], 1);
            l.clock().advance(300_000_000);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        restore_all(data);
        return;
    };
    match mode % 3 {
        0 => restore_all(rest),
        1 => restore_all(&reseal(rest.to_vec())),
        _ => {
            let Some((&kind, rest)) = rest.split_first() else { return };
            let mut bytes = genuine(kind);
            bytes.truncate(bytes.len() - 8);
            // Pairs of (offset, byte) written over the snapshot's body.
            for pair in rest.chunks_exact(3) {
                let at = usize::from(u16::from_le_bytes([pair[0], pair[1]])) % bytes.len();
                bytes[at] = pair[2];
            }
            if rest.len() % 3 == 1 {
                // Truncated before the reseal.
                let cut = usize::from(rest[rest.len() - 1]) % bytes.len();
                bytes.truncate(cut);
            }
            restore_all(&reseal(bytes));
        }
    }
});
