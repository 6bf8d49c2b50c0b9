//! envoyproxy/ratelimit's YAML config: which runtime files are read, the YAML read as its
//! parser reads it ([`crate::config::yaml11`]), the same validation (each error names the file), and
//! the same lookup of a descriptor's limit. Pure apart from reading the files: no Redis, no
//! clock.
//!
//! Lookup follows the Go service's `GetLimit`: at each level the entry's `key_value` is tried
//! first, then wildcard values (a `*` anywhere in the value matches any run of bytes; the
//! first match in file order wins), then the key alone (the default); a limit applies only
//! when the request's entries end at the level that holds it; a level without `rate_limit`
//! whitelists.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use redis_rl_client::Limit;

pub use crate::config::settings::runtime::Source;
use crate::config::yaml11::{Node, Resolved};

/// The keys a config file may hold anywhere; any other is a misspelling and refused, as the
/// Go service refuses it. `unit_multiplier`, `value_to_metric`, `share_threshold`,
/// `quota_mode` and `metadata` are the Go service's newer keys; `burst` (the bucket's capacity),
/// `post_paid`, `concurrency` and `reserve` are this service's extensions (the keys inside the
/// last two are checked where they are read).
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
    "concurrency",
    "reserve",
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
    /// Tokens per period; 0 (without `unlimited`) bans: always over the limit.
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
    /// `reserve`: a request that carries its request id reserves an estimate on this bucket,
    /// and the call at the stream's end settles it with the usage (`crate::decision::inflight`).
    pub reserve: Option<Reserve>,
}

/// A descriptor's `concurrency: {limit, ttl}` (this service's extension): at most `limit`
/// requests in flight, each a lease released by the call at its stream's end, or lapsing
/// after `ttl` when that call never comes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Concurrency {
    pub limit: u32,
    pub ttl_ms: u64,
}

/// A `rate_limit`'s `reserve: {estimate, ttl}` (this service's extension): the tokens taken
/// when the request starts unless Envoy sends a cost of its own, and how long the reservation
/// stays open for its settle before it stands as taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reserve {
    pub estimate: u64,
    pub ttl_ms: u64,
}

/// The most leases one key holds (`RL.LEASE`'s cap on `limit`).
pub const MAX_CONCURRENCY: u64 = 10_000;
/// The longest lease or reservation, in ms: 100 years, the module's cap on `ttl_ms`.
pub const MAX_TTL_MS: u64 = 3_153_600_000_000;

impl RateLimit {
    /// `requests_per_unit: 0`: every request is over the limit, and Redis is not asked.
    pub fn is_ban(&self) -> bool {
        !self.unlimited && self.requests_per_unit == 0
    }

    /// The period in seconds (`unit × unit_multiplier`).
    pub fn period_s(&self) -> u64 {
        self.unit
            .seconds()
            .saturating_mul(u64::from(self.unit_multiplier.max(1)))
    }
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
struct Level {
    limit: Option<Limited>,
    children: HashMap<String, Level>,
    /// Wildcard child keys (`key_value` with a `*` in the value), in file order.
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
    metadata: Option<Arc<serde_json::Value>>,
    concurrency: Option<Concurrency>,
}

#[derive(Clone, Copy, Debug, Default)]
struct LevelFlags {
    value_to_metric: bool,
    share_threshold: bool,
}

/// The loaded config: domains and their descriptor trees.
#[derive(Clone, Debug, Default)]
pub struct Config {
    domains: HashMap<String, Level>,
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
    /// The stats key without any request value (the config's path): where a stats key
    /// past the bound on client-valued series is folded.
    pub config_stats_key: String,
    pub shadow_mode: bool,
    /// The entries the bucket is keyed by: the request's, except a `share_threshold`
    /// wildcard level, which keys by its pattern so all matching values share one bucket.
    pub key_entries: Vec<(String, String)>,
    /// The level's `quota_mode` (stored for the quota behaviour; the lookup does not use it).
    pub quota_mode: bool,
    /// The level's `metadata`, free-form, as JSON.
    pub metadata: Option<Arc<serde_json::Value>>,
    /// The level's `concurrency` limit.
    pub concurrency: Option<Concurrency>,
}

// `Source` is the runtime settings' struct (a leaf of the settings); how its files are found
// and read is here.
impl Source {
    /// One directory, read as the unit tests use it: every file under `dir`.
    #[cfg(test)]
    pub fn dir(dir: &Path) -> Source {
        Source {
            base: dir.to_path_buf(),
            app_dir: String::new(),
            watch_root: false,
            ignore_dotfiles: false,
            merge_domains: false,
        }
    }

    /// The directory the files are under (`base/<app_dir>`).
    pub fn config_dir(&self) -> PathBuf {
        if self.app_dir.is_empty() {
            self.base.clone()
        } else {
            self.base.join(&self.app_dir)
        }
    }

    /// The files the Go service's runtime loader reads, sorted by path (the Go service takes
    /// them in a map's order). Every file counts, whatever its extension, as goruntime reads
    /// them all; a symlink to a file is read, a symlink to a directory is not followed.
    pub fn files(&self) -> Vec<PathBuf> {
        let walk_root = if self.watch_root {
            self.base.clone()
        } else {
            self.config_dir()
        };
        let mut found = Vec::new();
        self.walk(&walk_root, &walk_root, &mut found);
        found.sort();
        found
    }

