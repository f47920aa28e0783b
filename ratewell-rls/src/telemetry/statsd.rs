//! The statsd sink: the Go service's statistics sent to statsd (or dogstatsd) under its names,
//! byte for byte, so that a statsd_exporter mapping written for envoyproxy/ratelimit (Envoy
//! Gateway's `statsd_conf.yaml`) yields the same Prometheus series.
//!
//! # Design
//!
//! Decisions only add to the atomics of [`Stats`] (and [`crate::telemetry::stats::ResponseTime`]'s
//! per-millisecond array); nothing on the request path formats, allocates or sends. A background
//! task ([`spawn`]) wakes every `STATS_FLUSH_INTERVAL`, reads each counter's growth since its
//! last flush, and sends the non-zero ones (gostats skips a counter that did not move) in UDP
//! datagrams of at most 1,432 bytes (gostats' and datadog-go's UDP payload, under a 1,500-byte
//! MTU), each line ending in `\n`. A last flush runs when the service stops.
//!
//! The sink never fails the service: the host is resolved (tokio's `lookup_host`, bounded to
//! 2 s) when the task has no socket, a failed resolution or send drops the socket and the next
//! flush resolves again, and what that flush held is lost, as gostats drops a buffer it cannot
//! write.
//!
//! # Names (envoyproxy/ratelimit `src/stats/manager_impl.go`, `src/metrics/metrics.go`)
//!
//! | name | kind |
//! |---|---|
//! | `ratelimit.service.rate_limit.<key>.{total_hits,over_limit,near_limit,within_limit,shadow_mode}` | counter |
//! | `ratelimit.service.config_load_success`, `ratelimit.service.config_load_error` | counter |
//! | `ratelimit.service.global_shadow_mode` | counter |
//! | `ratelimit.service.call.should_rate_limit.{redis_error,service_error}` | counter |
//! | `ratelimit_server.ShouldRateLimit.total_requests` | counter |
//! | `ratelimit_server.ShouldRateLimit.response_time` | timer, whole milliseconds, one line per request |
//!
//! `<key>` is the rule's statistics key (`domain.k1_v1.k2`) sanitised as Go sanitises it
//! ([`crate::telemetry::stats::sanitize_stat_name`]). The method is the last part of the gRPC full method
//! name (`/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`).
//!
//! # Formats
//!
//! - statsd (gostats' net sink): `name:5|c`, `name:3|ms`; `EXTRA_TAGS` are serialised into the
//!   name as gostats does, sorted by key: `name.__k1=v1.__k2=v2:5|c` (a value's `.`, `:` and `|`
//!   become `_`; a pair with an empty key or value is left out).
//! - dogstatsd (`USE_DOG_STATSD`, the Go service's `godogstats` over datadog-go): the tags move
//!   to `|#`: `name:5|c|#k1:v1,k2:v2`, timers `name:3.000000|ms|#k1:v1`; mogrifiers
//!   (`USE_DOG_STATSD_MOGRIFIERS`) rename and tag each name as `godogstats` does.
//!
//! # Differences from the Go service
//!
//! - UDP only: gostats' default `STATSD_PROTOCOL` is `tcp`; statsd_exporter (Envoy Gateway's
//!   sidecar) and the Datadog agent listen on UDP. [`StatsdSettings::from_env`] refuses an
//!   explicit `STATSD_PROTOCOL=tcp`.
//! - Response times are sent at each flush, not within gostats' one second.
//! - Not sent: the Go runtime gauges (`ratelimit.go.*`), `domain_not_found`,
//!   `over_limit_with_local_cache` (no local cache), gostats' `reserved_tag`, datadog-go's own
//!   telemetry and origin-detection fields.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use regex::Regex;
use tokio::net::UdpSocket;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::telemetry::stats::{RULE_SUFFIXES, Stats};

/// The largest datagram sent: gostats' `defaultBufferSizeUDP` and datadog-go's
/// `DefaultMaxAgentPayloadSize`, 1,432 bytes, "optimal for regular networks with an MTU of 1500".
pub const MAX_DATAGRAM: usize = 1_432;
/// How long a resolution of `STATSD_HOST` may take before the flush gives up (and the next
/// flush tries again).
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(2);

