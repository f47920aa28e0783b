//! `ShouldRateLimit`, decided as envoyproxy/ratelimit answers it (its `src/service/ratelimit.go`
//! and `src/limiter/base_limiter.go`), with every descriptor of a request charged all or
//! nothing.
//!
//! ```
//! use ratewell::ManualClock;
//! use ratewell_rls::config::{ConfigFile, RateLimitConfig};
//! use ratewell_rls::proto::{Code, Entry, RateLimitDescriptor, RateLimitRequest};
//! use ratewell_rls::service::{RateLimitService, ServiceSettings};
//!
//! let file = ConfigFile::parse("edge.yaml", "
//! domain: edge
//! descriptors:
//!   - key: remote_address
//!     rate_limit: {unit: minute, requests_per_unit: 2}
//! ")?;
//! let config = RateLimitConfig::new(&[file], false)?;
//! let service = RateLimitService::memory(ServiceSettings::default(), 1_000, ManualClock::new(0))?;
//! service.set_config(config)?;
//! let runtime = tokio::runtime::Builder::new_current_thread().build()?;
//! let request = RateLimitRequest {
//!     domain: "edge".into(),
//!     descriptors: vec![RateLimitDescriptor {
//!         entries: vec![Entry { key: "remote_address".into(), value: "10.0.0.1".into() }],
//!         ..Default::default()
//!     }],
//!     hits_addend: 0,
//! };
//! let codes: Vec<i32> = (0..3)
//!     .map(|_| runtime.block_on(service.should_rate_limit(&request)).unwrap().overall_code)
//!     .collect();
//! assert_eq!(codes, [Code::Ok as i32, Code::Ok as i32, Code::OverLimit as i32]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod metadata;

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use ratewell::Clock;

use crate::configuration::config::{RateLimit as ConfigLimit, RateLimitConfig};
use crate::serving::proto::{
    Code, DescriptorStatus, HeaderValue, RateLimit, RateLimitDescriptor, RateLimitRequest,
    RateLimitResponse, Unit,
};
use crate::stores::memory::{Check, MemoryStore, Outcome, Prepared, StoreError, quotas};
use crate::stores::redis::RedisStore;
use crate::telemetry::stats::{Stats, near_threshold};

/// The most descriptors one request may carry; more is an `INVALID_ARGUMENT` error.
pub const MAX_DESCRIPTORS: usize = 1_000;

/// What the service reads from its environment once (envoyproxy/ratelimit's settings).
#[derive(Clone, Debug)]
pub struct ServiceSettings {
    /// `SHADOW_MODE`: a request over the limit is answered OK (its statuses keep OVER_LIMIT).
    pub shadow_mode: bool,
    /// `QUOTA_MODE`: every descriptor is in quota mode.
    pub quota_mode: bool,
    /// `NEAR_LIMIT_RATIO`: the share of a limit past which hits count as near it.
    pub near_limit_ratio: f32,
    /// `LIMIT_RESPONSE_HEADERS_ENABLED`, with `LIMIT_LIMIT_HEADER`, `LIMIT_REMAINING_HEADER` and
    /// `LIMIT_RESET_HEADER`: the header names, if enabled.
    pub headers: Option<[String; 3]>,
    /// `RESPONSE_DYNAMIC_METADATA`: the request and the matched rules' metadata in the
    /// response's `dynamic_metadata`.
    pub dynamic_metadata: bool,
    /// `MAX_STATS_KEYS`: the bound on distinct per-rule statistics keys.
    pub max_stats_keys: usize,
    /// `REDIS_FAILOVER`: the answer when the Redis server cannot decide.
    pub failover: Failover,
}

impl Default for ServiceSettings {
    fn default() -> Self {
        ServiceSettings {
            shadow_mode: false,
            quota_mode: false,
            near_limit_ratio: 0.8,
            headers: None,
            dynamic_metadata: false,
            max_stats_keys: crate::telemetry::stats::DEFAULT_MAX_STATS_KEYS,
            failover: Failover::Error,
        }
    }
}

/// The default response header names (`LIMIT_*_HEADER`).
pub fn default_header_names() -> [String; 3] {
    ["RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"].map(str::to_owned)
}

/// Why a request was answered with an error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServiceError {
    /// The Go service's request errors, in its words (gRPC `UNKNOWN`, as it answers them):
    /// `rate limit domain must not be empty`, `rate limit descriptor list must not be empty`,
    /// `no rate limit configuration loaded`.
    Request(&'static str),
    /// A request this service bounds or cannot read (gRPC `INVALID_ARGUMENT`): too many
    /// descriptors, an override with an unknown unit.
    Invalid(String),
    /// The store could not decide (gRPC `UNAVAILABLE`).
    Store(StoreError),
}