    fn walk(&self, root: &Path, dir: &Path, found: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            let name = entry.file_name();
            let dotted = name.to_string_lossy().starts_with('.');
            if self.ignore_dotfiles && dotted {
                continue;
            }
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                self.walk(root, &path, found);
                continue;
            }
            // A symlink to a directory is not walked (goruntime's walk does not follow it,
            // and reading it fails and is skipped).
            if kind.is_symlink() && path.is_dir() {
                continue;
            }
            if self.watch_root && !self.app_dir.is_empty() {
                // goruntime's key: the path under the base, `/` as `.`; the Go service keeps
                // keys starting with `config.`.
                let key = path
                    .strip_prefix(root)
                    .map(|p| p.to_string_lossy().replace('/', "."))
                    .unwrap_or_default();
                if !key.starts_with(&format!("{}.", self.app_dir)) {
                    continue;
                }
            }
            found.push(path);
        }
    }
}

impl Config {
    /// Loads every runtime file of `source` (see [`Source::files`]).
    ///
    /// # Errors
    /// The first file's problem, naming the file.
    pub fn load(source: &Source) -> Result<Config, ConfigError> {
        let paths = source.files();
        let mut files = Vec::new();
        for path in &paths {
            let file = path.display().to_string();
            let bytes = match std::fs::read(path) {
                Ok(b) => b,
                Err(e) => {
                    // goruntime logs an unreadable file and goes on without it.
                    tracing::warn!("runtime: error reading {file}: {e}");
                    continue;
                }
            };
            let text = String::from_utf8(bytes).map_err(|_| ConfigError {
                file: file.clone(),
                problem: "error loading config file: yaml: invalid UTF-8".into(),
            })?;
            files.push((file, text));
        }
        let mut config = Config::from_texts(&files, source.merge_domains)?;
        config.files = paths;
        Ok(config)
    }

    /// Loads `(file name, YAML text)` pairs. A domain in two files is refused unless
    /// `merge_domains`, which loads the later file's descriptors into the domain's top level
    /// (a descriptor both define is a duplicate and refused, as the Go service does).
    ///
    /// # Errors
    /// The first problem found, naming its file.
    pub fn from_texts(
        files: &[(String, String)],
        merge_domains: bool,
    ) -> Result<Config, ConfigError> {
        let mut config = Config::default();
        for (name, text) in files {
            let err = |problem: String| ConfigError {
                file: name.clone(),
                problem,
            };
            let root = crate::config::yaml11::parse(text)
                .map_err(|e| err(format!("error loading config file: {e}")))?;
            let empty = Node::Map(Vec::new());
            let root = match &root {
                None => &empty,
                Some(node @ Node::Map(_)) => node,
                Some(node) if node.is_null() => &empty,
                Some(other) => {
                    return Err(err(format!(
                        "error loading config file: cannot unmarshal {} into a map",
                        kind_of(other)
                    )))
                }
            };
            validate_keys(root).map_err(err)?;
            let domain = string_field(root, "domain").map_err(|e| err(unmarshal(e)))?;
            if domain.is_empty() {
                return Err(err("config file cannot have empty domain".into()));
            }
            let descriptors = list_field(root, "descriptors").map_err(|e| err(unmarshal(e)))?;
            if let Some(level) = config.domains.get_mut(&domain) {
                if !merge_domains {
                    return Err(err(format!("duplicate domain '{domain}' in config file")));
                }
                load_level(level, &mut config.flags, &format!("{domain}."), descriptors)
                    .map_err(err)?;
                continue;
            }
            let mut level = Level::default();
            load_level(
                &mut level,
                &mut config.flags,
                &format!("{domain}."),
                descriptors,
            )
            .map_err(err)?;
            config.domains.insert(domain, level);
        }
        Ok(config)
    }

    /// The number of domains loaded.
    pub fn domain_count(&self) -> usize {
        self.domains.len()
    }

    /// Every limit with its stats key, unit, `requests_per_unit` and `shadow_mode`, for the
    /// `/rlconfig` debug page (`crate::telemetry::stats`).
    pub fn limits(&self) -> Vec<(String, Unit, u32, bool)> {
        fn walk(level: &Level, out: &mut Vec<(String, Unit, u32, bool)>) {
            if let Some(l) = &level.limit {
                let r = &l.rate_limit;
                out.push((
                    l.full_key.clone(),
                    r.unit,
                    r.requests_per_unit,
                    l.shadow_mode,
                ));
            }
            for child in level.children.values() {
                walk(child, out);
            }
        }
        let mut out = Vec::new();
        for level in self.domains.values() {
            walk(level, &mut out);
        }
        out
    }

    /// Whether `domain` is configured.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// The limit of a descriptor's `entries` in `domain`, or `None` (no limit: allowed).
    pub fn lookup(&self, domain: &str, entries: &[(String, String)]) -> Option<Match> {
        let mut level = self.domains.get(domain)?;
        let mut found: Option<Match> = None;
        let mut key_entries = Vec::with_capacity(entries.len());
        let mut stats_key = domain.to_string();
        // The config's path to this level (its flags are stored under it): the stats key
        // without the request's values.
        let mut config_path = domain.to_string();
        // Whether a level on the path names its metric after the request's value.
        let mut valued = false;
        for (index, (key, value)) in entries.iter().enumerate() {
            let exact = format!("{key}_{value}");
            let (child_key, child) = if let Some(child) = level.children.get(&exact) {
                (exact.clone(), Some(child))
            } else if let Some(w) = level.wildcards.iter().find(|w| glob_match(w, &exact)) {
                (w.clone(), level.children.get(w))
            } else {
                (key.clone(), level.children.get(key))
            };
            let flags = self
                .flags
                .get(&format!("{config_path}.{child_key}"))
                .copied()
                .unwrap_or_default();
            let shared = flags.share_threshold && child_key != exact && child_key.contains('*');
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
            config_path = format!("{config_path}.{child_key}");
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
                        config_stats_key: limited.full_key.clone(),
                        shadow_mode: limited.shadow_mode,
                        key_entries: key_entries.clone(),
                        quota_mode: limited.quota_mode,
                        metadata: limited.metadata.clone(),
                        concurrency: limited.concurrency,
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
            level = child;
        }
        found
    }
}

