//! The peer's observability on a running service: statsd over UDP and TCP (gostats's
//! format, `EXTRA_TAGS` in the name), dogstatsd (`|#tags`), the peer's cleaning of stat
//! names (an IPv4 value stays one level, in statsd and in Prometheus), `DISABLE_STATS`, the
//! last flush on SIGTERM, the `DEBUG_PORT` pages, and bad values refused by name. The sinks
//! are real sockets the test listens on.
//!
//! Time: limits are per minute, so refill cannot change a count within a test; flushes are
//! every 100 ms and each wait below is a deadline, not a sleep.

#![cfg(test)]

use rl_testkit as common;
mod support;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::{TcpListener, UdpSocket};
use std::time::{Duration, Instant};

use support::{free_port, http, one, Service};

const CONFIG: &str = "
domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: remote_address
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 7}
";

const DEADLINE: Duration = Duration::from_secs(10);

fn redis_url(port: u16) -> String {
    format!("127.0.0.1:{port}")
}

/// Three calls on `k` (2 within, 1 over) and one on `remote_address` = `10.1.2.3`.
fn traffic(svc: &Service) {
    for expected in [200, 200, 429] {
        assert_eq!(svc.json(&one("d", &[("k", "x")])).status, expected);
    }
    assert_eq!(
        svc.json(&one("d", &[("remote_address", "10.1.2.3")]))
            .status,
        200
    );
}

/// Counter totals by name (`name:N|c…` lines added up) and the timer lines, of `lines`.
fn totals(lines: &[String]) -> (BTreeMap<String, u64>, Vec<String>) {
    let mut counters = BTreeMap::new();
    let mut timers = Vec::new();
    for l in lines {
        let Some((name, rest)) = l.split_once(':') else {
            continue;
        };
        let mut fields = rest.split('|');
        let value = fields.next().unwrap_or("");
        let kind = fields.next().unwrap_or("");
        let tags = fields.next().unwrap_or("");
        let key = if tags.is_empty() {
            name.to_string()
        } else {
            format!("{name}|{tags}")
        };
        match kind {
            "c" => *counters.entry(key).or_insert(0) += value.parse::<u64>().unwrap(),
            "ms" => {
                assert!(value.parse::<f64>().unwrap() >= 0.0, "{l}");
                timers.push(key);
            }
            other => panic!("unexpected kind {other:?} in {l:?}"),
        }
    }
    (counters, timers)
}

/// Datagrams received on `socket` until `done` holds for their lines (or the deadline).
fn receive_udp(socket: &UdpSocket, done: impl Fn(&[String]) -> bool) -> Vec<String> {
    socket
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut lines = Vec::new();
    let started = Instant::now();
    let mut buf = [0u8; 65_536];
    while started.elapsed() < DEADLINE && !done(&lines) {
        if let Ok(n) = socket.recv(&mut buf) {
            let text = std::str::from_utf8(&buf[..n]).unwrap();
            assert!(n <= 1432, "a datagram of {n} bytes");
            lines.extend(text.lines().map(str::to_string));
        }
    }
    lines
}

fn has(counters: &BTreeMap<String, u64>, name: &str, want: u64) -> bool {
    counters.get(name).copied() == Some(want)
}

fn statsd_env(port: u16) -> Vec<(String, String)> {
    vec![
        ("STATSD_HOST".into(), "127.0.0.1".into()),
        ("STATSD_PORT".into(), port.to_string()),
        ("STATS_FLUSH_INTERVAL".into(), "100ms".into()),
        ("DEBUG_PORT".into(), free_port().to_string()),
        ("DEBUG_HOST".into(), "127.0.0.1".into()),
    ]
}

fn start(redis: &common::Server, env: &[(String, String)]) -> Service {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    Service::start(&redis_url(redis.port), &[("d.yaml", CONFIG)], &env)
}

