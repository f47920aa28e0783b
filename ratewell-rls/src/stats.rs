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
//! The per-rule labels are the rule's statistics key split at its dots, as the mapper splits
//! it: `domain`, then the first two levels (`key1`, `key2`; deeper levels are summed into the
//! second, and a one-level key has no `key2`). The counters are exposed as the Go service's
//! exporter exposes them, under their plain names without OpenMetrics' `_total` suffix (their
//! `TYPE` is `unknown`), so that its dashboards read them unchanged.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;

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

/// The service's statistics.
#[derive(Debug)]
pub struct Stats {
    rules: RwLock<HashMap<String, Arc<RuleStats>>>,
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
    /// Their time to answer, in seconds.
    pub response_time: Histogram,
}

impl Stats {
    /// Statistics for at most `max_keys` distinct rule keys.
    pub fn new(max_keys: usize) -> Self {
        let buckets =
            [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0];
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
            response_time: Histogram::new(buckets),
        }
    }

    /// The counters of the rule whose statistics key is `full_key`: its own while fewer than
    /// the bound are in use (and the key is at most 1 KiB), else the domain's overflow counters
    /// (counted in `ratelimit_service_rate_limit_stats_overflow`).
    pub fn rule(&self, full_key: &str) -> Arc<RuleStats> {
        let rules = self.rules.read().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = rules.get(full_key) {
            return r.clone();
        }
        drop(rules);
        let mut rules = self.rules.write().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = rules.get(full_key) {
            return r.clone();
        }
        if full_key.len() <= MAX_STATS_KEY_LEN && rules.len() < self.max_keys {
            let r = Arc::new(RuleStats::default());
            rules.insert(full_key.to_owned(), r.clone());
            return r;
        }
        self.overflow.fetch_add(1, Ordering::Relaxed);
        let domain = full_key.split('.').next().unwrap_or_default();
        let domain = if domain.len() <= MAX_STATS_KEY_LEN { domain } else { OVERFLOW_KEY };
        let key = format!("{domain}.{OVERFLOW_KEY}");
        rules.entry(key).or_default().clone()
    }

    /// Distinct rule keys counted now (at most the bound, plus one overflow key per domain).
    pub fn rule_keys(&self) -> usize {
        self.rules.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Decisions counted under an overflow key.
    pub fn overflowed(&self) -> u64 {
        self.overflow.load(Ordering::Relaxed)
    }

    /// A rule's counters, if it has its own (for tests and `/stats`).
    pub fn get(&self, full_key: &str) -> Option<Arc<RuleStats>> {
        self.rules.read().unwrap_or_else(|e| e.into_inner()).get(full_key).cloned()
    }
}

/// The collector that encodes a [`Stats`] at each scrape.
#[derive(Debug, Clone)]
pub struct StatsCollector(pub Arc<Stats>);

fn plain(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: &AtomicU64,
) -> fmt::Result {
    let metric = encoder.encode_descriptor(name, help, None, MetricType::Unknown)?;
    ConstGauge::new(value.load(Ordering::Relaxed) as i64).encode(metric)
}

