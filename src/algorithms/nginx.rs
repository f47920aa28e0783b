//! Leaky bucket with nginx's own arithmetic (`compat=nginx`), for drop-in parity with
//! `ngx_http_limit_req_module`.
//!
//! nginx floors time to whole milliseconds, keeps `excess` in integer milli-requests and the rate in
//! milli-requests per second (`rate = N*1000*10^9 / D_ns`, integer division, so `1r/m` is 16). For an
//! existing key: `excess = max(0, excess - rate*ms/1000 + 1000)` (C integer division), and `last`
//! moves to now only when `ms != 0` (the truncated part of the leak is lost). A new key starts at
//! excess 0. A cost `c` counts as `c` requests in the same millisecond, all or nothing:
//! `excess_c = excess_1 + (c - 1)*1000`, rejected iff `excess_c > burst*1000`. The delay is
//! `(excess_c - delay*1000) * 1000 / rate` whole ms, when positive. nginx's idle-node expiry (60 s)
//! is not reproduced: a key's state is kept until it is indistinguishable from a new key.
//!
//! # State word
//!
//! | field      | bits   | unit           | wrap / range                              | fresh |
//! |------------|--------|----------------|-------------------------------------------|-------|
//! | `OCCUPIED` | 63     | flag           | set once a request was admitted           | 0     |
//! | `EXCESS`   | 35..63 | milli-requests | 0 ..= `burst*1000` (burst <= 268,435)     | 0     |
//! | `LAST`     | 0..35  | ms             | mod 2^35, read as signed: 198 days idle   | 0     |
//!
//! A clock reading earlier than `LAST` counts as `ms = 0` (nginx itself clamps small negative
//! gaps to 0). After more than 2^34 ms (198 days) of silence `LAST` can alias: the leak is then
//! undercounted, which is stricter, never looser.
//!
//! # Fields
//!
//! The state ratewell-redis's function library stores for the key (`make_nginx` in
//! `ratewell-redis/src/decide.lua`), `now_ms = floor(u / 1000)` with `u = now / 1000` (µs):
//!
//! | field    | unit                   | range              | meaning                                |
//! |----------|------------------------|--------------------|----------------------------------------|
//! | `excess` | milli-requests         | `0..=burst*1000`   | `EXCESS`: the excess as of `last`      |
//! | `last`   | ms since `now`'s epoch | `0..=2^53`         | `LAST`, absolute                       |
//!
//! The word holds the same two values, `last` modulo 2^35; [`to_fields`](OneWord::to_fields)
//! reads `last` back as `now_ms` less the signed difference, so the fields of a word are the
//! values the function library writes after the same decisions (`{ec, last}` after an
//! admission, `{max(0, excess - unpaid), last}` after a refund). It answers `None` for a new key
//! and for a key *leaked out* at `now`, its `excess` less the leak since `last` at most `-1000`
//! (its next request starts from excess 0 and moves `last`, as a new key's does; `nginx_refund`
//! deletes such a state).
//!
//! [`read_fields`](OneWord::read_fields) answers `None` for: a length other than 2; a value beyond
//! ±2^53; `excess` outside `0..=burst*1000` (no decision writes more; beyond it the function
//! library's leak, clamped to `full_ms`, and the word's differ); `last < 0` (every `last` written
//! is a `now_ms`, and `now >= 0`); `last` more than 2^34 ms ahead of `now_ms`, the furthest
//! `LAST` reads ahead. Fields leaked out at `now` give the word `0`. A `last` 2^33 ms (99 days) or
//! more behind `now_ms` (a key not leaked out after that long: a slow rate with a large burst)
//! moves on by whole seconds, as many as `excess` pays for at `rate` milli-requests a second and
//! at most up to `now_ms`; it is then less than 17 minutes behind. Every later leak, and so every
//! later decision, is the same; that word's fields are the moved pair. The word decides as the
//! fields do at every instant up to 2^33 ms after `now`.

use super::{Invalid, OneWord, invalid, wrap_diff};
use crate::decision::Decision;
use crate::word::Fields;