/// Whether `text` matches `pattern`, where each `*` matches any run of bytes (none too).
/// Greedy with one backtrack point: linear in the text for a pattern with one `*`, at most
/// text × pattern otherwise (patterns are config, values are a client's).
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut pi, mut ti) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        match p.get(pi) {
            Some(b'*') => {
                star = Some((pi, ti));
                pi += 1;
            }
            Some(c) if Some(c) == t.get(ti) => {
                pi += 1;
                ti += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    pi = sp + 1;
                    ti = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    p.get(pi..)
        .is_some_and(|rest| rest.iter().all(|&c| c == b'*'))
}

/// yaml.v2's name of a node's kind, as its errors print it.
fn kind_of(node: &Node) -> String {
    match node {
        Node::Scalar(s) => format!("{} `{}`", s.kind(), s.text),
        Node::Seq(_) => "!!seq".into(),
        Node::Map(_) => "!!map".into(),
    }
}

fn unmarshal(problem: String) -> String {
    format!("error loading config file: yaml: unmarshal errors: {problem}")
}

/// The Go service's `validateYamlKeys` on the document as yaml.v2 decodes it into
/// `map[interface{}]interface{}`: keys are strings from [`VALID_KEYS`], lists hold maps, and
/// a leaf is a string, an int (Go's `int`), a bool or null; a float is refused ("error
/// checking config"), except as `burst`, this service's own key. `metadata` is free-form.
fn validate_keys(map: &Node) -> Result<(), String> {
    let Node::Map(entries) = map else {
        return Ok(());
    };
    for (k, v) in entries {
        let key = match k {
            Node::Scalar(s) if s.resolve() == Resolved::Str => s.text.as_str(),
            other => {
                return Err(format!(
                    "config error, key is not of type string: {}",
                    short(&other.go_text())
                ))
            }
        };
        if !VALID_KEYS.contains(&key) {
            return Err(format!("config error, unknown key '{key}'"));
        }
        // Free-form, or checked key by key where it is read.
        if matches!(key, "metadata" | "concurrency" | "reserve") {
            continue;
        }
        match v {
            Node::Seq(items) => {
                for item in items {
                    if !matches!(item, Node::Map(_)) {
                        return Err(format!(
                            "config error, yaml file contains list of type other than map: {}",
                            short(&item.go_text())
                        ));
                    }
                    validate_keys(item)?;
                }
            }
            Node::Map(_) => validate_keys(v)?,
            Node::Scalar(s) => match s.resolve() {
                Resolved::Null | Resolved::Bool(_) | Resolved::Str => {}
                Resolved::Int(n) if i64::try_from(n).is_ok() => {}
                Resolved::Float(_) if key == "burst" => {}
                Resolved::Int(_) | Resolved::Float(_) => {
                    return Err(format!(
                        "error checking config ('{key}: {}' is not a string, a whole number or a boolean)",
                        s.text
                    ))
                }
            },
        }
    }
    Ok(())
}

fn short(text: &str) -> String {
    text.chars().take(80).collect()
}

fn get<'a>(map: &'a Node, key: &str) -> Option<&'a Node> {
    map.get(key).filter(|v| !v.is_null())
}

/// A Go `string` field: any scalar's text, as written (yaml.v2 keeps `0x10` and `01234`).
fn string_field(map: &Node, key: &str) -> Result<String, String> {
    match get(map, key) {
        None => Ok(String::new()),
        Some(Node::Scalar(s)) => Ok(s.text.clone()),
        Some(other) => Err(format!(
            "cannot unmarshal {} into string ('{key}')",
            kind_of(other)
        )),
    }
}

/// A Go `bool` field: a YAML 1.1 boolean (`true`, `yes`, `on`, `y`, and their negatives).
fn bool_field(map: &Node, key: &str) -> Result<bool, String> {
    match get(map, key) {
        None => Ok(false),
        Some(Node::Scalar(s)) => match s.resolve() {
            Resolved::Bool(b) => Ok(b),
            _ => Err(format!(
                "line {}: cannot unmarshal {} into bool ('{key}')",
                s.line,
                kind_of(&Node::Scalar(s.clone()))
            )),
        },
        Some(other) => Err(format!(
            "cannot unmarshal {} into bool ('{key}')",
            kind_of(other)
        )),
    }
}

/// A Go `uint32` field: a whole number from 0 to 4294967295, in any of YAML 1.1's forms.
fn u32_field(map: &Node, key: &str) -> Result<Option<u32>, String> {
    match get(map, key) {
        None => Ok(None),
        Some(Node::Scalar(s)) => match s.resolve() {
            Resolved::Int(n) => u32::try_from(n).map(Some).map_err(|_| {
                format!(
                    "line {}: cannot unmarshal !!int `{}` into uint32 ('{key}' must be a whole number from 0 to 4294967295)",
                    s.line, s.text
                )
            }),
            _ => Err(format!(
                "line {}: cannot unmarshal {} into uint32 ('{key}' must be a whole number from 0 to 4294967295)",
                s.line,
                kind_of(&Node::Scalar(s.clone()))
            )),
        },
        Some(other) => Err(format!("cannot unmarshal {} into uint32 ('{key}')", kind_of(other))),
    }
}

