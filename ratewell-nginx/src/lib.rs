//! ratewell inside nginx: the engine's shared key table in an nginx shared zone, decided on by
//! every worker, exactly.
//!
//! This crate is the module's Rust half: a static library with a C ABI (`src/ffi.rs`, the
//! only `unsafe` code; its header is `include/ratewell_nginx.h`), which the module's C half
//! (`module/ngx_http_ratewell_module.c`, built by nginx's own `configure` against the tree of
//! the nginx that loads it) calls. The decisions themselves are here, in safe code:
//!
//! - [`capacity_for`]: how many keys a zone of some bytes holds under a policy;
//! - [`Zone::open`]: a worker's handle on the table in a zone (the first one initialises it;
//!   the others check that it was made with the same policy and capacity);
//! - [`decide`]: one request against every zone of its location, all or nothing: a request
//!   that any zone rejects is charged by none.
//!
//! # Examples
//!
//! ```
//! use ratewell::{OnFull, Policy, Region};
//! use ratewell_nginx::{Ask, Zone, capacity_for, decide};
//!
//! let policy: Policy = "token-bucket capacity=2 rate=1/h".parse()?;
//! // An nginx zone is memory every worker maps; here, memory of this process's own.
//! let (capacity, len) = capacity_for(&policy, 1 << 20).expect("1 MiB holds some keys");
//! # #[repr(align(4096))] struct Page([u8; 4096]);
//! let mut memory: Vec<Page> = (0..len.div_ceil(4096)).map(|_| Page([0; 4096])).collect();
//! // SAFETY: the memory (page-aligned, zeroed) outlives the zone, and nothing else touches it.
//! let region = unsafe { Region::from_raw(memory.as_mut_ptr().cast(), len) };
//! let zone = Zone::open(region, &policy, capacity, OnFull::default(), "api")?;
//!
//! let asks = [Ask { zone: &zone, key: b"10.0.0.1", burst: None }];
//! let mut fields = String::new();
//! assert!(decide(&asks, 1, &mut fields).admitted);
//! assert!(decide(&asks, 1, &mut fields).admitted);
//! let rejected = decide(&asks, 1, &mut fields);
//! assert!(!rejected.admitted);
//! assert_eq!(rejected.retry_after_ns.map(|ns| ns.div_ceil(1_000_000_000)), Some(3600));
//! assert_eq!(fields, r#""api";r=0;t=3600"#);
//! drop(zone);
//! # drop(memory);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(unsafe_code)]

pub mod ffi;

use std::path::Path;

use ratewell::{
    Charge, KeyedLimiter, Metrics, OnFull, Parameters, Policy, Region, Restored, Resume,
    SharedClock, SharedError, SnapshotError, SnapshotInfo,
};

/// The burst of a zone declared in `limit_req`'s grammar (`rate=10r/s`): the widest a location's
/// `burst=` may name, the most a leaky bucket under `compat=nginx` holds (each location decides
/// at its own burst, on the zone's one state per key; see [`Ask::burst`]).
pub const RATE_ZONE_BURST: u32 = 268_435;

/// The policy of a zone declared as `limit_req_zone` declares one, `rate=10r/s` or `rate=30r/m`:
/// nginx's leaky bucket with nginx's own arithmetic, at the widest burst ([`RATE_ZONE_BURST`]),
/// which each location narrows.
///
/// ```
/// let policy = ratewell_nginx::rate_zone_policy("10r/s")?;
/// assert_eq!(policy.to_string(), "leaky-bucket rate=10r/s burst=268435 nodelay compat=nginx");
/// assert!(ratewell_nginx::rate_zone_policy("10/s").is_err());
/// # Ok::<(), String>(())
/// ```
pub fn rate_zone_policy(rate: &str) -> Result<Policy, String> {
    // limit_req's grammar only: a count, then `r/s` or `r/m`.
    let count = rate.strip_suffix("r/s").or_else(|| rate.strip_suffix("r/m"));
    if !count.is_some_and(|c| !c.is_empty() && c.bytes().all(|b| b.is_ascii_digit())) {
        return Err(format!(
            "invalid rate \"{rate}\": expected N requests a second or a minute, as limit_req \
             writes it (10r/s, 30r/m)"
        ));
    }
    let spec = format!("leaky-bucket rate={rate} burst={RATE_ZONE_BURST} nodelay compat=nginx");
    spec.parse().map_err(|e: ratewell::PolicyError| format!("invalid rate \"{rate}\": {e}"))
}

