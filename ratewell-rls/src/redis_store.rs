//! The Redis store (`BACKEND_TYPE=redis`): every request's descriptors decided in one call of
//! ratewell-redis's script on the server ([`PerCallLimiter`]), all or nothing there, on the
//! server's clock, so that every instance of the service shares the limits exactly.
//!
//! Keys are readable: `CACHE_KEY_PREFIX`, then the domain and each entry's key and value (or
//! `share_threshold` pattern), joined by `_` as the Go service joins them, with `\` and `_`
//! inside them escaped so that no two descriptors share a key by accident, then the window's
//! length in seconds (and `o<requests_per_unit>` for a limit override). On a Redis Cluster the
//! keys of one domain carry one hash tag (a hash of the domain), so a request is one script
//! call on one node: atomic.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ratewell_redis::{CallItem, CallPolicy, Mode, PerCallLimiter, RedisLimiter};

use crate::memory::{Check, Outcome, Quota, StoreError, denied};

/// The most distinct compiled limits kept (the configuration's and overrides'); past it the
/// cache starts again.
const MAX_POLICIES: usize = 10_000;

/// Where the Redis server is and how long to wait for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisSettings {
    /// `redis://` URLs: one server, or some nodes of a cluster.
    pub urls: Vec<String>,
    /// `REDIS_TYPE=CLUSTER`.
    pub cluster: bool,
    /// `REDIS_TIMEOUT`: a call that takes longer fails (and the connection counts as down until
    /// a probe finds it back, so later calls fail at once).
    pub timeout: Duration,
    /// `CACHE_KEY_PREFIX`.
    pub prefix: String,
}

/// The Redis store.
pub struct RedisStore {
    limiter: PerCallLimiter,
    policies: Mutex<HashMap<Quota, Arc<CallPolicy>>>,
    cluster: bool,
    prefix: String,
    tag: ahash::RandomState,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("cluster", &self.cluster)
            .field("prefix", &self.prefix)
            .finish()
    }
}

fn escaped(out: &mut String, part: &str) {
    for ch in part.chars() {
        if ch == '\\' || ch == '_' {
            out.push('\\');
        }
        out.push(ch);
    }
}

impl RedisStore {
    /// Connect. A URL that does not parse or a server that is not Redis is an error; a server
    /// that does not answer is not (the store starts down and reconnects in the background,
    /// each request failing at once meanwhile).
    pub async fn connect(settings: &RedisSettings) -> Result<RedisStore, String> {
        let builder = if settings.cluster {
            RedisLimiter::cluster_builder(&settings.urls)
        } else {
            RedisLimiter::builder(settings.urls.first().map_or("", String::as_str))
        };
        let limiter = builder
            .prefix("")
            .timeout(settings.timeout)
            .build_per_call()
            .await
            .map_err(|e| e.to_string())?;
        Ok(RedisStore {
            limiter,
            policies: Mutex::new(HashMap::new()),
            cluster: settings.cluster,
            prefix: settings.prefix.clone(),
            // Fixed seeds: every instance must put a domain's keys in the same slot.
            tag: ahash::RandomState::with_seeds(0x5241_5445, 0x5745_4c4c, 0x524c_5331, 0x7461_6773),
        })
    }

    /// The limiter (its metrics, whether it is down).
    pub fn limiter(&self) -> &PerCallLimiter {
        &self.limiter
    }

    /// The key a descriptor counts under (see the module's documentation).
    pub fn key(&self, domain: &str, check: &Check<'_>) -> String {
        let mut key = String::with_capacity(self.prefix.len() + domain.len() + 32);
        key.push_str(&self.prefix);
        if self.cluster {
            key.push_str(&format!("{{{:016x}}}", self.tag.hash_one(domain)));
        }
        escaped(&mut key, domain);
        for (i, entry) in check.entries.iter().enumerate() {
            key.push('_');
            escaped(&mut key, &entry.key);
            key.push('_');
            match check.patterns.and_then(|p| p.get(i)).filter(|p| !p.is_empty()) {
                Some(pattern) => escaped(&mut key, pattern),
                None => escaped(&mut key, &entry.value),
            }
        }
        key.push('_');
        let window_s = check.quota.window_ns().unwrap_or(0) / 1_000_000_000;
        key.push_str(&window_s.to_string());
        if check.overridden {
            key.push_str(&format!("o{}", check.quota.requests_per_unit));
        }
        if check.nth > 0 {
            key.push_str(&format!("n{}", check.nth));
        }
        key
    }

    fn policy(&self, quota: &Quota) -> Result<Arc<CallPolicy>, StoreError> {
        let mut policies = self.policies.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = policies.get(quota) {
            return Ok(p.clone());
        }
        let unregistrable = || {
            StoreError::Unregistrable(format!(
                "a limit of {} per {} has no policy",
                quota.requests_per_unit,
                quota.unit.name()
            ))
        };
        let policy = quota.engine_policy().ok_or_else(unregistrable)?;
        let compiled = Arc::new(
            CallPolicy::new(&policy).map_err(|e| StoreError::Unregistrable(e.to_string()))?,
        );
        if policies.len() >= MAX_POLICIES {
            policies.clear();
        }
        policies.insert(quota.clone(), compiled.clone());
        Ok(compiled)
    }