fn list_field<'a>(map: &'a Node, key: &str) -> Result<&'a [Node], String> {
    match get(map, key) {
        None => Ok(&[]),
        Some(Node::Seq(items)) => Ok(items),
        Some(other) => Err(format!(
            "cannot unmarshal {} into a list ('{key}')",
            kind_of(other)
        )),
    }
}

fn load_level(
    level: &mut Level,
    flags: &mut HashMap<String, LevelFlags>,
    parent_key: &str,
    descriptors: &[Node],
) -> Result<(), String> {
    for item in descriptors {
        if !matches!(item, Node::Map(_)) {
            return Err("descriptors must be a list of maps".into());
        }
        let key = string_field(item, "key").map_err(unmarshal)?;
        if key.is_empty() {
            return Err("descriptor has empty key".into());
        }
        let value = string_field(item, "value").map_err(unmarshal)?;
        let final_key = if value.is_empty() {
            key.clone()
        } else {
            format!("{key}_{value}")
        };
        let full_key = format!("{parent_key}{final_key}");
        if level.children.contains_key(&final_key) {
            return Err(format!("duplicate descriptor composite key '{full_key}'"));
        }
        let rate_limit = match get(item, "rate_limit") {
            None => None,
            Some(rl @ Node::Map(_)) => Some(load_rate_limit(rl)?),
            Some(other) => {
                return Err(unmarshal(format!(
                    "cannot unmarshal {} into a rate_limit map ('{full_key}')",
                    kind_of(other)
                )))
            }
        };
        let wildcard = value.contains('*');
        let share_threshold = bool_field(item, "share_threshold").map_err(unmarshal)?;
        if share_threshold && !wildcard {
            return Err(format!(
                "share_threshold can only be used with wildcard values (a value containing '*'), but found key '{final_key}'"
            ));
        }
        flags.insert(
            full_key.clone(),
            LevelFlags {
                value_to_metric: bool_field(item, "value_to_metric").map_err(unmarshal)?,
                share_threshold,
            },
        );
        let shadow_mode = bool_field(item, "shadow_mode").map_err(unmarshal)?;
        let detailed_metric = bool_field(item, "detailed_metric").map_err(unmarshal)?;
        let quota_mode = bool_field(item, "quota_mode").map_err(unmarshal)?;
        let metadata = get(item, "metadata").map(|m| Arc::new(m.to_json()));
        let concurrency = match get(item, "concurrency") {
            None => None,
            Some(c) => Some(load_concurrency(c).map_err(|e| format!("{full_key}: {e}"))?),
        };
        // A concurrency limit alone limits no rate: its level gets an unlimited rate limit,
        // so the lookup finds it.
        let rate_limit = match (rate_limit, concurrency) {
            (None, Some(_)) => Some(unlimited_rate_limit()),
            (rate_limit, _) => rate_limit,
        };
        let mut child = Level {
            limit: rate_limit.map(|rate_limit| Limited {
                rate_limit: Arc::new(rate_limit),
                full_key: full_key.clone(),
                shadow_mode,
                detailed_metric,
                quota_mode,
                metadata,
                concurrency,
            }),
            ..Level::default()
        };
        load_level(
            &mut child,
            flags,
            &format!("{full_key}."),
            list_field(item, "descriptors").map_err(unmarshal)?,
        )?;
        if wildcard {
            level.wildcards.push(final_key.clone());
        }
        level.children.insert(final_key, child);
    }
    Ok(())
}

fn load_rate_limit(map: &Node) -> Result<RateLimit, String> {
    let unlimited = bool_field(map, "unlimited").map_err(unmarshal)?;
    let unit_text = string_field(map, "unit").map_err(unmarshal)?;
    let unit = Unit::parse(&unit_text);
    if unlimited && unit.is_some() {
        return Err("should not specify rate limit unit when unlimited".into());
    }
    let unit = match (unit, unlimited) {
        (Some(unit), _) => unit,
        (None, true) => Unit::Second,
        (None, false) => return Err(format!("invalid rate limit unit '{unit_text}'")),
    };
    // 0 is the Go service's ban: every request over the limit (see `RateLimit::is_ban`).
    let requests_per_unit = u32_field(map, "requests_per_unit")
        .map_err(unmarshal)?
        .unwrap_or(0);
    let unit_multiplier = u32_field(map, "unit_multiplier")
        .map_err(unmarshal)?
        .unwrap_or(1);
    if unit_multiplier == 0 {
        return Err("unit_multiplier must be at least 1".into());
    }
    let burst = match get(map, "burst") {
        None => None,
        Some(Node::Scalar(s)) => match s.resolve() {
            Resolved::Int(n) if n > 0 && n <= 1_000_000_000_000_000 => {
                #[allow(clippy::cast_precision_loss)]
                let b = n as f64;
                Some(b)
            }
            Resolved::Float(b) if b.is_finite() && b > 0.0 && b <= 1e15 => Some(b),
            _ => return Err("burst must be a number above 0 and at most 1e15".into()),
        },
        Some(_) => return Err("burst must be a number above 0 and at most 1e15".into()),
    };
    let name = string_field(map, "name").map_err(unmarshal)?;
    let post_paid = bool_field(map, "post_paid").map_err(unmarshal)?;
    let reserve = match get(map, "reserve") {
        None => None,
        Some(r) => Some(load_reserve(r)?),
    };
    if reserve.is_some() && (unlimited || requests_per_unit == 0) {
        return Err("reserve needs a limit with requests_per_unit above 0".into());
    }
    let mut replaces = Vec::new();
    for item in list_field(map, "replaces").map_err(unmarshal)? {
        if !matches!(item, Node::Map(_)) {
            return Err("replaces must be a list of maps with a name".into());
        }
        let replaced = string_field(item, "name").map_err(unmarshal)?;
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
        reserve,
    })
}