const OCCUPIED: u64 = 1 << 63;
const LAST_BITS: u32 = 35;
const LAST_MASK: u64 = (1 << LAST_BITS) - 1;
const EXCESS_SHIFT: u32 = LAST_BITS;
const EXCESS_BITS: u32 = 28;
const EXCESS_MASK: u64 = (1 << EXCESS_BITS) - 1;
/// The largest burst whose `burst * 1000` fits `EXCESS`.
pub(crate) const MAX_BURST: u64 = EXCESS_MASK / 1000;
const _: () = assert!(1 + EXCESS_BITS + LAST_BITS == 64);

const MS: u64 = 1_000_000;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Nginx {
    /// milli-requests per second.
    rate: u64,
    burst: u64,
    /// `None`: `nodelay`; `Some(D)`: delay beyond `D` requests of excess.
    delay: Option<u64>,
}

/// Where a key stands at `now`: the excess a new request starts from (`excess_1 - 1000`, i.e.
/// after the leak, before the `+1000`), and the absolute ms of `last`.
struct Leaked {
    /// `excess - rate*ms/1000`, possibly negative; `None` for a new key.
    leaked: Option<i128>,
    /// `last`, in absolute ms; for a new key, `now_ms`.
    last_ms: i128,
    /// `ms != 0` (or a new key): an admitted request moves `last` to `now_ms`.
    moves_last: bool,
}

impl Nginx {
    pub(crate) fn new(
        count: u64,
        period_ns: u64,
        burst: u32,
        delay: Option<u32>,
    ) -> Result<Self, Invalid> {
        let rate = u128::from(count) * 1_000 * 1_000_000_000 / u128::from(period_ns);
        if rate == 0 {
            return invalid(
                "rate",
                "a rate of at least 1 milli-request per second under compat=nginx (nginx computes \
                 N*1000*10^9/period_ns with integer division; this one is 0)",
            );
        }
        if rate > 1 << 62 {
            return invalid(
                "rate",
                "a rate below 2^62 milli-requests per second under compat=nginx",
            );
        }
        if u64::from(burst) > MAX_BURST {
            return invalid("burst", format!("a burst of at most {MAX_BURST} under compat=nginx"));
        }
        Ok(Nginx { rate: rate as u64, burst: u64::from(burst), delay: delay.map(u64::from) })
    }

    /// The rate as nginx computes it: milli-requests per second (`1r/m` is 16, not 16.67).
    pub(crate) fn milli_per_second(&self) -> u64 {
        self.rate
    }

    #[inline]
    fn leak(&self, word: u64, now_ms: u64) -> Leaked {
        if word & OCCUPIED == 0 {
            return Leaked { leaked: None, last_ms: i128::from(now_ms), moves_last: true };
        }
        let excess = (word >> EXCESS_SHIFT) & EXCESS_MASK;
        let gap = wrap_diff(now_ms, word & LAST_MASK, LAST_BITS);
        let ms = gap.max(0) as u128;
        let leak = u128::from(self.rate) * ms / 1000;
        Leaked {
            leaked: Some(i128::from(excess) - leak as i128),
            last_ms: i128::from(now_ms) - i128::from(gap),
            moves_last: ms != 0,
        }
    }

    /// `excess_1`: the excess after one more request.
    #[inline]
    fn excess_one(leaked: &Leaked) -> u64 {
        match leaked.leaked {
            None => 0,
            Some(l) => (l + 1000).max(0) as u64,
        }
    }

    /// Nanoseconds from `now` until one more request fits after an admission left `excess`
    /// (milli-requests) at millisecond `last`: `until_fits` with `cost = remaining + 1`, whose
    /// need `excess + 1000 (remaining + 1) - bound` is `1000 - (bound - excess) mod 1000`, in
    /// 64-bit arithmetic (`last` is below 2^63 / 10^6 ms, the wait below 10^9 ms).
    #[inline]
    fn until_next(&self, excess: u64, last: u64, now: u64) -> u64 {
        let need = 1000 - (self.burst * 1000 - excess) % 1000;
        let ms = (need * 1000).div_ceil(self.rate.max(1));
        last.saturating_add(ms).saturating_mul(MS).saturating_sub(now).max(1)
    }

