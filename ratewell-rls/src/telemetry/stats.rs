//! The service's statistics, read live at each scrape of `/metrics` (no flush interval), under
//! the names envoyproxy/ratelimit's default Prometheus mapper gives them.
//!
//! | metric | labels | what |
//! |---|---|---|
//! | `ratelimit_service_rate_limit_total_hits` | `domain`, `key1`, `key2` | hits (the cost) of every request a rule decided |
//! | `ratelimit_service_rate_limit_over_limit` | same | hits over the limit |
//! | `ratelimit_service_rate_limit_near_limit` | same | hits past `NEAR_LIMIT_RATIO` of the limit |
//! | `ratelimit_service_rate_limit_within_limit` | same | hits within the limit |
//! | `ratelimit_service_rate_limit_shadow_mode` | same | hits over the limit of a `shadow_mode` rule |
//! | `ratelimit_service_rate_limit_stats_overflow` | | decisions whose rule found no room among the bounded statistics keys (counted under `key1="_overflow"`) |
//! | `ratelimit_service_config_load_success`, `ratelimit_service_config_load_error` | | configurations loaded and refused |
//! | `ratelimit_service_global_shadow_mode` | | requests over the limit answered OK by the global `SHADOW_MODE` |
//! | `ratelimit_service_should_rate_limit_error` | `err_type` | requests answered with an error: `service_error`, `redis_error` |
//! | `ratelimit_service_total_requests` | `grpc_method` | `ShouldRateLimit` calls |
//! | `ratelimit_service_response_time_seconds` | `grpc_method` | their time to answer (histogram) |
//!
//! | `ratelimit_service_response_time_samples_dropped` | | response-time samples the statsd sink could not keep (see [`ResponseTime`]) |
//!
//! The statistics keys are passed through [`sanitize_stat_name`] as the Go service passes them
//! (`manager_impl.go`'s `NewStats`), before they are counted: `:` and `|` become `_`, and so do
//! the dots of an IPv4 address (`remote_address_10.0.0.1` is `remote_address_10_0_0_1`, one
//! level), for `/metrics` and statsd alike.
//!
//! The per-rule labels are the rule's statistics key split at its dots, as the mapper splits
//! it: `domain`, then the first two levels (`key1`, `key2`; deeper levels are summed into the
//! second, and a one-level key has no `key2`). The counters keep the Go service's exporter's
//! plain names, without the `_total` suffix, so that its dashboards read them unchanged.
//! [`Stats::prometheus_text`] writes the page in Prometheus's text format 0.0.4
//! ([`PROMETHEUS_CONTENT_TYPE`]), which `promtool check metrics` accepts with no finding: the
//! counters are declared `untyped` ([`COUNTER_TYPE`]), since promtool's lint wants a counter's
//! name to end in `_total` (the Go service's exporter declares them `counter`, and promtool
//! lints its page for each of them). Prometheus's queries (`rate`, `increase`) read an untyped
//! series as they read a counter.

use std::borrow::Cow;

/// The `# TYPE` of the counters on `/metrics`: `untyped`, so that the page passes
/// `promtool check metrics` under the Go names, which lack the `_total` its lint asks of a
/// `counter`.
pub const COUNTER_TYPE: &str = "untyped";
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// The default bound on distinct statistics keys (`MAX_STATS_KEYS`).
pub const DEFAULT_MAX_STATS_KEYS: usize = 10_000;
/// A statistics key longer than this is counted under the overflow key.
const MAX_STATS_KEY_LEN: usize = 1_024;
const OVERFLOW_KEY: &str = "_overflow";

/// One rule's counters.
#[derive(Debug, Default)]
pub struct RuleStats {
    /// Hits decided.
    pub total_hits: AtomicU64,
    /// Hits over the limit.
    pub over_limit: AtomicU64,
    /// Hits near the limit.
    pub near_limit: AtomicU64,
    /// Hits within the limit.
    pub within_limit: AtomicU64,
    /// Hits over the limit of a shadow rule.
    pub shadow_mode: AtomicU64,
}