/// Which wire format the sink writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Flavor {
    /// Plain statsd, tags in the name (`USE_STATSD`).
    Statsd,
    /// Dogstatsd, tags after `|#` (`USE_DOG_STATSD`).
    DogStatsd,
}

/// A dogstatsd mogrifier (`USE_DOG_STATSD_MOGRIFIERS`): the first whose pattern matches a name
/// replaces it with `NAME` and adds `TAGS`, `$0`, `$1`… standing for the match's groups.
#[derive(Debug, Clone)]
pub struct Mogrifier {
    id: String,
    pattern: Regex,
    name: String,
    /// `key:value` templates, sorted by key (Go iterates a map: its order is unspecified).
    tags: Vec<(String, String)>,
}

impl Mogrifier {
    /// The mogrifier's name in `USE_DOG_STATSD_MOGRIFIERS`.
    pub fn id(&self) -> &str {
        &self.id
    }

    fn apply(&self, name: &str) -> Option<(String, Vec<String>)> {
        let caps = self.pattern.captures(name)?;
        let groups: Vec<&str> =
            (0..caps.len()).map(|i| caps.get(i).map_or("", |m| m.as_str())).collect();
        let tags = self.tags.iter().map(|(k, v)| format!("{k}:{}", expand(v, &groups))).collect();
        Some((expand(&self.name, &groups), tags))
    }
}

/// `template` with each `$<digits>` replaced by that group (kept as written when there is no
/// such group), as `godogstats`' `makePatternHandler` replaces them.
fn expand(template: &str, groups: &[&str]) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let digits = rest[at + 1..].bytes().take_while(u8::is_ascii_digit).count();
        let var = &rest[at..at + 1 + digits];
        match var[1..].parse::<usize>().ok().and_then(|i| groups.get(i)) {
            Some(group) if digits > 0 => out.push_str(group),
            _ => out.push_str(var),
        }
        rest = &rest[at + 1 + digits..];
    }
    out.push_str(rest);
    out
}

/// The sink's settings, read from the Go service's variables.
#[derive(Debug, Clone)]
pub struct StatsdSettings {
    /// `STATSD_HOST` (default `localhost`): a name or an address.
    pub host: String,
    /// `STATSD_PORT` (default 8125).
    pub port: u16,
    /// `STATS_FLUSH_INTERVAL` (default 10 s).
    pub flush_interval: Duration,
    /// statsd or dogstatsd.
    pub flavor: Flavor,
    /// `EXTRA_TAGS`, sorted by key, values cleaned as gostats cleans them.
    pub extra_tags: Vec<(String, String)>,
    /// `USE_DOG_STATSD_MOGRIFIERS`, in their order (dogstatsd only).
    pub mogrifiers: Vec<Mogrifier>,
}

/// `strconv.ParseBool`'s spellings.
fn parse_bool(key: &str, v: &str) -> Result<bool, String> {
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(format!("{key}={v}: not a boolean")),
    }
}

/// An envconfig `map[string]string`: `k1:v1,k2:v2`, each item exactly one `:`.
fn parse_map(key: &str, v: &str) -> Result<Vec<(String, String)>, String> {
    let mut map: Vec<(String, String)> = Vec::new();
    for item in v.split(',') {
        let mut parts = item.split(':');
        match (parts.next(), parts.next(), parts.next()) {
            (Some(k), Some(v), None) => {
                map.retain(|(old, _)| old != k);
                map.push((k.to_owned(), v.to_owned()));
            }
            _ => return Err(format!("{key}={v}: invalid map item: {item:?}")),
        }
    }
    map.sort();
    Ok(map)
}

