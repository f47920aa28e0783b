//! A configuration file read as envoyproxy/ratelimit reads it: YAML (or an xDS resource) into
//! one domain's descriptors, with the Go service's error messages for what it refuses.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;
use serde_yaml_ng::Value;

/// A configuration error: the file's name, and what is wrong (envoyproxy/ratelimit's words).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    file: String,
    message: String,
}

impl ConfigError {
    pub(super) fn new(file: &str, message: impl Into<String>) -> Self {
        ConfigError { file: file.to_owned(), message: message.into() }
    }

    /// The file the error is in.
    pub fn file(&self) -> &str {
        &self.file
    }

    /// What is wrong, without the file's name.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.file, self.message)
    }
}

impl std::error::Error for ConfigError {}

/// The keys a configuration file may use, at any level: the Go service's, then this service's
/// extensions (`policy`, `unit_multiplier`, `rate_limits`).
const VALID_KEYS: [&str; 19] = [
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
    "policy",
    "unit_multiplier",
    "rate_limits",
];

/// One parsed configuration file (one domain's descriptors), before it is loaded.
#[derive(Clone, Debug)]
pub struct ConfigFile {
    pub(super) name: String,
    pub(super) root: YamlRoot,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub(super) struct YamlRoot {
    #[serde(default, deserialize_with = "scalar_string")]
    pub(super) domain: String,
    #[serde(default, deserialize_with = "list")]
    pub(super) descriptors: Vec<YamlDescriptor>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub(super) struct YamlDescriptor {
    #[serde(default, deserialize_with = "scalar_string")]
    pub(super) key: String,
    #[serde(default, deserialize_with = "scalar_string")]
    pub(super) value: String,
    #[serde(default)]
    pub(super) rate_limit: Option<YamlRateLimit>,
    #[serde(default, deserialize_with = "list")]
    pub(super) rate_limits: Vec<YamlRateLimit>,
    #[serde(default, deserialize_with = "list")]
    pub(super) descriptors: Vec<YamlDescriptor>,
    #[serde(default, deserialize_with = "flag")]
    pub(super) shadow_mode: bool,
    #[serde(default, deserialize_with = "flag")]
    pub(super) quota_mode: bool,
    #[serde(default, deserialize_with = "flag")]
    pub(super) detailed_metric: bool,
    #[serde(default, deserialize_with = "flag")]
    pub(super) value_to_metric: bool,
    #[serde(default, deserialize_with = "flag")]
    pub(super) share_threshold: bool,
    #[serde(default)]
    pub(super) metadata: Option<BTreeMap<String, Value>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub(super) struct YamlRateLimit {
    #[serde(default, deserialize_with = "count")]
    pub(super) requests_per_unit: u32,
    #[serde(default, deserialize_with = "scalar_string")]
    pub(super) unit: String,
    #[serde(default, deserialize_with = "flag")]
    pub(super) unlimited: bool,
    #[serde(default, deserialize_with = "scalar_string")]
    pub(super) name: String,
    #[serde(default, deserialize_with = "list")]
    pub(super) replaces: Vec<YamlReplaces>,
    #[serde(default, deserialize_with = "scalar_string")]
    pub(super) policy: String,
    #[serde(default, deserialize_with = "count")]
    pub(super) unit_multiplier: u32,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub(super) struct YamlReplaces {
    #[serde(default, deserialize_with = "scalar_string")]
    pub(super) name: String,
}

/// A string field: any scalar, written as YAML wrote it (`value: 443` is the string `443`, as
/// Go's `yaml.v2` reads it); null is the empty string.
fn scalar_string<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    use serde::de::Error;
    match Value::deserialize(d)? {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s),
        Value::Bool(b) => Ok(b.to_string()),
        Value::Number(n) => Ok(n.to_string()),
        other => Err(D::Error::custom(format!("cannot read {} as a string", kind(&other)))),
    }
}

/// A list field; null is the empty list.
fn list<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

/// A boolean field; null is false.
fn flag<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(Option::<bool>::deserialize(d)?.unwrap_or_default())
}

/// `requests_per_unit`: an integer from 0 to 2^32 - 1; null is 0.
fn count<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    Ok(Option::<u32>::deserialize(d)?.unwrap_or_default())
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a map",
        Value::Tagged(_) => "a tagged value",
    }
}

/// `value` as Go's `%v` prints what `yaml.v2` decoded it to (a key or a list element in an
/// error message).
pub(super) fn go_format(value: &Value) -> String {
    match value {
        Value::Null => "<nil>".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && f.is_finite() && f == f.trunc() && f.abs() < 1e21 => {
                format!("{f:.0}")
            }
            _ => n.to_string(),
        },
        Value::String(s) => s.clone(),
        Value::Sequence(items) => {
            let items: Vec<String> = items.iter().map(go_format).collect();
            format!("[{}]", items.join(" "))
        }
        Value::Mapping(map) => {
            let mut pairs: Vec<String> =
                map.iter().map(|(k, v)| format!("{}:{}", go_format(k), go_format(v))).collect();
            pairs.sort();
            format!("map[{}]", pairs.join(" "))
        }
        Value::Tagged(tagged) => go_format(&tagged.value),
    }
}

