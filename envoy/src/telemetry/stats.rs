//! The peer's observability, as its users read it: the statsd and dogstatsd sinks
//! (`USE_STATSD`, `USE_DOG_STATSD`, `STATSD_*`, `EXTRA_TAGS`, `STATS_FLUSH_INTERVAL`,
//! `DISABLE_STATS`) under envoyproxy/ratelimit's stat names (cleaned by `names.rs`), and
//! the text of the `DEBUG_PORT` pages (`/`, `/rlconfig`, `/stats`; `transport/debug.rs`
//! serves them).
//!
//! One set of counters: the sinks read the Prometheus registry of `metrics.rs` and send what
//! each counter gained since the last flush, as gostats does; the response times are the
//! one thing kept apart ([`Timings`]), since a statsd timer is one line per call.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::io::AsyncWriteExt;

use crate::config::rules::Config;
use crate::config::settings::stats::{Sink, StatsSettings};
use crate::telemetry::metrics::Metrics;

/// gostats's UDP datagram bound: no fragmentation on a 1500-byte MTU.
const MAX_DATAGRAM_BYTES: usize = 1432;

/// A stat name with tags in gostats's statsd form: `name.__key=value…` (sorted keys).
fn tagged_name(name: &str, tags: &[(String, String)]) -> String {
    let mut out = name.to_string();
    for (k, v) in tags {
        out.push_str(".__");
        out.push_str(k);
        out.push('=');
        out.push_str(v);
    }
    out
}

/// One line: a counter (`|c`) or a timer in ms (`|ms`), in the sink's format.
fn line(sink: &Sink, tags: &[(String, String)], name: &str, value: &str, kind: &str) -> String {
    match sink {
        Sink::DogStatsd if !tags.is_empty() => {
            let tags: Vec<String> = tags.iter().map(|(k, v)| format!("{k}:{v}")).collect();
            format!("{name}:{value}|{kind}|#{}\n", tags.join(","))
        }
        Sink::DogStatsd => format!("{name}:{value}|{kind}\n"),
        _ => format!("{}:{value}|{kind}\n", tagged_name(name, tags)),
    }
}

/// A call's time as the peer times it: whole ms, cut down (Go's `Duration.Milliseconds()`),
/// which gostats writes as a plain integer.
fn ms_text(ms: f64) -> String {
    format!("{:.0}", ms.max(0.0).trunc())
}

/// The peer's statsd name of one Prometheus series (`family` with `labels`); `None` for
/// the series that have no statsd counterpart (the histograms: timers are sent per call).
fn statsd_name(family: &str, labels: &BTreeMap<&str, &str>) -> Option<String> {
    let label = |name: &str| labels.get(name).copied().unwrap_or("");
    if let Some(suffix) = family.strip_prefix("ratelimit_service_rate_limit_") {
        // The labels split the stats key at its first two dots: joined back, it is the key.
        let mut key = label("domain").to_string();
        for part in [label("key1"), label("key2")] {
            if !part.is_empty() {
                key.push('.');
                key.push_str(part);
            }
        }
        return Some(format!("ratelimit.service.rate_limit.{key}.{suffix}"));
    }
    Some(match family {
        "ratelimit_service_total_requests" => {
            format!("ratelimit_server.{}.total_requests", label("grpc_method"))
        }
        "ratelimit_service_should_rate_limit_error" => {
            // The peer counts two kinds: the backend's and the service's own.
            let kind = match label("err_type") {
                "invalid_argument" => "service_error",
                _ => "redis_error",
            };
            format!("ratelimit.service.call.should_rate_limit.{kind}")
        }
        "ratelimit_service_config_load_success" => "ratelimit.service.config_load_success".into(),
        "ratelimit_service_config_load_error" => "ratelimit.service.config_load_error".into(),
        "redis_rl_envoy_decisions_total" => {
            format!("redis_rl_envoy.decisions.{}", label("source"))
        }
        _ => return None,
    })
}

/// Every counter under its statsd name, with its total since start (series that share a
/// name, such as two error kinds the peer counts as one, are added up).
pub fn counters(metrics: &Metrics) -> BTreeMap<String, u64> {
    let mut out: BTreeMap<String, u64> = BTreeMap::new();
    for family in metrics.gather() {
        for metric in family.get_metric() {
            let labels: BTreeMap<&str, &str> = metric
                .get_label()
                .iter()
                .map(|l| (l.name(), l.value()))
                .collect();
            let Some(name) = statsd_name(family.name(), &labels) else {
                continue;
            };
            // Counters hold whole numbers (IntCounter): the f64 is exact below 2^53.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let value = metric.get_counter().get_value().max(0.0) as u64;
            let total = out.entry(name).or_insert(0);
            *total = total.saturating_add(value);
        }
    }
    out
}