impl RuleStats {
    /// Count a decision as envoyproxy/ratelimit counts it: `cost` hits on a limit of `limit`
    /// whose window held `before` before them, with the near-limit threshold `near`; `over`
    /// when they did not fit. Over and near counts split a request of several hits exactly
    /// (limit 20, 15 before, 7 hits: 2 over, 4 near... as `base_limiter.go` splits them).
    pub fn count(&self, cost: u64, before: u64, limit: u64, near: u64, over: bool, shadow: bool) {
        let add = |c: &AtomicU64, n: u64| {
            if n > 0 {
                c.fetch_add(n, Ordering::Relaxed);
            }
        };
        add(&self.total_hits, cost);
        // Saturating: a policy's own limit (a bucket's capacity) may not be `requests_per_unit`,
        // so `after` need not pass `limit` when the request was over.
        let after = before.saturating_add(cost);
        if over {
            let over_hits = if before >= limit { cost } else { after.saturating_sub(limit) };
            add(&self.over_limit, over_hits);
            if before < limit {
                add(&self.near_limit, limit.saturating_sub(near.max(before)));
            }
            if shadow {
                add(&self.shadow_mode, over_hits);
            }
        } else {
            if after > near {
                add(&self.near_limit, if before >= near { cost } else { after - near });
            }
            add(&self.within_limit, cost);
        }
    }
}

/// The near-limit threshold of `limit` at `ratio`, computed as the Go service computes it
/// (`floor(float32(limit) * ratio)`).
pub fn near_threshold(limit: u64, ratio: f32) -> u64 {
    let near = (limit as f32 * ratio) as f64;
    near.floor() as u64
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct RuleLabels {
    domain: String,
    key1: String,
    key2: Option<String>,
}

impl RuleLabels {
    fn of(full_key: &str) -> Self {
        let mut parts = full_key.splitn(3, '.');
        let domain = parts.next().unwrap_or_default().to_owned();
        let key1 = parts.next().unwrap_or_default().to_owned();
        let key2 = parts.next().map(|rest| rest.split('.').next().unwrap_or(rest).to_owned());
        RuleLabels { domain, key1, key2 }
    }
}

/// A statistics key as envoyproxy/ratelimit's `utils.SanitizeStatName` writes it: `:` and `|`
/// become `_`, then so does every dot of each IPv4-like run (`\d{1,3}(\.\d{1,3}){3}`, matched
/// leftmost-first and without overlap, as Go's `regexp.ReplaceAllStringFunc` matches it).
///
/// # Examples
///
/// ```
/// use ratewell_rls::stats::sanitize_stat_name;
/// assert_eq!(sanitize_stat_name("edge.remote_address_10.0.0.1"), "edge.remote_address_10_0_0_1");
/// assert_eq!(sanitize_stat_name("d.path_/a:b|c"), "d.path_/a_b_c");
/// assert_eq!(sanitize_stat_name("d.k_v"), "d.k_v");
/// ```
pub fn sanitize_stat_name(key: &str) -> Cow<'_, str> {
    let bytes = key.as_bytes();
    let mut first_ip = None;
    let mut at = 0;
    while at < bytes.len() {
        if let Some(end) = ipv4_at(bytes, at) {
            first_ip = Some((at, end));
            break;
        }
        at += 1;
    }
    if first_ip.is_none() && !bytes.iter().any(|b| matches!(b, b':' | b'|')) {
        return Cow::Borrowed(key);
    }
    sanitize_slow(key)
}

#[cold]
fn sanitize_slow(key: &str) -> Cow<'_, str> {
    // Only ASCII bytes are replaced by ASCII bytes: the result stays UTF-8.
    let mut out: Vec<u8> =
        key.bytes().map(|b| if matches!(b, b':' | b'|') { b'_' } else { b }).collect();
    let mut at = 0;
    while at < out.len() {
        match ipv4_at(&out, at) {
            Some(end) => {
                for b in &mut out[at..end] {
                    if *b == b'.' {
                        *b = b'_';
                    }
                }
                at = end;
            }
            None => at += 1,
        }
    }
    Cow::Owned(String::from_utf8(out).unwrap_or_else(|e| e.to_string()))
}