impl StatsdSettings {
    /// The sink the Go service's variables ask for, or `None` when they ask for none
    /// (`DISABLE_STATS`, `USE_STATSD=false`, or `USE_PROMETHEUS` without an explicit
    /// `USE_STATSD=true`).
    ///
    /// As in the Go service (`runner.go`), at most one of `USE_STATSD`, `USE_DOG_STATSD` and
    /// `USE_PROMETHEUS` may be on; `USE_STATSD` defaults to true there, so the Go service
    /// refuses `USE_PROMETHEUS=true` or `USE_DOG_STATSD=true` alone. Here an unset `USE_STATSD`
    /// gives way to the other (a configuration the Go service refuses, accepted), and only an
    /// explicit `USE_STATSD=true` beside another is refused with the Go service's message.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::collections::HashMap;
    /// use ratewell_rls::statsd::StatsdSettings;
    /// let env: HashMap<String, String> =
    ///     [("STATSD_PORT", "9125"), ("EXTRA_TAGS", "env:prod")].iter()
    ///         .map(|(k, v)| (k.to_string(), v.to_string())).collect();
    /// let s = StatsdSettings::from_env(&env).unwrap().expect("statsd is on by default");
    /// assert_eq!((s.host.as_str(), s.port), ("localhost", 9125));
    /// assert_eq!(s.extra_tags, [("env".to_string(), "prod".to_string())]);
    /// ```
    pub fn from_env(env: &HashMap<String, String>) -> Result<Option<StatsdSettings>, String> {
        let get = |k: &str| env.get(k).map(String::as_str).filter(|v| !v.is_empty());
        let flag = |k: &str| get(k).map(|v| parse_bool(k, v)).transpose();
        if flag("DISABLE_STATS")?.unwrap_or(false) {
            return Ok(None);
        }
        let (statsd, dog, prometheus) = (
            flag("USE_STATSD")?,
            flag("USE_DOG_STATSD")?.unwrap_or(false),
            flag("USE_PROMETHEUS")?,
        );
        let prometheus = prometheus.unwrap_or(false);
        if statsd == Some(true) && (dog || prometheus) || dog && prometheus {
            return Err("Error: unable to use more than one stats sink at the same time. Set one \
                        of USE_DOG_STATSD, USE_STATSD, USE_PROMETHEUS."
                .into());
        }
        let flavor = if dog {
            Flavor::DogStatsd
        } else if statsd.unwrap_or(!prometheus) {
            Flavor::Statsd
        } else {
            return Ok(None);
        };
        if let Some(p) = get("STATSD_PROTOCOL") {
            if !matches!(p, "udp" | "udp4" | "udp6") {
                return Err(format!("STATSD_PROTOCOL={p}: only udp is supported"));
            }
        }
        let host = get("STATSD_HOST").unwrap_or("localhost").to_owned();
        let port = match get("STATSD_PORT") {
            None => 8125,
            Some(p) => p.parse().map_err(|_| format!("STATSD_PORT={p}: not a port"))?,
        };
        let interval = get("STATS_FLUSH_INTERVAL").unwrap_or("10s");
        let flush_interval = crate::env::parse_duration(interval)
            .filter(|d| !d.is_zero())
            .ok_or_else(|| format!("STATS_FLUSH_INTERVAL={interval}: not a positive duration"))?;
        let extra_tags = match get("EXTRA_TAGS") {
            None => Vec::new(),
            Some(v) => parse_map("EXTRA_TAGS", v)?
                .into_iter()
                .filter(|(k, v)| !k.is_empty() && !v.is_empty())
                .map(|(k, v)| (k, v.replace(['.', ':', '|'], "_")))
                .collect(),
        };
        let mut mogrifiers = Vec::new();
        if flavor == Flavor::DogStatsd {
            for id in get("USE_DOG_STATSD_MOGRIFIERS").into_iter().flat_map(|v| v.split(',')) {
                mogrifiers.push(mogrifier(env, id)?);
            }
        }
        Ok(Some(StatsdSettings { host, port, flush_interval, flavor, extra_tags, mogrifiers }))
    }
}

/// A mogrifier from `DOG_STATSD_MOGRIFIER_<ID>_{PATTERN,NAME,TAGS}`, with `mogrifier_map.go`'s
/// errors.
fn mogrifier(env: &HashMap<String, String>, id: &str) -> Result<Mogrifier, String> {
    let prefix = format!("DOG_STATSD_MOGRIFIER_{}", id.to_uppercase());
    let get = |k: &str| env.get(&format!("{prefix}_{k}")).map(String::as_str).unwrap_or("");
    let pattern = get("PATTERN");
    if pattern.is_empty() {
        return Err(format!("no PATTERN specified for mogrifier {id}"));
    }
    let compiled = Regex::new(pattern)
        .map_err(|e| format!("failed to compile pattern for {id}: {pattern}: {e}"))?;
    let name = get("NAME");
    if name.is_empty() {
        return Err(format!("no NAME specified for mogrifier {id}"));
    }
    let tags = match get("TAGS") {
        "" => Vec::new(),
        v => parse_map(&format!("{prefix}_TAGS"), v)?,
    };
    for (k, v) in &tags {
        if k.is_empty() || v.is_empty() {
            return Err(format!("no key or value specified for tag {k} for mogrifier {id}"));
        }
    }
    Ok(Mogrifier { id: id.to_owned(), pattern: compiled, name: name.to_owned(), tags })
}