/// What one flush sends: the counters that moved since `last` (their gain, gostats skips
/// the rest) and the times recorded since. `last` becomes the current totals.
fn flush_lines(
    settings: &StatsSettings,
    metrics: &Metrics,
    last: &mut BTreeMap<String, u64>,
) -> Vec<String> {
    let now = counters(metrics);
    let mut lines = Vec::new();
    for (name, total) in &now {
        let before = last.get(name).copied().unwrap_or(0);
        let gained = total.saturating_sub(before);
        if gained > 0 {
            lines.push(line(
                &settings.sink,
                &settings.extra_tags,
                name,
                &gained.to_string(),
                "c",
            ));
        }
    }
    *last = now;
    for (method, ms) in metrics.timings.take() {
        lines.push(line(
            &settings.sink,
            &settings.extra_tags,
            &format!("ratelimit_server.{method}.response_time"),
            &ms_text(ms),
            "ms",
        ));
    }
    lines
}

/// The lines packed into datagrams of at most [`MAX_DATAGRAM_BYTES`] (a longer line goes
/// alone).
fn datagrams(lines: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut current = String::new();
    for l in lines {
        if !current.is_empty() && current.len().saturating_add(l.len()) > MAX_DATAGRAM_BYTES {
            out.push(std::mem::take(&mut current));
        }
        current.push_str(l);
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// The sink's connection: a UDP socket, or a TCP stream opened again after a failure.
enum Connection {
    Udp(tokio::net::UdpSocket),
    Tcp(Option<tokio::net::TcpStream>),
}

impl Connection {
    async fn send(&mut self, address: &str, lines: &[String]) -> Result<(), String> {
        match self {
            Connection::Udp(socket) => {
                let target = tokio::net::lookup_host(address)
                    .await
                    .map_err(|e| format!("{address}: {e}"))?
                    .next()
                    .ok_or_else(|| format!("{address}: no address"))?;
                for datagram in datagrams(lines) {
                    socket
                        .send_to(datagram.as_bytes(), target)
                        .await
                        .map_err(|e| format!("{address}: {e}"))?;
                }
                Ok(())
            }
            Connection::Tcp(stream) => {
                if stream.is_none() {
                    let connect = tokio::net::TcpStream::connect(address);
                    let s = tokio::time::timeout(Duration::from_millis(1500), connect)
                        .await
                        .map_err(|_| format!("{address}: connect timed out"))?
                        .map_err(|e| format!("{address}: {e}"))?;
                    *stream = Some(s);
                }
                let Some(s) = stream.as_mut() else {
                    return Ok(());
                };
                let text = lines.concat();
                let written =
                    tokio::time::timeout(Duration::from_secs(1), s.write_all(text.as_bytes()))
                        .await;
                match written {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(e)) => {
                        *stream = None;
                        Err(format!("{address}: {e}"))
                    }
                    Err(_) => {
                        *stream = None;
                        Err(format!("{address}: write timed out"))
                    }
                }
            }
        }
    }
}

/// Flushes every `STATS_FLUSH_INTERVAL` until `stop` turns true, then once more, so the
/// last calls are not lost. A sink that cannot be reached drops that flush's stats (as
/// gostats drops them) and is warned about once until it works again.
pub async fn run(
    settings: StatsSettings,
    metrics: Metrics,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let udp = match settings.sink {
        Sink::None => return,
        Sink::Statsd { udp } => udp,
        Sink::DogStatsd => true,
    };
    metrics.timings.enable();
    let address = if settings.host.contains(':') && !settings.host.starts_with('[') {
        format!("[{}]:{}", settings.host, settings.port)
    } else {
        format!("{}:{}", settings.host, settings.port)
    };
    let mut connection = if udp {
        let bind = if settings.host.contains(':') {
            "[::]:0"
        } else {
            "0.0.0.0:0"
        };
        match tokio::net::UdpSocket::bind(bind).await {
            Ok(s) => Connection::Udp(s),
            Err(e) => {
                tracing::error!("statsd: cannot open a UDP socket: {e}");
                return;
            }
        }
    } else {
        Connection::Tcp(None)
    };
    tracing::info!(
        "stats: {:?} to {address} every {} ms",
        settings.sink,
        settings.flush_interval_ms
    );
    let mut last = BTreeMap::new();
    let mut warned = false;
    let mut ticker = tokio::time::interval(Duration::from_millis(settings.flush_interval_ms));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        let stopping = tokio::select! {
            _ = ticker.tick() => false,
            _ = stop.wait_for(|s| *s) => true,
        };
        let lines = flush_lines(&settings, &metrics, &mut last);
        if !lines.is_empty() {
            match connection.send(&address, &lines).await {
                Ok(()) => warned = false,
                Err(e) if !warned => {
                    warned = true;
                    tracing::warn!("statsd: stats dropped: {e}");
                }
                Err(e) => tracing::debug!("statsd: stats dropped: {e}"),
            }
        }
        if stopping {
            return;
        }
    }
}

/// The `/rlconfig` text: one line per limit, the peer's `Dump` format
/// (`<stats key>: unit=<UNIT> requests_per_unit=<n>, shadow_mode: <bool>`), sorted.
pub fn dump_config(config: &Config) -> String {
    let mut lines: Vec<String> = config
        .limits()
        .into_iter()
        .map(|(key, unit, requests_per_unit, shadow_mode)| {
            format!(
                "{key}: unit={} requests_per_unit={requests_per_unit}, shadow_mode: {shadow_mode}\n",
                unit_name(unit)
            )
        })
        .collect();
    lines.sort();
    lines.concat()
}