/// The end of the match of `\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}` starting at `at`, with the
/// backtracking order (greedy repeats first) that RE2's leftmost-first match follows.
fn ipv4_at(bytes: &[u8], at: usize) -> Option<usize> {
    fn group(bytes: &[u8], at: usize, left: u8) -> Option<usize> {
        let run = bytes[at.min(bytes.len())..].iter().take(3).take_while(|b| b.is_ascii_digit());
        for n in (1..=run.count()).rev() {
            let end = at + n;
            if left == 0 {
                return Some(end);
            }
            if bytes.get(end) == Some(&b'.') {
                if let Some(done) = group(bytes, end + 1, left - 1) {
                    return Some(done);
                }
            }
        }
        None
    }
    group(bytes, at, 3)
}

/// The upper bounds of the Prometheus histogram's buckets, in seconds.
const BUCKETS: [f64; 12] =
    [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0];
/// Response times kept exactly for statsd, one counter per whole millisecond: 0 to 9,999 ms
/// (80 KiB). Ten seconds is 500 times Envoy's default 20 ms timeout for the rate limit call.
pub const EXACT_MS: usize = 10_000;
/// Samples of 10 s or more kept one by one until the statsd sink's next flush.
const SLOW_SLOTS: usize = 256;

/// The response time of `ShouldRateLimit`, recorded without locks or allocation: the
/// Prometheus histogram (`ratelimit_service_response_time_seconds`), and for statsd the
/// samples in whole milliseconds as the Go service sends them (`time.Since(start).Milliseconds()`,
/// truncated).
///
/// Design: the Go service sends one `…response_time:<ms>|ms` line per request. Every sample under
/// [`EXACT_MS`] is counted in a fixed array indexed by its millisecond (one relaxed
/// `fetch_add`); the sink sends each index's growth since its last flush as that many lines, so
/// none is lost however many requests come between two flushes (a bounded queue would have to
/// drop samples at any rate above its capacity per interval). Slower samples take one of 256
/// slots (a compare-exchange from a moving cursor); when every slot is full until the next
/// flush, the sample is dropped and counted ([`ResponseTime::dropped`]). Nothing ever blocks.
///
/// Orderings: each counter and each slot is a whole value of its own that publishes no other
/// memory, so every access is `Relaxed`.
#[derive(Debug)]
pub struct ResponseTime {
    /// Samples per histogram bucket (not cumulative); the last one is `+Inf`.
    buckets: [AtomicU64; BUCKETS.len() + 1],
    sum_ns: AtomicU64,
    count: AtomicU64,
    per_ms: Box<[AtomicU64]>,
    /// A slow sample's milliseconds plus one; 0 is an empty slot.
    slow: Box<[AtomicU64]>,
    slow_next: AtomicUsize,
    dropped: AtomicU64,
}

impl Default for ResponseTime {
    fn default() -> Self {
        ResponseTime {
            buckets: Default::default(),
            sum_ns: AtomicU64::new(0),
            count: AtomicU64::new(0),
            per_ms: (0..EXACT_MS).map(|_| AtomicU64::new(0)).collect(),
            slow: (0..SLOW_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            slow_next: AtomicUsize::new(0),
            dropped: AtomicU64::new(0),
        }
    }
}

impl ResponseTime {
    /// Record one request's time to answer.
    pub fn record(&self, elapsed: Duration) {
        let secs = elapsed.as_secs_f64();
        let bucket = BUCKETS.iter().position(|b| secs <= *b).unwrap_or(BUCKETS.len());
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        let ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX - 1);
        match usize::try_from(ms).ok().and_then(|i| self.per_ms.get(i)) {
            Some(c) => {
                c.fetch_add(1, Ordering::Relaxed);
            }
            None => self.record_slow(ms),
        }
    }

    #[cold]
    fn record_slow(&self, ms: u64) {
        let from = self.slow_next.fetch_add(1, Ordering::Relaxed);
        let value = ms.saturating_add(1);
        for k in 0..SLOW_SLOTS {
            let slot = &self.slow[(from + k) % SLOW_SLOTS];
            if slot.compare_exchange(0, value, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
                return;
            }
        }
        self.dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// Samples recorded.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Slow samples (10 s or more) dropped for statsd because all 256 slots were full until
    /// the sink's next flush (or no sink drains them). The Prometheus histogram has them all.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// The samples of each whole millisecond under [`EXACT_MS`] so far (index: milliseconds).
    pub(crate) fn per_ms(&self) -> impl Iterator<Item = u64> + '_ {
        self.per_ms.iter().map(|c| c.load(Ordering::Relaxed))
    }

