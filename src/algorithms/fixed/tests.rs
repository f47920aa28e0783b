//! Tests of the fixed window (`fixed.rs`): both alignments, limits per layout, and its fields
//! against the Redis function library's (`decide.lua`, transcribed).

use super::*;

const S: u64 = 1_000_000_000;

#[test]
fn clock_windows_reset_at_boundaries() {
    let f = Fixed::new(2, S, Align::Clock).unwrap();
    let (_, w) = f.decide(0, S - 1, 2);
    let w = w.unwrap();
    assert_eq!(f.decide(w, S - 1, 1).0.retry_after_ns(), Some(1));
    assert!(f.decide(w, S, 2).0.is_admitted());
}

#[test]
fn first_aligned_windows_open_at_the_first_request() {
    let f = Fixed::new(2, S, Align::First).unwrap();
    let (_, w) = f.decide(0, S - 1, 2);
    let w = w.unwrap();
    // The window is [S-1, 2S-1): still closed at S.
    assert_eq!(f.decide(w, S, 1).0.retry_after_ns(), Some(S - 1));
    assert!(!f.decide(w, 2 * S - 2, 1).0.is_admitted());
    assert!(f.decide(w, 2 * S - 1, 2).0.is_admitted());
    // A reading before the window opened counts in it.
    assert!(!f.decide(w, S - 5, 1).0.is_admitted());
}

#[test]
fn a_lower_limit_per_call_reads_the_same_words() {
    let wide = Fixed::new(u32::MAX, S, Align::Clock).unwrap();
    let three = wide.within(3);
    let (d, w) = three.decide(0, 0, 2);
    assert_eq!((d.limit(), d.remaining()), (3, 1));
    // The word is the wide layout's: the wide window sees the same count.
    assert_eq!(wide.probe(w.unwrap(), 0).remaining(), u64::from(u32::MAX) - 2);
    assert!(!three.decide(w.unwrap(), 0, 2).0.is_admitted());
    // A count above the call's limit (stored under a higher one) reads as full.
    let (_, w) = wide.decide(0, 0, 10);
    let d = three.decide(w.unwrap(), 0, 1).0;
    assert!(!d.is_admitted() && d.remaining() == 0);
    assert_eq!(wide.within(u32::MAX), wide, "no lower: the window as it is");
}

#[test]
fn limits_on_layouts() {
    assert!(Fixed::new(131_071, S, Align::First).is_ok());
    assert!(Fixed::new(131_072, S, Align::First).is_err());
    assert!(Fixed::new(u32::MAX, S, Align::Clock).is_ok());
    assert!(Fixed::new(u32::MAX, 1_000, Align::Clock).is_err());
}

const US: u64 = 1_000;

fn fixed(text: &str) -> Fixed {
    match text.parse::<crate::policy::Policy>().unwrap().algorithm {
        crate::algorithms::Algorithm::Fixed(f) => f,
        other => panic!("{text}: {other:?}"),
    }
}

use crate::algorithms::testing::Rng;

/// A time at or after `now`, in whole µs: the same instant, the next µs, on or next to a
/// window boundary (of the clock, or `edge`), a few windows on, or (rarely) hours later.
fn later(now: u64, w: u64, edge: Option<u64>, rng: &mut Rng) -> u64 {
    let near = |b: u64, rng: &mut Rng| (b + US * rng.below(3)).saturating_sub(US).max(now);
    match rng.below(40) {
        0..=7 => now,
        8..=11 => now + US,
        12..=19 => near((now / w + 1 + rng.below(2)) * w, rng),
        20..=23 => near(edge.unwrap_or(now + w), rng),
        24..=27 => near(now + w, rng),
        28..=32 => now + US * rng.below(3 * w / US),
        33..=38 => now + US * rng.below(1_000),
        _ => now + US * rng.below(6 * 3_600_000_000),
    }
}