/// The burst a leaky-bucket policy holds; `None` for the other algorithms (a location's
/// `burst=` applies to leaky buckets only).
pub fn policy_burst(policy: &Policy) -> Option<u32> {
    match policy.parameters() {
        Parameters::LeakyBucket { burst, .. } => Some(burst),
        _ => None,
    }
}

/// `policy` as a location's `burst` and `delay` narrow it (`None`: the policy itself; a burst
/// at most the policy's own); `None` when the narrowing does not apply (not a leaky bucket).
pub fn narrowed_policy(policy: &Policy, burst: Option<Burst>) -> Option<Policy> {
    let Some(b) = burst else { return Some(policy.clone()) };
    match policy.parameters() {
        Parameters::LeakyBucket { count, period_ns, burst: own, nginx, .. } => {
            let params = Parameters::LeakyBucket {
                count,
                period_ns,
                burst: b.burst.min(own),
                delay: b.delay,
                nginx,
            };
            Policy::new(params).ok()
        }
        _ => None,
    }
}

/// A location's `burst=N [nodelay | delay=D]` on a leaky-bucket zone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Burst {
    /// `N`: at most the zone's own burst (a wider one is the zone's).
    pub burst: u32,
    /// `D`: requests of the excess not delayed; `None`: `nodelay`.
    pub delay: Option<u32>,
}

/// The most keys [`capacity_for`] gives a zone.
const MAX_KEYS: u64 = 1 << 32;

/// The largest capacity whose table fits in `bytes` under `policy`, and the bytes that table
/// needs (at most `bytes`); `None` when not even a table of one key fits.
///
/// ```
/// let policy = "fixed-window limit=10 window=1m".parse()?;
/// let (keys, len) = ratewell_nginx::capacity_for(&policy, 10 << 20).unwrap();
/// assert!(keys > 100_000 && len <= 10 << 20);
/// assert_eq!(ratewell_nginx::capacity_for(&policy, 4096), None);
/// # Ok::<(), ratewell::PolicyError>(())
/// ```
pub fn capacity_for(policy: &Policy, bytes: usize) -> Option<(usize, usize)> {
    let size = |keys: u64| {
        let keys = usize::try_from(keys).ok()?;
        KeyedLimiter::<[u8]>::region_size(policy, keys).ok().filter(|&len| len <= bytes)
    };
    size(1)?;
    // The table's size grows with its capacity: the largest that fits, by bisection.
    let (mut fits, mut too_many) = (1u64, MAX_KEYS.min(KeyedLimiter::<[u8]>::MAX_CAPACITY) + 1);
    while too_many - fits > 1 {
        let mid = fits + (too_many - fits) / 2;
        if size(mid).is_some() { fits = mid } else { too_many = mid }
    }
    let keys = usize::try_from(fits).ok()?;
    Some((keys, size(fits)?))
}

/// One worker's handle on a zone's table.
pub struct Zone {
    limiter: KeyedLimiter<[u8], SharedClock>,
    name: String,
    policy_field: String,
}

impl Zone {
    /// The table in `region` (a zone's memory, zeroed when new), initialised by the first
    /// process to open it, with `capacity` keys under `policy`; `name` (the zone's) names it in
    /// the `RateLimit` fields.
    ///
    /// A region that holds a table made with another policy, capacity or full-table behaviour
    /// is refused ([`SharedError::Mismatch`], naming the field).
    pub fn open(
        region: Region,
        policy: &Policy,
        capacity: usize,
        on_full: OnFull,
        name: &str,
    ) -> Result<Zone, SharedError> {
        let limiter =
            KeyedLimiter::<[u8]>::builder(policy, capacity).on_full(on_full).in_region(region)?;
        Ok(Zone {
            limiter,
            name: name.to_owned(),
            policy_field: policy.ratelimit_policy_field(name),
        })
    }

