//! Tests of the leaky bucket with nginx's arithmetic (`nginx.rs`): its rate and leak rounding, and
//! its fields against the Redis function library's (`decide.lua`, transcribed).

use super::*;
use crate::algorithms::Algorithm;
use crate::decision::Outcome;

#[test]
fn one_per_minute_is_sixteen_milli_per_second() {
    let l = Nginx::new(1, 60_000_000_000, 0, None).unwrap();
    assert_eq!(l.rate, 16);
    assert!(Nginx::new(1, 100_000_000_000_000, 0, None).is_err());
}

#[test]
fn truncated_leak_is_lost_only_when_ms_moves() {
    // 1r/s: rate 1000 milli/s; each ms leaks exactly 1 milli-request.
    let l = Nginx::new(1, 1_000_000_000, 1, Some(0)).unwrap();
    let (d, w) = l.decide(0, 0, 1);
    assert!(d.is_admitted());
    let w = w.unwrap();
    // Same ms: excess 0 + 1000 = 1000 <= 1000, admitted with a delay of 1000 ms.
    let (d, w2) = l.decide(w, 999_999, 1);
    assert!(d.is_admitted());
    assert_eq!(d.delay_ns(), 1_000 * MS);
    // Third in the same ms: 2000 > 1000.
    let (d, _) = l.decide(w2.unwrap(), 999_999, 1);
    assert!(!d.is_admitted());
    // At ms 1000, 1000 milli leaked: 1000 - 1000 + 1000 = 1000: admitted again.
    assert_eq!(d.retry_after_ns(), Some(1_000 * MS - 999_999));
}

use crate::algorithms::testing::Rng;

fn nginx(spec: &str) -> Nginx {
    match spec.parse::<crate::policy::Policy>().unwrap().algorithm {
        Algorithm::Nginx(n) => n,
        other => panic!("{spec}: {other:?}"),
    }
}

/// A state of the function library: `[excess, last_ms]`.
type St = Option<[i128; 2]>;

/// `ngx_leak`'s answer.
struct Leak {
    /// `None`: no state.
    leaked: Option<i128>,
    last: i128,
    moves_last: bool,
    stored: i128,
}

/// `make_nginx` of `decide.lua`, transcribed, with `p = {rate, burst, delay, full_ms}` as
/// `Compiled::new` derives them (`delay` -1 for nodelay, at most `burst + 1`).
struct Lua {
    rate: i128,
    burst: i128,
    delay: i128,
    full_ms: i128,
}

impl Lua {
    fn of(n: &Nginx) -> Lua {
        let (rate, burst) = (i128::from(n.rate), i128::from(n.burst));
        let delay = n.delay.map_or(-1, |d| i128::from(d).min(burst + 1));
        let full_ms = ((burst + 1) * 1_000_000 + rate - 1) / rate + 1;
        Lua { rate, burst, delay, full_ms }
    }

    /// `ngx_leak`: the gap clamped to `full_ms`.
    fn leak(&self, st: St, now_ms: i128) -> Leak {
        let Some([excess, last]) = st else {
            return Leak { leaked: None, last: now_ms, moves_last: true, stored: 0 };
        };
        let gap = now_ms - last;
        let ms = gap.max(0);
        let leak = (self.rate * ms.min(self.full_ms)).div_euclid(1000);
        Leak {
            leaked: Some(excess - leak),
            last: now_ms - gap,
            moves_last: ms != 0,
            stored: excess,
        }
    }

    /// `ngx_at`.
    fn at(ms: i128, u: i128) -> i128 {
        ((ms * 1000 - u) * 1000).max(0)
    }

    /// `ngx_ms_to_leak`: truncated toward zero, as `/` is.
    fn ms_to_leak(&self, need: i128) -> i128 {
        (need * 1000 + self.rate - 1) / self.rate
    }

    /// `ngx_reset`.
    fn reset(&self, l: &Leak, u: i128) -> i128 {
        if l.leaked.is_none() {
            return 0;
        }
        Self::at(l.last + self.ms_to_leak(l.stored + 1000), u)
    }

    /// `ngx_until_fits`.
    fn until_fits(&self, l: &Leak, c: i128, u: i128) -> i128 {
        if c > self.burst + 1 {
            return 0;
        }
        let excess = if l.leaked.is_none() { 0 } else { l.stored };
        let need = excess + 1000 * c - self.burst * 1000;
        Self::at(l.last + self.ms_to_leak(need), u).max(1)
    }