/// A cost: 1 to 3, any up to the limit, the limit, above it, or a probe's.
fn cost(limit: u64, rng: &mut Rng) -> u64 {
    match rng.below(10) {
        0 => limit,
        1 => limit + 1 + rng.below(3),
        2 => u64::MAX,
        3 | 4 => 1 + rng.below(limit),
        _ => 1 + rng.below(limit.min(3)),
    }
}

fn values(fields: Option<Fields>) -> Option<Vec<i64>> {
    fields.map(|f| f.as_slice().to_vec())
}

/// `make_fixed` of `ratewell-redis/src/decide.lua`, on its own state: `p = {N, W_us, first}`.
struct Lua {
    n: i128,
    w: i128,
    first: bool,
}

type LuaState = Option<[i128; 2]>;

impl Lua {
    fn of(f: &Fixed) -> Lua {
        assert_eq!(f.window % US, 0);
        let w = i128::from(f.window / US);
        Lua { n: i128::from(f.limit), w, first: f.align == Align::First }
    }

    /// `fixed_window`: the count and the low value (`k` or the end).
    fn window(&self, st: LuaState, u: i128) -> (i128, i128) {
        let count = st.map_or(0, |st| st[0].min(self.n));
        if !self.first {
            let k_now = u / self.w;
            let mut k = k_now;
            let mut count = count;
            if let Some(st) = st.filter(|_| count > 0) {
                let gap = k_now - st[1];
                if gap > 0 {
                    count = 0;
                } else if gap < 0 {
                    k = st[1];
                }
            }
            return (count, k);
        }
        match st {
            Some(st) if count > 0 && st[1] > u => (count, st[1]),
            _ => (0, u + self.w),
        }
    }

    /// `fixed`: whether it admits, and the state it stores.
    fn take(&self, st: LuaState, u: i128, c: u64) -> (bool, LuaState) {
        let (count, low) = self.window(st, u);
        let c = i128::from(c);
        if c > self.n || count + c > self.n {
            return (false, None);
        }
        (true, Some([count + c, low]))
    }

    /// `fixed_refund`: the state it stores (`None` inside: deleted), or `None` (unchanged).
    fn refund(&self, st: LuaState, u: i128, c: u64, receipt: [i128; 2]) -> Option<LuaState> {
        let (count, low) = self.window(st, u);
        st?;
        if count == 0 || low != receipt[1] {
            return None;
        }
        let c = i128::from(c);
        let back = c.min(count);
        if self.first && receipt[0] == c {
            return if count == back { Some(None) } else { None };
        }
        let count = count - back;
        Some(if count == 0 { None } else { Some([count, low]) })
    }

    /// What `to_fields` must give for the key holding `st` at `u`: `None` when no window is
    /// open (the state decides as no state does).
    fn view(&self, st: LuaState, u: i128) -> Option<Vec<i64>> {
        let (count, low) = self.window(st, u);
        (count > 0).then(|| vec![count as i64, low as i64])
    }
}

/// Checks the fields of `word` at `now` against later decisions: `None` decides as `0` does,
/// and fields read back into a word that decides as `word` does and has the same fields.
fn check_fields(f: &Fixed, word: u64, now: u64, rng: &mut Rng) -> Option<Fields> {
    let fields = f.to_fields(word, now);
    let twin = match fields {
        None => 0,
        Some(fl) => {
            let w2 = f.read_fields(fl.as_slice(), now);
            assert!(w2.is_some(), "{fl:?} at {now} do not read back");
            assert_eq!(f.to_fields(w2.unwrap(), now), fields, "{fl:?} at {now}");
            w2.unwrap()
        }
    };
    let edge = values(fields).filter(|_| f.align == Align::First).map(|v| v[1] as u64 * US);
    for i in 0..6 {
        let t = if i == 0 { now } else { later(now, f.window, edge, rng) };
        let c = cost(f.limit, rng);
        let (d1, n1) = f.run(word, t, c);
        let (d2, n2) = f.run(twin, t, c);
        let ctx = format!("{word:#x} ({fields:?} at {now}) vs {twin:#x}, at {t}, cost {c}");
        assert_eq!(d1, d2, "{ctx}");
        assert_eq!(n1.map(|w| f.to_fields(w, t)), n2.map(|w| f.to_fields(w, t)), "{ctx}");
    }
    fields
}

