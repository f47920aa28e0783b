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

    /// This bucket decided at a burst of at most its own and with `delay` (`None`: `nodelay`)
    /// for one call, as nginx decides one zone under each location's `limit_req burst= delay=`:
    /// `EXCESS` keeps its meaning whatever the burst, so a state stored under either is read the
    /// same under the other; an excess above the call's bound reads as a full bucket.
    #[inline]
    pub(crate) fn with_burst(&self, burst: u32, delay: Option<u32>) -> Nginx {
        Nginx {
            burst: self.burst.min(u64::from(burst)),
            delay: delay.map(u64::from),
            ..self.clone()
        }
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
mod tests;
