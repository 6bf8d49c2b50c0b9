//! The stats variables (`USE_STATSD`, `USE_DOG_STATSD`, `STATSD_*`, `EXTRA_TAGS`,
//! `STATS_FLUSH_INTERVAL`, `DISABLE_STATS`, `DEBUG_HOST`/`DEBUG_PORT`), read into the struct
//! the sinks and the debug pages take. Imports only the environment readers.

use std::collections::BTreeMap;

/// Where the stats go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sink {
    /// `DISABLE_STATS`, or `USE_STATSD=false` without `USE_DOG_STATSD`.
    None,
    /// gostats's statsd sink: `name.__tag=value:1|c`, over TCP (gostats's default) or UDP
    /// (`STATSD_PROTOCOL=udp`).
    Statsd { udp: bool },
    /// datadog-go's: `name:1|c|#tag:value`, over UDP.
    DogStatsd,
}

/// The stats settings.
#[derive(Clone, Debug)]
pub struct StatsSettings {
    pub sink: Sink,
    pub host: String,
    pub port: u16,
    /// `EXTRA_TAGS`, sorted by key (gostats's order), values cleaned as gostats cleans them.
    pub extra_tags: Vec<(String, String)>,
    pub flush_interval_ms: u64,
    /// `DISABLE_STATS`: no sink at all, the Prometheus page included (the peer's null sink).
    pub disabled: bool,
    pub debug_host: String,
    pub debug_port: u16,
}

/// The longest `STATS_FLUSH_INTERVAL`, in ms (an hour).
pub const MAX_FLUSH_INTERVAL_MS: u64 = 3_600_000;

impl StatsSettings {
    /// Reads the stats variables through `var`; `duration_ms` reads a Go duration.
    ///
    /// # Errors
    /// The variable and what it must be.
    pub fn from_env(
        var: &dyn Fn(&str) -> Option<String>,
        duration_ms: fn(&str) -> Option<u64>,
    ) -> Result<StatsSettings, String> {
        let flag = |name: &str, default: bool| crate::config::env::env_flag(var, name, default);
        let port = |name: &str, default: u16| -> Result<u16, String> {
            match var(name) {
                None => Ok(default),
                Some(v) => v
                    .trim()
                    .parse::<u16>()
                    .map_err(|_| format!("{name} must be a port from 0 to 65535, not {v:?}")),
            }
        };
        let disabled = flag("DISABLE_STATS", false)?;
        let use_statsd = flag("USE_STATSD", true)?;
        let use_dog_statsd = flag("USE_DOG_STATSD", false)?;
        let udp = match var("STATSD_PROTOCOL")
            .unwrap_or_else(|| "tcp".into())
            .to_ascii_lowercase()
            .as_str()
        {
            "tcp" | "tcp4" | "tcp6" => false,
            "udp" | "udp4" | "udp6" => true,
            other => return Err(format!("STATSD_PROTOCOL must be tcp or udp, not {other:?}")),
        };
        let sink = if disabled {
            Sink::None
        } else if use_dog_statsd {
            Sink::DogStatsd
        } else if use_statsd {
            Sink::Statsd { udp }
        } else {
            Sink::None
        };
        let flush_interval_ms = match var("STATS_FLUSH_INTERVAL") {
            None => 10_000,
            Some(v) => duration_ms(&v)
                .filter(|ms| (1..=MAX_FLUSH_INTERVAL_MS).contains(ms))
                .ok_or_else(|| {
                    format!(
                        "STATS_FLUSH_INTERVAL must be a Go duration from 1ms to 1h, such as 10s, \
                         not {v:?}"
                    )
                })?,
        };
        Ok(StatsSettings {
            sink,
            host: var("STATSD_HOST").unwrap_or_else(|| "localhost".into()),
            port: port("STATSD_PORT", 8125)?,
            extra_tags: parse_extra_tags(&var("EXTRA_TAGS").unwrap_or_default())?,
            flush_interval_ms,
            disabled,
            debug_host: var("DEBUG_HOST").unwrap_or_else(|| "0.0.0.0".into()),
            debug_port: port("DEBUG_PORT", 6070)?,
        })
    }
}

/// `EXTRA_TAGS` as envconfig reads a map: `k:v,k:v`; a pair without a `:` is an error. Pairs
/// with an empty key or value are dropped (gostats drops them), values are cleaned
/// ([`tag_value`]), the last of a repeated key wins, and the result is sorted by key.
///
/// # Errors
/// `EXTRA_TAGS` and what it must be.
pub fn parse_extra_tags(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut tags = BTreeMap::new();
    for pair in text.split(',').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once(':').ok_or_else(|| {
            format!("EXTRA_TAGS must be key:value pairs joined by commas, not {pair:?}")
        })?;
        if !key.is_empty() && !value.is_empty() {
            tags.insert(key.to_string(), tag_value(value));
        }
    }
    Ok(tags.into_iter().collect())
}

/// gostats's `ReplaceChars`: `.`, `:` and `|` in a tag value become `_` (each would end
/// the name, the value or the line in the statsd format).
pub fn tag_value(value: &str) -> String {
    value.replace(['.', ':', '|'], "_")
}