/// Where a counter that is not per rule is read.
type Read = fn(&Stats) -> u64;

/// The counters that are not per rule, their Go names, and where each is read.
const PLAIN: [(&str, Read); 6] = [
    ("ratelimit.service.config_load_success", |s| load(&s.config_load_success)),
    ("ratelimit.service.config_load_error", |s| load(&s.config_load_error)),
    ("ratelimit.service.global_shadow_mode", |s| load(&s.global_shadow_mode)),
    ("ratelimit.service.call.should_rate_limit.redis_error", |s| load(&s.redis_error)),
    ("ratelimit.service.call.should_rate_limit.service_error", |s| load(&s.service_error)),
    ("ratelimit_server.ShouldRateLimit.total_requests", |s| load(&s.total_requests)),
];
const RESPONSE_TIME: &str = "ratelimit_server.ShouldRateLimit.response_time";

fn load(c: &std::sync::atomic::AtomicU64) -> u64 {
    c.load(std::sync::atomic::Ordering::Relaxed)
}

/// What one flush writes: lines packed into datagrams of at most [`MAX_DATAGRAM`] bytes.
#[derive(Debug, Default)]
struct Packets {
    done: Vec<Vec<u8>>,
    open: Vec<u8>,
    line: String,
}

impl Packets {
    /// Close the line written into `self.line` (which ends in `\n`).
    fn push_line(&mut self) {
        if !self.open.is_empty() && self.open.len() + self.line.len() > MAX_DATAGRAM {
            self.done.push(std::mem::take(&mut self.open));
        }
        // A line longer than a datagram goes alone, as gostats writes it.
        self.open.extend_from_slice(self.line.as_bytes());
        self.line.clear();
    }

    fn finish(mut self) -> Vec<Vec<u8>> {
        if !self.open.is_empty() {
            self.done.push(self.open);
        }
        self.done
    }
}

/// The flushing state: what was sent of each counter, and the socket.
struct Sink {
    settings: StatsdSettings,
    stats: Arc<Stats>,
    /// `.__k=v…`, the tags of a statsd name.
    name_tags: String,
    rules: HashMap<Arc<str>, [u64; 5]>,
    plain: [u64; PLAIN.len()],
    per_ms: Vec<u64>,
    socket: Option<UdpSocket>,
}

enum Value {
    Count(u64),
    Millis(u64),
}

impl Sink {
    fn new(settings: StatsdSettings, stats: Arc<Stats>) -> Self {
        let name_tags =
            settings.extra_tags.iter().fold(String::new(), |s, (k, v)| s + ".__" + k + "=" + v);
        Sink {
            settings,
            stats,
            name_tags,
            rules: HashMap::new(),
            plain: [0; PLAIN.len()],
            per_ms: Vec::new(),
            socket: None,
        }
    }

    /// Write one line for `name` (without tags) into `p.line` and close it.
    fn line(&self, p: &mut Packets, name: &str, value: Value) {
        let out = &mut p.line;
        match self.settings.flavor {
            Flavor::Statsd => {
                let _ = match value {
                    Value::Count(n) => writeln!(out, "{name}{}:{n}|c", self.name_tags),
                    Value::Millis(ms) => writeln!(out, "{name}{}:{ms}|ms", self.name_tags),
                };
            }
            Flavor::DogStatsd => {
                let mogrified = self.settings.mogrifiers.iter().find_map(|m| m.apply(name));
                let (name, more) = match &mogrified {
                    Some((name, tags)) => (name.as_str(), tags.as_slice()),
                    None => (name, &[][..]),
                };
                let _ = match value {
                    Value::Count(n) => write!(out, "{name}:{n}|c"),
                    Value::Millis(ms) => write!(out, "{name}:{ms}.000000|ms"),
                };
                let tags = self.settings.extra_tags.iter().map(|(k, v)| format!("{k}:{v}"));
                for (i, tag) in tags.chain(more.iter().cloned()).enumerate() {
                    out.push_str(if i == 0 { "|#" } else { "," });
                    out.push_str(&tag.replace('\n', ""));
                }
                out.push('\n');
            }
        }
        p.push_line();
    }

