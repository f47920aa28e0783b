//! The in-process store (`BACKEND_TYPE=memory`): one bounded key table of the ratewell engine,
//! whose keys are decided under the limit their rule or override names, all or nothing across
//! a request's descriptors.
//!
//! Each distinct window (a `unit`, times `unit_multiplier`) is one policy registered with the
//! table ([`KeyedLimiter::register`]): `fixed-window limit=4294967295 window=<unit>`, its
//! windows aligned on the clock's zero, which [`EpochClock`](crate::stores::clock::EpochClock) puts on
//! the Unix epoch. Every limit of that window, configured or sent as an override, is decided on
//! it at its own `requests_per_unit`, chosen per call ([`Request::within`](ratewell::Request::within)): so a
//! configuration may hold as many distinct limits as it has rules, and overrides are bounded by
//! memory only. A limit that names a ratewell `policy` is a policy of its own. A request charges
//! its descriptors in order; if the request is denied, every charge is taken back
//! ([`KeyedLimiter::refund`]) before it answers.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, Weak};

use ratewell::{CapacityError, Charge, Clock, KeyedLimiter, Parameters, Policy, PolicyId, Resume};

use crate::configuration::config::RateLimitConfig;
use crate::serving::proto::{Entry, Unit};

/// The most distinct windows (`unit` times `unit_multiplier`) and named `policy` limits one
/// configuration may use: each takes a policy slot of the table (255 in all), and a reload holds
/// the old configuration's and the new one's at once. Limits that differ only in
/// `requests_per_unit` share their window's slot: their number is not bounded.
pub const MAX_CONFIG_POLICIES: usize = 100;

/// A limit as a store decides it: so many requests per unit (or per several units), as a fixed
/// window, or as the ratewell policy the configuration names.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Quota {
    /// Requests per unit (0, without a policy: every request with a cost is over the limit).
    pub requests_per_unit: u32,
    /// The unit.
    pub unit: Unit,
    /// How many units a window is (`unit_multiplier`; 1 without it).
    pub multiplier: u32,
    /// A ratewell policy, canonical, that decides instead of the fixed window (`policy`).
    pub policy: Option<String>,
}

impl Quota {
    /// `requests_per_unit` per `unit`, a fixed window of one unit (the Go service's limit).
    pub fn fixed(requests_per_unit: u32, unit: Unit) -> Quota {
        Quota { requests_per_unit, unit, multiplier: 1, policy: None }
    }

    /// The window's length in nanoseconds (`None` for [`Unit::Unknown`]).
    pub fn window_ns(&self) -> Option<u64> {
        let seconds = self.unit.seconds()?.checked_mul(u64::from(self.multiplier.max(1)))?;
        seconds.checked_mul(1_000_000_000)
    }

    /// Whether nothing at all is admitted (a fixed window of 0 requests).
    pub fn is_zero(&self) -> bool {
        self.policy.is_none() && self.requests_per_unit == 0
    }

    /// The engine's policy for it: the named one, or `fixed-window limit=N window=Ws` (`None`
    /// for 0 requests or an unknown unit). The memory store decides the fixed windows on its
    /// [`window_policy`] instead, at `N` per call.
    pub fn engine_policy(&self) -> Option<Policy> {
        if let Some(text) = &self.policy {
            return text.parse().ok();
        }
        let seconds = self.window_ns()? / 1_000_000_000;
        if self.requests_per_unit == 0 {
            return None;
        }
        let window_ns = seconds.checked_mul(1_000_000_000)?;
        let limit = self.requests_per_unit;
        Policy::new(Parameters::FixedWindow { limit, window_ns, align_first: false }).ok()
    }
}

/// The one policy every fixed window of `seconds` is decided on, at each limit's own
/// `requests_per_unit` ([`Request::within`](ratewell::Request::within)).
pub fn window_policy(seconds: u64) -> Option<Policy> {
    let window_ns = seconds.checked_mul(1_000_000_000)?;
    Policy::new(Parameters::FixedWindow { limit: u32::MAX, window_ns, align_first: false }).ok()
}

