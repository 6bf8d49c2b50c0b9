//! envoyproxy/ratelimit's YAML config, unchanged: loading, the same validation (each error
//! names the file), and the same lookup of a descriptor's limit. Pure: no Redis, no clock.
//!
//! Lookup follows the Go service's `GetLimit`: at each level the entry's `key_value` is tried
//! first, then wildcard values (`foo*`, first match in file order), then the key alone (the
//! default); a limit applies only when the request's entries end at the level that holds it;
//! a level without `rate_limit` whitelists.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use redis_rl_client::Limit;

use serde_yaml_ng::Value;

/// The keys a config file may hold anywhere; any other is a misspelling and refused, as the
/// Go service refuses it. `unit_multiplier`, `value_to_metric` and `share_threshold` are the
/// Go service's newer keys, as are `quota_mode` and `metadata` (a descriptor's own map, sent
/// back in the response's dynamic metadata, whose keys are the user's and not checked);
/// `burst` (the bucket's capacity) and `post_paid` are this service's extensions.
const VALID_KEYS: &[&str] = &[
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "unit_multiplier",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "quota_mode",
    "metadata",
    "burst",
    "post_paid",
];

/// A config error: the file and the problem, as `<file>: <problem>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The file that holds the problem.
    pub file: String,
    /// What is wrong.
    pub problem: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.file, self.problem)
    }
}

impl std::error::Error for ConfigError {}

/// A rate limit's unit, with its length in seconds (a month is 30 days and a year 365, as
/// the Go service counts them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl Unit {
    /// The unit named `text`, case-insensitive, as the Go service reads it.
    pub fn parse(text: &str) -> Option<Unit> {
        Some(match text.to_ascii_lowercase().as_str() {
            "second" => Unit::Second,
            "minute" => Unit::Minute,
            "hour" => Unit::Hour,
            "day" => Unit::Day,
            "week" => Unit::Week,
            "month" => Unit::Month,
            "year" => Unit::Year,
            _ => return None,
        })
    }

    /// The unit's length in seconds.
    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 604_800,
            Unit::Month => 2_592_000,
            Unit::Year => 31_536_000,
        }
    }

    /// The proto's enum value (`RateLimitResponse.RateLimit.Unit`).
    pub fn proto(self) -> i32 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 2,
            Unit::Hour => 3,
            Unit::Day => 4,
            Unit::Month => 5,
            Unit::Year => 6,
            Unit::Week => 7,
        }
    }

    /// The unit of a proto enum value; `None` for UNKNOWN or an unknown number.
    pub fn from_proto(value: i32) -> Option<Unit> {
        Some(match value {
            1 => Unit::Second,
            2 => Unit::Minute,
            3 => Unit::Hour,
            4 => Unit::Day,
            5 => Unit::Month,
            6 => Unit::Year,
            7 => Unit::Week,
            _ => return None,
        })
    }
}

/// One `rate_limit` block.
#[derive(Clone, Debug, PartialEq)]
pub struct RateLimit {
    /// Tokens per period.
    pub requests_per_unit: u32,
    pub unit: Unit,
    /// The period is `unit × unit_multiplier` (at least 1).
    pub unit_multiplier: u32,
    /// The bucket's capacity; `requests_per_unit` unless `burst` says otherwise.
    pub burst: Option<f64>,
    /// Always allowed, nothing counted in Redis.
    pub unlimited: bool,
    pub name: String,
    pub replaces: Vec<String>,
    /// Hits always apply, even past what is left (the bucket goes into debt), and the
    /// descriptor is over its limit while in debt: a charge after the fact (Envoy's
    /// `apply_on_stream_done`) is never refused. Quota-mode limits are always post-paid.
    pub post_paid: bool,
    /// The limit sent to Redis, built once when the config loads rather than on every call;
    /// `Err` (the client library's text) is answered per call, as the limit is used.
    pub bucket: Result<Limit, String>,
}

/// The limit sent to Redis: `requests_per_unit` every `period_s` seconds exactly (the
/// module's `N/S` rate: 100 per minute is one token every 0.6 s), with `capacity` tokens.
pub fn bucket_limit(requests_per_unit: u32, period_s: u64, capacity: f64) -> Result<Limit, String> {
    let limit = Limit::per(
        u64::from(requests_per_unit),
        std::time::Duration::from_secs(period_s.max(1)),
    )
    .map_err(|e| e.to_string())?;
    if capacity == f64::from(requests_per_unit) {
        return Ok(limit);
    }
    limit.with_capacity(capacity).map_err(|e| e.to_string())
}