    /// The lines of every counter that moved since the last flush, and of every response
    /// time recorded since.
    fn collect(&mut self) -> Vec<Vec<u8>> {
        let mut p = Packets::default();
        let stats = self.stats.clone();
        for (key, rule) in stats.rules() {
            let now = rule.load();
            let last = self.rules.entry(key.clone()).or_default();
            let deltas: [u64; 5] = std::array::from_fn(|i| now[i].wrapping_sub(last[i]));
            *last = now;
            for (suffix, delta) in RULE_SUFFIXES.iter().zip(deltas) {
                if delta != 0 {
                    let name = format!("ratelimit.service.rate_limit.{key}.{suffix}");
                    self.line(&mut p, &name, Value::Count(delta));
                }
            }
        }
        for (i, (name, read)) in PLAIN.iter().enumerate() {
            let now = read(&stats);
            let delta = now.wrapping_sub(std::mem::replace(&mut self.plain[i], now));
            if delta != 0 {
                self.line(&mut p, name, Value::Count(delta));
            }
        }
        let mut per_ms = std::mem::take(&mut self.per_ms);
        per_ms.resize(crate::telemetry::stats::EXACT_MS, 0);
        for (ms, (last, now)) in per_ms.iter_mut().zip(stats.response_time.per_ms()).enumerate() {
            for _ in 0..now.wrapping_sub(*last) {
                self.line(&mut p, RESPONSE_TIME, Value::Millis(ms as u64));
            }
            *last = now;
        }
        self.per_ms = per_ms;
        let mut slow = Vec::new();
        stats.response_time.take_slow(|ms| slow.push(ms));
        for ms in slow {
            self.line(&mut p, RESPONSE_TIME, Value::Millis(ms));
        }
        p.finish()
    }

    async fn connect(&self) -> Option<UdpSocket> {
        let target = (self.settings.host.as_str(), self.settings.port);
        let addrs = tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host(target));
        let addr: SocketAddr = addrs.await.ok()?.ok()?.next()?;
        let local: SocketAddr = if addr.is_ipv4() {
            ([0, 0, 0, 0], 0).into()
        } else {
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let socket = UdpSocket::bind(local).await.ok()?;
        socket.connect(addr).await.ok()?;
        Some(socket)
    }

    async fn flush(&mut self) {
        let packets = self.collect();
        if packets.is_empty() {
            return;
        }
        if self.socket.is_none() {
            self.socket = self.connect().await;
        }
        let Some(socket) = &self.socket else { return };
        for (i, packet) in packets.iter().enumerate() {
            if socket.send(packet).await.is_err() {
                // Unreachable (ICMP), unresolvable or gone: resolve again at the next flush.
                self.socket = None;
                return;
            }
            if i % 64 == 63 {
                tokio::task::yield_now().await;
            }
        }
    }
}