/// A policy registered with the table, released when the last configuration (or override
/// cache entry) holding it is dropped.
struct Registered<C: Clock> {
    table: Arc<KeyedLimiter<u64, C>>,
    id: Option<PolicyId>,
}

impl<C: Clock> Drop for Registered<C> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.table.release(id);
        }
    }
}

/// What deciding one check took: its key, its registration (`None` for a limit of 0), its
/// charge if it was charged, and the limit it was decided at per call.
type Taken<C> = (u64, Option<Arc<Registered<C>>>, Option<Charge>, Option<u32>);

/// The registration a check is decided on, and the limit to decide at per call (`None`: the
/// registered policy's own).
type Deciding<C> = (Arc<Registered<C>>, Option<u32>);

/// A key's state as it is, at the limit `within` (else its policy's own).
fn peek<C: Clock>(
    table: &KeyedLimiter<u64, C>,
    key: &u64,
    id: &PolicyId,
    within: Option<u32>,
) -> ratewell::Decision {
    match within {
        Some(limit) => table.request(key).within(id, limit).peek(),
        None => table.request(key).policy(id).peek(),
    }
}

/// The policies of one loaded configuration, registered with the store's table: one per
/// window (by its length in nanoseconds), and one per limit naming a `policy`.
pub struct Prepared<C: Clock> {
    windows: HashMap<u64, Arc<Registered<C>>>,
    policies: HashMap<Quota, Arc<Registered<C>>>,
}

impl<C: Clock> std::fmt::Debug for Prepared<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared")
            .field("windows", &self.windows.len())
            .field("policies", &self.policies.len())
            .finish()
    }
}

impl<C: Clock> Prepared<C> {
    /// Policy slots the configuration holds: its windows and its named policies.
    pub fn slots(&self) -> usize {
        self.windows.len() + self.policies.len()
    }
}

/// One descriptor to decide.
#[derive(Clone, Debug)]
pub struct Check<'a> {
    /// The descriptor's entries.
    pub entries: &'a [Entry],
    /// The `share_threshold` patterns that stand for some of their values.
    pub patterns: Option<&'a [String]>,
    /// Whether the limit is the request's override.
    pub overridden: bool,
    /// Which of the descriptor's limits this is (0: the first; more with `rate_limits`): each
    /// counts under a key of its own.
    pub nth: u8,
    /// Its limit.
    pub quota: Quota,
    /// Its cost (0: only read the state).
    pub cost: u64,
    /// `shadow_mode`: never rejects.
    pub shadow: bool,
    /// `quota_mode` (or the global `QUOTA_MODE`).
    pub quota_mode: bool,
}

/// What the store decided for one descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Over the limit: the request's cost does not fit what remains.
    pub over: bool,
    /// The cost was taken (the request was admitted and the descriptor had room).
    pub charged: bool,
    /// What remains after the request: after the charge if charged, else what there was.
    pub remaining: u64,
    /// What was consumed in the window before the request.
    pub consumed: u64,
    /// The limit decided by: `requests_per_unit`, or the named policy's own (a bucket's
    /// capacity).
    pub limit: u64,
    /// Nanoseconds until the window ends.
    pub reset_ns: u64,
}

impl Outcome {
    /// The outcome for a limit of 0 requests: over for any cost, nothing counted.
    pub fn zero(cost: u64, reset_ns: u64) -> Self {
        Outcome { over: cost > 0, charged: false, remaining: 0, consumed: 0, limit: 0, reset_ns }
    }

    /// The outcome of the decision `d` for a cost of `cost`: `charged` if its cost was taken,
    /// `over` if it did not fit, resetting in `reset_ns`.
    pub fn of(d: &ratewell::Decision, cost: u64, charged: bool, over: bool, reset_ns: u64) -> Self {
        let remaining = d.remaining();
        let before = if charged { remaining.saturating_add(cost) } else { remaining };
        Outcome {
            over,
            charged,
            remaining,
            consumed: d.limit().saturating_sub(before),
            limit: d.limit(),
            reset_ns,
        }
    }
}