/// One level of the descriptor tree.
#[derive(Clone, Debug, Default)]
struct Node {
    limit: Option<Limited>,
    children: HashMap<String, Node>,
    /// Wildcard child keys (`key_prefix*`), in file order.
    wildcards: Vec<String>,
}

#[derive(Clone, Debug)]
struct Limited {
    /// Shared with every call's [`Match`], so a lookup copies no strings.
    rate_limit: Arc<RateLimit>,
    /// The config path of this level (`domain.key_value.key`), the Go service's stats key.
    full_key: String,
    shadow_mode: bool,
    detailed_metric: bool,
    quota_mode: bool,
    /// The level's `metadata`, as JSON (the response's dynamic metadata is a Struct).
    metadata: Option<Arc<serde_json::Value>>,
}

#[derive(Clone, Copy, Debug, Default)]
struct LevelFlags {
    value_to_metric: bool,
    share_threshold: bool,
}

/// The loaded config: domains and their descriptor trees.
#[derive(Clone, Debug, Default)]
pub struct Config {
    domains: HashMap<String, Node>,
    /// Per level, the flags that change the key or the metric name.
    flags: HashMap<String, LevelFlags>,
    /// The files loaded, for the log line.
    pub files: Vec<PathBuf>,
}

/// The limit a descriptor gets, with what its key and metrics are named after.
#[derive(Clone, Debug, PartialEq)]
pub struct Match {
    pub rate_limit: Arc<RateLimit>,
    /// The stats key: the config path, with the request's value where `detailed_metric` or
    /// `value_to_metric` ask for it.
    pub stats_key: String,
    pub shadow_mode: bool,
    /// `quota_mode: true` on the level: the request is over only when every quota-mode
    /// descriptor is (or a plain one is), and hits are post-paid.
    pub quota_mode: bool,
    /// The level's `metadata`, merged into the response's dynamic metadata when the
    /// descriptor is within its limit (`RESPONSE_DYNAMIC_METADATA=true`).
    pub metadata: Option<Arc<serde_json::Value>>,
    /// The entries the bucket is keyed by: the request's, except a `share_threshold`
    /// wildcard level, which keys by its pattern so all matching values share one bucket.
    pub key_entries: Vec<(String, String)>,
}