    /// The `RateLimit-Policy` field of the zone: its name, quota and window.
    pub fn policy_field(&self) -> &str {
        &self.policy_field
    }

    /// The `RateLimit-Policy` field of the zone as a location's `burst` narrows it.
    pub fn policy_field_for(&self, burst: Option<Burst>) -> String {
        let policy = self.limiter.policy();
        match narrowed_policy(&policy, burst) {
            Some(narrowed) => narrowed.ratelimit_policy_field(&self.name),
            None => self.policy_field.clone(),
        }
    }

    /// The zone's counters and occupancy (every worker's decisions).
    pub fn metrics(&self) -> Metrics {
        self.limiter.metrics()
    }

    /// Write every key's state to `path` (atomically: a file beside it, renamed), for
    /// [`restore`](Self::restore) when nginx starts again.
    pub fn save(&self, path: &Path) -> std::io::Result<SnapshotInfo> {
        self.limiter.save(path)
    }

    /// Replace every key's state by the snapshot at `path`, the time since it was saved passed
    /// (the system clock's), while no other process has the zone open (as nginx's master
    /// before it starts the workers). On any error the zone is as it was.
    pub fn restore(&mut self, path: &Path) -> Result<Restored, SnapshotError> {
        let file = std::fs::File::open(path).map_err(SnapshotError::from)?;
        self.limiter.restore(std::io::BufReader::new(file), Resume::WallClock)
    }

    /// The limiter on the zone's table.
    pub fn limiter(&self) -> &KeyedLimiter<[u8], SharedClock> {
        &self.limiter
    }
}

/// One zone of a request's location, and the request's key in it.
#[derive(Clone, Copy)]
pub struct Ask<'a> {
    /// The zone.
    pub zone: &'a Zone,
    /// The key (the bytes of the zone's key expression for this request).
    pub key: &'a [u8],
    /// The location's burst and delay on a leaky-bucket zone (`None`: the zone's own).
    pub burst: Option<Burst>,
}

impl<'a> Ask<'a> {
    #[inline]
    fn request(&self, cost: u32) -> ratewell::Request<'a, [u8], SharedClock> {
        let request = self.zone.limiter.request(self.key).cost(cost);
        match self.burst {
            Some(b) => request.burst(b.burst, b.delay),
            None => request,
        }
    }
}

/// What [`decide`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// Whether every zone admitted the request (and each is charged).
    pub admitted: bool,
    /// The ask that rejected it (the first to), when rejected.
    pub rejected_by: Option<usize>,
    /// Whether the rejecting zone can never admit the cost (above its capacity): no
    /// `Retry-After`.
    pub impossible: bool,
    /// Whether the rejecting zone is full and refused the request's new key (a zone with
    /// `on_full=refuse`, whose every key holds state that reclaiming would lose).
    pub table_full: bool,
    /// When rejected, the wait before the same request could pass every zone (the longest of
    /// the rejecting zone's and of those after it that would reject it too); `None` when one of
    /// them can never admit it.
    pub retry_after_ns: Option<u64>,
    /// When admitted, the longest delay a zone asks for (a delaying leaky bucket), else 0.
    pub delay_ns: u64,
    /// The ask whose zone asks for that delay (the first to), when there is one.
    pub delayed_by: Option<usize>,
    /// What remains: when admitted, the least any zone has left after the request; when
    /// rejected, what the rejecting zone has left (less than the cost).
    pub remaining: u64,
}