#[test]
fn statsd_over_udp_sends_the_peers_names_with_extra_tags_in_the_name() {
    let redis = common::Server::start();
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut env = statsd_env(socket.local_addr().unwrap().port());
    env.push(("STATSD_PROTOCOL".into(), "udp".into()));
    env.push(("EXTRA_TAGS".into(), "region:eu.west,env:prod".into()));
    let svc = start(&redis, &env);
    traffic(&svc);
    // Tags sorted by key, the value's dot cleaned (gostats's ReplaceChars).
    let t = ".__env=prod.__region=eu_west";
    let key = |k: &str| format!("ratelimit.service.rate_limit.d.{k}{t}");
    let lines = receive_udp(&socket, |lines| {
        let (c, timers) = totals(lines);
        has(&c, &key("k.total_hits"), 3)
            && has(&c, &key("remote_address_10_1_2_3.total_hits"), 1)
            && timers.len() >= 4
    });
    let (counters, timers) = totals(&lines);
    let log = svc.log();
    assert!(
        has(&counters, &key("k.total_hits"), 3),
        "{counters:#?}\n{log}"
    );
    assert!(has(&counters, &key("k.within_limit"), 2), "{counters:#?}");
    assert!(has(&counters, &key("k.over_limit"), 1), "{counters:#?}");
    // The peer's cleaning: the address is one level, not four.
    assert!(
        has(&counters, &key("remote_address_10_1_2_3.total_hits"), 1),
        "{counters:#?}"
    );
    assert!(
        !counters.keys().any(|k| k.contains("10.1")),
        "{counters:#?}"
    );
    assert!(has(
        &counters,
        &format!("ratelimit_server.json.total_requests{t}"),
        4
    ));
    assert!(has(
        &counters,
        &format!("ratelimit.service.config_load_success{t}"),
        1
    ));
    let timer = format!("ratelimit_server.json.response_time{t}");
    assert_eq!(
        timers.iter().filter(|n| **n == timer).count(),
        4,
        "{timers:?}"
    );
    // Prometheus reads the same counters, and its labels are cleaned the same way.
    let page = svc.metrics();
    assert!(
        page.lines().any(
            |l| l.starts_with("ratelimit_service_rate_limit_total_hits{")
                && l.contains(r#"key1="remote_address_10_1_2_3""#)
                && l.contains(r#"key2="""#)
                && l.ends_with(" 1")
        ),
        "{page}"
    );
}

#[test]
fn dogstatsd_puts_extra_tags_after_a_hash() {
    let redis = common::Server::start();
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut env = statsd_env(socket.local_addr().unwrap().port());
    env.push(("USE_DOG_STATSD".into(), "true".into()));
    env.push(("USE_STATSD".into(), "false".into()));
    env.push(("EXTRA_TAGS".into(), "env:prod,team:a|b".into()));
    let svc = start(&redis, &env);
    traffic(&svc);
    let name = "ratelimit.service.rate_limit.d.k.over_limit|#env:prod,team:a_b";
    let lines = receive_udp(&socket, |lines| has(&totals(lines).0, name, 1));
    let (counters, timers) = totals(&lines);
    assert!(has(&counters, name, 1), "{counters:#?}\n{}", svc.log());
    assert!(has(
        &counters,
        "ratelimit.service.rate_limit.d.k.total_hits|#env:prod,team:a_b",
        3
    ));
    assert!(
        !counters.keys().any(|k| k.contains(".__")),
        "no gostats tags in dogstatsd names: {counters:#?}"
    );
    assert!(timers
        .iter()
        .all(|t| t == "ratelimit_server.json.response_time|#env:prod,team:a_b"));
}

#[test]
fn statsd_is_on_by_default_over_tcp_as_gostats_sends_it() {
    let redis = common::Server::start();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let env = statsd_env(listener.local_addr().unwrap().port());
    let svc = start(&redis, &env);
    traffic(&svc);
    // The sink connects at its first flush; a deadline, not a blocking accept.
    listener.set_nonblocking(true).unwrap();
    let started = Instant::now();
    let stream = loop {
        match listener.accept() {
            Ok((stream, _)) => break stream,
            Err(_) if started.elapsed() < DEADLINE => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("no statsd connection: {e}\n{}", svc.log()),
        }
    };
    stream.set_nonblocking(false).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut reader = BufReader::new(stream);
    let mut lines = Vec::new();
    let started = Instant::now();
    let want = "ratelimit.service.rate_limit.d.k.total_hits";
    while started.elapsed() < DEADLINE && !has(&totals(&lines).0, want, 3) {
        let mut line = String::new();
        if reader.read_line(&mut line).is_ok_and(|n| n > 0) {
            lines.push(line.trim_end().to_string());
        }
    }
    let (counters, _) = totals(&lines);
    assert!(has(&counters, want, 3), "{counters:#?}\n{}", svc.log());
    assert!(has(
        &counters,
        "ratelimit.service.rate_limit.d.k.over_limit",
        1
    ));
}

#[test]
fn disable_stats_sends_nothing_and_serves_no_prometheus_page() {
    let redis = common::Server::start();
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut env = statsd_env(socket.local_addr().unwrap().port());
    env.push(("STATSD_PROTOCOL".into(), "udp".into()));
    env.push(("DISABLE_STATS".into(), "true".into()));
    let svc = start(&redis, &env);
    traffic(&svc);
    // Ten flush intervals: a datagram would have come.
    socket
        .set_read_timeout(Some(Duration::from_millis(1000)))
        .unwrap();
    let mut buf = [0u8; 2048];
    assert!(socket.recv(&mut buf).is_err(), "a datagram arrived");
    assert!(http(svc.metrics_port, "GET", "/metrics", &[], "").is_none());
}

#[test]
fn the_last_flush_on_sigterm_counts_every_call() {
    let redis = common::Server::start();
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut env = statsd_env(socket.local_addr().unwrap().port());
    env.push(("STATSD_PROTOCOL".into(), "udp".into()));
    // No flush would come for an hour: only the one at the exit.
    env.push(("STATS_FLUSH_INTERVAL".into(), "1h".into()));
    let mut svc = start(&redis, &env);
    traffic(&svc);
    svc.signal("TERM");
    assert!(svc.wait_exit().is_some_and(|s| s.success()));
    let lines = receive_udp(&socket, |lines| {
        has(&totals(lines).0, "ratelimit_server.json.total_requests", 4)
    });
    let (counters, _) = totals(&lines);
    assert!(
        has(&counters, "ratelimit_server.json.total_requests", 4),
        "{counters:#?}\n{}",
        svc.log()
    );
    assert!(has(
        &counters,
        "ratelimit.service.rate_limit.d.k.total_hits",
        3
    ));
}

#[test]
fn the_debug_port_serves_rlconfig_and_stats() {
    let redis = common::Server::start();
    let env = statsd_env(free_port());
    let debug_port: u16 = env
        .iter()
        .find(|(k, _)| k == "DEBUG_PORT")
        .map(|(_, v)| v.parse().unwrap())
        .unwrap();
    let svc = start(&redis, &env);
    traffic(&svc);
    let get = |path: &str| {
        let reply = http(debug_port, "GET", path, &[], "")
            .unwrap_or_else(|| panic!("no answer on {path}: {}", svc.log()));
        assert_eq!(reply.status, 200, "{path}");
        reply.body
    };
    let index = get("/");
    assert!(index.contains("/rlconfig: print out the currently loaded configuration"));
    assert!(index.contains("/stats: print out stats"));
    assert_eq!(
        get("/rlconfig"),
        "d.k: unit=MINUTE requests_per_unit=2, shadow_mode: false\n\
         d.remote_address: unit=MINUTE requests_per_unit=100, shadow_mode: false\n\
         d.shadow: unit=HOUR requests_per_unit=7, shadow_mode: true\n"
    );
    let stats = get("/stats");
    for line in [
        "ratelimit.service.rate_limit.d.k.total_hits: 3",
        "ratelimit.service.rate_limit.d.k.over_limit: 1",
        "ratelimit.service.rate_limit.d.remote_address_10_1_2_3.within_limit: 1",
        "ratelimit_server.json.total_requests: 4",
        "ratelimit.service.config_load_success: 1",
    ] {
        assert!(stats.lines().any(|l| l == line), "{line}\n{stats}");
    }
}

#[test]
fn bad_stats_values_are_refused_by_name() {
    let redis = common::Server::start();
    for (name, value) in [
        ("EXTRA_TAGS", "nocolon"),
        ("STATS_FLUSH_INTERVAL", "10"),
        ("STATS_FLUSH_INTERVAL", "0s"),
        ("STATSD_PORT", "port"),
        ("STATSD_PROTOCOL", "quic"),
        ("USE_STATSD", "maybe"),
        ("DEBUG_PORT", "70000"),
    ] {
        let err = Service::try_start(
            &redis_url(redis.port),
            &[("d.yaml", CONFIG)],
            &[(name, value)],
        )
        .err()
        .unwrap_or_else(|| panic!("{name}={value} was accepted"));
        assert!(
            err.contains(&format!("redis-rl-envoy: {name} must be")),
            "{name}: {err}"
        );
    }
}

/// The metric names an expression reads (`ratelimit_*`, `redis_rl_envoy_*`).
fn metric_names(expr: &str) -> Vec<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("ratelimit_") || w.starts_with("redis_rl_envoy_"))
        .map(str::to_string)
        .collect()
}

