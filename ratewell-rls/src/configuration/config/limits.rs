//! A loaded configuration: every domain's descriptor tree, and the lookup of a request
//! descriptor's limit in it.

use std::collections::{BTreeMap, HashMap};

use serde_yaml_ng::Value;

use crate::configuration::config::yaml::{
    ConfigError, ConfigFile, YamlDescriptor, YamlRateLimit, go_format,
};
use crate::serving::proto::{RateLimitDescriptor, Unit};

/// A loaded configuration: every domain's descriptor tree.
#[derive(Clone, Debug, Default)]
pub struct RateLimitConfig {
    domains: HashMap<String, Node>,
}

#[derive(Clone, Debug, Default)]
struct Node {
    children: HashMap<String, Node>,
    limit: Option<RateLimit>,
    /// The children whose key holds a `*`, in configuration order.
    wildcards: Vec<Wildcard>,
    value_to_metric: bool,
    share_threshold: bool,
    /// The child's own `key_value` when `share_threshold` is set (it holds a `*`).
    wildcard_pattern: String,
    metadata: Option<prost_types::Struct>,
}

#[derive(Clone, Debug)]
struct Wildcard {
    /// The child's `key_value`, as in [`Node::children`].
    key: String,
    /// `key` split at each `*`.
    parts: Vec<String>,
}

/// A limit as the configuration (or a request's override) gives it for one descriptor.
#[derive(Clone, Debug, PartialEq)]
pub struct RateLimit {
    /// The limit's statistics key (`domain.key1_value1.key2`), envoyproxy/ratelimit's `FullKey`.
    pub full_key: String,
    /// Requests per unit (0 rejects every request).
    pub requests_per_unit: u32,
    /// The unit; [`Unit::Unknown`] only for an unlimited rule, or an override that sent it.
    pub unit: Unit,
    /// `rate_limit.name`, or empty.
    pub name: String,
    /// `rate_limit.unlimited`: always within the limit, counted nowhere.
    pub unlimited: bool,
    /// `shadow_mode`: decided and counted, never rejecting.
    pub shadow_mode: bool,
    /// `quota_mode`: over the limit without rejecting, unless every quota descriptor is over.
    pub quota_mode: bool,
    /// The names of the limits this one replaces, when both apply to one request.
    pub replaces: Vec<String>,
    /// `detailed_metric`: statistics keyed by the request's values.
    pub detailed_metric: bool,
    /// Per request entry, the wildcard pattern that stands for the value in the cache key of a
    /// `share_threshold` match (empty for the other entries); `None` without any.
    pub share_threshold_key_pattern: Option<Vec<String>>,
    /// The matched descriptor's `metadata`.
    pub metadata: Option<prost_types::Struct>,
    /// `unit_multiplier` (an extension): the window is this many units (1 without it).
    pub unit_multiplier: u32,
    /// `policy` (an extension): the ratewell policy that decides, canonical, instead of a fixed
    /// window of `requests_per_unit` per unit.
    pub policy: Option<String>,
    /// `rate_limits` (an extension): the descriptor's limits after the first, decided with it,
    /// all or nothing.
    pub more: Vec<MoreLimit>,
}

/// One more limit of a descriptor with `rate_limits` (an extension).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MoreLimit {
    /// `name`.
    pub name: String,
    /// Requests per unit.
    pub requests_per_unit: u32,
    /// The unit.
    pub unit: Unit,
    /// `unit_multiplier` (1 without it).
    pub unit_multiplier: u32,
    /// `policy`, canonical.
    pub policy: Option<String>,
}

impl RateLimit {
    #[allow(clippy::too_many_arguments)]
    fn new(
        full_key: String,
        requests_per_unit: u32,
        unit: Unit,
        unlimited: bool,
        shadow_mode: bool,
        quota_mode: bool,
        name: String,
        replaces: Vec<String>,
        detailed_metric: bool,
    ) -> Self {
        RateLimit {
            full_key,
            requests_per_unit,
            unit,
            name,
            unlimited,
            shadow_mode,
            quota_mode,
            replaces,
            detailed_metric,
            share_threshold_key_pattern: None,
            metadata: None,
            unit_multiplier: 1,
            policy: None,
            more: Vec::new(),
        }
    }