    /// Take the slow samples kept since the last call, in milliseconds.
    pub(crate) fn take_slow(&self, mut each: impl FnMut(u64)) {
        for slot in self.slow.iter() {
            let value = slot.swap(0, Ordering::Relaxed);
            if value != 0 {
                each(value - 1);
            }
        }
    }

    /// The histogram: per-bucket counts (the last `+Inf`), the sum in seconds, the count.
    fn histogram(&self) -> ([u64; BUCKETS.len() + 1], f64, u64) {
        let buckets = std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed));
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        (buckets, sum, self.count.load(Ordering::Relaxed))
    }
}

/// The content type of [`Stats::prometheus_text`]: Prometheus's text format 0.0.4.
pub const PROMETHEUS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The service's statistics.
#[derive(Debug)]
pub struct Stats {
    rules: RwLock<HashMap<Arc<str>, Arc<RuleStats>>>,
    max_keys: usize,
    overflow: AtomicU64,
    /// Configurations loaded.
    pub config_load_success: AtomicU64,
    /// Configurations refused.
    pub config_load_error: AtomicU64,
    /// Requests answered OK by the global shadow mode.
    pub global_shadow_mode: AtomicU64,
    /// Requests answered with a service error.
    pub service_error: AtomicU64,
    /// Requests answered with a store error.
    pub redis_error: AtomicU64,
    /// `ShouldRateLimit` calls.
    pub total_requests: AtomicU64,
    /// Their time to answer.
    pub response_time: ResponseTime,
}

/// The per-rule families: name, help, and which counter of [`RuleStats`] (in
/// [`RuleStats::load`]'s order).
const RULE_FAMILIES: [(&str, &str); 5] = [
    ("ratelimit_service_rate_limit_total_hits", "Hits decided per rule."),
    ("ratelimit_service_rate_limit_over_limit", "Hits over the limit per rule."),
    ("ratelimit_service_rate_limit_near_limit", "Hits near the limit per rule."),
    ("ratelimit_service_rate_limit_within_limit", "Hits within the limit per rule."),
    ("ratelimit_service_rate_limit_shadow_mode", "Hits over the limit of shadow rules."),
];

/// The statsd suffixes of the per-rule counters, in [`RuleStats::load`]'s order
/// (`manager_impl.go`'s `NewStats`).
pub(crate) const RULE_SUFFIXES: [&str; 5] =
    ["total_hits", "over_limit", "near_limit", "within_limit", "shadow_mode"];

impl RuleStats {
    /// The counters now: total, over, near, within, shadow.
    pub fn load(&self) -> [u64; 5] {
        [
            &self.total_hits,
            &self.over_limit,
            &self.near_limit,
            &self.within_limit,
            &self.shadow_mode,
        ]
        .map(|c| c.load(Ordering::Relaxed))
    }
}

impl Stats {
    /// Statistics for at most `max_keys` distinct rule keys.
    pub fn new(max_keys: usize) -> Self {
        Stats {
            rules: RwLock::new(HashMap::new()),
            max_keys,
            overflow: AtomicU64::new(0),
            config_load_success: AtomicU64::new(0),
            config_load_error: AtomicU64::new(0),
            global_shadow_mode: AtomicU64::new(0),
            service_error: AtomicU64::new(0),
            redis_error: AtomicU64::new(0),
            total_requests: AtomicU64::new(0),
            response_time: ResponseTime::default(),
        }
    }