    /// `nginx`: the reply's outcome, remaining, reset, wait and replenish, and the state
    /// written.
    fn decide(&self, st: St, u: i128, c: i128) -> ([i128; 5], St) {
        let now_ms = u.div_euclid(1000);
        let (limit, bound) = (self.burst + 1, self.burst * 1000);
        let l = self.leak(st, now_ms);
        let e1 = l.leaked.map_or(0, |leaked| (leaked + 1000).max(0));
        let rem_now = if e1 <= bound { (bound - e1) / 1000 + 1 } else { 0 };
        if c > limit {
            let next = self.until_fits(&l, rem_now + 1, u);
            return ([2, rem_now, self.reset(&l, u), 0, next], None);
        }
        let ec = e1 + (c - 1) * 1000;
        if ec <= bound {
            let last = if l.moves_last { now_ms } else { l.last };
            let mut delay = 0;
            if self.delay >= 0 && ec > self.delay * 1000 {
                delay = ((ec - self.delay * 1000) * 1000).div_euclid(self.rate) * 1_000_000;
            }
            let after = Leak { leaked: Some(ec), last, moves_last: false, stored: ec };
            let reset = self.reset(&after, u);
            let need = 1000 - (bound - ec).rem_euclid(1000);
            let ms = (need * 1000 + self.rate - 1).div_euclid(self.rate);
            let next = Self::at(last + ms, u).max(1);
            return ([0, (bound - ec) / 1000, reset, delay, next], Some([ec, last]));
        }
        let retry = self.until_fits(&l, c, u);
        let next = self.until_fits(&l, rem_now + 1, u);
        ([1, rem_now, self.reset(&l, u), retry, next], None)
    }

    /// `nginx_refund` (on a key that holds a state); `None` deletes the key.
    fn refund(&self, st: St, u: i128, c: i128, receipt: St) -> St {
        let [excess, last] = st?;
        let now_ms = u.div_euclid(1000);
        let unpaid = match self.leak(receipt, now_ms).leaked {
            Some(leaked) => (leaked + 1000).max(0).min(c.min(self.burst + 1) * 1000),
            None => 0,
        };
        let ns = [(excess - unpaid).max(0), last];
        (self.leak(Some(ns), now_ms).leaked.unwrap() > -1000).then_some(ns)
    }

    /// The state decides as no state does (leaked to -1000 or below).
    fn is_fresh(&self, st: St, u: i128) -> bool {
        self.leak(st, u.div_euclid(1000)).leaked.is_none_or(|leaked| leaked <= -1000)
    }
}

/// The decision the function library's reply fields describe (`Compiled::decision`).
fn reply(limit: u64, r: [i128; 5]) -> Decision {
    let outcome = match r[0] {
        0 => Outcome::Admitted,
        1 => Outcome::Rejected,
        _ => Outcome::Impossible,
    };
    let ns = |v: i128| u64::try_from(v).unwrap();
    Decision::from_parts(outcome, limit, ns(r[1]), ns(r[2]), ns(r[3]), (r[4] > 0).then(|| ns(r[4])))
}

fn fields(st: [i128; 2]) -> Fields {
    Fields::new(&[st[0] as i64, st[1] as i64]).unwrap()
}

/// A step of whole µs from `u` (µs): none (a burst), under a ms, onto or next to one of the
/// next ms boundaries, up to twice the time a full bucket takes to leak, seconds, or hours.
fn step_us(rng: &mut Rng, lua: &Lua, u: u64) -> u64 {
    let full_us = lua.full_ms as u64 * 1000;
    match rng.below(20) {
        0..6 => 0,
        6..9 => 1 + rng.below(1000),
        9..13 => (u / 1000 + 1 + rng.below(3)) * 1000 + rng.below(3) - 1 - u,
        13..16 => rng.below(2 * full_us),
        16..19 => rng.below(10_000_000),
        _ => rng.below(5 * 3_600_000_000),
    }
}