    /// Decide `checks` in one script call, all or nothing by [`denied`]'s rule (`extra_quota` as
    /// there): the same contract as [`MemoryStore::decide`](crate::memory::MemoryStore::decide).
    pub async fn decide(
        &self,
        domain: &str,
        checks: &[Check<'_>],
        extra_quota: usize,
        out: &mut Vec<Outcome>,
    ) -> Result<bool, StoreError> {
        out.clear();
        // Checks decided here without the server: a limit of 0 (over for any cost), and costs
        // no limit holds (over); the server still reads the latter's state.
        let local_over =
            |c: &Check<'_>| c.quota.is_zero() && c.cost > 0 || c.cost > u64::from(u32::MAX);
        let forced: Vec<bool> = checks.iter().map(local_over).collect();
        let locally: Vec<(bool, bool, bool)> = checks
            .iter()
            .zip(&forced)
            .filter(|(_, f)| **f)
            .map(|(c, _)| (true, c.shadow, c.quota_mode))
            .collect();
        let enforced_over = locally.iter().any(|&(_, shadow, quota)| !shadow && !quota);
        let local_quota = locally.iter().filter(|&&(_, shadow, quota)| quota && !shadow).count();
        let remote_quota = checks
            .iter()
            .zip(&forced)
            .filter(|(c, f)| !**f && c.quota_mode && !c.shadow && !c.quota.is_zero())
            .count();
        // Whether the quota rule can deny: no quota descriptor that is never over (shadow, only
        // read at a cost of 0, or without a limit under the global QUOTA_MODE).
        let never_over = |c: &Check<'_>| c.quota_mode && (c.shadow || c.cost == 0);
        let quota_can_deny = extra_quota == 0 && !checks.iter().any(never_over);
        // Denied whatever the server says: read every state, charge nothing.
        let read_only = enforced_over || (quota_can_deny && local_quota > 0 && remote_quota == 0);

        let keys: Vec<String> = checks.iter().map(|c| self.key(domain, c)).collect();
        let mut policies = Vec::with_capacity(checks.len());
        for check in checks {
            policies.push(match check.quota.is_zero() {
                true => None,
                false => Some(self.policy(&check.quota)?),
            });
        }
        let mut items = Vec::with_capacity(checks.len());
        let mut index = Vec::with_capacity(checks.len());
        for (i, check) in checks.iter().enumerate() {
            let Some(policy) = &policies[i] else { continue };
            let mode = if read_only || forced[i] || check.cost == 0 {
                Mode::Read
            } else if check.shadow {
                Mode::DryRun
            } else if check.quota_mode {
                if quota_can_deny { Mode::Quota } else { Mode::DryRun }
            } else {
                Mode::Enforce
            };
            let cost = u32::try_from(check.cost).unwrap_or(1).max(1);
            index.push(i);
            items.push(CallItem { key: &keys[i], policy, cost, mode });
        }
        let decided =
            self.limiter.decide(&items).await.map_err(|e| StoreError::Redis(e.to_string()))?;
        // The server's time; the wall clock's when nothing was sent to it.
        let now_ns = if items.is_empty() {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        } else {
            decided.now_us.saturating_mul(1_000)
        };
        let mut decisions = vec![None; checks.len()];
        for (k, &i) in index.iter().enumerate() {
            decisions[i] = Some((items[k].mode, decided.decisions[k]));
        }
        let admitted = decided.admitted && !read_only;
        for (i, check) in checks.iter().enumerate() {
            let window = check.quota.window_ns().unwrap_or(1).max(1);
            let window_reset = window - now_ns % window;
            let outcome = match decisions[i] {
                None => Outcome::zero(check.cost, window_reset),
                Some((mode, d)) => {
                    let charged = admitted && mode != Mode::Read && d.is_admitted();
                    // Every item was decided at its cost (a read one too, storing nothing).
                    let over = forced[i] || (check.cost > 0 && !d.is_admitted());
                    // A fixed window resets at its end; another policy when the key is full.
                    let reset_ns = if check.quota.policy.is_none() {
                        window_reset
                    } else {
                        d.reset_after_ns()
                    };
                    Outcome::of(&d, check.cost, charged, over, reset_ns)
                }
            };
            out.push(outcome);
        }
        let rows = out.iter().zip(checks).map(|(o, c)| (o.over, c.shadow, c.quota_mode));
        let denied = denied(rows, extra_quota);
        // The server applied the same rule to the same outcomes.
        debug_assert!(index.is_empty() || read_only || denied != decided.admitted);
        Ok(denied)
    }
}