#[test]
fn the_grafana_dashboard_reads_metrics_the_service_exports() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/grafana/redis-rl-envoy.json"
    );
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let redis = common::Server::start();
    let svc = start(&redis, &statsd_env(free_port()));
    // Every series the dashboard draws: within, over, near (the 2nd of 2), shadow (the 8th
    // of 7 an hour), an error (a bad body), decisions, both histograms.
    traffic(&svc);
    for _ in 0..8 {
        assert_eq!(svc.json(&one("d", &[("shadow", "s")])).status, 200);
    }
    assert_eq!(svc.json("{").status, 400);
    let page = svc.metrics();
    let exported: std::collections::BTreeSet<&str> = page
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();

    let variables: Vec<&str> = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert!(variables.contains(&"datasource") && variables.contains(&"domain"));
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(panels.len() >= 6);
    let mut ids = std::collections::BTreeSet::new();
    let mut cells = std::collections::BTreeSet::new();
    let mut read = std::collections::BTreeSet::new();
    for panel in panels {
        let title = panel["title"].as_str().unwrap();
        assert!(
            ids.insert(panel["id"].as_u64().unwrap()),
            "{title}: id reused"
        );
        assert_eq!(panel["type"], "timeseries", "{title}");
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title}");
        // The grid is 24 wide and no two panels overlap.
        let g = &panel["gridPos"];
        let (x, y, w, h) = (
            g["x"].as_u64().unwrap(),
            g["y"].as_u64().unwrap(),
            g["w"].as_u64().unwrap(),
            g["h"].as_u64().unwrap(),
        );
        assert!(x + w <= 24 && w > 0 && h > 0, "{title}");
        for cx in x..x + w {
            for cy in y..y + h {
                assert!(cells.insert((cx, cy)), "{title} overlaps another panel");
            }
        }
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title}");
        let mut refs = std::collections::BTreeSet::new();
        for target in targets {
            assert!(refs.insert(target["refId"].as_str().unwrap()), "{title}");
            let expr = target["expr"].as_str().unwrap();
            let names = metric_names(expr);
            assert!(!names.is_empty(), "{title}: {expr}");
            for name in names {
                assert!(
                    exported.contains(name.as_str()),
                    "{title}: {name} is not on the service's page:\n{page}"
                );
                read.insert(name);
            }
        }
    }
    // Every peer-named counter the service exports is on the dashboard.
    for name in exported
        .iter()
        .filter(|n| n.starts_with("ratelimit_service_rate_limit_"))
    {
        assert!(read.contains(*name), "{name} is not on the dashboard");
    }
}