impl Config {
    /// Loads every `*.yaml` / `*.yml` file of `dir`, sorted by name.
    ///
    /// # Errors
    /// The first file's problem, naming the file; an unreadable directory names the
    /// directory.
    pub fn load_dir(dir: &Path) -> Result<Config, ConfigError> {
        let entries = std::fs::read_dir(dir).map_err(|e| ConfigError {
            file: dir.display().to_string(),
            problem: format!("cannot read the config directory: {e}"),
        })?;
        let mut paths: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.is_file()
                    && matches!(
                        p.extension().and_then(|x| x.to_str()),
                        Some("yaml") | Some("yml")
                    )
            })
            .collect();
        paths.sort();
        let mut files = Vec::new();
        for path in &paths {
            let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
                file: path.display().to_string(),
                problem: format!("cannot read: {e}"),
            })?;
            files.push((path.display().to_string(), text));
        }
        let mut config = Config::from_texts(&files)?;
        config.files = paths;
        Ok(config)
    }

    /// Loads `(file name, YAML text)` pairs; a domain may appear in one file only.
    ///
    /// # Errors
    /// The first problem found, naming its file.
    pub fn from_texts(files: &[(String, String)]) -> Result<Config, ConfigError> {
        let mut config = Config::default();
        for (name, text) in files {
            let err = |problem: String| ConfigError {
                file: name.clone(),
                problem,
            };
            let root: Value = serde_yaml_ng::from_str(text)
                .map_err(|e| err(format!("error loading config file: {e}")))?;
            let map = match &root {
                Value::Mapping(map) => map,
                Value::Null => return Err(err("config file cannot have empty domain".into())),
                _ => return Err(err("config file must be a map".into())),
            };
            validate_keys(map).map_err(err)?;
            let domain = string_field(map, "domain")
                .map_err(err)?
                .unwrap_or_default();
            if domain.is_empty() {
                return Err(err("config file cannot have empty domain".into()));
            }
            if config.domains.contains_key(&domain) {
                return Err(err(format!("duplicate domain '{domain}' in config file")));
            }
            let mut node = Node::default();
            let descriptors = list_field(map, "descriptors").map_err(err)?;
            load_level(
                &mut node,
                &mut config.flags,
                &format!("{domain}."),
                descriptors,
            )
            .map_err(err)?;
            config.domains.insert(domain, node);
        }
        Ok(config)
    }

    /// The number of domains loaded.
    pub fn domain_count(&self) -> usize {
        self.domains.len()
    }

    /// Whether `domain` is configured.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// The limit of a descriptor's `entries` in `domain`, or `None` (no limit: allowed).
    pub fn lookup(&self, domain: &str, entries: &[(String, String)]) -> Option<Match> {
        let mut node = self.domains.get(domain)?;
        let mut found: Option<Match> = None;
        let mut key_entries = Vec::with_capacity(entries.len());
        let mut stats_key = domain.to_string();
        // Whether a level on the path names its metric after the request's value.
        let mut valued = false;
        for (index, (key, value)) in entries.iter().enumerate() {
            let exact = format!("{key}_{value}");
            let (child_key, child) = if let Some(child) = node.children.get(&exact) {
                (exact.clone(), Some(child))
            } else if let Some(w) = node
                .wildcards
                .iter()
                .find(|w| exact.starts_with(w.trim_end_matches('*')))
            {
                (w.clone(), node.children.get(w))
            } else {
                (key.clone(), node.children.get(key))
            };
            let flags = self
                .flags
                .get(&format!("{stats_key}.{child_key}"))
                .copied()
                .unwrap_or_default();
            let shared = flags.share_threshold && child_key.ends_with('*');
            key_entries.push((
                key.clone(),
                if shared {
                    child_key
                        .strip_prefix(&format!("{key}_"))
                        .unwrap_or(&child_key)
                        .to_string()
                } else {
                    value.clone()
                },
            ));
            valued |= flags.value_to_metric && !shared;
            let level_name = if flags.value_to_metric && !shared {
                exact.clone()
            } else {
                child_key.clone()
            };
            stats_key = format!("{stats_key}.{level_name}");
            let Some(child) = child else {
                break;
            };
            if let Some(limited) = &child.limit {
                if index + 1 == entries.len() {
                    found = Some(Match {
                        rate_limit: limited.rate_limit.clone(),
                        stats_key: if valued {
                            stats_key.clone()
                        } else {
                            limited.full_key.clone()
                        },
                        shadow_mode: limited.shadow_mode,
                        quota_mode: limited.quota_mode,
                        metadata: limited.metadata.clone(),
                        key_entries: key_entries.clone(),
                    });
                }
            }
            if child.children.is_empty() {
                if let Some(m) = found.as_mut() {
                    // detailed_metric names a key-only (default) level's metric after the
                    // request's value.
                    let detailed = child.limit.as_ref().is_some_and(|l| l.detailed_metric);
                    if detailed && child_key == *key {
                        m.stats_key = format!("{}_{value}", m.stats_key);
                    }
                }
                break;
            }
            node = child;
        }
        found
    }
}

fn validate_keys(map: &serde_yaml_ng::Mapping) -> Result<(), String> {
    for (k, v) in map {
        let Value::String(key) = k else {
            return Err(format!(
                "config error, key is not of type string: {}",
                short(k)
            ));
        };
        if !VALID_KEYS.contains(&key.as_str()) {
            return Err(format!("config error, unknown key '{key}'"));
        }
        if key == "metadata" {
            // The user's own map: any keys, checked when the level loads.
            continue;
        }
        match v {
            Value::Sequence(items) => {
                for item in items {
                    let Value::Mapping(inner) = item else {
                        return Err(format!(
                            "config error, yaml file contains list of type other than map: {}",
                            short(item)
                        ));
                    };
                    validate_keys(inner)?;
                }
            }
            Value::Mapping(inner) => validate_keys(inner)?,
            _ => {}
        }
    }
    Ok(())
}

fn short(value: &Value) -> String {
    let text = serde_yaml_ng::to_string(value).unwrap_or_default();
    let text = text.trim();
    text.chars().take(80).collect()
}

fn get<'a>(map: &'a serde_yaml_ng::Mapping, key: &str) -> Option<&'a Value> {
    map.get(Value::String(key.to_string()))
        .filter(|v| !v.is_null())
}