impl std::fmt::Display for ServiceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServiceError::Request(m) => f.write_str(m),
            ServiceError::Invalid(m) => f.write_str(m),
            ServiceError::Store(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ServiceError {}

impl From<ServiceError> for tonic::Status {
    fn from(e: ServiceError) -> Self {
        match &e {
            ServiceError::Request(m) => tonic::Status::unknown(*m),
            ServiceError::Invalid(m) => tonic::Status::invalid_argument(m.clone()),
            ServiceError::Store(_) => tonic::Status::unavailable(e.to_string()),
        }
    }
}

/// A configuration loaded, with its limits registered with the memory store.
struct Loaded<C: Clock> {
    config: RateLimitConfig,
    prepared: Option<Prepared<C>>,
}

/// Where decisions are made.
pub enum Store<C: Clock> {
    /// In process (`BACKEND_TYPE=memory`).
    Memory(MemoryStore<C>),
    /// On a Redis server every instance shares (`BACKEND_TYPE=redis`).
    Redis(RedisStore),
}

/// What a request is answered when the Redis server cannot decide it (`REDIS_FAILOVER`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failover {
    /// A gRPC `UNAVAILABLE` error (the Go service's answer): Envoy's `failure_mode_deny` then
    /// decides.
    Error,
    /// OK, every descriptor with its whole limit remaining, nothing counted.
    Open,
    /// OVER_LIMIT, every descriptor with nothing remaining.
    Closed,
}

/// The rate limit service: the loaded configuration, the store and the statistics.
pub struct RateLimitService<C: Clock> {
    settings: ServiceSettings,
    store: Store<C>,
    loaded: RwLock<Option<Arc<Loaded<C>>>>,
    stats: Arc<Stats>,
}

impl<C: Clock> std::fmt::Debug for RateLimitService<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitService").field("settings", &self.settings).finish_non_exhaustive()
    }
}

/// One descriptor on its way through a request.
struct Slot {
    limit: Option<ConfigLimit>,
    unlimited: bool,
}

impl<C: Clock + Clone> RateLimitService<C> {
    /// A service deciding in process, in a table of `capacity` keys (`MEMORY_CAPACITY`), on
    /// `clock` (an [`EpochClock`](crate::stores::clock::EpochClock) in production).
    pub fn memory(
        settings: ServiceSettings,
        capacity: usize,
        clock: C,
    ) -> Result<Self, ratewell::CapacityError> {
        let store = Store::Memory(MemoryStore::new(capacity, clock)?);
        Ok(Self::with_store(settings, store))
    }

    /// A service deciding on `store`.
    pub fn with_store(settings: ServiceSettings, store: Store<C>) -> Self {
        let stats = Arc::new(Stats::new(settings.max_stats_keys));
        RateLimitService { settings, store, loaded: RwLock::new(None), stats }
    }

    /// The statistics.
    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// The settings.
    pub fn settings(&self) -> &ServiceSettings {
        &self.settings
    }

    /// The store.
    pub fn store(&self) -> &Store<C> {
        &self.store
    }

    /// Put `config` in force (counted in `config_load_success`), or refuse it and keep the one
    /// in force (counted in `config_load_error`).
    pub fn set_config(&self, config: RateLimitConfig) -> Result<(), String> {
        let prepared = match &self.store {
            Store::Memory(memory) => memory.prepare(&config).map(Some),
            Store::Redis(_) => Ok(None),
        };
        match prepared {
            Ok(prepared) => {
                let loaded = Arc::new(Loaded { config, prepared });
                *self.loaded.write().unwrap_or_else(|e| e.into_inner()) = Some(loaded);
                self.stats.config_load_success.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                self.config_error();
                Err(e)
            }
        }
    }

