//! `PROMETHEUS_MAPPER_YAML`: a statsd_exporter mapping file, as the Go service's Prometheus sink
//! takes one. This service does not run statsd_exporter's mapping language; it serves the
//! default mapper's series itself (`/metrics`). A mapping file is taken when every mapping in it
//! names one of those series, from the statsd name that the service's own series comes from,
//! with the same labels from the same parts of the name: the Go service's default mapper, and
//! Envoy Gateway's (`statsd_conf.yaml`, which its Deployment mounts), are such files. Any other
//! mapping (another name or label, a `drop` action, a match on another statsd name) is refused
//! at start, naming it: a subset of the language would silently map differently.

use std::collections::BTreeMap;

use serde::Deserialize;

#[derive(Deserialize)]
struct File {
    #[serde(default)]
    mappings: Vec<Mapping>,
}

#[derive(Deserialize)]
struct Mapping {
    #[serde(rename = "match")]
    pattern: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    match_type: Option<String>,
    #[serde(default)]
    action: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

/// The stats of one rate limit key, each a series `ratelimit_service_rate_limit_<stat>`.
const KEY_STATS: [&str; 5] =
    ["near_limit", "over_limit", "total_hits", "within_limit", "shadow_mode"];

/// Whether `m` names a series this service serves, from the statsd name it comes from, with its
/// labels from the same parts: `Ok`, or why not.
fn served(m: &Mapping) -> Result<(), String> {
    if let Some(action) = m.action.as_deref().filter(|a| *a != "map") {
        return Err(format!("action `{action}`"));
    }
    let regex = match m.match_type.as_deref() {
        None | Some("glob") | Some("") => false,
        Some("regex") => true,
        Some(other) => return Err(format!("match_type `{other}`")),
    };
    let labels = |want: &[(&str, &str)]| -> Result<(), String> {
        let got: Vec<(&str, &str)> =
            m.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let mut want = want.to_vec();
        want.sort_unstable();
        if got == want { Ok(()) } else { Err(format!("labels {:?}, not {want:?}", m.labels)) }
    };
    if let Some(stat) = m.name.strip_prefix("ratelimit_service_rate_limit_") {
        if !KEY_STATS.contains(&stat) {
            return Err(format!("name `{}`", m.name));
        }
        let glob = format!("ratelimit.service.rate_limit.*.*.{stat}");
        let regex_form = format!(
            "ratelimit\\.service\\.rate_limit\\.([^\\.]*)\\.([^\\.]*)\\.([^\\.]*)(\\..*)?\\.{stat}"
        );
        return match (regex, m.pattern.as_str()) {
            (false, p) if p == glob => labels(&[("domain", "$1"), ("key1", "$2")]),
            (true, p) if p == regex_form => {
                labels(&[("domain", "$1"), ("key1", "$2"), ("key2", "$3")])
            }
            _ => Err(format!("match `{}` for `{}`", m.pattern, m.name)),
        };
    }
    let (pattern, want): (&str, &[(&str, &str)]) = match m.name.as_str() {
        "ratelimit_service_should_rate_limit_error" => {
            ("ratelimit.service.call.should_rate_limit.*", &[("err_type", "$1")])
        }
        "ratelimit_service_total_requests" => {
            ("ratelimit_server.*.total_requests", &[("grpc_method", "$1")])
        }
        "ratelimit_service_response_time_seconds" => {
            ("ratelimit_server.*.response_time", &[("grpc_method", "$1")])
        }
        "ratelimit_service_config_load_success" => ("ratelimit.service.config_load_success", &[]),
        "ratelimit_service_config_load_error" => ("ratelimit.service.config_load_error", &[]),
        "ratelimit_service_global_shadow_mode" => ("ratelimit.service.global_shadow_mode", &[]),
        other => return Err(format!("name `{other}`")),
    };
    if regex || m.pattern != pattern {
        return Err(format!("match `{}` for `{}`", m.pattern, m.name));
    }
    labels(want)
}

/// Check the mapping file `text` (from `path`, for messages): `Ok` with how many mappings it
/// holds, all naming series this service serves; or the first that does not, and why.
pub fn check(path: &str, text: &str) -> Result<usize, String> {
    let file: File = serde_yaml_ng::from_str(text).map_err(|e| {
        format!("PROMETHEUS_MAPPER_YAML={path}: not a statsd_exporter mapping file: {e}")
    })?;
    for (i, m) in file.mappings.iter().enumerate() {
        served(m).map_err(|why| {
            format!(
                "PROMETHEUS_MAPPER_YAML={path} is not supported: mapping {} (`{}`) has {why}; the \
                 series served are the default mapper's, and only a file of those mappings is taken",
                i + 1,
                m.pattern
            )
        })?;
    }
    Ok(file.mappings.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape of the Go service's default mapper (and Envoy Gateway's): one glob and one
    /// regex mapping per key stat, then the service's own series.
    fn default_mapper() -> String {
        let mut out = String::from("mappings:\n");
        for stat in KEY_STATS {
            out.push_str(&format!(
                "  - match: \"ratelimit.service.rate_limit.*.*.{stat}\"\n    name: \"ratelimit_service_rate_limit_{stat}\"\n    timer_type: \"histogram\"\n    labels:\n      domain: \"$1\"\n      key1: \"$2\"\n"
            ));
        }
        for stat in KEY_STATS {
            out.push_str(&format!(
                "  - match: \"ratelimit\\\\.service\\\\.rate_limit\\\\.([^\\\\.]*)\\\\.([^\\\\.]*)\\\\.([^\\\\.]*)(\\\\..*)?\\\\.{stat}\"\n    match_type: regex\n    name: \"ratelimit_service_rate_limit_{stat}\"\n    timer_type: \"histogram\"\n    labels:\n      domain: \"$1\"\n      key1: \"$2\"\n      key2: \"$3\"\n"
            ));
        }
        out.push_str(
            "  - match: \"ratelimit.service.call.should_rate_limit.*\"\n    name: \"ratelimit_service_should_rate_limit_error\"\n    match_metric_type: counter\n    labels:\n      err_type: \"$1\"\n\
             \x20 - match: \"ratelimit_server.*.total_requests\"\n    name: \"ratelimit_service_total_requests\"\n    match_metric_type: counter\n    labels:\n      grpc_method: \"$1\"\n\
             \x20 - match: \"ratelimit_server.*.response_time\"\n    name: \"ratelimit_service_response_time_seconds\"\n    timer_type: histogram\n    scale: 0.001\n    labels:\n      grpc_method: \"$1\"\n\
             \x20 - match: \"ratelimit.service.config_load_success\"\n    name: \"ratelimit_service_config_load_success\"\n    match_metric_type: counter\n\
             \x20 - match: \"ratelimit.service.config_load_error\"\n    name: \"ratelimit_service_config_load_error\"\n    match_metric_type: counter\n",
        );
        out
    }

    #[test]
    fn the_default_mapper_is_taken() {
        assert_eq!(check("m.yaml", &default_mapper()), Ok(15));
        assert_eq!(check("m.yaml", "mappings: []"), Ok(0));
    }

    #[test]
    fn any_other_mapping_is_refused_by_name() {
        let swapped = default_mapper().replacen(
            "name: \"ratelimit_service_rate_limit_near_limit\"",
            "name: \"ratelimit_service_rate_limit_over_limit\"",
            1,
        );
        let e = check("m.yaml", &swapped).unwrap_err();
        assert!(e.contains("mapping 1 (`ratelimit.service.rate_limit.*.*.near_limit`)"), "{e}");
        let relabelled = default_mapper().replacen("key1: \"$2\"", "client: \"$2\"", 1);
        assert!(check("m.yaml", &relabelled).unwrap_err().contains("labels"));
        let dropped = "mappings:\n  - match: \"ratelimit.go.*\"\n    name: x\n    action: drop\n";
        assert!(check("m.yaml", dropped).unwrap_err().contains("action `drop`"));
        let other = "mappings:\n  - match: \"a.*\"\n    name: \"my_series\"\n";
        assert!(check("m.yaml", other).unwrap_err().contains("name `my_series`"));
        assert!(check("m.yaml", "mappings: 3").unwrap_err().contains("not a statsd_exporter"));
    }
}