/// At `now`: `word`'s fields are the function library's state (none where that decides as no
/// state), they read back as a word that decides as `word` does, and as the function library
/// does, at later instants, and the next states agree.
fn check(n: &Nginx, lua: &Lua, rng: &mut Rng, word: u64, now: u64, st: St) {
    let u = i128::from(now / 1000);
    let f = n.to_fields(word, now);
    let expected = st.filter(|_| !lua.is_fresh(st, u)).map(fields);
    assert_eq!(f, expected, "word {word:#x} at {now}");
    let w2 = f.map(|f| n.read_fields(f.as_slice(), now).expect("fields read back"));
    if let (Some(f), Some(w2)) = (f, w2) {
        assert_eq!(n.to_fields(w2, now), Some(f));
    }
    let limit = n.burst + 1;
    for _ in 0..4 {
        let later = match rng.below(5) {
            // The instant the key is leaked out, and the µs before it.
            0 => now + n.reset_after(word, now).saturating_sub(rng.below(2) * 1000),
            _ => now + 1000 * step_us(rng, lua, now / 1000),
        };
        let ul = i128::from(later / 1000);
        for c in [1, 1 + rng.below(limit + 1), limit, limit + 1, u64::MAX] {
            let (d1, n1) = n.run(word, later, c);
            let (lo, lua_next) = lua.decide(st, ul, i128::from(c));
            assert_eq!(d1, reply(limit, lo), "{st:?} at {later}, cost {c}");
            let at = |w: u64| n.to_fields(w, later);
            assert_eq!(n1.map(at), lua_next.map(|s| Some(fields(s))));
            match w2 {
                None => assert_eq!((d1, n1), n.run(0, later, c), "fresh at {later}, cost {c}"),
                Some(w2) => {
                    let (d2, n2) = n.run(w2, later, c);
                    assert_eq!(d1, d2, "{f:?} at {later}, cost {c}");
                    assert_eq!(n1.map(at), n2.map(at));
                }
            }
        }
    }
}

#[test]
fn fields_are_the_function_librarys_state() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for spec in [
        "leaky-bucket rate=3/250ms burst=5 delay=2 compat=nginx",
        "leaky-bucket rate=10r/s burst=3 nodelay compat=nginx",
        "leaky-bucket rate=1r/m burst=1 compat=nginx",
    ] {
        let n = nginx(spec);
        let lua = Lua::of(&n);
        let limit = n.burst + 1;
        // Steps that left fields, none; exact refunds, other refunds; rejections.
        let mut seen = [0u32; 5];
        for run in 0..32 {
            // The function library's times stay below 2^53 µs.
            let mut now = match run % 4 {
                0 => 0,
                1 => rng.below(10_000_000) * 1000,
                2 => 1_700_000_000_000_000_000 + rng.below(1 << 40) * 1000,
                _ => ((1 << 53) - 10_000_000_000_000) * 1000,
            };
            let (mut word, mut st) = (0u64, None);
            // (before, after, cost, the library's before and after)
            let mut receipts: Vec<(u64, u64, u64, St, St)> = vec![];
            for _ in 0..300 {
                now = match rng.below(10) {
                    0 => now + n.reset_after(word, now).saturating_sub(rng.below(2) * 1000),
                    _ => now + 1000 * step_us(&mut rng, &lua, now / 1000),
                };
                let u = i128::from(now / 1000);
                if rng.below(4) == 0 && !receipts.is_empty() {
                    let i = rng.below(receipts.len() as u64) as usize;
                    let (before, after, cost, st_before, st_after) = receipts.swap_remove(i);
                    let c = i128::from(cost);
                    if rng.below(3) == 0 {
                        // A receipt of the stored state alone: always `nginx_refund`.
                        seen[3] += 1;
                        word = n.give_back(word, now, after, cost);
                        st = lua.refund(st, u, c, st_after);
                    } else {
                        // `decide_one`'s refund: the state before, bit for bit, while the
                        // key still holds the charge's; else `nginx_refund`.
                        seen[if word == after { 2 } else { 3 }] += 1;
                        word = n.refund(word, now, before, after, cost);
                        if st.is_some() {
                            st = if st == st_after {
                                st_before
                            } else {
                                lua.refund(st, u, c, st_after)
                            };
                        }
                    }
                } else {
                    let cost = match rng.below(10) {
                        0 => limit + 1 + rng.below(3),
                        1 => u64::from(u32::MAX),
                        _ => 1 + rng.below(limit),
                    };
                    let (d, next) = n.run(word, now, cost);
                    let (lo, next_st) = lua.decide(st, u, i128::from(cost));
                    assert_eq!(d, reply(limit, lo), "{spec}: cost {cost} at {now}");
                    seen[4] += u32::from(lo[0] == 1);
                    if let Some(next) = next {
                        receipts.push((word, next, cost, st, next_st));
                        (word, st) = (next, next_st);
                    }
                }
                check(&n, &lua, &mut rng, word, now, st);
                seen[usize::from(n.to_fields(word, now).is_none())] += 1;
            }
        }
        assert!(seen.iter().all(|&n| n > 0), "{spec}: {seen:?}");
    }
}

