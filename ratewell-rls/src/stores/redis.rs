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

use ratewell_redis::{CallDecision, CallItem, CallPolicy, Mode, PerCallLimiter, RedisLimiter};

use crate::env::{Env, parse_duration};
use crate::serving::proto::Unit;
use crate::stores::memory::{Check, Outcome, Quota, StoreError, denied};

/// The most distinct compiled limits kept (the configuration's and overrides'); past it the
/// cache starts again.
const MAX_POLICIES: usize = 10_000;

/// Where the Redis server is and how long to wait for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisSettings {
    /// `redis://` URLs: one server, some nodes of a cluster, or the sentinels.
    pub urls: Vec<String>,
    /// `REDIS_TYPE=CLUSTER`.
    pub cluster: bool,
    /// `REDIS_TYPE=SENTINEL`: the primary the sentinels (`urls`) name.
    pub sentinel: Option<ratewell_redis::Sentinel>,
    /// `REDIS_TLS`: TLS to the server (and the sentinels), with the `REDIS_TLS_*` files.
    pub tls: Option<ratewell_redis::Tls>,
    /// `REDIS_TIMEOUT`: a call that takes longer fails (and the connection counts as down until
    /// a probe finds it back, so later calls fail at once).
    pub timeout: Duration,
    /// `CACHE_KEY_PREFIX`.
    pub prefix: String,
    /// `REDIS_PERSECOND`: the server that decides the limits whose unit is a second.
    pub per_second: Option<Box<RedisSettings>>,
}

impl RedisSettings {
    /// Where it decides, passwords left out, for the startup line.
    pub fn describe(&self) -> String {
        let urls = self.urls.iter().map(|u| redact(u)).collect::<Vec<_>>();
        let mut out = match &self.sentinel {
            Some(s) => format!("the primary {} named by the sentinels {}", s.name, urls.join(", ")),
            None => urls.join(", "),
        };
        if self.tls.is_some() {
            out.push_str(" over TLS");
        }
        if let Some(per_second) = &self.per_second {
            out.push_str(&format!(", per-second limits at {}", per_second.describe()));
        }
        out
    }
}

impl RedisSettings {
    /// The Redis store's settings, read as the Go service reads them: `REDIS_SOCKET_TYPE` (`tcp`
    /// or `unix`) and `REDIS_URL` (`host:port`, a socket's path, a comma-separated list of
    /// `host:port` for `REDIS_TYPE=CLUSTER`, or `name,host:port,...` for `REDIS_TYPE=SENTINEL`), or
    /// a `redis://` URL; `REDIS_AUTH` (`password` or `user:password`); `REDIS_SENTINEL_AUTH`;
    /// `REDIS_TLS` with `REDIS_TLS_*`; `REDIS_TIMEOUT` (default 50ms here: see the README). With
    /// `REDIS_PERSECOND`, the same under `REDIS_PERSECOND_` for the per-second server (TLS with the
    /// same `REDIS_TLS_*` files, as in Go).
    pub(crate) fn from_env(env: &HashMap<String, String>) -> Result<RedisSettings, String> {
        let e = &Env(env);
        let mut main = redis_server(e, "REDIS_", "/var/run/nutcracker/ratelimit.sock")?;
        if e.flag("REDIS_PERSECOND", false)? {
            let per_second =
                redis_server(e, "REDIS_PERSECOND_", "/var/run/nutcracker/ratelimitpersecond.sock")?;
            main.per_second = Some(Box::new(per_second));
        }
        Ok(main)
    }
}

/// Go's `REDIS_TLS_*` files, read now: a file that cannot be read stops the start (as in Go).
fn redis_tls(e: &Env<'_>) -> Result<ratewell_redis::Tls, String> {
    let read = |name: &str| -> Result<Option<Vec<u8>>, String> {
        match e.get(name).filter(|p| !p.is_empty()) {
            None => Ok(None),
            Some(path) => std::fs::read(path)
                .map(Some)
                .map_err(|err| format!("{name}={path}: cannot be read: {err}")),
        }
    };
    let client = match (read("REDIS_TLS_CLIENT_CERT")?, read("REDIS_TLS_CLIENT_KEY")?) {
        (Some(cert), Some(key)) => Some((cert, key)),
        // As Go's TlsConfigFromFiles: a pair is loaded only when both are given.
        _ => None,
    };
    Ok(ratewell_redis::Tls {
        ca: read("REDIS_TLS_CACERT")?,
        client,
        skip_hostname_verification: e.flag("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", false)?,
    })
}