    /// The same limit under another statistics key, as envoyproxy/ratelimit's `NewRateLimit`
    /// rebuilds it (keeping the share-threshold patterns and dropping the metadata).
    fn rekeyed(&self, full_key: String) -> Self {
        RateLimit {
            share_threshold_key_pattern: self.share_threshold_key_pattern.clone(),
            unit_multiplier: self.unit_multiplier,
            policy: self.policy.clone(),
            more: self.more.clone(),
            ..RateLimit::new(
                full_key,
                self.requests_per_unit,
                self.unit,
                self.unlimited,
                self.shadow_mode,
                self.quota_mode,
                self.name.clone(),
                self.replaces.clone(),
                self.detailed_metric,
            )
        }
    }
}

/// Whether `value` matches the wildcard pattern split into `parts` at its `*`s (each `*` any
/// run of characters, the empty one included).
pub(super) fn wildcard_match(parts: &[String], value: &str) -> bool {
    let [first, .., last] = parts else {
        return parts.first().is_some_and(|p| p == value);
    };
    if !value.starts_with(first.as_str()) || !value.ends_with(last.as_str()) {
        return false;
    }
    if value.len() < parts.iter().map(String::len).sum::<usize>() {
        return false;
    }
    let mut remaining = &value[first.len()..value.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        let Some(at) = remaining.find(part.as_str()) else { return false };
        remaining = &remaining[at + part.len()..];
    }
    true
}

/// The YAML `metadata` map as a `google.protobuf.Struct` (Go's `structpb.NewStruct` over what
/// `yaml.v2` decoded: numbers as doubles, keys of nested maps printed).
fn metadata_struct(map: &BTreeMap<String, Value>) -> prost_types::Struct {
    prost_types::Struct {
        fields: map.iter().map(|(k, v)| (k.clone(), metadata_value(v))).collect(),
    }
}