/// Why the store could not decide.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreError {
    /// A limit the table cannot register (a unit of `UNKNOWN`, or no slot free).
    Unregistrable(String),
    /// The Redis server did not decide: down, too slow, or answering what the script does not.
    Redis(String),
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Unregistrable(why) => write!(f, "{why}"),
            StoreError::Redis(why) => write!(f, "redis: {why}"),
        }
    }
}

impl std::error::Error for StoreError {}

/// A configured limit's limits as a store decides them: its own, then its further ones
/// (`rate_limits`).
pub fn quotas(limit: &crate::configuration::config::RateLimit) -> Vec<Quota> {
    let first = Quota {
        requests_per_unit: limit.requests_per_unit,
        unit: limit.unit,
        multiplier: limit.unit_multiplier,
        policy: limit.policy.clone(),
    };
    let more = limit.more.iter().map(|m| Quota {
        requests_per_unit: m.requests_per_unit,
        unit: m.unit,
        multiplier: m.unit_multiplier,
        policy: m.policy.clone(),
    });
    std::iter::once(first).chain(more).collect()
}

/// Whether a request whose descriptors came out as `items` (over, shadow, quota mode) is
/// denied: when a descriptor that is neither shadow nor quota mode is over, or when every
/// quota-mode descriptor is (envoyproxy/ratelimit's overall code, before the global
/// `SHADOW_MODE`). A shadow descriptor's answer is OK, so it never counts as over;
/// `extra_quota` counts descriptors without a decision (no limit applies) that are quota mode
/// under the global `QUOTA_MODE`, never over.
pub fn denied(items: impl Iterator<Item = (bool, bool, bool)>, extra_quota: usize) -> bool {
    let (mut quota_total, mut quota_over) = (extra_quota, 0);
    for (over, shadow, quota) in items {
        let over = over && !shadow;
        if quota {
            quota_total += 1;
            quota_over += usize::from(over);
        } else if over {
            return true;
        }
    }
    quota_total > 0 && quota_total == quota_over
}

/// The first bytes of a state file (`STATE_FILE`).
pub const STATE_MAGIC: [u8; 8] = *b"RWRLSST\n";

fn hasher_of(seeds: [u64; 4]) -> ahash::RandomState {
    ahash::RandomState::with_seeds(seeds[0], seeds[1], seeds[2], seeds[3])
}

/// A check of a state file's seeds (a corrupted seed would hash every descriptor elsewhere).
fn seeds_check(seeds: [u64; 4]) -> u64 {
    ahash::RandomState::with_seeds(1, 2, 3, 4).hash_one(seeds) ^ 0x5254_4c53
}

/// The in-process store.
pub struct MemoryStore<C: Clock> {
    table: Arc<KeyedLimiter<u64, C>>,
    /// The sliding logs' table (a log is not one word: it has a table of its own).
    logs: Arc<KeyedLimiter<u64, C>>,
    hasher: ahash::RandomState,
    /// The seeds of `hasher`: a state file keeps them, so that descriptors hash to the same keys.
    seeds: [u64; 4],
    /// The capacity asked for (a restore builds its tables alike).
    capacity: usize,
    /// The tables' clock.
    clock: C,
    /// Every window registered, shared by the configurations and the overrides that use it.
    windows: Mutex<HashMap<u64, Weak<Registered<C>>>>,
    /// The windows of the overrides seen (one per unit: a handful), kept registered.
    overrides: Mutex<HashMap<u64, Arc<Registered<C>>>>,
}

impl<C: Clock + Clone> std::fmt::Debug for MemoryStore<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore").field("capacity", &self.table.metrics().capacity).finish()
    }
}