/// The rate limit of a level that has only a `concurrency` limit: never limited by rate.
fn unlimited_rate_limit() -> RateLimit {
    RateLimit {
        requests_per_unit: 0,
        unit: Unit::Second,
        unit_multiplier: 1,
        burst: None,
        unlimited: true,
        name: String::new(),
        replaces: Vec::new(),
        post_paid: false,
        bucket: bucket_limit(0, 1, 0.0),
        reserve: None,
    }
}

/// A whole number from `min` to `max` at `key` of an extension's map.
fn bounded_field(map: &Node, key: &str, min: u64, max: u64) -> Result<Option<u64>, String> {
    let bad = || format!("{key} must be a whole number from {min} to {max}");
    match get(map, key) {
        None => Ok(None),
        Some(Node::Scalar(s)) => match s.resolve() {
            Resolved::Int(n) => match u64::try_from(n) {
                Ok(n) if (min..=max).contains(&n) => Ok(Some(n)),
                _ => Err(bad()),
            },
            _ => Err(bad()),
        },
        Some(_) => Err(bad()),
    }
}

/// A `ttl`: whole seconds (`30`) or a Go duration (`30s`, `5m`, `1500ms`), from 1 ms to 100
/// years.
fn ttl_field(map: &Node) -> Result<Option<u64>, String> {
    let bad =
        || "ttl must be whole seconds or a duration (30s, 5m) from 1ms to 100 years".to_string();
    match get(map, "ttl") {
        None => Ok(None),
        Some(Node::Scalar(s)) => {
            let ms = match s.resolve() {
                Resolved::Int(n) => u64::try_from(n).ok().and_then(|n| n.checked_mul(1000)),
                Resolved::Str => crate::config::env::go_duration_ms(&s.text),
                _ => None,
            };
            match ms {
                Some(ms) if (1..=MAX_TTL_MS).contains(&ms) => Ok(Some(ms)),
                _ => Err(bad()),
            }
        }
        Some(_) => Err(bad()),
    }
}

fn only_keys(map: &Node, what: &str, keys: &[&str]) -> Result<(), String> {
    let Node::Map(entries) = map else {
        return Err(format!("{what} must be a map of {}", keys.join(", ")));
    };
    for (k, _) in entries {
        let name = match k {
            Node::Scalar(s) => s.text.as_str(),
            _ => "",
        };
        if !keys.contains(&name) {
            return Err(format!(
                "{what} takes only {}, not '{name}'",
                keys.join(", ")
            ));
        }
    }
    Ok(())
}

/// `concurrency: {limit, ttl}`: `limit` from 1 to 10,000 (required), `ttl` 5 minutes unless
/// set.
fn load_concurrency(map: &Node) -> Result<Concurrency, String> {
    only_keys(map, "concurrency", &["limit", "ttl"])?;
    let limit = bounded_field(map, "limit", 1, MAX_CONCURRENCY)?
        .ok_or("concurrency needs a limit (in flight at once)")?;
    Ok(Concurrency {
        limit: u32::try_from(limit).map_err(|_| "concurrency limit too large".to_string())?,
        ttl_ms: ttl_field(map)?.unwrap_or(DEFAULT_TTL_MS),
    })
}

/// `reserve: {estimate, ttl}`: `estimate` from 1 to 10^15 (required), `ttl` 5 minutes unless
/// set.
fn load_reserve(map: &Node) -> Result<Reserve, String> {
    only_keys(map, "reserve", &["estimate", "ttl"])?;
    let estimate = bounded_field(map, "estimate", 1, 1_000_000_000_000_000)?
        .ok_or("reserve needs an estimate (tokens taken when a request starts)")?;
    Ok(Reserve {
        estimate,
        ttl_ms: ttl_field(map)?.unwrap_or(DEFAULT_TTL_MS),
    })
}