fn string_field(map: &serde_yaml_ng::Mapping, key: &str) -> Result<Option<String>, String> {
    match get(map, key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        // YAML reads `value: 42` or `value: true` as a number or a bool; the Go service takes
        // them as their text.
        Some(Value::Number(n)) => Ok(Some(n.to_string())),
        Some(Value::Bool(b)) => Ok(Some(b.to_string())),
        Some(_) => Err(format!("'{key}' must be a string")),
    }
}

fn bool_field(map: &serde_yaml_ng::Mapping, key: &str) -> Result<bool, String> {
    match get(map, key) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(format!("'{key}' must be true or false")),
    }
}

fn u32_field(map: &serde_yaml_ng::Mapping, key: &str) -> Result<Option<u32>, String> {
    match get(map, key) {
        None => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| format!("'{key}' must be a whole number from 0 to 4294967295")),
        Some(_) => Err(format!(
            "'{key}' must be a whole number from 0 to 4294967295"
        )),
    }
}

/// A level's `metadata`: a map with string keys, kept as JSON.
fn metadata_field(
    map: &serde_yaml_ng::Mapping,
    full_key: &str,
) -> Result<Option<Arc<serde_json::Value>>, String> {
    let Some(value) = get(map, "metadata") else {
        return Ok(None);
    };
    let bad = || format!("'metadata' of '{full_key}' must be a map with string keys");
    if !matches!(value, Value::Mapping(_)) {
        return Err(bad());
    }
    match serde_json::to_value(value) {
        Ok(json @ serde_json::Value::Object(_)) => Ok(Some(Arc::new(json))),
        _ => Err(bad()),
    }
}

fn list_field<'a>(map: &'a serde_yaml_ng::Mapping, key: &str) -> Result<&'a [Value], String> {
    match get(map, key) {
        None => Ok(&[]),
        Some(Value::Sequence(items)) => Ok(items),
        Some(_) => Err(format!("'{key}' must be a list")),
    }
}

fn load_level(
    node: &mut Node,
    flags: &mut HashMap<String, LevelFlags>,
    parent_key: &str,
    descriptors: &[Value],
) -> Result<(), String> {
    for item in descriptors {
        let Value::Mapping(map) = item else {
            return Err("descriptors must be a list of maps".into());
        };
        let key = string_field(map, "key")?.unwrap_or_default();
        if key.is_empty() {
            return Err("descriptor has empty key".into());
        }
        let value = string_field(map, "value")?.unwrap_or_default();
        let final_key = if value.is_empty() {
            key.clone()
        } else {
            format!("{key}_{value}")
        };
        let full_key = format!("{parent_key}{final_key}");
        if node.children.contains_key(&final_key) {
            return Err(format!("duplicate descriptor composite key '{full_key}'"));
        }
        let rate_limit = match get(map, "rate_limit") {
            None => None,
            Some(Value::Mapping(rl)) => Some(load_rate_limit(rl)?),
            Some(_) => return Err(format!("'rate_limit' of '{full_key}' must be a map")),
        };
        flags.insert(
            full_key.clone(),
            LevelFlags {
                value_to_metric: bool_field(map, "value_to_metric")?,
                share_threshold: bool_field(map, "share_threshold")?,
            },
        );
        let mut child = Node {
            limit: rate_limit.map(|rate_limit| Limited {
                rate_limit: Arc::new(rate_limit),
                full_key: full_key.clone(),
                shadow_mode: false,
                detailed_metric: false,
                quota_mode: false,
                metadata: None,
            }),
            ..Node::default()
        };
        if let Some(limited) = child.limit.as_mut() {
            limited.shadow_mode = bool_field(map, "shadow_mode")?;
            limited.detailed_metric = bool_field(map, "detailed_metric")?;
            limited.quota_mode = bool_field(map, "quota_mode")?;
            limited.metadata = metadata_field(map, &full_key)?;
        }
        load_level(
            &mut child,
            flags,
            &format!("{full_key}."),
            list_field(map, "descriptors")?,
        )?;
        if final_key.ends_with('*') {
            node.wildcards.push(final_key.clone());
        }
        node.children.insert(final_key, child);
    }
    Ok(())
}