const CLIENT_VALUES: &str = "
domain: vtm
descriptors:
  - key: user
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 1000}
  # A ban asks no Redis: the bound on series is tested without 100,000 buckets.
  - key: banned
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 60}
";

/// The sum and the number of series of `name` on the Prometheus page.
fn series(metrics: &str, name: &str) -> (u64, usize) {
    let lines: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .collect();
    let sum = lines
        .iter()
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    (sum, lines.len())
}

#[test]
fn client_values_make_a_bounded_number_of_series_and_the_rest_are_counted_as_folded() {
    // 100,000 distinct values under detailed_metric, 64 per call, with the default bound of
    // 10,000: the first 10,000 stats keys get their own series, the other 90,000 values are
    // counted under the config's key (`banned`), and the folding is counted. Every hit is
    // still counted, and the page stays the size of 10,001 series.
    const VALUES: u32 = 100_000;
    const BOUND: usize = 10_000;
    let redis = common::Server::start();
    let svc = Service::start(&redis_url(redis.port), &[("vtm.yaml", CLIENT_VALUES)], &[]);
    let mut n = 0u32;
    while n < VALUES {
        let descriptors: Vec<serde_json::Value> = (n..(n + 64).min(VALUES))
            .map(|i| serde_json::json!({"entries": [{"key": "banned", "value": format!("u{i}")}]}))
            .collect();
        n += 64;
        let body = serde_json::json!({"domain": "vtm", "descriptors": descriptors}).to_string();
        assert_eq!(svc.json(&body).status, 429);
    }
    let metrics = svc.metrics();
    let (hits, count) = series(&metrics, "ratelimit_service_rate_limit_total_hits");
    assert_eq!(hits, u64::from(VALUES));
    // 10,000 with a value, and the folded one.
    assert_eq!(count, BOUND + 1);
    let folded = u64::from(VALUES) - BOUND as u64;
    assert_eq!(
        svc.metric(
            r#"ratelimit_service_rate_limit_total_hits{domain="vtm",key1="banned",key2=""}"#
        ),
        folded
    );
    assert_eq!(svc.metric("redis_rl_envoy_stats_keys_folded "), folded);
    // The page holds 10,001 series of each counter: 1.7 MB here, where every value kept
    // would make it ten times that.
    assert!(
        metrics.len() < 2 * 1024 * 1024,
        "/metrics is {} bytes",
        metrics.len()
    );
}

#[test]
fn value_to_metric_names_every_level_and_a_nul_is_escaped() {
    let redis = common::Server::start();
    let svc = Service::start(&redis_url(redis.port), &[("vtm.yaml", CLIENT_VALUES)], &[]);
    // The peer's example, three levels deep: both values named.
    let three = one(
        "vtm",
        &[
            ("route", "api"),
            ("http_method", "GET"),
            ("subject_id", "123"),
        ],
    );
    assert_eq!(svc.json(&three).status, 200);
    assert_eq!(
        svc.metric(r#"ratelimit_service_rate_limit_total_hits{domain="vtm",key1="route_api",key2="http_method_GET.subject_id"}"#),
        1,
        "{}",
        svc.metrics()
    );
    // A NUL and a newline in a value reach the label escaped, never raw.
    assert_eq!(svc.json(&one("vtm", &[("user", "a\u{0}b\nc")])).status, 200);
    let metrics = svc.metrics();
    assert!(!metrics.contains('\u{0}'), "a raw NUL in /metrics");
    assert_eq!(
        svc.metric(r#"ratelimit_service_rate_limit_total_hits{domain="vtm",key1="user_a\\x00b\\x0ac",key2=""}"#),
        1,
        "{metrics}"
    );
}