/// envoyproxy/ratelimit's `validateYamlKeys`: every mapping key a string among
/// [`VALID_KEYS`], every list a list of mappings, every leaf a string, an integer, a boolean or
/// null (`metadata` is free-form and not looked into).
fn validate_keys(file: &str, map: &serde_yaml_ng::Mapping) -> Result<(), ConfigError> {
    for (key, value) in map {
        let Value::String(key) = key else {
            return Err(ConfigError::new(
                file,
                format!("config error, key is not of type string: {}", go_format(key)),
            ));
        };
        if !VALID_KEYS.contains(&key.as_str()) {
            return Err(ConfigError::new(file, format!("config error, unknown key '{key}'")));
        }
        if key == "metadata" {
            continue;
        }
        validate_value(file, value)?;
    }
    Ok(())
}

fn validate_value(file: &str, value: &Value) -> Result<(), ConfigError> {
    match value {
        Value::Sequence(items) => {
            for item in items {
                let Value::Mapping(map) = item else {
                    return Err(ConfigError::new(
                        file,
                        format!(
                            "config error, yaml file contains list of type other than map: {}",
                            go_format(item)
                        ),
                    ));
                };
                validate_keys(file, map)?;
            }
            Ok(())
        }
        Value::Mapping(map) => validate_keys(file, map),
        Value::String(_) | Value::Bool(_) | Value::Null => Ok(()),
        // Go's `int`: what yaml.v2 decodes an integer to when it fits in 64 signed bits.
        Value::Number(n) if n.is_i64() => Ok(()),
        _ => Err(ConfigError::new(file, "error checking config")),
    }
}

impl ConfigFile {
    /// Read the file `name` holding `content`: as YAML, its keys checked, then in the
    /// configuration's shape (envoyproxy/ratelimit's `ConfigFileContentToYaml`).
    pub fn parse(name: &str, content: &str) -> Result<ConfigFile, ConfigError> {
        let load_error = |e: serde_yaml_ng::Error| {
            ConfigError::new(name, format!("error loading config file: {e}"))
        };
        let value: Value = serde_yaml_ng::from_str(content).map_err(load_error)?;
        match &value {
            // An empty file is an empty mapping (so: no domain).
            Value::Null => {}
            Value::Mapping(map) => validate_keys(name, map)?,
            other => {
                return Err(ConfigError::new(
                    name,
                    format!("error loading config file: the file is {}, not a map", kind(other)),
                ));
            }
        }
        let root = if value.is_null() {
            YamlRoot::default()
        } else {
            serde_yaml_ng::from_str(content).map_err(load_error)?
        };
        Ok(ConfigFile { name: name.to_owned(), root })
    }

    /// The file an xDS `RateLimitConfig` resource stands for, as envoyproxy/ratelimit's
    /// `ConfigXdsProtoToYaml` makes it: named by the resource's `name`, each field as the YAML
    /// key of the same name, the unit by Go's name for its number (`SECOND`; `UNKNOWN` for 0,
    /// which only an unlimited limit may have; a number the enum does not declare as the number,
    /// which the load refuses), no `value_to_metric` or `share_threshold` (the resource has
    /// neither). It is checked when loaded ([`RateLimitConfig::new`](crate::configuration::config::RateLimitConfig::new)), as a YAML file is.
    pub fn from_xds(resource: &crate::configuration::xds::proto::RateLimitConfig) -> ConfigFile {
        let root = YamlRoot {
            domain: resource.domain.clone(),
            descriptors: resource.descriptors.iter().map(xds_descriptor).collect(),
        };
        ConfigFile { name: resource.name.clone(), root }
    }

    /// The file's name (in its errors).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The domain the file configures.
    pub fn domain(&self) -> &str {
        &self.root.domain
    }
}

/// An xDS `RateLimitDescriptor` as the YAML descriptor it stands for.
fn xds_descriptor(d: &crate::configuration::xds::proto::RateLimitDescriptor) -> YamlDescriptor {
    YamlDescriptor {
        key: d.key.clone(),
        value: d.value.clone(),
        rate_limit: d.rate_limit.as_ref().map(|r| YamlRateLimit {
            requests_per_unit: r.requests_per_unit,
            unit: crate::configuration::xds::proto::RateLimitUnit::go_name(r.unit),
            unlimited: r.unlimited,
            name: r.name.clone(),
            replaces: r.replaces.iter().map(|r| YamlReplaces { name: r.name.clone() }).collect(),
            ..YamlRateLimit::default()
        }),
        descriptors: d.descriptors.iter().map(xds_descriptor).collect(),
        shadow_mode: d.shadow_mode,
        quota_mode: d.quota_mode,
        detailed_metric: d.detailed_metric,
        metadata: d
            .metadata
            .as_ref()
            .map(|m| m.fields.iter().map(|(k, v)| (k.clone(), yaml_value(v))).collect()),
        ..YamlDescriptor::default()
    }
}

/// A `google.protobuf.Value` as the YAML value that [`metadata_value`] turns back into it (Go's
/// `structpb.AsMap`, then `structpb.NewStruct`).
fn yaml_value(value: &prost_types::Value) -> Value {
    use prost_types::value::Kind;
    match &value.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::NumberValue(n)) => Value::Number((*n).into()),
        Some(Kind::StringValue(s)) => Value::String(s.clone()),
        Some(Kind::BoolValue(b)) => Value::Bool(*b),
        Some(Kind::StructValue(s)) => Value::Mapping(
            s.fields.iter().map(|(k, v)| (Value::String(k.clone()), yaml_value(v))).collect(),
        ),
        Some(Kind::ListValue(l)) => Value::Sequence(l.values.iter().map(yaml_value).collect()),
    }
}