struct Charge {
    before: u64,
    after: u64,
    lua_before: LuaState,
    lua_after: [i128; 2],
    cost: u64,
}

#[test]
fn fields_round_trip_and_are_the_function_librarys() {
    let configs = [
        "fixed-window limit=5 window=1s",
        "fixed-window limit=3 window=1m align=first",
        "fixed-window limit=10 window=1500ms",
    ];
    for (seed, text) in configs.into_iter().enumerate() {
        let f = fixed(text);
        let lua = Lua::of(&f);
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 + seed as u64);
        let mut now = US * rng.below(1 << 40);
        let (mut word, mut st) = (0u64, None);
        let mut charges: Vec<Charge> = Vec::new();
        // Admitted, refused, refunds that changed the state, open windows, ended ones.
        let mut seen = [0u32; 5];
        for step in 0..4_000 {
            let edge = lua.view(st, i128::from(now / US)).map(|v| v[1] as u64 * US);
            now = if rng.below(30) == 0 {
                // A clock reading earlier than the last (by up to two windows).
                now.saturating_sub(US * rng.below(2 * f.window / US))
            } else {
                later(now, f.window, edge.filter(|_| lua.first), &mut rng)
            };
            let u = i128::from(now / US);
            let ctx = format!("{text}, step {step}, at {now}");
            let fields = check_fields(&f, word, now, &mut rng);
            assert_eq!(values(fields), lua.view(st, u), "{ctx}");
            seen[if fields.is_some() { 3 } else { 4 }] += u32::from(word != 0);
            match rng.below(5) {
                0..=2 => {
                    let c = cost(f.limit, &mut rng);
                    let (d, next) = f.run(word, now, c);
                    let (admitted, written) = lua.take(st, u, c);
                    assert_eq!(d.is_admitted(), admitted, "{ctx}, cost {c}");
                    seen[usize::from(!admitted)] += 1;
                    if let Some(next) = next {
                        // Exactly what the function library writes.
                        let lua_after = written.unwrap();
                        let expected = lua_after.map(|v| v as i64).to_vec();
                        assert_eq!(values(f.to_fields(next, now)), Some(expected), "{ctx}");
                        charges.push(Charge {
                            before: word,
                            after: next,
                            lua_before: st,
                            lua_after,
                            cost: c,
                        });
                        (word, st) = (next, written);
                    }
                }
                _ if charges.is_empty() => {}
                op => {
                    let before = word;
                    let recent = rng.below(charges.len().min(4) as u64) as usize;
                    let ch = &charges[charges.len() - 1 - recent];
                    if op == 3 {
                        // A whole receipt: the state before while the key holds the
                        // charge's, else `fixed_refund`.
                        word = f.refund(word, now, ch.before, ch.after, ch.cost);
                        if st.is_some() {
                            st = if st == Some(ch.lua_after) {
                                ch.lua_before
                            } else {
                                lua.refund(st, u, ch.cost, ch.lua_after).unwrap_or(st)
                            };
                        }
                    } else {
                        // A receipt of the charged state alone, read back from its fields
                        // as another decider on the key reads it.
                        let receipt = ch.lua_after.map(|v| v as i64);
                        let charged = f.read_fields(&receipt, now).expect("a receipt");
                        let back = f.give_back(word, now, charged, ch.cost);
                        let same = f.give_back(word, now, ch.after, ch.cost);
                        assert_eq!(f.to_fields(back, now), f.to_fields(same, now), "{ctx}");
                        word = back;
                        if let Some(ns) = lua.refund(st, u, ch.cost, ch.lua_after) {
                            st = ns;
                        }
                    }
                    // Exactly what the function library's refund leaves.
                    assert_eq!(values(f.to_fields(word, now)), lua.view(st, u), "{ctx}");
                    seen[2] += u32::from(word != before);
                }
            }
        }
        assert!(seen.iter().all(|&n| n > 100), "{text}: {seen:?}");
    }
}