fn load_rate_limit(map: &serde_yaml_ng::Mapping) -> Result<RateLimit, String> {
    let unlimited = bool_field(map, "unlimited")?;
    let unit_text = string_field(map, "unit")?.unwrap_or_default();
    let unit = Unit::parse(&unit_text);
    if unlimited && unit.is_some() {
        return Err("should not specify rate limit unit when unlimited".into());
    }
    let unit = match (unit, unlimited) {
        (Some(unit), _) => unit,
        (None, true) => Unit::Second,
        (None, false) => return Err(format!("invalid rate limit unit '{unit_text}'")),
    };
    let requests_per_unit = u32_field(map, "requests_per_unit")?.unwrap_or(0);
    if !unlimited && requests_per_unit == 0 {
        return Err(
            "requests_per_unit must be at least 1 (use unlimited: true for no limit)".into(),
        );
    }
    let unit_multiplier = u32_field(map, "unit_multiplier")?.unwrap_or(1);
    if unit_multiplier == 0 {
        return Err("unit_multiplier must be at least 1".into());
    }
    let burst = match get(map, "burst") {
        None => None,
        Some(Value::Number(n)) => match n.as_f64() {
            Some(b) if b.is_finite() && b > 0.0 && b <= 1e15 => Some(b),
            _ => return Err("burst must be a number above 0 and at most 1e15".into()),
        },
        Some(_) => return Err("burst must be a number above 0 and at most 1e15".into()),
    };
    let name = string_field(map, "name")?.unwrap_or_default();
    let post_paid = bool_field(map, "post_paid")?;
    let mut replaces = Vec::new();
    for item in list_field(map, "replaces")? {
        let Value::Mapping(r) = item else {
            return Err("replaces must be a list of maps with a name".into());
        };
        let replaced = string_field(r, "name")?.unwrap_or_default();
        if replaced.is_empty() {
            return Err("should not have an empty replaces entry".into());
        }
        if replaced == name {
            return Err("replaces should not contain name of same descriptor".into());
        }
        replaces.push(replaced);
    }
    let period_s = unit
        .seconds()
        .saturating_mul(u64::from(unit_multiplier.max(1)));
    Ok(RateLimit {
        requests_per_unit,
        unit,
        unit_multiplier,
        burst,
        unlimited,
        name,
        replaces,
        post_paid,
        bucket: bucket_limit(
            requests_per_unit,
            period_s,
            burst.unwrap_or(f64::from(requests_per_unit)),
        ),
    })
}

/// The domains and their files, for the startup log.
pub fn summary(config: &Config) -> BTreeMap<String, usize> {
    config
        .domains
        .iter()
        .map(|(d, n)| (d.clone(), n.children.len()))
        .collect()
}