impl<C: Clock + Clone> MemoryStore<C> {
    /// A store for up to `capacity` keys (16 bytes each, allocated now; sliding logs, whose
    /// memory grows with use, up to as many more), reading `clock`.
    pub fn new(capacity: usize, clock: C) -> Result<Self, CapacityError> {
        // The tables' own policies decide no key: every decision names a registered one.
        let default: Policy = "fixed-window limit=1 window=1s".parse().expect("a valid policy");
        let log: Policy = "sliding-log limit=1 window=1s".parse().expect("a valid policy");
        let table = KeyedLimiter::builder(&default, capacity).clock(clock.clone()).build()?;
        let logs = KeyedLimiter::builder(&log, capacity).clock(clock.clone()).build()?;
        let random = ahash::RandomState::new();
        let seeds = [1u64, 2, 3, 4].map(|i| random.hash_one(i));
        Ok(MemoryStore {
            table: Arc::new(table),
            logs: Arc::new(logs),
            hasher: hasher_of(seeds),
            seeds,
            capacity,
            clock,
            windows: Mutex::new(HashMap::new()),
            overrides: Mutex::new(HashMap::new()),
        })
    }

    /// Write the store's keys to the file at `path` (`STATE_FILE`), replacing it only once the
    /// new one is whole; the keys written. Decisions go on meanwhile.
    ///
    /// The file: [`STATE_MAGIC`], the descriptor hash's four seeds, a check of them, then the
    /// two tables' snapshots (each with its length; the engine's format, checksummed).
    pub fn save(&self, path: &std::path::Path) -> std::io::Result<u64> {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&STATE_MAGIC);
        for seed in self.seeds {
            bytes.extend_from_slice(&seed.to_le_bytes());
        }
        bytes.extend_from_slice(&seeds_check(self.seeds).to_le_bytes());
        let mut keys = 0;
        for table in [&self.table, &self.logs] {
            let mut snapshot = Vec::new();
            keys += table.snapshot(&mut snapshot)?.keys;
            bytes.extend_from_slice(&(snapshot.len() as u64).to_le_bytes());
            bytes.extend_from_slice(&snapshot);
        }
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = std::path::PathBuf::from(tmp);
        let mut file = std::fs::File::create(&tmp)?;
        std::io::Write::write_all(&mut file, &bytes)?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&tmp, path)?;
        Ok(keys)
    }

    /// Restore the keys of a state file written by [`save`](Self::save) into this new store
    /// (before any configuration registers its limits); the keys restored. On an error the
    /// store is unchanged.
    ///
    /// The service's clock reads nanoseconds since the Unix epoch ([`EpochClock`]), so the new
    /// process's clock is already on the snapshot's time line: the states are restored with no
    /// shift ([`Resume::SameClock`]), the time that passed is on the clock itself, and fixed
    /// windows stay on the epoch's boundaries, as every replica's are. A wall clock that reads
    /// earlier than the snapshot mints nothing: a state ahead of the clock is decided at its
    /// own time.
    ///
    /// [`EpochClock`]: crate::stores::clock::EpochClock
    pub fn restore(&mut self, bytes: &[u8]) -> Result<u64, String> {
        let bad = |what: &str| format!("not a state file of this service: {what}");
        let rest = bytes.strip_prefix(&STATE_MAGIC[..]).ok_or_else(|| bad("bad magic"))?;
        if rest.len() < 40 {
            return Err(bad("truncated"));
        }
        let word = |i: usize| u64::from_le_bytes(rest[i * 8..i * 8 + 8].try_into().expect("8"));
        let seeds = [word(0), word(1), word(2), word(3)];
        if seeds_check(seeds) != word(4) {
            return Err(bad("the seeds' check does not match"));
        }
        let mut rest = &rest[40..];
        let mut parts = [&[][..], &[][..]];
        for part in &mut parts {
            let len = rest.get(..8).ok_or_else(|| bad("truncated"))?;
            let len = usize::try_from(u64::from_le_bytes(len.try_into().expect("8")))
                .map_err(|_| bad("a length"))?;
            *part = rest.get(8..8usize.saturating_add(len)).ok_or_else(|| bad("truncated"))?;
            rest = &rest[8 + len..];
        }
        if !rest.is_empty() {
            return Err(bad("bytes after the last table"));
        }
        if Arc::strong_count(&self.table) > 1 || Arc::strong_count(&self.logs) > 1 {
            return Err("the store is in use: restore a new one".into());
        }
        // Into new tables, put in place only once both are restored: nothing half-restored.
        let fresh = |like: &KeyedLimiter<u64, C>| {
            KeyedLimiter::builder(&like.policy(), self.capacity)
                .clock(self.clock.clone())
                .build()
                .map_err(|e| e.to_string())
        };
        let (mut table, mut logs) = (fresh(&self.table)?, fresh(&self.logs)?);
        let restored = table
            .restore(parts[0], Resume::SameClock)
            .map_err(|e| format!("the key table: {e}"))?;
        let logged = logs
            .restore(parts[1], Resume::SameClock)
            .map_err(|e| format!("the sliding logs' table: {e}"))?;
        self.table = Arc::new(table);
        self.logs = Arc::new(logs);
        self.seeds = seeds;
        self.hasher = hasher_of(seeds);
        Ok(restored.keys + logged.keys)
    }

    /// The key table (its metrics, its clock).
    pub fn table(&self) -> &KeyedLimiter<u64, C> {
        &self.table
    }

    /// The key a descriptor is counted under: its domain and entries (the value of an entry
    /// matched by a `share_threshold` wildcard replaced by the pattern, so every value the
    /// pattern matches shares one count), and its window's length. A request's limit override
    /// counts under its own key, its `requests_per_unit` in it too, so that no two limits of one
    /// request share a key. Unambiguous: each string is hashed with its length.
    ///
    /// So a reload that changes a rule's `requests_per_unit` keeps what its keys consumed (they
    /// are converted), and one that changes its unit starts them afresh in the new windows.
    pub fn key(
        &self,
        domain: &str,
        entries: &[Entry],
        patterns: Option<&[String]>,
        quota: &Quota,
        overridden: bool,
    ) -> u64 {
        let mut h = self.hasher.build_hasher();
        quota.window_ns().hash(&mut h);
        if overridden {
            quota.requests_per_unit.hash(&mut h);
        }
        domain.hash(&mut h);
        for (i, entry) in entries.iter().enumerate() {
            entry.key.hash(&mut h);
            match patterns.and_then(|p| p.get(i)).filter(|p| !p.is_empty()) {
                Some(pattern) => {
                    h.write_u8(1);
                    pattern.hash(&mut h);
                }
                None => {
                    h.write_u8(0);
                    entry.value.hash(&mut h);
                }
            }
        }
        h.finish()
    }

    /// The registration a limit naming a `policy` is decided on (`None`: the limit names none).
    fn register(&self, quota: &Quota) -> Result<Option<Arc<Registered<C>>>, StoreError> {
        if quota.policy.is_none() {
            return Ok(None);
        }
        let Some(policy) = quota.engine_policy() else {
            return Err(StoreError::Unregistrable(format!(
                "a limit of {} per {} has no policy",
                quota.requests_per_unit,
                quota.unit.name()
            )));
        };
        let table = match policy.parameters() {
            ratewell::Parameters::SlidingLog { .. } => &self.logs,
            _ => &self.table,
        };
        let id = table.register(&policy).map_err(|e| StoreError::Unregistrable(e.to_string()))?;
        Ok(Some(Arc::new(Registered { table: table.clone(), id: Some(id) })))
    }

    /// The registration the fixed windows of `quota`'s length are decided on: the one already
    /// registered while anything holds it, else a new one.
    fn window(&self, quota: &Quota) -> Result<(u64, Arc<Registered<C>>), StoreError> {
        let no_window = || {
            StoreError::Unregistrable(format!(
                "a limit of {} per {} has no window",
                quota.requests_per_unit,
                quota.unit.name()
            ))
        };
        let window = quota.window_ns().ok_or_else(no_window)?;
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = windows.get(&window).and_then(Weak::upgrade) {
            return Ok((window, r));
        }
        let policy = window_policy(window / 1_000_000_000).ok_or_else(no_window)?;
        let id =
            self.table.register(&policy).map_err(|e| StoreError::Unregistrable(e.to_string()))?;
        let registered = Arc::new(Registered { table: self.table.clone(), id: Some(id) });
        windows.retain(|_, r| r.strong_count() > 0);
        windows.insert(window, Arc::downgrade(&registered));
        Ok((window, registered))
    }

    /// A check's key: its descriptor's ([`key`](Self::key)), and for a descriptor's further
    /// limit its position too.
    pub fn check_key(&self, domain: &str, check: &Check<'_>) -> u64 {
        let key = self.key(domain, check.entries, check.patterns, &check.quota, check.overridden);
        if check.nth == 0 {
            return key;
        }
        self.hasher.hash_one((key, check.nth))
    }

    /// Register every window and named policy of `config`, or say why not (more than
    /// [`MAX_CONFIG_POLICIES`] of them).
    pub fn prepare(&self, config: &RateLimitConfig) -> Result<Prepared<C>, String> {
        let (mut windows, mut policies) = (HashMap::new(), HashMap::new());
        let too_many = || {
            format!(
                "a configuration may use at most {MAX_CONFIG_POLICIES} distinct windows (unit and unit_multiplier) and limits naming a policy"
            )
        };
        for quota in config.limits().into_iter().filter(|l| !l.unlimited).flat_map(quotas) {
            if quota.policy.is_some() {
                if policies.contains_key(&quota) {
                    continue;
                }
                if windows.len() + policies.len() == MAX_CONFIG_POLICIES {
                    return Err(too_many());
                }
                if let Some(registered) = self.register(&quota).map_err(|e| e.to_string())? {
                    policies.insert(quota, registered);
                }
            } else if quota.window_ns().is_some_and(|w| !windows.contains_key(&w)) {
                if windows.len() + policies.len() == MAX_CONFIG_POLICIES {
                    return Err(too_many());
                }
                let (window, registered) = self.window(&quota).map_err(|e| e.to_string())?;
                windows.insert(window, registered);
            }
        }
        Ok(Prepared { windows, policies })
    }

    /// The window an override's limit is decided on: its unit's, kept registered once seen
    /// (overrides name a unit, and no multiplier: a handful in all).
    fn override_window(&self, quota: &Quota) -> Result<Arc<Registered<C>>, StoreError> {
        let window = quota.window_ns().unwrap_or(0);
        if let Some(r) = self.overrides.lock().unwrap_or_else(|e| e.into_inner()).get(&window) {
            return Ok(r.clone());
        }
        let (window, registered) = self.window(quota)?;
        let mut overrides = self.overrides.lock().unwrap_or_else(|e| e.into_inner());
        Ok(overrides.entry(window).or_insert(registered).clone())
    }

    /// The registration `check`'s limit is decided on (`None` for a limit of 0 requests), and
    /// the limit to decide at per call (`None`: the registered policy's own).
    fn registration(
        &self,
        prepared: &Prepared<C>,
        quota: &Quota,
    ) -> Result<Option<Deciding<C>>, StoreError> {
        if quota.policy.is_some() {
            return match prepared.policies.get(quota) {
                Some(r) => Ok(Some((r.clone(), None))),
                None => self.register(quota).map(|r| r.map(|r| (r, None))),
            };
        }
        if quota.requests_per_unit == 0 {
            // Nothing is counted for it; only its window must be one.
            quota.window_ns().ok_or_else(|| {
                StoreError::Unregistrable(format!(
                    "a limit of 0 per {} has no window",
                    quota.unit.name()
                ))
            })?;
            return Ok(None);
        }
        let within = Some(quota.requests_per_unit);
        match quota.window_ns().and_then(|w| prepared.windows.get(&w)) {
            Some(r) => Ok(Some((r.clone(), within))),
            None => Ok(Some((self.override_window(quota)?, within))),
        }
    }

    /// Decide `checks` at one instant, all or nothing: each is charged in turn; then, if the
    /// request is [`denied`] (`extra_quota` as there), every charge is taken back. One
    /// [`Outcome`] per check is written to `out` (cleared first). Returns whether the request
    /// was denied.
    pub fn decide(
        &self,
        prepared: &Prepared<C>,
        domain: &str,
        checks: &[Check<'_>],
        extra_quota: usize,
        out: &mut Vec<Outcome>,
    ) -> Result<bool, StoreError> {
        out.clear();
        // Per check: its key and registration (`None` for a limit of 0), and what it took.
        let mut taken: Vec<Taken<C>> = Vec::with_capacity(checks.len());
        let now = self.clock.now();
        for check in checks {
            let (registered, within) = match self.registration(prepared, &check.quota) {
                Ok(Some((r, within))) => (Some(r), within),
                Ok(None) => (None, None),
                Err(e) => {
                    // Nothing of an undecided request stays charged.
                    for (_, registered, charge, _) in taken {
                        if let (Some(r), Some(charge)) = (registered, charge) {
                            r.table.refund(charge);
                        }
                    }
                    return Err(e);
                }
            };
            let key = self.check_key(domain, check);
            let window = check.quota.window_ns().unwrap_or(1);
            let window_reset = window - now % window;
            let Some((table, id)) =
                registered.as_ref().and_then(|r| Some((&r.table, r.id.as_ref()?)))
            else {
                // No requests at all: any cost is over, and nothing is counted.
                out.push(Outcome::zero(check.cost, window_reset));
                taken.push((key, registered, None, within));
                continue;
            };
            // A fixed window resets at its end; another policy when the key is full again.
            let reset = |d: &ratewell::Decision| {
                if check.quota.policy.is_none() { window_reset } else { d.reset_after_ns() }
            };
            let (d, charge, over) = match u32::try_from(check.cost) {
                Ok(0) => (peek(table, &key, id, within), None, false),
                Ok(cost) => {
                    let (d, charge) = match within {
                        Some(limit) => table.request(&key).within(id, limit).cost(cost).take(),
                        None => table.request(&key).policy(id).cost(cost).take(),
                    };
                    let over = charge.is_none();
                    (d, charge, over)
                }
                // More than any limit holds: over, and nothing taken.
                Err(_) => (peek(table, &key, id, within), None, true),
            };
            let outcome = Outcome::of(&d, check.cost, charge.is_some(), over, reset(&d));
            out.push(outcome);
            taken.push((key, registered, charge, within));
        }
        let items = out.iter().zip(checks).map(|(o, c)| (o.over, c.shadow, c.quota_mode));
        let denied = denied(items, extra_quota);
        if denied {
            let mut refunded = false;
            for (_, registered, charge, _) in &mut taken {
                if let (Some(r), Some(charge)) = (registered.as_ref(), charge.take()) {
                    r.table.refund(charge);
                    refunded = true;
                }
            }
            // Each reports what its key had before the request: read again once the charges
            // are back (a descriptor decided after a charge on its own key saw that charge).
            if refunded {
                for (((key, registered, _, within), outcome), check) in
                    taken.iter().zip(out.iter_mut()).zip(checks)
                {
                    if let Some(r) = registered {
                        if let Some(id) = r.id.as_ref() {
                            let d = peek(&r.table, key, id, *within);
                            outcome.remaining = d.remaining();
                            if check.quota.policy.is_some() {
                                outcome.reset_ns = d.reset_after_ns();
                            }
                        }
                    }
                    outcome.charged = false;
                }
            }
        }
        Ok(denied)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_overall_rule() {
        // (over, shadow, quota)
        assert!(!denied([(false, false, false)].into_iter(), 0));
        assert!(denied([(false, false, false), (true, false, false)].into_iter(), 0));
        assert!(!denied([(true, true, false)].into_iter(), 0), "shadow never rejects");
        assert!(denied([(true, false, true)].into_iter(), 0), "the only quota descriptor is over");
        assert!(!denied([(true, false, true), (false, false, true)].into_iter(), 0));
        assert!(
            !denied([(true, false, true)].into_iter(), 1),
            "a quota descriptor without a limit"
        );
        assert!(!denied([(true, true, true)].into_iter(), 0), "shadow and quota: OK");
    }
}