/// Decide a request of `cost` against every ask, in order, all or nothing: the first zone that
/// rejects ends it, and the charges the zones before it took are given back (so concurrent
/// requests never see a zone charged past its limit, and a rejected request costs nothing);
/// the zones after it are only asked how long the request would wait.
///
/// `fields` is cleared and then holds the `RateLimit` field: every zone's, admitted; the
/// rejecting zone's, rejected.
pub fn decide(asks: &[Ask<'_>], cost: u32, fields: &mut String) -> Verdict {
    decide_into(asks, cost, Some(fields))
}

/// [`decide`], writing no `RateLimit` field (for a location that sends no headers).
///
/// ```
/// # use ratewell::{OnFull, Policy, Region};
/// # use ratewell_nginx::{Ask, Zone, capacity_for, decide_bare};
/// # let policy: Policy = "token-bucket capacity=1 rate=1/h".parse()?;
/// # let (capacity, len) = capacity_for(&policy, 1 << 20).expect("1 MiB holds some keys");
/// # #[repr(align(4096))] struct Page([u8; 4096]);
/// # let mut memory: Vec<Page> = (0..len.div_ceil(4096)).map(|_| Page([0; 4096])).collect();
/// # // SAFETY: the memory (page-aligned, zeroed) outlives the zone, and nothing else touches it.
/// # let region = unsafe { Region::from_raw(memory.as_mut_ptr().cast(), len) };
/// // `zone`: a Zone of "token-bucket capacity=1 rate=1/h", opened as in the crate's example.
/// let zone = Zone::open(region, &policy, capacity, OnFull::default(), "api")?;
/// let asks = [Ask { zone: &zone, key: b"10.0.0.1", burst: None }];
/// assert!(decide_bare(&asks, 1).admitted);
/// let rejected = decide_bare(&asks, 1);
/// assert_eq!(rejected.retry_after_ns.map(|ns| ns.div_ceil(1_000_000_000)), Some(3600));
/// # drop(zone);
/// # drop(memory);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[inline]
pub fn decide_bare(asks: &[Ask<'_>], cost: u32) -> Verdict {
    decide_into(asks, cost, None)
}

#[inline]
fn decide_into(asks: &[Ask<'_>], cost: u32, mut fields: Option<&mut String>) -> Verdict {
    if let Some(fields) = fields.as_deref_mut() {
        fields.clear();
    }
    // Most locations name one zone: nothing to give back, nothing after it to ask.
    if let [ask] = asks {
        let decision = ask.request(cost).check();
        if let Some(fields) = fields {
            decision.write_ratelimit_field(&ask.zone.name, fields);
        }
        let admitted = decision.is_admitted();
        return Verdict {
            admitted,
            rejected_by: if admitted { None } else { Some(0) },
            impossible: !admitted && decision.is_impossible(),
            table_full: !admitted && decision.is_table_full(),
            retry_after_ns: if admitted || decision.is_impossible() {
                None
            } else {
                decision.retry_after_ns()
            },
            delay_ns: if admitted { decision.delay_ns() } else { 0 },
            delayed_by: (admitted && decision.delay_ns() > 0).then_some(0),
            remaining: decision.remaining(),
        };
    }
    // A location names a few zones: their charges on the stack, up to eight.
    let mut taken: [Option<Charge>; 8] = Default::default();
    let mut spilled: Vec<(usize, Charge)> = Vec::new();
    let (mut delay_ns, mut delayed_by) = (0, None);
    let mut remaining = u64::MAX;
    for (i, ask) in asks.iter().enumerate() {
        let (decision, charge) = ask.request(cost).take();
        if !decision.is_admitted() {
            for (j, charge) in spilled.into_iter().rev() {
                asks[j].zone.limiter.refund(charge);
            }
            for (j, charge) in taken.iter_mut().enumerate().take(i.min(8)).rev() {
                if let Some(charge) = charge.take() {
                    asks[j].zone.limiter.refund(charge);
                }
            }
            if let Some(fields) = fields.as_deref_mut() {
                fields.clear();
                decision.write_ratelimit_field(&ask.zone.name, fields);
            }
            // The wait is the longest of every zone that would reject it: the zones after
            // this one are asked too, and charged nothing.
            let mut verdict = Verdict {
                admitted: false,
                rejected_by: Some(i),
                impossible: decision.is_impossible(),
                table_full: decision.is_table_full(),
                retry_after_ns: decision.retry_after_ns(),
                delay_ns: 0,
                delayed_by: None,
                remaining: decision.remaining(),
            };
            for later in &asks[i + 1..] {
                let peeked = later.request(cost).peek();
                if peeked.is_impossible() {
                    verdict.impossible = true;
                }
                verdict.retry_after_ns = match (verdict.retry_after_ns, peeked.retry_after_ns()) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    (a, b) => a.or(b),
                };
            }
            if verdict.impossible {
                verdict.retry_after_ns = None;
            }
            return verdict;
        }
        if let Some(fields) = fields.as_deref_mut() {
            if !fields.is_empty() {
                fields.push_str(", ");
            }
            decision.write_ratelimit_field(&ask.zone.name, fields);
        }
        if decision.delay_ns() > delay_ns {
            (delay_ns, delayed_by) = (decision.delay_ns(), Some(i));
        }
        remaining = remaining.min(decision.remaining());
        if let Some(charge) = charge {
            match taken.get_mut(i) {
                Some(slot) => *slot = Some(charge),
                None => spilled.push((i, charge)),
            }
        }
    }
    Verdict {
        admitted: true,
        rejected_by: None,
        impossible: false,
        table_full: false,
        retry_after_ns: None,
        delay_ns,
        delayed_by,
        remaining: if asks.is_empty() { 0 } else { remaining },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Page-aligned memory, as an nginx zone's.
    #[repr(align(4096))]
    struct Page(#[allow(dead_code)] [u8; 4096]);

    struct Memory(Vec<Page>);

    impl Memory {
        fn zone(&mut self, spec: &str, name: &str) -> Result<Zone, SharedError> {
            let policy: Policy = spec.parse().unwrap();
            let (capacity, len) = capacity_for(&policy, self.0.len() * 4096).unwrap();
            #[allow(unsafe_code)]
            // SAFETY: every test drops its zones before the memory.
            let region = unsafe { Region::from_raw(self.0.as_mut_ptr().cast(), len) };
            Zone::open(region, &policy, capacity, OnFull::default(), name)
        }
    }

    const NS: u64 = 1_000_000_000;

    fn memory() -> Memory {
        Memory((0..256).map(|_| Page([0; 4096])).collect())
    }

    #[test]
    fn capacity_is_the_largest_that_fits() {
        for spec in ["token-bucket capacity=5 rate=1/s", "sliding-log limit=40 window=1m"] {
            let policy: Policy = spec.parse().unwrap();
            for bytes in [200_000, 1 << 20, 10 << 20] {
                let (keys, len) = capacity_for(&policy, bytes).unwrap();
                assert!(len <= bytes);
                assert_eq!(KeyedLimiter::<[u8]>::region_size(&policy, keys).unwrap(), len);
                let more = KeyedLimiter::<[u8]>::region_size(&policy, keys + 1).unwrap();
                assert!(more > bytes, "{spec}: {} keys fit in {bytes} too", keys + 1);
            }
        }
        let policy: Policy = "gcra rate=1/s burst=1".parse().unwrap();
        assert_eq!(capacity_for(&policy, 0), None);
        assert_eq!(capacity_for(&policy, usize::MAX).map(|(k, _)| k as u64), Some(MAX_KEYS));
    }

    #[test]
    fn one_zone_decides_as_one_among_others_that_admit_all() {
        // A location of one zone takes a shorter path; beside a zone that admits everything,
        // the same zone takes the general one. Their verdicts agree.
        for spec in ["token-bucket capacity=3 rate=1/h", "leaky-bucket rate=1r/m burst=2"] {
            let (mut a, mut b, mut c) = (memory(), memory(), memory());
            let alone = a.zone(spec, "z").unwrap();
            let paired = b.zone(spec, "z").unwrap();
            let open = c.zone("token-bucket capacity=1000000 rate=1000000/s", "open").unwrap();
            let mut seed = 11u64;
            for _ in 0..300 {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let key = [b'a' + (seed >> 60) as u8 % 4];
                let cost = 1 + (seed >> 40) as u32 % 4;
                let x = decide_bare(&[Ask { zone: &alone, key: &key, burst: None }], cost);
                let y = decide_bare(
                    &[
                        Ask { zone: &paired, key: &key, burst: None },
                        Ask { zone: &open, key: &key, burst: None },
                    ],
                    cost,
                );
                assert_eq!(
                    (x.admitted, x.rejected_by, x.impossible, x.table_full, x.delayed_by),
                    (y.admitted, y.rejected_by, y.impossible, y.table_full, y.delayed_by),
                    "{spec}"
                );
                assert_eq!(x.retry_after_ns.is_some(), y.retry_after_ns.is_some(), "{spec}");
                assert_eq!(x.remaining, y.remaining, "{spec}");
                assert!(x.delay_ns.abs_diff(y.delay_ns) < NS, "{spec}");
            }
        }
    }

    #[test]
    fn without_fields_the_verdicts_are_the_same() {
        let (mut a, mut b, mut c, mut d) = (memory(), memory(), memory(), memory());
        let specs = ["token-bucket capacity=3 rate=1/h", "leaky-bucket rate=1r/m burst=2"];
        let with = [a.zone(specs[0], "a").unwrap(), b.zone(specs[1], "b").unwrap()];
        let bare = [c.zone(specs[0], "a").unwrap(), d.zone(specs[1], "b").unwrap()];
        let mut fields = String::new();
        let mut seed = 7u64;
        for _ in 0..400 {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let (k1, k2) = ([b'a' + (seed >> 60) as u8 % 5], [b'a' + (seed >> 56) as u8 % 5]);
            let cost = 1 + (seed >> 40) as u32 % 2;
            fn asks<'a>(z: &'a [Zone; 2], k1: &'a [u8], k2: &'a [u8]) -> [Ask<'a>; 2] {
                [
                    Ask { zone: &z[0], key: k1, burst: None },
                    Ask { zone: &z[1], key: k2, burst: None },
                ]
            }
            let x = decide(&asks(&with, &k1, &k2), cost, &mut fields);
            let y = decide_bare(&asks(&bare, &k1, &k2), cost);
            assert_eq!(
                (x.admitted, x.rejected_by, x.impossible, x.remaining, x.delayed_by),
                (y.admitted, y.rejected_by, y.impossible, y.remaining, y.delayed_by)
            );
            // The delays are the same but for the time between the two calls.
            assert!(x.delay_ns.abs_diff(y.delay_ns) < NS, "{} and {}", x.delay_ns, y.delay_ns);
            assert_eq!(x.retry_after_ns.is_some(), y.retry_after_ns.is_some());
            assert!(!fields.is_empty());
        }
    }

    #[test]
    fn every_zone_or_none_is_charged() {
        let (mut a, mut b, mut c) = (memory(), memory(), memory());
        let m_zone_slow =
            |m: &mut Memory| m.zone("token-bucket capacity=1 rate=1/d", "slow").unwrap();
        let wide = a.zone("token-bucket capacity=3 rate=1/h", "wide").unwrap();
        let narrow = b.zone("token-bucket capacity=1 rate=1/h", "narrow").unwrap();
        let mut fields = String::new();
        let both = |k1: &'static [u8], k2: &'static [u8]| {
            [Ask { zone: &wide, key: k1, burst: None }, Ask { zone: &narrow, key: k2, burst: None }]
        };
        let v = decide(&both(b"x", b"y"), 1, &mut fields);
        assert!(v.admitted);
        assert_eq!(fields, r#""wide";r=2;t=3600, "narrow";r=0;t=3600"#);
        // Rejected by the second zone: the first one's charge is given back.
        for _ in 0..5 {
            let v = decide(&both(b"x", b"y"), 1, &mut fields);
            assert_eq!((v.admitted, v.rejected_by), (false, Some(1)));
            assert_eq!(fields, r#""narrow";r=0;t=3600"#);
        }
        // So "x" has its two tokens left for other keys of the narrow zone.
        assert!(decide(&both(b"x", b"z1"), 1, &mut fields).admitted);
        assert!(decide(&both(b"x", b"z2"), 1, &mut fields).admitted);
        let v = decide(&both(b"x", b"z3"), 1, &mut fields);
        assert_eq!((v.admitted, v.rejected_by), (false, Some(0)));
        assert!(decide(&[Ask { zone: &narrow, key: b"z3", burst: None }], 1, &mut fields).admitted);
        // Rejected by the first zone, and by the second too, which waits longer: the longer
        // wait is the request's (the second zone is only peeked at).
        let slow = m_zone_slow(&mut c);
        let asks = [
            Ask { zone: &narrow, key: b"y", burst: None },
            Ask { zone: &slow, key: b"s", burst: None },
        ];
        assert!(decide(&[asks[1]], 1, &mut fields).admitted);
        let v = decide(&asks, 1, &mut fields);
        let seconds = v.retry_after_ns.map(|ns| ns.div_ceil(NS));
        assert_eq!(
            (v.rejected_by, seconds),
            (Some(0), Some(86_400)),
            "a day's wait, not an hour's"
        );
        assert_eq!(fields, r#""narrow";r=0;t=3600"#);
        let big = decide(&both(b"fresh", b"fresh"), 2, &mut fields);
        assert_eq!((big.rejected_by, big.impossible, big.retry_after_ns), (Some(1), true, None));
    }

    #[test]
    fn each_location_decides_the_zone_at_its_own_burst() {
        let mut m = memory();
        let policy = rate_zone_policy("1r/m").unwrap();
        let (capacity, len) = capacity_for(&policy, m.0.len() * 4096).unwrap();
        #[allow(unsafe_code)]
        // SAFETY: the zone is dropped before the memory.
        let region = unsafe { Region::from_raw(m.0.as_mut_ptr().cast(), len) };
        let zone = Zone::open(region, &policy, capacity, OnFull::default(), "one").unwrap();
        let wide = Some(Burst { burst: 99, delay: None });
        let strict = Some(Burst { burst: 0, delay: Some(0) });
        let ask = |burst| [Ask { zone: &zone, key: b"k".as_slice(), burst }];
        let mut fields = String::new();
        let admitted = (0..200).filter(|_| decide(&ask(wide), 1, &mut fields).admitted).count();
        assert_eq!(admitted, 100, "burst=99 nodelay: 100 at once");
        // The same key's one state, at the strict location's burst: full.
        let v = decide(&ask(strict), 1, &mut fields);
        assert_eq!((v.admitted, v.remaining), (false, 0));
        // A fresh key at a delaying location: the second request waits a period (60 s, at
        // nginx's 16 milli-requests a second: 1000 * 1000 / 16 ms).
        let delaying = Some(Burst { burst: 5, delay: Some(0) });
        let fresh = |burst| [Ask { zone: &zone, key: b"fresh".as_slice(), burst }];
        assert_eq!(decide(&fresh(delaying), 1, &mut fields).delay_ns, 0);
        let second = decide(&fresh(delaying), 1, &mut fields);
        assert_eq!(
            (second.admitted, second.delay_ns, second.remaining),
            (true, 62_500 * 1_000_000, 4)
        );
        let at_99: Policy = "leaky-bucket rate=1r/m burst=99 nodelay compat=nginx".parse().unwrap();
        assert_eq!(zone.policy_field_for(wide), at_99.ratelimit_policy_field("one"));
        assert_eq!(zone.policy_field_for(None), policy.ratelimit_policy_field("one"));
        // A burst above the zone's own is the zone's.
        let over = Some(Burst { burst: u32::MAX, delay: None });
        assert_eq!(zone.policy_field_for(over), zone.policy_field());
        assert_eq!(policy_burst(&policy), Some(RATE_ZONE_BURST));
        let token: Policy = "token-bucket capacity=3 rate=1/h".parse().unwrap();
        assert_eq!((policy_burst(&token), narrowed_policy(&token, wide)), (None, None));
        for bad in ["10", "r/s", "10r/h", "1.5r/s", "-1r/s", "10 r/s", ""] {
            assert!(rate_zone_policy(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_zone_made_otherwise_is_refused() {
        let mut m = memory();
        let zone = m.zone("token-bucket capacity=3 rate=1/h", "z").unwrap();
        let policy: Policy = "token-bucket capacity=3 rate=1/h".parse().unwrap();
        assert_eq!(zone.policy_field(), policy.ratelimit_policy_field("z"));
        let other = m.zone("token-bucket capacity=4 rate=1/h", "z").err().unwrap();
        assert!(matches!(other, SharedError::Mismatch { field: "policy", .. }), "{other}");
        let again = m.zone("token-bucket capacity=3 rate=1/h", "z").unwrap();
        let ask = |zone| [Ask { zone, key: b"k".as_slice(), burst: None }];
        let mut fields = String::new();
        assert!(decide(&ask(&zone), 3, &mut fields).admitted);
        assert!(!decide(&ask(&again), 1, &mut fields).admitted, "one table, seen twice");
    }
}