    /// The counters of the rule whose statistics key is `full_key` (sanitised first, with
    /// [`sanitize_stat_name`]): its own while fewer than the bound are in use (and the key is at
    /// most 1 KiB), else the domain's overflow counters (counted in
    /// `ratelimit_service_rate_limit_stats_overflow`).
    pub fn rule(&self, full_key: &str) -> Arc<RuleStats> {
        let key = sanitize_stat_name(full_key);
        let key = key.as_ref();
        let rules = self.rules.read().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = rules.get(key) {
            return r.clone();
        }
        drop(rules);
        let mut rules = self.rules.write().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = rules.get(key) {
            return r.clone();
        }
        if key.len() <= MAX_STATS_KEY_LEN && rules.len() < self.max_keys {
            let r = Arc::new(RuleStats::default());
            rules.insert(Arc::from(key), r.clone());
            return r;
        }
        self.overflow.fetch_add(1, Ordering::Relaxed);
        let domain = key.split('.').next().unwrap_or_default();
        let domain = if domain.len() <= MAX_STATS_KEY_LEN { domain } else { OVERFLOW_KEY };
        let overflow: Arc<str> = Arc::from(format!("{domain}.{OVERFLOW_KEY}"));
        rules.entry(overflow).or_default().clone()
    }

    /// Distinct rule keys counted now (at most the bound, plus one overflow key per domain).
    pub fn rule_keys(&self) -> usize {
        self.rules.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Decisions counted under an overflow key.
    pub fn overflowed(&self) -> u64 {
        self.overflow.load(Ordering::Relaxed)
    }

    /// A rule's counters, if it has its own (for tests and `/stats`); `full_key` is sanitised
    /// as [`Stats::rule`] sanitises it.
    pub fn get(&self, full_key: &str) -> Option<Arc<RuleStats>> {
        let key = sanitize_stat_name(full_key);
        self.rules.read().unwrap_or_else(|e| e.into_inner()).get(key.as_ref()).cloned()
    }

    /// Every rule's (sanitised) key and counters; the lock is held only to clone the `Arc`s.
    pub(crate) fn rules(&self) -> Vec<(Arc<str>, Arc<RuleStats>)> {
        let rules = self.rules.read().unwrap_or_else(|e| e.into_inner());
        rules.iter().map(|(k, r)| (k.clone(), r.clone())).collect()
    }

    /// The rules' counters summed per label set (the default mapper's), sorted by labels.
    fn labelled_rules(&self) -> Vec<(RuleLabels, [u64; 5])> {
        let mut summed: HashMap<RuleLabels, [u64; 5]> = HashMap::new();
        for (key, r) in self.rules() {
            let into = summed.entry(RuleLabels::of(&key)).or_default();
            for (to, from) in into.iter_mut().zip(r.load()) {
                *to = to.wrapping_add(from);
            }
        }
        let mut rules: Vec<_> = summed.into_iter().collect();
        rules.sort_by(|a, b| {
            (&a.0.domain, &a.0.key1, &a.0.key2).cmp(&(&b.0.domain, &b.0.key1, &b.0.key2))
        });
        rules
    }

    /// The `/metrics` page in Prometheus's text format 0.0.4 ([`PROMETHEUS_CONTENT_TYPE`]),
    /// with the names, labels and types of the Go service's Prometheus exporter (the table in
    /// this module's documentation).
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell_rls::stats::Stats;
    /// let stats = Stats::new(100);
    /// stats.rule("edge.remote_address_10.0.0.1").count(1, 0, 5, 4, false, false);
    /// let page = stats.prometheus_text();
    /// assert!(page.contains("# TYPE ratelimit_service_rate_limit_total_hits untyped\n"));
    /// assert!(page.contains(
    ///     "ratelimit_service_rate_limit_total_hits{domain=\"edge\",key1=\"remote_address_10_0_0_1\"} 1\n"
    /// ));
    /// ```
    pub fn prometheus_text(&self) -> String {
        let mut out = String::with_capacity(4096);
        let rules = self.labelled_rules();
        for (i, (name, help)) in RULE_FAMILIES.iter().enumerate() {
            describe(&mut out, name, help, COUNTER_TYPE);
            for (labels, counts) in &rules {
                let mut set = vec![("domain", labels.domain.as_str()), ("key1", &labels.key1)];
                if let Some(key2) = &labels.key2 {
                    set.push(("key2", key2));
                }
                sample(&mut out, name, &set, counts[i]);
            }
        }
        let plain: [(&str, &str, u64); 5] = [
            (
                "ratelimit_service_rate_limit_stats_overflow",
                "Decisions counted under an overflow key: the bound on statistics keys was reached.",
                self.overflowed(),
            ),
            (
                "ratelimit_service_config_load_success",
                "Configurations loaded.",
                self.config_load_success.load(Ordering::Relaxed),
            ),
            (
                "ratelimit_service_config_load_error",
                "Configurations refused (the one loaded before stays).",
                self.config_load_error.load(Ordering::Relaxed),
            ),
            (
                "ratelimit_service_global_shadow_mode",
                "Requests over the limit answered OK by the global SHADOW_MODE.",
                self.global_shadow_mode.load(Ordering::Relaxed),
            ),
            (
                "ratelimit_service_response_time_samples_dropped",
                "Response-time samples of 10 s or more the statsd sink could not keep.",
                self.response_time.dropped(),
            ),
        ];
        for (name, help, value) in plain {
            describe(&mut out, name, help, COUNTER_TYPE);
            sample(&mut out, name, &[], value);
        }
        let name = "ratelimit_service_should_rate_limit_error";
        describe(&mut out, name, "Requests answered with an error.", COUNTER_TYPE);
        for (kind, value) in
            [("service_error", &self.service_error), ("redis_error", &self.redis_error)]
        {
            sample(&mut out, name, &[("err_type", kind)], value.load(Ordering::Relaxed));
        }
        let method = [("grpc_method", "ShouldRateLimit")];
        let name = "ratelimit_service_total_requests";
        describe(&mut out, name, "ShouldRateLimit calls.", COUNTER_TYPE);
        sample(&mut out, name, &method, self.total_requests.load(Ordering::Relaxed));
        let name = "ratelimit_service_response_time_seconds";
        describe(&mut out, name, "Time to answer ShouldRateLimit.", "histogram");
        let (buckets, sum, count) = self.response_time.histogram();
        let mut cumulative = 0u64;
        for (i, n) in buckets.iter().enumerate() {
            cumulative += n;
            let le = BUCKETS.get(i).map_or_else(|| "+Inf".to_owned(), |b| b.to_string());
            let set = [method[0], ("le", le.as_str())];
            sample(&mut out, "ratelimit_service_response_time_seconds_bucket", &set, cumulative);
        }
        let _ = writeln!(out, "{name}_sum{{grpc_method=\"ShouldRateLimit\"}} {sum}");
        sample(&mut out, "ratelimit_service_response_time_seconds_count", &method, count);
        out
    }
}

/// A family's `# HELP` and `# TYPE` lines (the help escaped as the text format escapes it).
fn describe(out: &mut String, name: &str, help: &str, kind: &str) {
    let help = help.replace('\\', "\\\\").replace('\n', "\\n");
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// One sample line, its label values escaped as the text format escapes them.
fn sample(out: &mut String, name: &str, labels: &[(&str, &str)], value: u64) {
    out.push_str(name);
    if !labels.is_empty() {
        out.push('{');
        for (i, (label, value)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(label);
            out.push_str("=\"");
            for c in value.chars() {
                match c {
                    '\\' => out.push_str("\\\\"),
                    '"' => out.push_str("\\\""),
                    '\n' => out.push_str("\\n"),
                    c => out.push(c),
                }
            }
            out.push('"');
        }
        out.push('}');
    }
    let _ = writeln!(out, " {value}");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(r: &RuleStats) -> [u64; 5] {
        [&r.total_hits, &r.over_limit, &r.near_limit, &r.within_limit, &r.shadow_mode]
            .map(|c| c.load(Ordering::Relaxed))
    }

    /// `base_limiter.go`'s splits: limit 20, near threshold 16.
    #[test]
    fn hits_split_as_the_go_service_splits_them() {
        let near = near_threshold(20, 0.8);
        assert_eq!(near, 16);
        let r = RuleStats::default();
        r.count(7, 15, 20, near, true, false); // after 22: 2 over, 20 - 16 = 4 near
        assert_eq!(counts(&r), [7, 2, 4, 0, 0]);
        let r = RuleStats::default();
        r.count(3, 14, 20, near, false, false); // after 17: 1 near, 3 within
        assert_eq!(counts(&r), [3, 0, 1, 3, 0]);
        let r = RuleStats::default();
        r.count(2, 20, 20, near, true, true); // all over, shadow counts them
        assert_eq!(counts(&r), [2, 2, 0, 0, 2]);
    }

    #[test]
    fn keys_are_bounded() {
        let stats = Stats::new(2);
        stats.rule("d.a").total_hits.fetch_add(1, Ordering::Relaxed);
        stats.rule("d.b");
        stats.rule("d.c").total_hits.fetch_add(5, Ordering::Relaxed);
        stats.rule("d.e").total_hits.fetch_add(5, Ordering::Relaxed);
        assert_eq!(stats.rule_keys(), 3);
        assert_eq!(stats.overflowed(), 2);
        let overflow = stats.get("d._overflow").unwrap();
        assert_eq!(overflow.total_hits.load(Ordering::Relaxed), 10);
    }

    /// `utils.SanitizeStatName`'s cases, and where the IPv4 rule starts and stops.
    #[test]
    fn stat_names_are_sanitised_as_go_sanitises_them() {
        for (key, want) in [
            ("edge.remote_address_10.0.0.1", "edge.remote_address_10_0_0_1"),
            ("d.k_a:b|c", "d.k_a_b_c"),
            ("d.k_192.168.1.100.path", "d.k_192_168_1_100.path"),
            // Leftmost-first, greedy: `1234.5.6.7` matches from its second digit.
            ("d.1234.5.6.7", "d.1234_5_6_7"),
            ("d.1.2.3.4567", "d.1_2_3_4567"),
            ("d.1.2.3.4.5.6.7.8", "d.1_2_3_4.5_6_7_8"),
            ("d.1.2.3", "d.1.2.3"),
            ("d.1..2.3.4", "d.1..2.3.4"),
            ("d.1..2.3.4.5", "d.1..2_3_4_5"),
            ("d.k_ü:1.2.3.4", "d.k_ü_1_2_3_4"),
            ("plain.key_value", "plain.key_value"),
        ] {
            assert_eq!(sanitize_stat_name(key), want, "{key}");
        }
        assert!(matches!(sanitize_stat_name("d.k_v"), Cow::Borrowed(_)));
    }

    #[test]
    fn rule_keys_are_sanitised_before_they_are_counted() {
        let stats = Stats::new(10);
        stats.rule("edge.remote_address_10.0.0.1").total_hits.fetch_add(2, Ordering::Relaxed);
        stats.rule("edge.remote_address_10_0_0_1").total_hits.fetch_add(1, Ordering::Relaxed);
        assert_eq!(stats.rule_keys(), 1);
        assert_eq!(stats.get("edge.remote_address_10_0_0_1").unwrap().load()[0], 3);
        let l = RuleLabels::of(&stats.rules()[0].0);
        assert_eq!((l.key1.as_str(), l.key2), ("remote_address_10_0_0_1", None));
    }

    #[test]
    fn response_times_are_kept_per_millisecond_and_slow_ones_in_slots() {
        let t = ResponseTime::default();
        t.record(Duration::from_micros(300));
        t.record(Duration::from_micros(1_999));
        t.record(Duration::from_millis(12_345));
        let per_ms: Vec<u64> = t.per_ms().take(3).collect();
        assert_eq!(per_ms, [1, 1, 0]);
        let mut slow = Vec::new();
        t.take_slow(|ms| slow.push(ms));
        assert_eq!(slow, [12_345]);
        for _ in 0..SLOW_SLOTS + 3 {
            t.record(Duration::from_secs(11));
        }
        assert_eq!(t.dropped(), 3);
        assert_eq!(t.count(), 3 + SLOW_SLOTS as u64 + 3);
        let (buckets, _, count) = t.histogram();
        assert_eq!(
            (buckets[0], buckets[BUCKETS.len()], count),
            (0, 1 + SLOW_SLOTS as u64 + 3, t.count())
        );
    }

    #[test]
    fn labels_follow_the_default_mapper() {
        let l = RuleLabels::of("edge.remote_address");
        assert_eq!((l.domain.as_str(), l.key1.as_str(), l.key2), ("edge", "remote_address", None));
        let l = RuleLabels::of("edge.k1_v1.k2_v2.k3");
        assert_eq!(l.key2.as_deref(), Some("k2_v2"));
    }
}