/// A lease's or a reservation's life when `ttl` is not set: 5 minutes, longer than most
/// streamed answers, short enough that a lost end-of-stream call frees its slot soon.
pub const DEFAULT_TTL_MS: u64 = 300_000;

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
        Config::from_texts(&[("f.yaml".into(), text.into())], false)
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
    fn value_to_metric_holds_at_every_level() {
        // The peer's own example: route and http_method carry value_to_metric, so both
        // values are in the name, three levels deep.
        let c = load(
            "domain: vtm\ndescriptors:\n  - key: route\n    value_to_metric: true\n    descriptors:\n      - key: http_method\n        value_to_metric: true\n        descriptors:\n          - key: subject_id\n            rate_limit: {unit: minute, requests_per_unit: 60}\n",
        )
        .unwrap();
        let m = c
            .lookup(
                "vtm",
                &[
                    ("route".into(), "api".into()),
                    ("http_method".into(), "GET".into()),
                    ("subject_id".into(), "123".into()),
                ],
            )
            .unwrap();
        assert_eq!(m.stats_key, "vtm.route_api.http_method_GET.subject_id");
        assert_eq!(m.config_stats_key, "vtm.route.http_method.subject_id");
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
        let dup = Config::from_texts(
            &[
                ("a.yaml".into(), "domain: d\n".into()),
                ("b.yaml".into(), "domain: d\n".into()),
            ],
            false,
        )
        .unwrap_err();
        assert_eq!(dup.file, "b.yaml");
        assert!(dup.problem.contains("duplicate domain 'd'"));
    }

    #[test]
    fn wildcards_match_anywhere_in_the_value_after_exact_values() {
        let c = load(
            "domain: d
descriptors:
  - key: w
    value: bar*b
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: w
    value: foo*bar*baz
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: w
    value: /api*v1
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: w
    value: /api*
    rate_limit: {unit: minute, requests_per_unit: 4}
  - key: w
    value: /api/v1
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: w
    rate_limit: {unit: minute, requests_per_unit: 6}
",
        )
        .unwrap();
        // (value, the requests_per_unit it gets)
        let cases = [
            ("barb", 1),
            ("bar-xyz-b", 1),
            ("barbX", 6),
            ("foobarbaz", 2),
            ("foo-1-bar-2-baz", 2),
            ("foo-bar", 6),
            // The first wildcard in file order wins: `/api*v1` is listed before `/api*`.
            ("/api/users/v1", 3),
            ("/api/users/v2", 4),
            // An exact value beats every wildcard.
            ("/api/v1", 5),
            ("other", 6),
        ];
        for (value, rpu) in cases {
            let m = c.lookup("d", &entries(&[("w", value)])).unwrap();
            assert_eq!(m.rate_limit.requests_per_unit, rpu, "{value}");
        }
        assert!(glob_match("a*", "a"));
        assert!(glob_match("*", ""));
        assert!(!glob_match("a*b", "ba"));
        assert!(glob_match("a**b", "ab"));
    }

    #[test]
    fn share_threshold_needs_a_wildcard_and_shares_a_middle_one() {
        let e = load("domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n").unwrap_err();
        assert!(
            e.problem
                .contains("share_threshold can only be used with wildcard values")
                && e.problem.contains("'k_v'"),
            "{e}"
        );
        let e =
            load("domain: d\ndescriptors:\n  - key: k\n    share_threshold: true\n").unwrap_err();
        assert!(e.problem.contains("found key 'k'"), "{e}");
        let c = load("domain: d\ndescriptors:\n  - key: k\n    value: /api*v1\n    share_threshold: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n").unwrap();
        let a = c.lookup("d", &entries(&[("k", "/api/a/v1")])).unwrap();
        let b = c.lookup("d", &entries(&[("k", "/api/b/v1")])).unwrap();
        assert_eq!(a.key_entries, entries(&[("k", "/api*v1")]));
        assert_eq!(a.key_entries, b.key_entries);
    }

    #[test]
    fn quota_mode_metadata_and_a_zero_limit_load() {
        let c = load(
            "domain: d
descriptors:
  - key: service
    value: s1
    quota_mode: true
    metadata: {name: service_1, nested: {any_key: [1, yes, x]}}
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: bar
    value: banned
    rate_limit: {unit: minute, requests_per_unit: 0}
",
        )
        .unwrap();
        let m = c.lookup("d", &entries(&[("service", "s1")])).unwrap();
        assert!(m.quota_mode);
        assert_eq!(
            m.metadata.as_deref(),
            Some(&serde_json::json!({"name": "service_1", "nested": {"any_key": [1, true, "x"]}}))
        );
        let ban = c.lookup("d", &entries(&[("bar", "banned")])).unwrap();
        assert!(ban.rate_limit.is_ban());
        assert!(!m.rate_limit.is_ban());
    }

    #[test]
    fn concurrency_and_reserve_load_with_their_defaults_and_bounds() {
        let c = load(
            "domain: d\ndescriptors:\n  - key: slots\n    concurrency: {limit: 3, ttl: 30s}\n  - key: tokens\n    concurrency: {limit: 2}\n    rate_limit:\n      unit: minute\n      requests_per_unit: 100\n      reserve: {estimate: 40, ttl: 90}\n",
        )
        .unwrap();
        let slots = c.lookup("d", &entries(&[("slots", "a")])).unwrap();
        assert_eq!(
            slots.concurrency,
            Some(Concurrency {
                limit: 3,
                ttl_ms: 30_000
            })
        );
        // A concurrency limit alone limits no rate.
        assert!(slots.rate_limit.unlimited);
        assert_eq!(slots.rate_limit.reserve, None);
        let tokens = c.lookup("d", &entries(&[("tokens", "a")])).unwrap();
        assert_eq!(
            tokens.concurrency,
            Some(Concurrency {
                limit: 2,
                ttl_ms: DEFAULT_TTL_MS
            })
        );
        assert_eq!(
            tokens.rate_limit.reserve,
            Some(Reserve {
                estimate: 40,
                ttl_ms: 90_000
            })
        );
        for (text, problem) in [
            (
                "concurrency: {limit: 0}",
                "limit must be a whole number from 1 to 10000",
            ),
            (
                "concurrency: {limit: 10001}",
                "limit must be a whole number from 1 to 10000",
            ),
            ("concurrency: {ttl: 5s}", "concurrency needs a limit"),
            ("concurrency: {limit: 1, ttl: 0}", "ttl must be"),
            ("concurrency: {limit: 1, ttl: soon}", "ttl must be"),
            (
                "concurrency: {limit: 1, estimate: 3}",
                "concurrency takes only limit, ttl",
            ),
            (
                "rate_limit: {unit: minute, requests_per_unit: 5, reserve: {ttl: 5s}}",
                "reserve needs an estimate",
            ),
            (
                "rate_limit: {unit: minute, requests_per_unit: 0, reserve: {estimate: 1}}",
                "reserve needs a limit with requests_per_unit above 0",
            ),
            (
                "concurrency: {limit: 1, lmit: 2}",
                "concurrency takes only limit, ttl, not 'lmit'",
            ),
            ("concurrency: {limit: 1.5}", "limit must be a whole number"),
            ("concurrency: 3", "concurrency must be a map of limit, ttl"),
            // Their keys are not valid elsewhere.
            (
                "limit: 3\n    rate_limit: {unit: second, requests_per_unit: 1}",
                "unknown key 'limit'",
            ),
        ] {
            let e = load(&format!(
                "domain: d\ndescriptors:\n  - key: k\n    {text}\n"
            ))
            .unwrap_err();
            assert!(e.problem.contains(problem), "{text}: {e}");
        }
    }

    #[test]
    fn post_paid_is_kept_with_the_limit() {
        let c = load(
            "domain: d\ndescriptors:\n  - key: tokens\n    rate_limit: {unit: minute, requests_per_unit: 9, post_paid: yes}\n  - key: plain\n    rate_limit: {unit: minute, requests_per_unit: 9}\n",
        )
        .unwrap();
        assert!(
            c.lookup("d", &entries(&[("tokens", "x")]))
                .unwrap()
                .rate_limit
                .post_paid
        );
        assert!(
            !c.lookup("d", &entries(&[("plain", "x")]))
                .unwrap()
                .rate_limit
                .post_paid
        );
        let e = load("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, post_paid: 3}\n").unwrap_err();
        assert!(e.problem.contains("post_paid"), "{e}");
    }

    #[test]
    fn merge_domain_config_merges_files_and_refuses_a_shared_descriptor() {
        let a = ("a.yaml".to_string(), "domain: d\ndescriptors:\n  - key: k1\n    rate_limit: {unit: minute, requests_per_unit: 1}\n".to_string());
        let b = ("b.yaml".to_string(), "domain: d\ndescriptors:\n  - key: k2\n    value: v2\n    rate_limit: {unit: minute, requests_per_unit: 2}\n".to_string());
        let c = Config::from_texts(&[a.clone(), b.clone()], true).unwrap();
        assert_eq!(
            c.lookup("d", &entries(&[("k1", "x")]))
                .unwrap()
                .rate_limit
                .requests_per_unit,
            1
        );
        assert_eq!(
            c.lookup("d", &entries(&[("k2", "v2")]))
                .unwrap()
                .rate_limit
                .requests_per_unit,
            2
        );
        // Off: the Go service's error.
        let e = Config::from_texts(&[a.clone(), b], false).unwrap_err();
        assert_eq!(e.file, "b.yaml");
        assert!(e.problem.contains("duplicate domain 'd'"), "{e}");
        // On, with a descriptor both files define: the Go service's duplicate key error.
        let e = Config::from_texts(&[a.clone(), ("c.yaml".into(), a.1.clone())], true).unwrap_err();
        assert_eq!(e.file, "c.yaml");
        assert!(
            e.problem
                .contains("duplicate descriptor composite key 'd.k1'"),
            "{e}"
        );
    }

    #[test]
    fn yaml_1_1_forms_decode_as_the_go_service_decodes_them() {
        let rl =
            |extra: &str| format!("domain: d\ndescriptors:\n  - key: k\n    value: v\n{extra}");
        // (a descriptor's lines, whether shadow_mode is on)
        let bools = [
            ("    shadow_mode: yes\n", true),
            ("    shadow_mode: Yes\n", true),
            ("    shadow_mode: on\n", true),
            ("    shadow_mode: ON\n", true),
            ("    shadow_mode: y\n", true),
            ("    shadow_mode: True\n", true),
            ("    shadow_mode: no\n", false),
            ("    shadow_mode: off\n", false),
            ("    shadow_mode: n\n", false),
            ("    shadow_mode: ~\n", false),
        ];
        for (line, on) in bools {
            let text = rl(&format!(
                "{line}    rate_limit: {{unit: minute, requests_per_unit: 1}}\n"
            ));
            let c = load(&text).unwrap_or_else(|e| panic!("{line}: {e}"));
            assert_eq!(
                c.lookup("d", &entries(&[("k", "v")])).unwrap().shadow_mode,
                on,
                "{line}"
            );
        }
        // (requests_per_unit as written, its value)
        let ints = [
            ("10", 10),
            ("0x1F", 31),
            ("0o17", 15),
            ("017", 15),
            ("0b101", 5),
            ("1_000", 1000),
            ("+7", 7),
        ];
        for (text, n) in ints {
            let c = load(&rl(&format!(
                "    rate_limit: {{unit: minute, requests_per_unit: {text}}}\n"
            )))
            .unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(
                c.lookup("d", &entries(&[("k", "v")]))
                    .unwrap()
                    .rate_limit
                    .requests_per_unit,
                n,
                "{text}"
            );
        }
        // A string field keeps a number's text: `01234` is matched as "01234".
        let c = load("domain: d\ndescriptors:\n  - key: zip\n    value: 01234\n    rate_limit: {unit: minute, requests_per_unit: 1}\n  - key: hex\n    value: 0x10\n    rate_limit: {unit: minute, requests_per_unit: 2}\n  - key: b\n    value: yes\n    rate_limit: {unit: minute, requests_per_unit: 3}\n").unwrap();
        assert!(c.lookup("d", &entries(&[("zip", "01234")])).is_some());
        assert!(c.lookup("d", &entries(&[("hex", "0x10")])).is_some());
        assert!(c.lookup("d", &entries(&[("b", "yes")])).is_some());
        // Refused as the Go service refuses them: (lines, words of the problem)
        let bad = [
            // A quoted "yes" is a string, not a bool.
            (
                "    shadow_mode: \"yes\"\n",
                "cannot unmarshal !!str `yes` into bool",
            ),
            (
                "    shadow_mode: 1\n",
                "cannot unmarshal !!int `1` into bool",
            ),
            // A float anywhere but `burst` fails the Go service's key check.
            (
                "    rate_limit: {unit: minute, requests_per_unit: 1.5}\n",
                "error checking config",
            ),
            (
                "    rate_limit: {unit: minute, requests_per_unit: -1}\n",
                "into uint32",
            ),
            (
                "    rate_limit: {unit: minute, requests_per_unit: 4294967296}\n",
                "into uint32",
            ),
            (
                "    rate_limit: {unit: minute, requests_per_unit: yes}\n",
                "cannot unmarshal !!bool `yes` into uint32",
            ),
            // A quoted number is a string.
            (
                "    rate_limit: {unit: minute, requests_per_unit: \"5\"}\n",
                "cannot unmarshal !!str `5` into uint32",
            ),
            ("    yes: 1\n", "key is not of type string: true"),
        ];
        for (line, words) in bad {
            let e = load(&rl(line)).unwrap_err();
            assert!(e.problem.contains(words), "{line}: {e}");
        }
    }

    #[test]
    fn runtime_files_are_found_as_the_go_loader_finds_them() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path();
        let config = base.join("config");
        std::fs::create_dir_all(config.join("sub")).unwrap();
        std::fs::create_dir_all(config.join(".hidden")).unwrap();
        std::fs::write(config.join("a.yaml"), "domain: a\n").unwrap();
        std::fs::write(config.join("b.conf"), "domain: b\n").unwrap();
        std::fs::write(config.join("sub/c.yml"), "domain: c\n").unwrap();
        std::fs::write(config.join(".dot.yaml"), "domain: dot\n").unwrap();
        std::fs::write(config.join(".hidden/e.yaml"), "domain: e\n").unwrap();
        std::fs::write(base.join("config.top.yaml"), "domain: top\n").unwrap();
        std::fs::write(base.join("other.yaml"), "domain: other\n").unwrap();
        let names = |source: &Source| -> Vec<String> {
            source
                .files()
                .iter()
                .map(|p| p.strip_prefix(base).unwrap().display().to_string())
                .collect()
        };
        let mut source = Source {
            base: base.to_path_buf(),
            app_dir: "config".into(),
            watch_root: false,
            ignore_dotfiles: false,
            merge_domains: false,
        };
        // Every file under config/, whatever its name, dotfiles included.
        assert_eq!(
            names(&source),
            [
                "config/.dot.yaml",
                "config/.hidden/e.yaml",
                "config/a.yaml",
                "config/b.conf",
                "config/sub/c.yml"
            ]
        );
        source.ignore_dotfiles = true;
        assert_eq!(
            names(&source),
            ["config/a.yaml", "config/b.conf", "config/sub/c.yml"]
        );
        // Watching the root: every file whose path under the base reads `config.…`.
        source.watch_root = true;
        assert_eq!(
            names(&source),
            [
                "config/a.yaml",
                "config/b.conf",
                "config/sub/c.yml",
                "config.top.yaml"
            ]
        );
        let loaded = Config::load(&source).unwrap();
        assert_eq!(loaded.domain_count(), 4);
        assert!(Config::load(&Source::dir(&config))
            .unwrap()
            .has_domain("dot"));
    }

    #[test]
    fn nested_share_thresholds_and_their_metrics_load_and_match() {
        // The features of the Go service's share_threshold test file, in our own config.
        let c = load(
            "domain: d
descriptors:
  - key: tenant
    value: t*prod
    share_threshold: true
    descriptors:
      - key: resource
        value: res*v2
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 60}
  - key: route
    value: api/*
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: {unit: minute, requests_per_unit: 60}
  - key: file
    value: test1
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: file
    value: test*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
",
        )
        .unwrap();
        let m = c
            .lookup(
                "d",
                &entries(&[("tenant", "t-a-prod"), ("resource", "res-x-v2")]),
            )
            .unwrap();
        assert_eq!(
            m.key_entries,
            entries(&[("tenant", "t*prod"), ("resource", "res*v2")])
        );
        assert_eq!(m.stats_key, "d.tenant_t*prod.resource_res*v2");
        // share_threshold wins over value_to_metric: the metric keeps the pattern.
        let m = c
            .lookup("d", &entries(&[("route", "api/users"), ("method", "GET")]))
            .unwrap();
        assert_eq!(
            m.key_entries,
            entries(&[("route", "api/*"), ("method", "GET")])
        );
        assert_eq!(m.stats_key, "d.route_api/*.method");
        // An explicit value beats the shared wildcard and keys by itself.
        let m = c.lookup("d", &entries(&[("file", "test1")])).unwrap();
        assert_eq!(m.rate_limit.requests_per_unit, 50);
        assert_eq!(m.key_entries, entries(&[("file", "test1")]));
        let m = c.lookup("d", &entries(&[("file", "test2")])).unwrap();
        assert_eq!(m.key_entries, entries(&[("file", "test*")]));
    }
}