#[test]
fn fields_by_hand() {
    // fixed-window limit=5 window=1s: p = {5, 1000000, 0}.
    let f = fixed("fixed-window limit=5 window=1s");
    // A take of 2 at u = 3500000 µs on no state: count 0, k = floor(3500000 / 1000000) = 3;
    // 0 + 2 <= 5 stores {0 + 2, 3}.
    let a = f.decide(0, 3_500_000 * US, 2).1.unwrap();
    assert_eq!(f.to_fields(a, 3_500_000 * US).unwrap().as_slice(), &[2, 3]);
    // A take of 3 at u = 3999999: k_now = floor(3999999 / 1000000) = 3 = st[2], count 2;
    // 2 + 3 <= 5 stores {5, 3}.
    let b = f.decide(a, 3_999_999 * US, 3).1.unwrap();
    assert_eq!(f.to_fields(b, 3_999_999 * US).unwrap().as_slice(), &[5, 3]);
    // A refund of 2 on the receipt {2, 3} at the same u: fixed_refund's count 5, low 3 =
    // receipt[2], back = min(2, 5) = 2, p[3] = 0: stores {5 - 2, 3}.
    let back = f.give_back(b, 3_999_999 * US, a, 2);
    assert_eq!(f.to_fields(back, 3_999_999 * US).unwrap().as_slice(), &[3, 3]);
    // At u = 4000000: k_now = 4, gap = 4 - 3 > 0, count 0: no window open.
    assert_eq!(f.to_fields(b, 4_000_000 * US), None);
    assert_eq!(f.read_fields(&[5, 3], 3_999_999 * US), Some(b));

    // fixed-window limit=3 window=1m align=first: p = {3, 60000000, 1}.
    let f = fixed("fixed-window limit=3 window=1m align=first");
    // A take of 1 at u = 90000000 on no state opens a window: low = u + W = 150000000;
    // stores {1, 150000000}.
    let a = f.decide(0, 90_000_000 * US, 1).1.unwrap();
    assert_eq!(f.to_fields(a, 90_000_000 * US).unwrap().as_slice(), &[1, 150_000_000]);
    // A take of 2 at u = 149999999: st[2] = 150000000 > u, count 1; 1 + 2 <= 3 stores
    // {3, 150000000}.
    let b = f.decide(a, 149_999_999 * US, 2).1.unwrap();
    assert_eq!(f.to_fields(b, 149_999_999 * US).unwrap().as_slice(), &[3, 150_000_000]);
    // Refunding the first charge: receipt[1] = 1 = c (it opened the window) and count 3 is
    // not back = 1: fixed_refund leaves the state.
    assert_eq!(f.give_back(b, 149_999_999 * US, a, 1), b);
    // At u = 150000000, st[2] > u fails: no window open.
    assert_eq!(f.to_fields(b, 150_000_000 * US), None);
}