    /// Nanoseconds from `now` until a request of `cost` fits on the state `st`, at least 1; 0
    /// when it can never fit (`cost > burst + 1`: the key is full at `cost - 1`).
    #[inline]
    fn until_fits(&self, st: &Leaked, cost: u64, now: u64) -> u64 {
        if cost > self.burst + 1 {
            return 0;
        }
        // Admitted once floor(rate*ms/1000) >= excess + 1000*c - bound, with ms counted from
        // `last`: the first such ms, at its first ns.
        let now_ms = now / MS;
        let excess = st.leaked.unwrap_or(0) + Self::leaked_part(st, self.rate, now_ms);
        let need = excess + 1000 * i128::from(cost) - i128::from(self.burst * 1000);
        self.at_ms(st.last_ms + self.ms_to_leak(need), now).max(1)
    }

    /// The leak already subtracted in `st.leaked` (to recover the stored excess).
    #[inline]
    fn leaked_part(st: &Leaked, rate: u64, now_ms: u64) -> i128 {
        let ms = (i128::from(now_ms) - st.last_ms).max(0);
        i128::from(rate) * ms / 1000
    }

    /// Nanoseconds from `now` until the key is like a new one: the leak from `last` reaches
    /// `excess + 1000`.
    fn reset(&self, st: &Leaked, now: u64) -> u64 {
        let Some(leaked) = st.leaked else { return 0 };
        let now_ms = now / MS;
        let excess = leaked + Self::leaked_part(st, self.rate, now_ms);
        let need = excess + 1000;
        self.at_ms(st.last_ms + self.ms_to_leak(need), now)
    }

    /// Whole ms after which `floor(rate*ms/1000) >= need` (milli-requests).
    #[inline]
    fn ms_to_leak(&self, need: i128) -> i128 {
        let rate = i128::from(self.rate);
        // `rate` is at least 1 (checked at construction); `checked_div` keeps this panic-free.
        (need * 1000 + rate - 1).checked_div(rate).unwrap_or(0)
    }

    /// Nanoseconds from `now` to the start of absolute millisecond `ms` (0 if already past).
    #[inline]
    fn at_ms(&self, ms: i128, now: u64) -> u64 {
        let t = ms * i128::from(MS) - i128::from(now);
        t.clamp(0, i128::from(u64::MAX)) as u64
    }
}

impl OneWord for Nginx {
    fn idle_horizon_ns(&self) -> u128 {
        (1u128 << (LAST_BITS - 1)) * u128::from(MS)
    }

    #[inline(always)]
    fn run(&self, word: u64, now: u64, cost: u64) -> (Decision, Option<u64>) {
        let now_ms = now / MS;
        let limit = self.burst + 1;
        let bound = self.burst * 1000;
        let st = self.leak(word, now_ms);
        let excess_1 = Self::excess_one(&st);
        let remaining_now = if excess_1 > bound { 0 } else { (bound - excess_1) / 1000 + 1 };
        if cost > limit {
            let reset = self.reset(&st, now);
            let next = self.until_fits(&st, remaining_now + 1, now);
            return (Decision::impossible(limit, remaining_now, reset).replenish(next), None);
        }
        let excess_c = excess_1 + (cost - 1) * 1000;
        if excess_c <= bound {
            let last = if st.moves_last { now_ms } else { st.last_ms as u64 };
            let new_word = OCCUPIED | (excess_c << EXCESS_SHIFT) | (last & LAST_MASK);
            let delay_ms = match self.delay {
                Some(free) if excess_c > free * 1000 => (u128::from(excess_c - free * 1000) * 1000)
                    .checked_div(u128::from(self.rate))
                    .unwrap_or(0),
                _ => 0,
            };
            let after = Leaked {
                leaked: Some(i128::from(excess_c)),
                last_ms: i128::from(last),
                moves_last: false,
            };
            let remaining = (bound - excess_c) / 1000;
            let d = Decision::admitted(
                limit,
                remaining,
                self.reset(&after, now),
                (delay_ms as u64).saturating_mul(MS),
            );
            (d.replenish(self.until_next(excess_c, last, now)), Some(new_word))
        } else {
            let retry = self.until_fits(&st, cost, now);
            let next = self.until_fits(&st, remaining_now + 1, now);
            let d = Decision::rejected(limit, remaining_now, self.reset(&st, now), retry);
            (d.replenish(next), None)
        }
    }