impl Collector for StatsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let stats = &self.0;
        let rules: Vec<(RuleLabels, Arc<RuleStats>)> = {
            let rules = stats.rules.read().unwrap_or_else(|e| e.into_inner());
            let mut summed: HashMap<RuleLabels, Arc<RuleStats>> = HashMap::new();
            for (key, r) in rules.iter() {
                let into = summed.entry(RuleLabels::of(key)).or_default();
                for (to, from) in [
                    (&into.total_hits, &r.total_hits),
                    (&into.over_limit, &r.over_limit),
                    (&into.near_limit, &r.near_limit),
                    (&into.within_limit, &r.within_limit),
                    (&into.shadow_mode, &r.shadow_mode),
                ] {
                    to.fetch_add(from.load(Ordering::Relaxed), Ordering::Relaxed);
                }
            }
            let mut rules: Vec<_> = summed.into_iter().collect();
            rules.sort_by(|a, b| {
                (&a.0.domain, &a.0.key1, &a.0.key2).cmp(&(&b.0.domain, &b.0.key1, &b.0.key2))
            });
            rules
        };
        type Pick = fn(&RuleStats) -> &AtomicU64;
        let families: [(&str, &str, Pick); 5] = [
            ("ratelimit_service_rate_limit_total_hits", "Hits decided per rule.", |r| {
                &r.total_hits
            }),
            ("ratelimit_service_rate_limit_over_limit", "Hits over the limit per rule.", |r| {
                &r.over_limit
            }),
            ("ratelimit_service_rate_limit_near_limit", "Hits near the limit per rule.", |r| {
                &r.near_limit
            }),
            ("ratelimit_service_rate_limit_within_limit", "Hits within the limit per rule.", |r| {
                &r.within_limit
            }),
            (
                "ratelimit_service_rate_limit_shadow_mode",
                "Hits over the limit of shadow rules.",
                |r| &r.shadow_mode,
            ),
        ];
        for (name, help, pick) in families {
            let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Unknown)?;
            for (labels, r) in &rules {
                let value = pick(r).load(Ordering::Relaxed) as i64;
                let (domain, key1) = (labels.domain.as_str(), labels.key1.as_str());
                match &labels.key2 {
                    Some(key2) => {
                        let set = [("domain", domain), ("key1", key1), ("key2", key2.as_str())];
                        ConstGauge::new(value).encode(metric.encode_family(&set)?)?;
                    }
                    None => {
                        let set = [("domain", domain), ("key1", key1)];
                        ConstGauge::new(value).encode(metric.encode_family(&set)?)?;
                    }
                }
            }
        }
        plain(
            &mut encoder,
            "ratelimit_service_rate_limit_stats_overflow",
            "Decisions counted under an overflow key: the bound on statistics keys was reached.",
            &stats.overflow,
        )?;
        plain(
            &mut encoder,
            "ratelimit_service_config_load_success",
            "Configurations loaded.",
            &stats.config_load_success,
        )?;
        plain(
            &mut encoder,
            "ratelimit_service_config_load_error",
            "Configurations refused (the one loaded before stays).",
            &stats.config_load_error,
        )?;
        plain(
            &mut encoder,
            "ratelimit_service_global_shadow_mode",
            "Requests over the limit answered OK by the global SHADOW_MODE.",
            &stats.global_shadow_mode,
        )?;
        let mut metric = encoder.encode_descriptor(
            "ratelimit_service_should_rate_limit_error",
            "Requests answered with an error.",
            None,
            MetricType::Unknown,
        )?;
        for (kind, value) in
            [("service_error", &stats.service_error), ("redis_error", &stats.redis_error)]
        {
            ConstGauge::new(value.load(Ordering::Relaxed) as i64)
                .encode(metric.encode_family(&[("err_type", kind)])?)?;
        }
        let mut metric = encoder.encode_descriptor(
            "ratelimit_service_total_requests",
            "ShouldRateLimit calls.",
            None,
            MetricType::Unknown,
        )?;
        let method = [("grpc_method", "ShouldRateLimit")];
        ConstGauge::new(stats.total_requests.load(Ordering::Relaxed) as i64)
            .encode(metric.encode_family(&method)?)?;
        let mut metric = encoder.encode_descriptor(
            "ratelimit_service_response_time_seconds",
            "Time to answer ShouldRateLimit.",
            None,
            MetricType::Histogram,
        )?;
        stats.response_time.encode(metric.encode_family(&method)?)?;
        Ok(())
    }
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

    #[test]
    fn labels_follow_the_default_mapper() {
        let l = RuleLabels::of("edge.remote_address");
        assert_eq!((l.domain.as_str(), l.key1.as_str(), l.key2), ("edge", "remote_address", None));
        let l = RuleLabels::of("edge.k1_v1.k2_v2.k3");
        assert_eq!(l.key2.as_deref(), Some("k2_v2"));
    }
}