#[test]
fn fields_out_of_range_are_refused() {
    let f = fixed("fixed-window limit=5 window=1s");
    let now = 3_500_000 * US;
    assert_eq!(f.read_fields(&[2, 3], now), f.decide(0, now, 2).1);
    for bad in [&[][..], &[2], &[2, 3, 0], &[0, 3], &[6, 3], &[-1, 3], &[2, -1], &[2, 1 << 54]] {
        assert_eq!(f.read_fields(bad, now), None, "{bad:?}");
    }
    // As far ahead as `INDEX` reads (2^51 windows for `N = 4000`), and no further.
    let f = fixed("fixed-window limit=4000 window=1s");
    let half = 1i64 << (f.low_bits - 1);
    assert_eq!(half, 1 << 51);
    assert!(f.read_fields(&[2, half + 3], now).is_some());
    assert_eq!(f.read_fields(&[2, half + 4], now), None);
    // A window ended `2^(IB-1)` windows ago or more decides as a fresh key: the word `0`.
    let f = fixed("fixed-window limit=1 window=1ns");
    let half = 1u64 << (f.low_bits - 1);
    assert_ne!(f.read_fields(&[1, 3], half + 2), Some(0));
    assert_eq!(f.to_fields(f.read_fields(&[1, 3], half + 2).unwrap(), half + 2), None);
    assert_eq!(f.read_fields(&[1, 3], half + 3), Some(0));

    let f = fixed("fixed-window limit=3 window=1m align=first");
    let now = 90_000_000 * US;
    for bad in [&[1, 59_999_999][..], &[4, 150_000_000], &[0, 150_000_000], &[1, -5]] {
        assert_eq!(f.read_fields(bad, now), None, "{bad:?}");
    }
    // An end further than `2^(EB-1)` ns ahead is beyond what `END` reads.
    let half_us = (1i64 << (f.low_bits - 1)) / 1_000;
    assert!(f.read_fields(&[1, 90_000_000 + half_us], now).is_some());
    assert_eq!(f.read_fields(&[1, 90_000_000 + half_us + 1], now), None);
    // An ended window keeps its end while `END` reads it as past: a receipt still matches.
    let ended = f.read_fields(&[1, 60_000_000], now).unwrap();
    assert_ne!(ended, 0);
    assert_eq!(f.to_fields(ended, now), None);
    assert_eq!(f.read_fields(&[1, 60_000_000], u64::MAX / 2), Some(0));
}

#[test]
fn fields_do_not_depend_on_the_limit_of_a_call() {
    let wide = fixed("fixed-window limit=10 window=1s");
    let three = wide.within(3);
    let w = wide.decide(0, 0, 8).1.unwrap();
    assert_eq!(three.to_fields(w, 0).unwrap().as_slice(), &[8, 0]);
    assert_eq!(three.read_fields(&[8, 0], 0), Some(w));
    assert_eq!(three.read_fields(&[11, 0], 0), None);
    // A refund within 3 reads the count as 3, as fixed_refund with p[1] = 3 does: {2, 0}.
    let back = three.give_back(w, 0, w, 1);
    assert_eq!(three.to_fields(back, 0).unwrap().as_slice(), &[2, 0]);
}

#[test]
fn any_fields_are_refused_or_read_without_panic() {
    let extremes = [
        i64::MIN,
        i64::MIN + 1,
        -(1 << 53) - 1,
        -(1 << 53),
        -1,
        0,
        1,
        2,
        3,
        5,
        131_071,
        u32::MAX as i64,
        1 << 52,
        (1 << 53) - 1,
        1 << 53,
        (1 << 53) + 1,
        i64::MAX - 1,
        i64::MAX,
    ];
    let configs = [
        "fixed-window limit=5 window=1s",
        "fixed-window limit=3 window=1m align=first",
        "fixed-window limit=10 window=1500ms",
        "fixed-window limit=131071 window=1us align=first",
        "fixed-window limit=4294967295 window=52d",
        "fixed-window limit=1 window=1ns",
    ];
    let mut rng = Rng(0xDEAD_BEEF_CAFE_F00D);
    for text in configs {
        let f = fixed(text);
        let nows = [0, US, 3_500_000 * US, 1 << 62, u64::MAX - 1, u64::MAX, rng.next()];
        for now in nows {
            let read = |fields: &[i64]| {
                if let Some(w) = f.read_fields(fields, now) {
                    let _ = (f.to_fields(w, now), f.probe(w, now), f.decide(w, now, 1));
                }
            };
            for a in extremes {
                read(&[a]);
                for b in extremes {
                    read(&[a, b]);
                    read(&[a, b, a]);
                }
            }
            for _ in 0..2_000 {
                let small = |rng: &mut Rng| (rng.next() % (1 << 55)) as i64 - (1 << 54);
                read(&[rng.next() as i64, rng.next() as i64]);
                read(&[small(&mut rng), small(&mut rng)]);
                read(&[1 + rng.below(5) as i64, small(&mut rng)]);
                let _ = f.to_fields(rng.next(), now);
            }
        }
    }
}