/// `user:password` (split at the first `:`, as Go's `strings.Cut`) or a password alone.
fn credentials(auth: &str) -> (Option<String>, Option<String>) {
    match auth.split_once(':') {
        _ if auth.is_empty() => (None, None),
        Some((user, password)) => (Some(user.to_owned()), Some(password.to_owned())),
        None => (None, Some(auth.to_owned())),
    }
}

/// One server's settings under `p` (`REDIS_` or `REDIS_PERSECOND_`).
fn redis_server(e: &Env<'_>, p: &str, default_url: &str) -> Result<RedisSettings, String> {
    let var = |name: &str| format!("{p}{name}");
    let kind = e.string(&var("TYPE"), "SINGLE").to_ascii_uppercase();
    let (cluster, sentinel) = match kind.as_str() {
        "SINGLE" => (false, false),
        "CLUSTER" => (true, false),
        "SENTINEL" => (false, true),
        other => {
            return Err(format!(
                "{}={other} is not supported: SINGLE, CLUSTER or SENTINEL",
                var("TYPE")
            ));
        }
    };
    let tls = if e.flag(&var("TLS"), false)? { Some(redis_tls(e)?) } else { None };
    let socket = e.string(&var("SOCKET_TYPE"), "unix").to_ascii_lowercase();
    let auth = e.string(&var("AUTH"), "");
    let raw = e.string(&var("URL"), default_url);
    let userinfo = |auth: &str| match credentials(auth) {
        (Some(user), Some(password)) => format!("{}:{}@", url_escape(&user), url_escape(&password)),
        (None, Some(password)) => format!(":{}@", url_escape(&password)),
        _ => String::new(),
    };
    let url_of = |one: &str| -> Result<String, String> {
        let one = one.trim();
        if one.contains("://") {
            return Ok(one.to_owned());
        }
        match socket.as_str() {
            "tcp" => Ok(format!("redis://{}{one}", userinfo(&auth))),
            "unix" if cluster => {
                Err(format!("{}=CLUSTER needs {}=tcp", var("TYPE"), var("SOCKET_TYPE")))
            }
            "unix" if tls.is_some() => {
                Err(format!("{}: TLS to Redis needs {}=tcp", var("TLS"), var("SOCKET_TYPE")))
            }
            "unix" if auth.is_empty() => Ok(format!("unix://{one}")),
            "unix" => Ok(format!(
                "unix://{one}?pass={}",
                url_escape(auth.rsplit(':').next().unwrap_or(""))
            )),
            other => Err(format!("{}={other}: tcp or unix", var("SOCKET_TYPE"))),
        }
    };
    let (urls, sentinel) = if sentinel {
        // Go's form: the primary's name, then the sentinels (always TCP), each reached with
        // REDIS_SENTINEL_AUTH; REDIS_AUTH is the primary's.
        let parts: Vec<&str> = raw.split(',').map(str::trim).collect();
        if parts.len() < 2 || parts[0].is_empty() {
            return Err(
                "Expected master name and a list of urls for the sentinels, in the format: <redis master name>,<sentinel1>,...,<sentineln>"
                    .into(),
            );
        }
        let sentinel_auth = e.string(&var("SENTINEL_AUTH"), "");
        let urls: Vec<String> = parts[1..]
            .iter()
            .map(|a| {
                if a.contains("://") {
                    a.to_string()
                } else {
                    format!("redis://{}{a}", userinfo(&sentinel_auth))
                }
            })
            .collect();
        let (username, password) = credentials(&auth);
        let target = ratewell_redis::Sentinel {
            name: parts[0].to_owned(),
            sentinels: urls.clone(),
            username,
            password,
        };
        (urls, Some(target))
    } else if cluster {
        (raw.split(',').map(url_of).collect::<Result<Vec<_>, _>>()?, None)
    } else {
        (vec![url_of(&raw)?], None)
    };
    let timeout_text = e.string(&var("TIMEOUT"), "50ms");
    let timeout = parse_duration(&timeout_text)
        .filter(|d| !d.is_zero())
        .ok_or_else(|| format!("{}={timeout_text}: not a duration", var("TIMEOUT")))?;
    Ok(RedisSettings {
        urls,
        cluster,
        sentinel,
        tls,
        timeout,
        prefix: e.string("CACHE_KEY_PREFIX", ""),
        per_second: None,
    })
}