/// The names of limits replaced by other limits in one request (the Go service's `replaces`).
pub fn replaced_names<'a>(matches: impl Iterator<Item = &'a RateLimit>) -> HashSet<String> {
    matches.flat_map(|r| r.replaces.iter().cloned()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<Config, ConfigError> {
        Config::from_texts(&[("f.yaml".into(), text.into())])
    }

    fn entries(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    const BASIC: &str = "
domain: d
descriptors:
  - key: k1
    value: v1
    rate_limit: {unit: second, requests_per_unit: 5}
    descriptors:
      - key: k2
        rate_limit: {unit: minute, requests_per_unit: 10, name: inner}
  - key: k1
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: white
    value: listed
  - key: w
    value: pre*
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 7}
";

    #[test]
    fn exact_value_beats_the_key_default() {
        let c = load(BASIC).unwrap();
        let m = c.lookup("d", &entries(&[("k1", "v1")])).unwrap();
        assert_eq!(m.rate_limit.requests_per_unit, 5);
        assert_eq!(m.stats_key, "d.k1_v1");
        // Another value falls back to the key-only default.
        let m = c.lookup("d", &entries(&[("k1", "other")])).unwrap();
        assert_eq!(
            (m.rate_limit.requests_per_unit, m.rate_limit.unit),
            (3, Unit::Hour)
        );
        assert_eq!(m.stats_key, "d.k1");
    }

    #[test]
    fn a_limit_applies_only_at_the_request_depth() {
        let c = load(BASIC).unwrap();
        let m = c
            .lookup("d", &entries(&[("k1", "v1"), ("k2", "x")]))
            .unwrap();
        assert_eq!(m.rate_limit.name, "inner");
        assert_eq!(m.stats_key, "d.k1_v1.k2");
        // One entry too many: no limit.
        assert!(c
            .lookup("d", &entries(&[("k1", "v1"), ("k2", "x"), ("k3", "y")]))
            .is_none());
    }

    #[test]
    fn a_value_without_rate_limit_is_whitelisted_and_unknowns_get_none() {
        let c = load(BASIC).unwrap();
        assert!(c.lookup("d", &entries(&[("white", "listed")])).is_none());
        assert!(c.lookup("d", &entries(&[("nothing", "x")])).is_none());
        assert!(c.lookup("other", &entries(&[("k1", "v1")])).is_none());
    }

    #[test]
    fn share_threshold_keys_by_the_pattern() {
        let c = load(BASIC).unwrap();
        let a = c.lookup("d", &entries(&[("w", "prefix-a")])).unwrap();
        let b = c.lookup("d", &entries(&[("w", "prefix-b")])).unwrap();
        assert_eq!(a.key_entries, b.key_entries);
        assert_eq!(a.key_entries, entries(&[("w", "pre*")]));
    }

    #[test]
    fn value_to_metric_names_the_metric_after_the_value() {
        let c = load(
            "domain: d\ndescriptors:\n  - key: route\n    value_to_metric: true\n    descriptors:\n      - key: user\n        rate_limit: {unit: second, requests_per_unit: 1}\n",
        )
        .unwrap();
        let m = c
            .lookup("d", &entries(&[("route", "api"), ("user", "u")]))
            .unwrap();
        assert_eq!(m.stats_key, "d.route_api.user");
        // The bucket is still the request's entries.
        assert_eq!(m.key_entries, entries(&[("route", "api"), ("user", "u")]));
    }

    #[test]
    fn quota_mode_metadata_and_post_paid_are_kept_with_the_limit() {
        // The peer's metadata test file's shape: a map at any level, nested maps inside,
        // whose keys are the user's (not config keys).
        let c = load(
            "domain: d\ndescriptors:\n  - key: service\n    value: s1\n    quota_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 1}\n    metadata:\n      service_with_quota:\n        name: s1\n  - key: tokens\n    rate_limit: {unit: minute, requests_per_unit: 9, post_paid: true}\n",
        )
        .unwrap();
        let m = c.lookup("d", &entries(&[("service", "s1")])).unwrap();
        assert!(m.quota_mode);
        assert!(!m.rate_limit.post_paid);
        assert_eq!(
            m.metadata.as_deref(),
            Some(&serde_json::json!({"service_with_quota": {"name": "s1"}}))
        );
        let m = c.lookup("d", &entries(&[("tokens", "x")])).unwrap();
        assert!(!m.quota_mode);
        assert!(m.rate_limit.post_paid);
        assert_eq!(m.metadata, None);
        let e = load("domain: d\ndescriptors:\n  - key: k\n    metadata: [1]\n    rate_limit: {unit: second, requests_per_unit: 1}\n").unwrap_err();
        assert!(
            e.problem.contains("'metadata' of 'd.k' must be a map"),
            "{e}"
        );
    }

    #[test]
    fn bad_files_are_refused_naming_file_and_problem() {
        // (yaml, the problem's words)
        let cases = [
            ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n", "invalid rate limit unit 'fortnight'"),
            ("domain: \"\"\n", "empty domain"),
            ("domain: d\ndescriptors:\n  - value: v\n", "descriptor has empty key"),
            ("domain: d\ndescriptors:\n  - key: k\n  - key: k\n", "duplicate descriptor composite key 'd.k'"),
            ("domain: d\ndescriptors:\n  - key: k\n    ratelimit: {}\n", "unknown key 'ratelimit'"),
            ("domain: d\ndescriptors:\n  - a\n", "list of type other than map"),
            ("domain: d\n1: x\n", "key is not of type string"),
            ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, name: n, replaces: [{name: \"\"}]}\n", "empty replaces"),
            ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, name: n, replaces: [{name: n}]}\n", "same descriptor"),
            ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, unlimited: true}\n", "unit when unlimited"),
            ("domain: d\ndescriptors: [\n", "error loading config file"),
        ];
        for (yaml, words) in cases {
            let e = load(yaml).unwrap_err();
            assert_eq!(e.file, "f.yaml");
            assert!(e.problem.contains(words), "{yaml:?} gave {e}");
        }
        let dup = Config::from_texts(&[
            ("a.yaml".into(), "domain: d\n".into()),
            ("b.yaml".into(), "domain: d\n".into()),
        ])
        .unwrap_err();
        assert_eq!(dup.file, "b.yaml");
        assert!(dup.problem.contains("duplicate domain 'd'"));
    }
}