#[test]
fn fields_of_admissions_and_a_refund_by_hand() {
    // rate=3/250ms burst=5 delay=2: rate = 3*1000*10^9 / 250_000_000 = 12000 milli-requests
    // a second (12 a ms), bound = 5000. A new key takes 3 at u = 1_000_000_000_123 µs:
    // now_ms = floor(u / 1000) = 1_000_000_000, e1 = 0, ec = 0 + 2*1000 = 2000 <= 5000, and
    // `last` moves to now_ms: {2000, 1_000_000_000}; ec > delay*1000 = 2000 is false: no delay.
    let n = nginx("leaky-bucket rate=3/250ms burst=5 delay=2 compat=nginx");
    let now = 1_000_000_000_123_000;
    let (d, a) = n.run(0, now, 3);
    assert_eq!(d.delay_ns(), 0);
    let a = a.unwrap();
    assert_eq!(n.to_fields(a, now).unwrap().as_slice(), &[2000, 1_000_000_000]);
    assert_eq!(n.read_fields(&[2000, 1_000_000_000], now), Some(a));
    // 1.7 ms later, u = 1_000_000_001_823: ms = 1, leak = floor(12000*1/1000) = 12, leaked =
    // 1988, e1 = 2988 = ec for one; `last` moves: {2988, 1_000_000_001}. The delay is
    // floor((2988 - 2000)*1000 / 12000) = 82 ms.
    let later = now + 1_700_000;
    let (d, b) = n.run(a, later, 1);
    assert_eq!(d.delay_ns(), 82 * MS);
    let b = b.unwrap();
    assert_eq!(n.to_fields(b, later).unwrap().as_slice(), &[2988, 1_000_000_001]);
    // 100 µs later, in the same ms: no leak, ec = 3988, `last` stays: {3988, 1_000_000_001}.
    let same = later + 100_000;
    let c = n.run(b, same, 1).1.unwrap();
    assert_eq!(n.to_fields(c, same).unwrap().as_slice(), &[3988, 1_000_000_001]);
    // The second charge given back (its receipt {2988, 1_000_000_001} alone): its leak at
    // now_ms is 0, unpaid = min(2988 + 1000, 1*1000) = 1000, left = 3988 - 1000 = 2988.
    let back = n.give_back(c, same, b, 1);
    assert_eq!(n.to_fields(back, same).unwrap().as_slice(), &[2988, 1_000_000_001]);
    // {2000, 1_000_000_000} leaks 3000 in exactly 250 ms: leaked -988 at 249 ms, -1000 at 250.
    assert!(n.to_fields(a, (1_000_000_000 + 249) * MS + 999_000).is_some());
    assert_eq!(n.to_fields(a, (1_000_000_000 + 250) * MS), None);
    // Leaked out (3988 + 1000 needs ceil(4988*1000/12000) = 416 ms from `last`): a new key.
    assert!(n.to_fields(c, (1_000_000_001 + 415) * MS).is_some());
    assert_eq!(n.to_fields(c, (1_000_000_001 + 416) * MS), None);
    assert_eq!(n.read_fields(&[3988, 1_000_000_001], (1_000_000_001 + 416) * MS), Some(0));
}