/// `url` without its password, for a log line.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

/// Percent-encode what a URL's user information cannot hold as is.
fn url_escape(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// One server: its limiter, and whether it is a cluster (whose keys carry a hash tag).
struct Server {
    limiter: PerCallLimiter,
    cluster: bool,
}

impl Server {
    async fn connect(settings: &RedisSettings) -> Result<Server, String> {
        let mut builder = match &settings.sentinel {
            Some(sentinel) => RedisLimiter::sentinel_builder(sentinel.clone()),
            None if settings.cluster => RedisLimiter::cluster_builder(&settings.urls),
            None => RedisLimiter::builder(settings.urls.first().map_or("", String::as_str)),
        };
        if let Some(tls) = &settings.tls {
            builder = builder.tls(tls.clone());
        }
        let limiter = builder
            .prefix("")
            .timeout(settings.timeout)
            .build_per_call()
            .await
            .map_err(|e| e.to_string())?;
        Ok(Server { limiter, cluster: settings.cluster })
    }
}

/// The Redis store.
pub struct RedisStore {
    main: Server,
    /// `REDIS_PERSECOND`: where the limits whose unit is a second are decided.
    per_second: Option<Server>,
    policies: Mutex<HashMap<Quota, Arc<CallPolicy>>>,
    prefix: String,
    tag: ahash::RandomState,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("cluster", &self.main.cluster)
            .field("per_second", &self.per_second.is_some())
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
    /// Connect (to both servers with `REDIS_PERSECOND`). A URL that does not parse, a server
    /// that is not Redis, a refused password or certificate is an error; a server that does not
    /// answer is not (the store starts down and reconnects in the background, each request
    /// that needs it failing at once meanwhile).
    pub async fn connect(settings: &RedisSettings) -> Result<RedisStore, String> {
        let main = Server::connect(settings).await?;
        let per_second = match &settings.per_second {
            Some(p) => {
                Some(Server::connect(p).await.map_err(|e| format!("per-second server: {e}"))?)
            }
            None => None,
        };
        Ok(RedisStore {
            main,
            per_second,
            policies: Mutex::new(HashMap::new()),
            prefix: settings.prefix.clone(),
            // Fixed seeds: every instance must put a domain's keys in the same slot.
            tag: ahash::RandomState::with_seeds(0x5241_5445, 0x5745_4c4c, 0x524c_5331, 0x7461_6773),
        })
    }

    /// The main server's limiter (its metrics, whether it is down).
    pub fn limiter(&self) -> &PerCallLimiter {
        &self.main.limiter
    }

    /// The per-second server's limiter, with `REDIS_PERSECOND`.
    pub fn per_second_limiter(&self) -> Option<&PerCallLimiter> {
        self.per_second.as_ref().map(|s| &s.limiter)
    }

    /// Whether `check` is decided on the per-second server.
    fn on_per_second(&self, check: &Check<'_>) -> bool {
        self.per_second.is_some() && check.quota.unit == Unit::Second
    }

    /// The key a descriptor counts under (see the module's documentation).
    pub fn key(&self, domain: &str, check: &Check<'_>) -> String {
        let cluster = match &self.per_second {
            Some(per_second) if self.on_per_second(check) => per_second.cluster,
            _ => self.main.cluster,
        };
        let mut key = String::with_capacity(self.prefix.len() + domain.len() + 32);
        key.push_str(&self.prefix);
        if cluster {
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
    /// there): the same contract as [`MemoryStore::decide`](crate::stores::memory::MemoryStore::decide).
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
        // With REDIS_PERSECOND, the per-second limits go to their own server. A request with
        // limits on both is decided on both at once; neither script sees the other's limits,
        // so the quota rule is judged here (quota limits sent as dry runs) and, when the
        // request is denied, the charges either server made are refunded.
        let per_second: Vec<bool> = checks.iter().map(|c| self.on_per_second(c)).collect();
        let split = self.per_second.is_some()
            && (0..checks.len()).any(|i| policies[i].is_some() && per_second[i])
            && (0..checks.len()).any(|i| policies[i].is_some() && !per_second[i]);
        let mut parts: [(Vec<CallItem<'_>>, Vec<usize>); 2] = Default::default();
        for (i, check) in checks.iter().enumerate() {
            let Some(policy) = &policies[i] else { continue };
            let mode = if read_only || forced[i] || check.cost == 0 {
                Mode::Read
            } else if check.shadow {
                Mode::DryRun
            } else if check.quota_mode {
                if quota_can_deny && !split { Mode::Quota } else { Mode::DryRun }
            } else {
                Mode::Enforce
            };
            let cost = u32::try_from(check.cost).unwrap_or(1).max(1);
            let part = &mut parts[usize::from(per_second[i])];
            part.1.push(i);
            part.0.push(CallItem { key: &keys[i], policy, cost, mode });
        }
        let [(main_items, main_index), (second_items, second_index)] = &parts;
        let (main, second) = tokio::join!(
            ask(Some(&self.main), main_items),
            ask(self.per_second.as_ref(), second_items)
        );
        let (main, second) = match (main.transpose(), second.transpose()) {
            (Ok(main), Ok(second)) => (main, second),
            (main, second) => {
                // One server could not decide: what the other charged is taken back.
                tokio::join!(
                    undo(Some(&self.main), main_items, main.as_ref().ok().and_then(Option::as_ref)),
                    undo(
                        self.per_second.as_ref(),
                        second_items,
                        second.as_ref().ok().and_then(Option::as_ref)
                    ),
                );
                let e = main.err().or(second.err()).map(|e| e.to_string());
                return Err(StoreError::Redis(e.unwrap_or_default()));
            }
        };
        // The server's time; the wall clock's when nothing was sent to it.
        let now_us = main.as_ref().or(second.as_ref()).map(|d| d.now_us);
        let now_ns = match now_us {
            Some(us) => us.saturating_mul(1_000),
            None => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64),
        };
        let mut decisions = vec![None; checks.len()];
        for (items, index, decided) in
            [(main_items, main_index, &main), (second_items, second_index, &second)]
        {
            let Some(decided) = decided else { continue };
            for (k, &i) in index.iter().enumerate() {
                let charged = !read_only && decided.charged(k);
                decisions[i] = Some((items[k].mode, decided.decisions[k], charged));
            }
        }
        for (i, check) in checks.iter().enumerate() {
            let window = check.quota.window_ns().unwrap_or(1).max(1);
            let window_reset = window - now_ns % window;
            let outcome = match decisions[i] {
                None => Outcome::zero(check.cost, window_reset),
                Some((mode, d, charged)) => {
                    debug_assert!(!charged || mode != Mode::Read);
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
        if split && denied {
            // Denied across the two servers: neither keeps a charge, and each descriptor
            // reports what it had before.
            tokio::join!(
                undo(Some(&self.main), main_items, main.as_ref()),
                undo(self.per_second.as_ref(), second_items, second.as_ref()),
            );
            for o in out.iter_mut().filter(|o| o.charged) {
                o.charged = false;
                o.remaining = o.limit.saturating_sub(o.consumed);
            }
        } else {
            // The server applied the same rule to the same outcomes.
            debug_assert!(
                split
                    || read_only
                    || main.as_ref().or(second.as_ref()).is_none_or(|d| denied != d.admitted)
            );
        }
        Ok(denied)
    }
}

/// `items` decided on `server`; `None` when there is no such server or nothing to decide.
async fn ask(
    server: Option<&Server>,
    items: &[CallItem<'_>],
) -> Option<Result<CallDecision, ratewell_redis::Error>> {
    match server {
        Some(s) if !items.is_empty() => Some(s.limiter.decide(items).await),
        _ => None,
    }
}

/// Take back what `decided` charged for `items` on `server` (nothing to send when it charged
/// nothing). A refund that fails leaves the charge in place: the limit then errs on the side of
/// admitting less.
async fn undo(server: Option<&Server>, items: &[CallItem<'_>], decided: Option<&CallDecision>) {
    if let (Some(s), Some(d)) = (server, decided) {
        let _ = s.limiter.refund(items, d).await;
    }
}