    fn reset_after(&self, word: u64, now: u64) -> u64 {
        self.reset(&self.leak(word, now / MS), now)
    }

    /// The leaky bucket's argument in nginx's units: the charge added the top `c*1000`
    /// milli-requests of the excess (a new key counts from -1000, where its first request is
    /// free), which leak last; what of them is left at `now`, `min(c*1000, max(0, A - leak + 1000))`
    /// with `A` the excess it stored and the leak counted from its `last`, comes off the stored
    /// excess (at most all of it), `last` unchanged: every later leak is the one the state
    /// would see anyway. A key leaked to `-1000` or below is a new key.
    fn give_back(&self, word: u64, now: u64, charged: u64, cost: u64) -> u64 {
        let now_ms = now / MS;
        if word & OCCUPIED == 0 {
            return word;
        }
        let unpaid = match self.leak(charged, now_ms).leaked {
            Some(top) => (top + 1000).clamp(0, i128::from(cost.min(self.burst + 1)) * 1000),
            None => 0,
        } as u64;
        let excess = (word >> EXCESS_SHIFT) & EXCESS_MASK;
        let left = excess - unpaid.min(excess);
        let word = OCCUPIED | (left << EXCESS_SHIFT) | (word & LAST_MASK);
        match self.leak(word, now_ms).leaked {
            Some(potential) if potential <= -1000 => 0,
            _ => word,
        }
    }

    /// `[excess, last]` (see *Fields*); `None` for a new key or one leaked out.
    fn to_fields(&self, word: u64, now: u64) -> Option<Fields> {
        let st = self.leak(word, now / MS);
        if st.leaked? <= -1000 {
            return None;
        }
        // `EXCESS` is 28 bits, `last_ms` within 2^34 of `now_ms` (< 2^45): both fit.
        let excess = ((word >> EXCESS_SHIFT) & EXCESS_MASK) as i64;
        Fields::new(&[excess, i64::try_from(st.last_ms).ok()?])
    }

    /// The word of `{excess, last}`; see *Fields* for what is refused.
    fn read_fields(&self, fields: &[i64], now: u64) -> Option<u64> {
        let &[excess, last] = fields else { return None };
        // `burst * 1000 < 2^28`.
        let bound = (self.burst * 1000) as i64;
        if Fields::new(fields).is_none() || last < 0 || !(0..=bound).contains(&excess) {
            return None;
        }
        let (mut excess, mut last) = (i128::from(excess), i128::from(last));
        // Both within 2^53 and `rate` below 2^62: no product here reaches 2^120.
        let ms = i128::from(now / MS) - last;
        if i128::from(self.rate) * ms.max(0) / 1000 >= excess + 1000 {
            return Some(0);
        }
        let half = 1i128 << (LAST_BITS - 1);
        if ms < -half {
            return None;
        }
        if ms >= half / 2 {
            // A whole second leaks exactly `rate`: `last` moves on by as many as `excess` pays
            // for, up to `now_ms`.
            let rate = i128::from(self.rate);
            let seconds = (ms / 1000).min(excess / rate);
            excess -= rate * seconds;
            last += 1000 * seconds;
        }
        // `0 <= excess <= bound`, `0 <= last`.
        let excess = excess as u64;
        Some(OCCUPIED | (excess << EXCESS_SHIFT) | (last as u64 & LAST_MASK))
    }
}

#[cfg(test)]
mod tests {
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
        Decision::from_parts(
            outcome,
            limit,
            ns(r[1]),
            ns(r[2]),
            ns(r[3]),
            (r[4] > 0).then(|| ns(r[4])),
        )
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
}