#[test]
fn a_last_long_behind_moves_by_whole_seconds() {
    // 1 milli-request a second, burst 268435: a full bucket takes 8.5 years to leak.
    let n = Nginx::new(1, 1_000_000_000_000, 268_435, None).unwrap();
    let lua = Lua::of(&n);
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let half = 1i64 << (LAST_BITS - 1);
    let now_ms = 5 * half;
    let now = now_ms as u64 * MS + 123_000;
    let full = 268_435_000;
    for (behind, excess) in [
        (half / 2 - 1, full - 7),
        (half / 2, full - 7),
        (half, full),
        (3 * half + 12_345, full - 7),
        // Only just not leaked out: the excess pays for all but the last 500 s.
        (half / 2, half / 2 / 1000 - 500),
        (3 * half + 999, (3 * half + 999) / 1000 - 999),
    ] {
        let st = [excess, now_ms - behind];
        let w = n.read_fields(&st, now).unwrap();
        let f = n.to_fields(w, now).unwrap();
        let [moved_excess, last] = [f.as_slice()[0], f.as_slice()[1]];
        let moved = last - st[1];
        assert!(moved >= 0 && moved % 1000 == 0, "{st:?}: {f:?}");
        assert_eq!(moved_excess, excess - moved / 1000);
        if behind < half / 2 {
            assert_eq!(moved, 0);
        } else {
            // Up to `now_ms`, or as far as the excess pays.
            assert!(now_ms - last < 1000 || moved_excess == 0, "{st:?}: {f:?}");
            assert!(now_ms - last < 1_001_000, "{st:?}: {f:?}");
        }
        let st = Some([i128::from(st[0]), i128::from(st[1])]);
        for _ in 0..300 {
            let later = now
                + match rng.below(3) {
                    0 => 1000 * rng.below(10_000_000_000),
                    1 => MS * rng.below(1 << 33),
                    _ => MS * ((1 << 33) - rng.below(1000)),
                };
            let c = 1 + rng.below(n.burst + 2);
            let (lo, next) = lua.decide(st, i128::from(later / 1000), i128::from(c));
            let (d, w2) = n.run(w, later, c);
            assert_eq!(d, reply(n.burst + 1, lo), "{st:?}: cost {c} at {later}");
            assert_eq!(w2.map(|w| n.to_fields(w, later)), next.map(|s| Some(fields(s))));
        }
    }
}

#[test]
fn garbage_fields_never_panic() {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for n in [
        nginx("leaky-bucket rate=3/250ms burst=5 delay=2 compat=nginx"),
        nginx("leaky-bucket rate=1r/m burst=1 compat=nginx"),
        Nginx::new(1, 1_000_000_000_000, 268_435, None).unwrap(),
    ] {
        let bound = n.burst as i64 * 1000;
        let half = 1i64 << (LAST_BITS - 1);
        for now in [0, 1000, 1_700_000_000_000_000_000, ((1 << 53) - 1) * 1000, u64::MAX] {
            let m = (now / MS) as i64;
            let mut values = vec![i64::MIN, i64::MIN + 1, -(1 << 53) - 1, -(1 << 53), -1, 0, 1];
            values.extend([bound - 1, bound, bound + 1, 1 << 53, (1 << 53) + 1, i64::MAX]);
            values.extend([
                m - half - 1,
                m - half / 2,
                m - half / 2 + 1,
                m - 1,
                m,
                m + 1,
                m + half,
            ]);
            values.push(m + half + 1);
            for &a in &values {
                assert_eq!(n.read_fields(&[a], now), None);
                for &b in &values {
                    assert_eq!(n.read_fields(&[a, b, 0], now), None);
                    let Some(w) = n.read_fields(&[a, b], now) else { continue };
                    assert!((0..=bound).contains(&a) && (0..=m + half).contains(&b));
                    match n.to_fields(w, now) {
                        None => assert_eq!(w, 0),
                        Some(f) if b > m - half / 2 => assert_eq!(f.as_slice(), &[a, b]),
                        Some(f) => assert!(f.as_slice()[1] > b && f.as_slice()[0] < a),
                    }
                }
            }
            assert_eq!(n.read_fields(&[], now), None);
            // The edges: `last` at most 2^34 ms ahead, never negative, excess within bound.
            if (1 << 53) - m > half {
                assert!(n.read_fields(&[bound, m + half], now).is_some());
                assert_eq!(n.read_fields(&[bound, m + half + 1], now), None);
                assert_eq!(n.read_fields(&[bound + 1, m], now), None);
                assert_eq!(n.read_fields(&[-1, m], now), None);
                assert_eq!(n.read_fields(&[0, -1], now), None);
            }
        }
        for _ in 0..100_000 {
            let len = rng.below(4) as usize;
            let v = [rng.next() as i64, rng.next() as i64 >> rng.below(64), rng.next() as i64];
            let now = rng.next() >> rng.below(64);
            let _ = n.read_fields(&v[..len], now);
            let _ = n.to_fields(rng.next(), now);
        }
    }
}