    /// Count a configuration refused before it reached [`set_config`](Self::set_config).
    pub fn config_error(&self) {
        self.stats.config_load_error.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether a configuration is in force, and whether it has a domain.
    pub fn config_state(&self) -> (bool, bool) {
        let loaded = self.current();
        (loaded.is_some(), loaded.is_some_and(|l| !l.config.is_empty()))
    }

    /// The configuration in force as `/rlconfig` prints it (empty before one is loaded).
    pub fn dump_config(&self) -> String {
        self.current().map(|l| l.config.dump()).unwrap_or_default()
    }

    fn current(&self) -> Option<Arc<Loaded<C>>> {
        self.loaded.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Answer one request (counted in the statistics, its time included).
    pub async fn should_rate_limit(
        &self,
        request: &RateLimitRequest,
    ) -> Result<RateLimitResponse, ServiceError> {
        let start = Instant::now();
        self.stats.total_requests.fetch_add(1, Ordering::Relaxed);
        let result = self.decide(request).await;
        match &result {
            Err(ServiceError::Store(_)) => {
                self.stats.redis_error.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                self.stats.service_error.fetch_add(1, Ordering::Relaxed);
            }
            Ok(_) => {}
        }
        self.stats.response_time.record(start.elapsed());
        result
    }

    async fn decide(&self, request: &RateLimitRequest) -> Result<RateLimitResponse, ServiceError> {
        if request.domain.is_empty() {
            return Err(ServiceError::Request("rate limit domain must not be empty"));
        }
        if request.descriptors.is_empty() {
            return Err(ServiceError::Request("rate limit descriptor list must not be empty"));
        }
        if request.descriptors.len() > MAX_DESCRIPTORS {
            return Err(ServiceError::Invalid(format!(
                "at most {MAX_DESCRIPTORS} descriptors in a request, not {}",
                request.descriptors.len()
            )));
        }
        let Some(loaded) = self.current() else {
            return Err(ServiceError::Request("no rate limit configuration loaded"));
        };
        let settings = &self.settings;

        // The limits, `replaces` applied (envoyproxy/ratelimit's constructLimitsToCheck).
        let limits: Vec<Option<ConfigLimit>> = request
            .descriptors
            .iter()
            .map(|d| loaded.config.get_limit(&request.domain, d))
            .collect();
        // The names some matched limit replaces (most requests have none: no set is built).
        let replacing: HashSet<String> =
            limits.iter().flatten().flat_map(|l| l.replaces.iter().cloned()).collect();
        let slots: Vec<Slot> = limits
            .into_iter()
            .map(|limit| {
                let unlimited = limit.as_ref().is_some_and(|l| l.unlimited);
                let replaced = limit
                    .as_ref()
                    .is_some_and(|l| !l.name.is_empty() && replacing.contains(&l.name));
                let limit = if unlimited || replaced { None } else { limit };
                Slot { limit, unlimited }
            })
            .collect();

        // The checks for the store, one per descriptor with a limit.
        let mut checks = Vec::new();
        // Per descriptor, the range of its checks (one per limit).
        let mut check_of: Vec<Option<std::ops::Range<usize>>> = vec![None; slots.len()];
        let mut extra_quota = 0;
        for (i, (slot, descriptor)) in slots.iter().zip(&request.descriptors).enumerate() {
            let Some(limit) = &slot.limit else {
                if !slot.unlimited && settings.quota_mode {
                    extra_quota += 1;
                }
                continue;
            };
            if limit.unit.seconds().is_none() {
                return Err(ServiceError::Invalid(format!(
                    "descriptor {i}: a limit of {} per UNKNOWN unit",
                    limit.requests_per_unit
                )));
            }
            let cost = hits(request, descriptor);
            let start = checks.len();
            for (nth, quota) in quotas(limit).into_iter().enumerate() {
                checks.push(Check {
                    entries: &descriptor.entries,
                    patterns: limit.share_threshold_key_pattern.as_deref(),
                    overridden: descriptor.limit.is_some(),
                    nth: nth as u8,
                    quota,
                    cost,
                    shadow: limit.shadow_mode,
                    quota_mode: settings.quota_mode || limit.quota_mode,
                });
            }
            check_of[i] = Some(start..checks.len());
        }

        let mut outcomes = Vec::with_capacity(checks.len());
        let decided = match (&self.store, &loaded.prepared) {
            (Store::Memory(memory), Some(prepared)) => {
                memory.decide(prepared, &request.domain, &checks, extra_quota, &mut outcomes)
            }
            (Store::Redis(redis), _) => {
                redis.decide(&request.domain, &checks, extra_quota, &mut outcomes).await
            }
            (Store::Memory(_), None) => unreachable!("a memory store's configuration is prepared"),
        };
        let denied = match decided {
            Ok(denied) => denied,
            Err(StoreError::Redis(_)) if settings.failover != Failover::Error => {
                // Counted as the store's error; answered as configured, on the wall clock.
                self.stats.redis_error.fetch_add(1, Ordering::Relaxed);
                let open = settings.failover == Failover::Open;
                let wall = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64);
                outcomes = checks
                    .iter()
                    .map(|c| {
                        let limit = u64::from(c.quota.requests_per_unit);
                        let window = c.quota.window_ns().unwrap_or(1).max(1);
                        let remaining = if open { limit } else { 0 };
                        let reset_ns = window - wall % window;
                        Outcome {
                            over: !open,
                            charged: false,
                            remaining,
                            consumed: limit - remaining,
                            limit,
                            reset_ns,
                        }
                    })
                    .collect();
                !open
            }
            Err(e) => return Err(ServiceError::Store(e)),
        };

        // The statuses, in the request's order.
        let mut response = RateLimitResponse::default();
        let mut header_status: Option<usize> = None;
        let mut min_remaining = u32::MAX;
        let mut passed = Vec::new();
        for (i, slot) in slots.iter().enumerate() {
            let status = match (&slot.limit, check_of[i].clone()) {
                (Some(limit), Some(range)) => {
                    // A descriptor with several limits reports the first that is over, else the
                    // one with the least remaining.
                    let start = range.start;
                    let outcomes = &outcomes[range];
                    let k = outcomes.iter().position(|o| o.over).unwrap_or_else(|| {
                        let least = outcomes.iter().map(|o| o.remaining).min().unwrap_or(0);
                        outcomes.iter().position(|o| o.remaining == least).unwrap_or(0)
                    });
                    let (check, outcome) = (&checks[start + k], &outcomes[k]);
                    self.count(limit, check, outcome);
                    let (name, rpu, unit) = match k.checked_sub(1).and_then(|m| limit.more.get(m)) {
                        Some(m) => (&m.name, m.requests_per_unit, m.unit),
                        None => (&limit.name, limit.requests_per_unit, limit.unit),
                    };
                    status(name, rpu, unit, check, outcome)
                }
                _ if slot.unlimited => DescriptorStatus {
                    code: Code::Ok as i32,
                    limit_remaining: u32::MAX,
                    ..Default::default()
                },
                _ => DescriptorStatus { code: Code::Ok as i32, ..Default::default() },
            };
            let quota_mode =
                settings.quota_mode || slot.limit.as_ref().is_some_and(|l| l.quota_mode);
            if settings.headers.is_some()
                && status.current_limit.is_some()
                && status.limit_remaining < min_remaining
            {
                header_status = Some(i);
                min_remaining = status.limit_remaining;
            }
            if status.code == Code::OverLimit as i32 {
                if !quota_mode {
                    header_status = Some(i);
                    min_remaining = 0;
                }
            } else if !slot.unlimited {
                passed.push(i);
            }
            response.statuses.push(status);
        }
        let mut overall = if denied { Code::OverLimit } else { Code::Ok };
        if let (Some(names), Some(i)) = (&settings.headers, header_status) {
            let status = &response.statuses[i];
            let limit = status.current_limit.as_ref().map_or(0, |l| l.requests_per_unit);
            let reset = status.duration_until_reset.as_ref().map_or(0, |d| d.seconds);
            response.response_headers_to_add = vec![
                header(&names[0], limit.to_string()),
                header(&names[1], status.limit_remaining.to_string()),
                header(&names[2], reset.to_string()),
            ];
        }
        if overall == Code::OverLimit && settings.shadow_mode {
            overall = Code::Ok;
            self.stats.global_shadow_mode.fetch_add(1, Ordering::Relaxed);
        }
        if settings.dynamic_metadata {
            response.dynamic_metadata = Some(metadata::of(request, &passed, &slots_limits(&slots)));
        }
        response.overall_code = overall as i32;
        Ok(response)
    }

    fn count(&self, limit: &ConfigLimit, check: &Check, outcome: &Outcome) {
        let rule = self.stats.rule(&limit.full_key);
        let max = outcome.limit;
        let near = near_threshold(max, self.settings.near_limit_ratio);
        rule.count(check.cost, outcome.consumed, max, near, outcome.over, check.shadow);
    }
}

fn slots_limits(slots: &[Slot]) -> Vec<Option<&ConfigLimit>> {
    slots.iter().map(|s| s.limit.as_ref()).collect()
}

/// A descriptor's cost: its own `hits_addend` if it has one (0: only read the state), else the
/// request's, at least 1.
fn hits(request: &RateLimitRequest, descriptor: &RateLimitDescriptor) -> u64 {
    descriptor.hits_addend.unwrap_or_else(|| u64::from(request.hits_addend.max(1)))
}

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue { key: key.to_owned(), value, raw_value: Vec::new() }
}

/// The status of a descriptor the store decided.
fn status(name: &str, rpu: u32, unit: Unit, check: &Check, outcome: &Outcome) -> DescriptorStatus {
    let code = if outcome.over && !check.shadow { Code::OverLimit } else { Code::Ok };
    DescriptorStatus {
        code: code as i32,
        current_limit: Some(RateLimit {
            name: name.to_owned(),
            requests_per_unit: rpu,
            unit: unit as i32,
        }),
        limit_remaining: u32::try_from(outcome.remaining).unwrap_or(u32::MAX),
        duration_until_reset: Some(prost_types::Duration {
            seconds: outcome.reset_ns.div_ceil(1_000_000_000) as i64,
            nanos: 0,
        }),
    }
}