fn metadata_value(value: &Value) -> prost_types::Value {
    use prost_types::value::Kind;
    let kind = match value {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(*b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        Value::String(s) => Kind::StringValue(s.clone()),
        Value::Sequence(items) => Kind::ListValue(prost_types::ListValue {
            values: items.iter().map(metadata_value).collect(),
        }),
        Value::Mapping(map) => Kind::StructValue(prost_types::Struct {
            fields: map.iter().map(|(k, v)| (go_format(k), metadata_value(v))).collect(),
        }),
        Value::Tagged(tagged) => return metadata_value(&tagged.value),
    };
    prost_types::Value { kind: Some(kind) }
}

/// A rate limit's extensions: `unit_multiplier` (at least 1; 1 without it) and `policy` (a
/// ratewell policy, canonical), checked.
fn extension(
    file: &str,
    r: &YamlRateLimit,
    unit: Option<Unit>,
) -> Result<(u32, Option<String>), ConfigError> {
    if r.unlimited && (r.unit_multiplier != 0 || !r.policy.is_empty()) {
        return Err(ConfigError::new(
            file,
            "an unlimited rate limit has no unit_multiplier or policy",
        ));
    }
    let multiplier = match r.unit_multiplier {
        0 => 1,
        m => m,
    };
    let window = unit.and_then(Unit::seconds).unwrap_or(1);
    if window.checked_mul(u64::from(multiplier)).is_none_or(|w| w > 100 * 31_536_000) {
        return Err(ConfigError::new(
            file,
            format!("unit_multiplier {multiplier}: a window of at most 100 years"),
        ));
    }
    let policy = if r.policy.is_empty() {
        None
    } else {
        match r.policy.parse::<ratewell::Policy>() {
            Ok(p) => Some(p.to_string()),
            Err(e) => {
                return Err(ConfigError::new(
                    file,
                    format!("invalid rate limit policy '{}': {e}", r.policy),
                ));
            }
        }
    };
    Ok((multiplier, policy))
}

impl Node {
    /// envoyproxy/ratelimit's `loadDescriptors`: `descriptors` as children of this node, whose
    /// statistics key is `parent_key` (ending in `.`).
    fn load(
        &mut self,
        file: &str,
        parent_key: &str,
        descriptors: &[YamlDescriptor],
    ) -> Result<(), ConfigError> {
        for d in descriptors {
            if d.key.is_empty() {
                return Err(ConfigError::new(file, "descriptor has empty key"));
            }
            let mut final_key = d.key.clone();
            if !d.value.is_empty() {
                final_key.push('_');
                final_key.push_str(&d.value);
            }
            let full_key = format!("{parent_key}{final_key}");
            if self.children.contains_key(&final_key) {
                return Err(ConfigError::new(
                    file,
                    format!("duplicate descriptor composite key '{full_key}'"),
                ));
            }
            if d.rate_limit.is_some() && !d.rate_limits.is_empty() {
                return Err(ConfigError::new(file, "use rate_limit or rate_limits, not both"));
            }
            if d.quota_mode && d.rate_limits.len() > 1 {
                return Err(ConfigError::new(file, "a quota_mode descriptor takes one rate limit"));
            }
            let mut limits = d.rate_limit.iter().chain(&d.rate_limits);
            let limit = match limits.next() {
                None => None,
                Some(r) => {
                    let unit = Unit::from_name(&r.unit).filter(|&u| u != Unit::Unknown);
                    if r.unlimited {
                        if unit.is_some() {
                            return Err(ConfigError::new(
                                file,
                                "should not specify rate limit unit when unlimited",
                            ));
                        }
                    } else if unit.is_none() {
                        return Err(ConfigError::new(
                            file,
                            format!("invalid rate limit unit '{}'", r.unit),
                        ));
                    }
                    for replaces in &r.replaces {
                        if replaces.name.is_empty() {
                            return Err(ConfigError::new(
                                file,
                                "should not have an empty replaces entry",
                            ));
                        }
                        if replaces.name == r.name {
                            return Err(ConfigError::new(
                                file,
                                "replaces should not contain name of same descriptor",
                            ));
                        }
                    }
                    let (unit_multiplier, policy) = extension(file, r, unit)?;
                    let mut limit = RateLimit::new(
                        full_key.clone(),
                        r.requests_per_unit,
                        unit.unwrap_or(Unit::Unknown),
                        r.unlimited,
                        d.shadow_mode,
                        d.quota_mode,
                        r.name.clone(),
                        r.replaces.iter().map(|r| r.name.clone()).collect(),
                        d.detailed_metric,
                    );
                    limit.unit_multiplier = unit_multiplier;
                    limit.policy = policy;
                    for more in limits {
                        if r.unlimited || more.unlimited {
                            return Err(ConfigError::new(
                                file,
                                "an unlimited rate limit cannot be one of several",
                            ));
                        }
                        if !more.replaces.is_empty() {
                            return Err(ConfigError::new(
                                file,
                                "replaces belongs to a descriptor's first rate limit",
                            ));
                        }
                        let Some(unit) =
                            Unit::from_name(&more.unit).filter(|&u| u != Unit::Unknown)
                        else {
                            return Err(ConfigError::new(
                                file,
                                format!("invalid rate limit unit '{}'", more.unit),
                            ));
                        };
                        let (unit_multiplier, policy) = extension(file, more, Some(unit))?;
                        limit.more.push(MoreLimit {
                            name: more.name.clone(),
                            requests_per_unit: more.requests_per_unit,
                            unit,
                            unit_multiplier,
                            policy,
                        });
                    }
                    Some(limit)
                }
            };
            let wild = final_key.contains('*');
            if d.share_threshold && !wild {
                return Err(ConfigError::new(
                    file,
                    format!(
                        "share_threshold can only be used with wildcard values (containing '*'), but found key '{final_key}'"
                    ),
                ));
            }
            if wild {
                self.wildcards.push(Wildcard {
                    key: final_key.clone(),
                    parts: final_key.split('*').map(str::to_owned).collect(),
                });
            }
            let mut child = Node {
                limit,
                value_to_metric: d.value_to_metric,
                share_threshold: d.share_threshold,
                wildcard_pattern: if d.share_threshold { final_key.clone() } else { String::new() },
                metadata: d.metadata.as_ref().filter(|m| !m.is_empty()).map(metadata_struct),
                ..Node::default()
            };
            child.load(file, &format!("{full_key}."), &d.descriptors)?;
            self.children.insert(final_key, child);
        }
        Ok(())
    }

    fn dump(&self, out: &mut String) {
        if let Some(l) = &self.limit {
            out.push_str(&format!(
                "{}: unit={} requests_per_unit={}, shadow_mode: {}, quota_mode: {}\n",
                l.full_key,
                l.unit.name(),
                l.requests_per_unit,
                l.shadow_mode,
                l.quota_mode
            ));
        }
        let mut children: Vec<_> = self.children.iter().collect();
        children.sort_by(|a, b| a.0.cmp(b.0));
        for (_, child) in children {
            child.dump(out);
        }
    }
}

impl RateLimitConfig {
    /// Load `files` in order (envoyproxy/ratelimit's `NewRateLimitConfigImpl`). Two files of
    /// one domain are an error, unless `merge_domains` (`MERGE_DOMAIN_CONFIG`): then the later
    /// file's descriptors join the earlier's, and a descriptor both define is an error.
    pub fn new(files: &[ConfigFile], merge_domains: bool) -> Result<RateLimitConfig, ConfigError> {
        let mut config = RateLimitConfig::default();
        for file in files {
            let root = &file.root;
            if root.domain.is_empty() {
                return Err(ConfigError::new(&file.name, "config file cannot have empty domain"));
            }
            let parent_key = format!("{}.", root.domain);
            if let Some(domain) = config.domains.get_mut(&root.domain) {
                if !merge_domains {
                    return Err(ConfigError::new(
                        &file.name,
                        format!("duplicate domain '{}' in config file", root.domain),
                    ));
                }
                domain.load(&file.name, &parent_key, &root.descriptors)?;
                continue;
            }
            let mut domain = Node::default();
            domain.load(&file.name, &parent_key, &root.descriptors)?;
            config.domains.insert(root.domain.clone(), domain);
        }
        Ok(config)
    }

    /// Whether no domain is configured.
    pub fn is_empty(&self) -> bool {
        self.domains.is_empty()
    }

    /// Whether `domain` is configured.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// Every limit the configuration defines, in no particular order.
    pub fn limits(&self) -> Vec<&RateLimit> {
        fn walk<'a>(node: &'a Node, out: &mut Vec<&'a RateLimit>) {
            out.extend(node.limit.as_ref());
            for child in node.children.values() {
                walk(child, out);
            }
        }
        let mut out = Vec::new();
        for node in self.domains.values() {
            walk(node, &mut out);
        }
        out
    }

    /// Every limit, one line each (`domain.key_value: unit=SECOND requests_per_unit=5,
    /// shadow_mode: false, quota_mode: false`), domains and keys in byte order.
    pub fn dump(&self) -> String {
        let mut out = String::new();
        let mut domains: Vec<_> = self.domains.iter().collect();
        domains.sort_by(|a, b| a.0.cmp(b.0));
        for (_, node) in domains {
            node.dump(&mut out);
        }
        out
    }

    /// The limit of `descriptor` in `domain` (envoyproxy/ratelimit's `GetLimit`): `None` for an
    /// unknown domain, and where no limit applies.
    ///
    /// A descriptor carrying a limit override (in a known domain) gets it as is. Otherwise the
    /// entries walk the tree level by level: at each level the exact `key_value`, else the
    /// first wildcard of that level (in configuration order) that matches `key_value`, else
    /// `key` alone; never backtracking. A limit applies when the node of the last entry has one.
    pub fn get_limit(&self, domain: &str, descriptor: &RateLimitDescriptor) -> Option<RateLimit> {
        let root = self.domains.get(domain)?;
        if let Some(limit) = &descriptor.limit {
            return Some(RateLimit::new(
                descriptor_key(domain, descriptor),
                limit.requests_per_unit,
                Unit::try_from(limit.unit).unwrap_or(Unit::Unknown),
                false,
                false,
                false,
                String::new(),
                Vec::new(),
                false,
            ));
        }
        let entries = &descriptor.entries;
        // The node whose children the next entry is looked up in (the domain, then each match).
        let mut node = root;
        let mut detailed_key = domain.to_owned();
        let mut value_key = domain.to_owned();
        let mut share_patterns: BTreeMap<usize, String> = BTreeMap::new();
        let mut rate_limit: Option<RateLimit> = None;

        for (i, entry) in entries.iter().enumerate() {
            let key_value = format!("{}_{}", entry.key, entry.value);
            detailed_key.push('.');
            detailed_key.push_str(&key_value);

            let mut next = node.children.get(&key_value);
            let mut matched_wildcard: Option<&str> = None;
            if next.is_none() {
                if let Some(w) =
                    node.wildcards.iter().find(|w| wildcard_match(&w.parts, &key_value))
                {
                    next = node.children.get(&w.key);
                    matched_wildcard = Some(&w.key);
                }
            }
            let matched_using_value = next.is_some();
            if next.is_none() {
                next = node.children.get(&entry.key);
            }

            let key_prefix = format!("{}_", entry.key);
            if let (Some(_), Some(n)) = (matched_wildcard, next) {
                if n.share_threshold && !n.wildcard_pattern.is_empty() {
                    let pattern =
                        n.wildcard_pattern.strip_prefix(&key_prefix).unwrap_or(&n.wildcard_pattern);
                    share_patterns.insert(i, pattern.to_owned());
                }
            }

            value_key.push('.');
            value_key.push_str(&entry.key);
            if let Some(n) = next {
                let share = share_patterns.get(&i).filter(|p| !p.is_empty());
                let value: &str = match (matched_wildcard, share) {
                    (Some(_), Some(pattern)) => pattern,
                    (Some(_), None) if n.value_to_metric => &entry.value,
                    (Some(wild), None) => wild.strip_prefix(&key_prefix).unwrap_or(wild),
                    (None, _) if matched_using_value || n.value_to_metric => &entry.value,
                    (None, _) => "",
                };
                if !value.is_empty() {
                    value_key.push('_');
                    value_key.push_str(value);
                }
            }

            if let Some(limit) = next.and_then(|n| n.limit.as_ref()) {
                if i == entries.len() - 1 {
                    let mut matched = limit.clone();
                    matched.metadata = next.and_then(|n| n.metadata.clone());
                    if !share_patterns.is_empty() {
                        let mut patterns = vec![String::new(); entries.len()];
                        for (&at, pattern) in &share_patterns {
                            patterns[at] = pattern.clone();
                        }
                        matched.share_threshold_key_pattern = Some(patterns);
                    }
                    rate_limit = Some(matched);
                }
            }

            match next {
                Some(n) if !n.children.is_empty() => {
                    node = n;
                }
                _ => {
                    if let Some(limit) = rate_limit.as_mut().filter(|l| l.detailed_metric) {
                        *limit = limit.rekeyed(limit.full_key.clone());
                    }
                    break;
                }
            }
        }

        let mut limit = rate_limit?;
        if limit.detailed_metric {
            let patterns = limit.share_threshold_key_pattern.clone().filter(|p| !p.is_empty());
            let full_key = match patterns {
                Some(patterns) => {
                    let mut key = domain.to_owned();
                    for (i, entry) in entries.iter().enumerate() {
                        key.push('.');
                        key.push_str(&entry.key);
                        match patterns.get(i).filter(|p| !p.is_empty()) {
                            Some(pattern) => {
                                key.push('_');
                                key.push_str(pattern);
                            }
                            None if !entry.value.is_empty() => {
                                key.push('_');
                                key.push_str(&entry.value);
                            }
                            None => {}
                        }
                    }
                    key
                }
                None => detailed_key,
            };
            limit.full_key = full_key;
        } else if value_key != limit.full_key {
            limit = limit.rekeyed(value_key);
        }
        Some(limit)
    }
}

/// The statistics key of a descriptor with a limit override: `domain.k1_v1.k2` (a value only
/// where there is one).
fn descriptor_key(domain: &str, descriptor: &RateLimitDescriptor) -> String {
    let mut key = format!("{domain}.");
    for (i, entry) in descriptor.entries.iter().enumerate() {
        if i > 0 {
            key.push('.');
        }
        key.push_str(&entry.key);
        if !entry.value.is_empty() {
            key.push('_');
            key.push_str(&entry.value);
        }
    }
    key
}