fn unit_name(unit: crate::config::rules::Unit) -> &'static str {
    use crate::config::rules::Unit;
    match unit {
        Unit::Second => "SECOND",
        Unit::Minute => "MINUTE",
        Unit::Hour => "HOUR",
        Unit::Day => "DAY",
        Unit::Week => "WEEK",
        Unit::Month => "MONTH",
        Unit::Year => "YEAR",
    }
}

/// The `/stats` text: every counter under its statsd name with its total, `name: value`
/// per line (the peer's page prints Go's expvar in that shape).
pub fn dump_stats(metrics: &Metrics) -> String {
    counters(metrics)
        .into_iter()
        .map(|(name, value)| format!("{name}: {value}\n"))
        .collect()
}

pub const DEBUG_ENDPOINTS: &[(&str, &str)] = &[
    (
        "/rlconfig",
        "print out the currently loaded configuration for debugging",
    ),
    ("/stats", "print out stats"),
];

/// `host:port` of the debug listener (an IPv6 host in brackets).
pub fn debug_bind(settings: &StatsSettings) -> String {
    if settings.debug_host.contains(':') && !settings.debug_host.starts_with('[') {
        format!("[{}]:{}", settings.debug_host, settings.debug_port)
    } else {
        format!("{}:{}", settings.debug_host, settings.debug_port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::settings::stats::parse_extra_tags;
    use crate::telemetry::names::sanitize_stat_name;
    use std::borrow::Cow;

    #[test]
    fn names_are_cleaned_as_the_peer_cleans_them() {
        for (raw, clean) in [
            ("d.remote_address_10.1.2.3", "d.remote_address_10_1_2_3"),
            ("d.k_a:b|c", "d.k_a_b_c"),
            ("d.k_1.2.3", "d.k_1.2.3"),
            ("d.k_1234.5.6.7", "d.k_1234_5_6_7"),
            ("d.k_10.1.2.3456", "d.k_10_1_2_3456"),
            ("d.k_1.2.3.4.5.6.7.8", "d.k_1_2_3_4.5_6_7_8"),
            ("d.ip_::ffff:10.0.0.1", "d.ip___ffff_10_0_0_1"),
            ("d.é.1.2.3.4", "d.é.1_2_3_4"),
        ] {
            assert_eq!(sanitize_stat_name(raw), clean, "{raw}");
        }
        assert!(matches!(sanitize_stat_name("d.k_1.2.3"), Cow::Borrowed(_)));
    }

    #[test]
    fn prometheus_labels_keep_an_address_in_one_label() {
        let labels = Metrics::labels("d", "d.remote_address_10.1.2.3");
        assert_eq!(labels, ["d", "remote_address_10_1_2_3", ""]);
        let labels = Metrics::labels("d", "d.a_1.b_2.c");
        assert_eq!(labels, ["d", "a_1", "b_2.c"]);
        assert!(labels.iter().all(|l| matches!(l, Cow::Borrowed(_))));
        assert_eq!(Metrics::labels("a:b", "a:b.k_v"), ["a_b", "k_v", ""]);
    }

    #[test]
    fn extra_tags_read_as_envconfig_reads_a_map() {
        assert_eq!(
            parse_extra_tags("z:1,a:b.c,empty:,:x").unwrap(),
            vec![("a".into(), "b_c".into()), ("z".into(), "1".into())]
        );
        assert!(parse_extra_tags("").unwrap().is_empty());
        assert!(parse_extra_tags("novalue")
            .unwrap_err()
            .starts_with("EXTRA_TAGS"));
    }

    #[test]
    fn lines_in_both_formats() {
        let tags = vec![("env".to_string(), "prod".to_string())];
        assert_eq!(
            line(&Sink::Statsd { udp: true }, &tags, "a.b", "3", "c"),
            "a.b.__env=prod:3|c\n"
        );
        assert_eq!(
            line(&Sink::DogStatsd, &tags, "a.b", "3", "c"),
            "a.b:3|c|#env:prod\n"
        );
        assert_eq!(
            line(&Sink::DogStatsd, &[], "a.b", "2.5", "ms"),
            "a.b:2.5|ms\n"
        );
        assert_eq!(ms_text(2.0), "2");
        assert_eq!(ms_text(0.25), "0");
        assert_eq!(ms_text(12.99), "12");
    }

    #[test]
    fn datagrams_stay_under_the_mtu() {
        let lines: Vec<String> = (0..300).map(|i| format!("name.{i}:1|c\n")).collect();
        let grams = datagrams(&lines);
        assert!(grams.len() > 1);
        assert!(grams.iter().all(|g| g.len() <= MAX_DATAGRAM_BYTES));
        assert_eq!(grams.concat(), lines.concat());
    }
}