/// Start the sink: every `settings.flush_interval`, the growth of `stats` since the last flush
/// goes to `settings.host:settings.port`; when `stopped` turns true (or its sender is dropped),
/// a last flush, then the task ends. Must be called within a tokio runtime.
pub fn spawn(
    settings: StatsdSettings,
    stats: Arc<Stats>,
    mut stopped: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let every = settings.flush_interval;
        let mut sink = Sink::new(settings, stats);
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if *stopped.borrow_and_update() {
                break;
            }
            tokio::select! {
                _ = ticks.tick() => sink.flush().await,
                changed = stopped.changed() => if changed.is_err() { break },
            }
        }
        sink.flush().await;
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> HashMap<String, String> {
        vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn defaults_are_the_go_services() {
        let s = StatsdSettings::from_env(&env(&[])).unwrap().unwrap();
        assert_eq!(
            (s.host.as_str(), s.port, s.flush_interval),
            ("localhost", 8125, Duration::from_secs(10))
        );
        assert_eq!(s.flavor, Flavor::Statsd);
        assert!(s.extra_tags.is_empty() && s.mogrifiers.is_empty());
    }

    #[test]
    fn one_sink_at_a_time() {
        let none = |vars: &[(&str, &str)]| StatsdSettings::from_env(&env(vars)).unwrap().is_none();
        assert!(none(&[("USE_STATSD", "false")]));
        assert!(none(&[("DISABLE_STATS", "true")]));
        assert!(none(&[("USE_PROMETHEUS", "true")]));
        let dog = StatsdSettings::from_env(&env(&[("USE_DOG_STATSD", "true")])).unwrap().unwrap();
        assert_eq!(dog.flavor, Flavor::DogStatsd);
        for both in [
            &[("USE_STATSD", "true"), ("USE_PROMETHEUS", "true")][..],
            &[("USE_STATSD", "1"), ("USE_DOG_STATSD", "true")][..],
            &[("USE_DOG_STATSD", "true"), ("USE_PROMETHEUS", "true")][..],
        ] {
            let e = StatsdSettings::from_env(&env(both)).unwrap_err();
            assert!(e.contains("more than one stats sink"), "{e}");
        }
        for bad in [
            ("USE_STATSD", "yes"),
            ("STATSD_PORT", "x"),
            ("STATS_FLUSH_INTERVAL", "0s"),
            ("EXTRA_TAGS", "a:b:c"),
            ("STATSD_PROTOCOL", "tcp"),
        ] {
            assert!(StatsdSettings::from_env(&env(&[bad])).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn extra_tags_are_sorted_and_cleaned_as_gostats_does() {
        let s = StatsdSettings::from_env(&env(&[("EXTRA_TAGS", "zone:eu.1,app:r|l,empty:")]))
            .unwrap()
            .unwrap();
        let tags: Vec<_> = s.extra_tags.iter().map(|(k, v)| format!("{k}={v}")).collect();
        assert_eq!(tags, ["app=r_l", "zone=eu_1"]);
        assert_eq!(Sink::new(s, Arc::new(Stats::new(1))).name_tags, ".__app=r_l.__zone=eu_1");
    }

    /// `mogrifier_map_test.go`'s example: domain and descriptor moved into tags.
    #[test]
    fn mogrifiers_rename_and_tag() {
        let s = StatsdSettings::from_env(&env(&[
            ("USE_STATSD", "false"),
            ("USE_DOG_STATSD", "true"),
            ("USE_DOG_STATSD_MOGRIFIERS", "tag"),
            (
                "DOG_STATSD_MOGRIFIER_TAG_PATTERN",
                r"^ratelimit\.service\.rate_limit\.(.*)\.(.*)\.(.*)$",
            ),
            ("DOG_STATSD_MOGRIFIER_TAG_NAME", "ratelimit.service.rate_limit.$3"),
            ("DOG_STATSD_MOGRIFIER_TAG_TAGS", "domain:$1,descriptor:$2"),
        ]))
        .unwrap()
        .unwrap();
        let (name, tags) =
            s.mogrifiers[0].apply("ratelimit.service.rate_limit.d.k_v.total_hits").unwrap();
        assert_eq!(name, "ratelimit.service.rate_limit.total_hits");
        assert_eq!(tags, ["descriptor:k_v", "domain:d"]);
        assert_eq!(expand("a$9b$c$", &["x"]), "a$9b$c$");
        let missing = env(&[("USE_DOG_STATSD", "true"), ("USE_DOG_STATSD_MOGRIFIERS", "X")]);
        assert_eq!(
            StatsdSettings::from_env(&missing).unwrap_err(),
            "no PATTERN specified for mogrifier X"
        );
    }

    #[test]
    fn lines_pack_into_bounded_datagrams() {
        let mut p = Packets::default();
        for i in 0..100 {
            p.line = format!("ratelimit.service.rate_limit.domain.key_{i}.total_hits:1|c\n");
            p.push_line();
        }
        let packets = p.finish();
        assert!(packets.len() > 1);
        for packet in &packets {
            assert!(packet.len() <= MAX_DATAGRAM && packet.ends_with(b"\n"));
        }
        assert_eq!(
            packets.iter().map(|d| d.split(|b| *b == b'\n').count() - 1).sum::<usize>(),
            100
        );
    }
}
