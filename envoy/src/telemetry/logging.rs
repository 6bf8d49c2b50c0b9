//! The log lines: `LOG_FORMAT=text` (a timestamp, the level, the message and its fields) or
//! `json`, shaped as envoyproxy/ratelimit's logrus `JSONFormatter` writes them (`@message`,
//! `@timestamp` in RFC 3339 with nanoseconds, `level` in logrus's names: `warning`, not
//! `warn`), so a log pipeline parsing the peer's lines parses these.
//!
//! The client library reports an outage as "deciding with on_error=Closed", its own policy;
//! under `RL_ON_ERROR=error` the service turns that into `UNAVAILABLE`, so the line is told
//! what the caller actually gets.

use std::fmt::Write as _;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

use crate::config::settings::Policy;

/// What the client library's outage line says under `RL_ON_ERROR=error`, and what it
/// becomes.
const CLIENT_POLICY: &str = "deciding with on_error=Closed";
const ERROR_POLICY: &str =
    "answering UNAVAILABLE (RL_ON_ERROR=error: Envoy's failure_mode_deny decides, and its default lets the request through)";

/// The formatter of every line.
pub struct PeerFormat {
    pub json: bool,
    pub on_error: Policy,
}

/// logrus's name of a level.
pub fn logrus_level(level: Level) -> &'static str {
    match level {
        Level::TRACE => "trace",
        Level::DEBUG => "debug",
        Level::INFO => "info",
        Level::WARN => "warning",
        Level::ERROR => "error",
    }
}

/// The message and the other fields of an event.
#[derive(Default)]
struct Fields {
    message: String,
    others: Vec<(String, String)>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_string();
        } else if !field.name().starts_with("log.") {
            self.others
                .push((field.name().to_string(), value.to_string()));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        } else if !field.name().starts_with("log.") {
            self.others
                .push((field.name().to_string(), format!("{value:?}")));
        }
    }
}

impl PeerFormat {
    /// The message as the caller should read it.
    pub fn message(&self, message: &str) -> String {
        if self.on_error == Policy::Error && message.contains(CLIENT_POLICY) {
            message.replace(CLIENT_POLICY, ERROR_POLICY)
        } else {
            message.to_string()
        }
    }

    /// One line for `level`, `timestamp`, the message and the other fields.
    pub fn line(
        &self,
        level: Level,
        timestamp: &str,
        message: &str,
        others: &[(String, String)],
    ) -> String {
        let message = self.message(message);
        if self.json {
            let mut map = serde_json::Map::new();
            for (k, v) in others {
                map.insert(k.clone(), serde_json::Value::String(v.clone()));
            }
            map.insert("@message".into(), serde_json::Value::String(message));
            map.insert(
                "@timestamp".into(),
                serde_json::Value::String(timestamp.to_string()),
            );
            map.insert(
                "level".into(),
                serde_json::Value::String(logrus_level(level).into()),
            );
            serde_json::Value::Object(map).to_string()
        } else {
            let mut line = format!("{timestamp} {level:>5} {message}");
            for (k, v) in others {
                let _ = write!(line, " {k}={v}");
            }
            line
        }
    }
}

impl<S, N> FormatEvent<S, N> for PeerFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let mut timestamp = String::new();
        SystemTime.format_time(&mut Writer::new(&mut timestamp))?;
        let mut fields = Fields::default();
        event.record(&mut fields);
        let level = *event.metadata().level();
        writeln!(
            writer,
            "{}",
            self.line(level, &timestamp, &fields.message, &fields.others)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_lines_carry_the_peers_field_names() {
        let f = PeerFormat {
            json: true,
            on_error: Policy::Open,
        };
        let line = f.line(
            Level::WARN,
            "2026-01-02T03:04:05.123456Z",
            "hello",
            &[("domain".into(), "d".into())],
        );
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["@message"], "hello");
        assert_eq!(v["@timestamp"], "2026-01-02T03:04:05.123456Z");
        assert_eq!(v["level"], "warning");
        assert_eq!(v["domain"], "d");
        assert!(
            v.get("message").is_none() && v.get("fields").is_none(),
            "{line}"
        );
    }

    #[test]
    fn the_outage_line_says_what_the_caller_gets() {
        let line =
            "redis-rl: Redis cannot decide (x); deciding with on_error=Closed until it answers";
        let error = PeerFormat {
            json: false,
            on_error: Policy::Error,
        };
        assert!(error.message(line).contains("answering UNAVAILABLE"));
        assert!(!error.message(line).contains("Closed"));
        let closed = PeerFormat {
            json: false,
            on_error: Policy::Closed,
        };
        assert_eq!(closed.message(line), line);
    }
}
