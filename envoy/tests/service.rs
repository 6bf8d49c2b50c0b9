//! The service on a running process, through `/json`, gRPC and the Prometheus page: config parity
//! with envoyproxy/ratelimit's rules, bad configs refused at startup and on reload, the
//! exact bucket's arithmetic, every `RL_ON_ERROR` with Redis killed, the Lua path on a
//! plain Redis, a cluster, and a drained SIGTERM. Envoy itself is in `tests/envoy.rs`.
//!
//! Time: limits are per minute or slower, so refill cannot change a count within a test.

#![cfg(test)]

use rl_testkit as common;
mod support;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{one, PlainRedis, Reply, Service};

const PARITY: &str = "
domain: parity
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 5}
      - key: subkey1
        value: subvalue1
        rate_limit: {unit: second, requests_per_unit: 10, name: sub}
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: key2
    value: value2
    rate_limit: {unit: minute, requests_per_unit: 30}
  - key: key2
    value: listed
  - key: key3
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: key4
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: key5
    rate_limit: {unit: week, requests_per_unit: 2}
  - key: key6
    rate_limit: {unlimited: true}
  - key: wild
    value: foo*
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: shared
    value: bar*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: detailed
    detailed_metric: true
    rate_limit: {unit: day, requests_per_unit: 100}
  - key: first
    rate_limit: {unit: minute, requests_per_unit: 10, name: first}
  - key: second
    rate_limit:
      unit: minute
      requests_per_unit: 5
      name: second
      replaces: [{name: first}]
  - key: multi
    rate_limit: {unit: minute, requests_per_unit: 20, unit_multiplier: 5}
  - key: burst
    rate_limit: {unit: hour, requests_per_unit: 10, burst: 3}
";

fn redis_url(port: u16) -> String {
    format!("127.0.0.1:{port}")
}

/// The status list of a response.
fn statuses(v: &Value) -> Vec<Value> {
    v["statuses"].as_array().cloned().unwrap_or_default()
}

#[test]
fn config_lookup_matches_the_go_service() {
    let redis = common::Server::start();
    let svc = Service::start(&redis_url(redis.port), &[("parity.yaml", PARITY)], &[]);
    // (entries, the limit expected: requests_per_unit, unit, name; None = no limit)
    type Case<'a> = (Vec<(&'a str, &'a str)>, Option<(u64, &'a str, &'a str)>);
    let cases: Vec<Case> = vec![
        // A nested key-only default under an exact value.
        (
            vec![("key1", "value1"), ("subkey1", "x")],
            Some((5, "SECOND", "")),
        ),
        // The exact nested value beats the key-only default.
        (
            vec![("key1", "value1"), ("subkey1", "subvalue1")],
            Some((10, "SECOND", "sub")),
        ),
        // The request stops above the level that holds the limit: no limit.
        (vec![("key1", "value1")], None),
        // One entry more than the config's depth: no limit.
        (vec![("key2", "value2"), ("extra", "x")], None),
        // An exact value beats the key's default, and an unknown value gets the default.
        (vec![("key2", "value2")], Some((30, "MINUTE", ""))),
        (vec![("key2", "other")], Some((20, "MINUTE", ""))),
        // A value without rate_limit is whitelisted.
        (vec![("key2", "listed")], None),
        (vec![("key3", "a")], Some((1, "HOUR", ""))),
        (vec![("key4", "a")], Some((1, "DAY", ""))),
        (vec![("key5", "a")], Some((2, "WEEK", ""))),
        // A wildcard value matches by prefix.
        (vec![("wild", "foo-1")], Some((3, "MINUTE", ""))),
        (vec![("wild", "bar")], None),
        // An unknown key: no limit.
        (vec![("nothing", "a")], None),
        // unit_multiplier keeps the unit in the response (the proto has no multiplier).
        (vec![("multi", "a")], Some((20, "MINUTE", ""))),
    ];
    for (entries, expected) in cases {
        let reply = svc.json(&one("parity", &entries));
        assert_eq!(reply.status, 200, "{entries:?}: {}", reply.body);
        let body = reply.json();
        let status = &statuses(&body)[0];
        assert_eq!(status["code"], "OK", "{entries:?}");
        match expected {
            None => assert!(
                status.get("currentLimit").is_none(),
                "{entries:?}: {status}"
            ),
            Some((rpu, unit, name)) => {
                let limit = &status["currentLimit"];
                assert_eq!(limit["requestsPerUnit"], json!(rpu), "{entries:?}");
                assert_eq!(limit["unit"], unit, "{entries:?}");
                assert_eq!(limit["name"].as_str().unwrap_or(""), name, "{entries:?}");
            }
        }
    }
    // Unlimited: OK with the largest remaining, and nothing written to Redis.
    let body = svc.json(&one("parity", &[("key6", "a")])).json();
    assert_eq!(statuses(&body)[0]["limitRemaining"], json!(u32::MAX));
    // An unknown domain answers OK with no limit, as the Go service does.
    let body = svc.json(&one("elsewhere", &[("key3", "a")])).json();
    assert_eq!(body["overallCode"], "OK");
    assert!(statuses(&body)[0].get("currentLimit").is_none());
    let mut con = redis.conn();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut con).unwrap();
    assert!(
        keys.iter()
            .all(|k| !k.contains("key6") && !k.contains("elsewhere")),
        "{keys:?}"
    );
}

#[test]
fn replaces_wildcards_share_threshold_and_detailed_metric() {
    let redis = common::Server::start();
    let svc = Service::start(&redis_url(redis.port), &[("parity.yaml", PARITY)], &[]);
    // `second` replaces `first` when both are in one request.
    let both = json!({"domain": "parity", "descriptors": [
        {"entries": [{"key": "first", "value": "a"}]},
        {"entries": [{"key": "second", "value": "a"}]}]});
    let body = svc.json(&both.to_string()).json();
    let s = statuses(&body);
    assert!(s[0].get("currentLimit").is_none(), "{body}");
    assert_eq!(s[1]["currentLimit"]["name"], "second");
    // A wildcard without share_threshold: one bucket per value.
    for _ in 0..3 {
        assert_eq!(svc.json(&one("parity", &[("wild", "foo-1")])).status, 200);
    }
    assert_eq!(svc.json(&one("parity", &[("wild", "foo-1")])).status, 429);
    assert_eq!(svc.json(&one("parity", &[("wild", "foo-2")])).status, 200);
    // share_threshold: every matching value shares the pattern's bucket of 2.
    assert_eq!(svc.json(&one("parity", &[("shared", "bar-1")])).status, 200);
    assert_eq!(svc.json(&one("parity", &[("shared", "bar-2")])).status, 200);
    assert_eq!(svc.json(&one("parity", &[("shared", "bar-3")])).status, 429);
    // detailed_metric: the key-only limit's metric carries the request's value.
    svc.json(&one("parity", &[("detailed", "abc")]));
    assert_eq!(
        svc.metric(r#"ratelimit_service_rate_limit_total_hits{domain="parity",key1="detailed_abc",key2=""}"#),
        1,
        "{}",
        svc.metrics()
    );
    // Nested stats keys fill key2, as the Go service's Prometheus mapper names them.
    svc.json(&one(
        "parity",
        &[("key1", "value1"), ("subkey1", "subvalue1")],
    ));
    assert_eq!(
        svc.metric(r#"ratelimit_service_rate_limit_total_hits{domain="parity",key1="key1_value1",key2="subkey1_subvalue1"}"#),
        1
    );
}

#[test]
fn burst_cost_refund_and_override_are_exact() {
    let redis = common::Server::start();
    let svc = Service::start(&redis_url(redis.port), &[("parity.yaml", PARITY)], &[]);
    // burst: 3 of a 10/hour limit pass at once, the 4th does not.
    for _ in 0..3 {
        assert_eq!(svc.json(&one("parity", &[("burst", "u")])).status, 200);
    }
    let over = svc.json(&one("parity", &[("burst", "u")]));
    assert_eq!(over.status, 429);
    let status = &statuses(&over.json())[0];
    assert_eq!(status["code"], "OVER_LIMIT");
    // One token of 10/hour comes back in 360 s: a denial's reset is when that request
    // could pass, not when the bucket is full again (1080 s).
    let reset = status["durationUntilReset"].as_str().unwrap();
    let reset_s: f64 = reset.trim_end_matches('s').parse().unwrap();
    assert!(reset_s > 350.0 && reset_s <= 360.0, "{reset}");
    // hits_addend is the cost: 30 of 30/minute pass as one call, then nothing.
    let cost_on = |value: &str, n: u64, negative: bool| {
        json!({"domain": "parity", "descriptors": [{"entries": [{"key": "key2", "value": value}],
               "hitsAddend": n.to_string(), "isNegativeHits": negative}]})
        .to_string()
    };
    let cost = |n: u64, negative: bool| cost_on("value2", n, negative);
    // More than the burst never fits; under POST_PAID_CHARGES=auto such a cost may be a
    // stream-done charge, so it applies (1 in debt) and a 0-hit check is refused.
    assert_eq!(svc.json(&cost_on("big", 31, false)).status, 429);
    assert_eq!(svc.json(&cost_on("big", 0, false)).status, 429);
    assert_eq!(svc.json(&cost(30, false)).status, 200);
    assert_eq!(svc.json(&cost(1, false)).status, 429);
    // A negative addend gives 10 back: exactly 10 more fit.
    assert_eq!(svc.json(&cost(10, true)).status, 200);
    assert_eq!(svc.json(&cost(10, false)).status, 200);
    assert_eq!(svc.json(&cost(1, false)).status, 429);
    // Request-level hitsAddend applies to descriptors without their own.
    let req = json!({"domain": "parity", "hitsAddend": 2, "descriptors": [{"entries": [{"key": "key5", "value": "z"}]}]});
    assert_eq!(svc.json(&req.to_string()).status, 200);
    assert_eq!(svc.json(&one("parity", &[("key5", "z")])).status, 429);
    // Envoy's limit override wins over the config (key3 is 1/hour in the file).
    let with_override =
        json!({"domain": "parity", "descriptors": [{"entries": [{"key": "key3", "value": "o"}],
        "limit": {"requestsPerUnit": 2, "unit": "HOUR"}}]})
        .to_string();
    let body = svc.json(&with_override).json();
    assert_eq!(
        statuses(&body)[0]["currentLimit"]["requestsPerUnit"],
        json!(2)
    );
    assert_eq!(svc.json(&with_override).status, 200);
    assert_eq!(svc.json(&with_override).status, 429);
}

/// The module gets the configured limit's exact texts: 5 per minute is `5/60` (read back with
/// MONITOR), not the double 0.0833…, which left a fraction of a token in every state.
#[test]
fn five_per_minute_reaches_redis_as_5_per_60() {
    use std::io::{BufRead, BufReader, Write};
    let redis = common::Server::start();
    // What reaches Redis is the keys path's RL.ACQUIRE, whatever RL_BUCKET_STORAGE the
    // suite runs with.
    let svc = Service::start(
        &redis_url(redis.port),
        &[("parity.yaml", PARITY)],
        &[("RL_BUCKET_STORAGE", "keys")],
    );
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", redis.port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(b"MONITOR\r\n").unwrap();
    let mut monitor = BufReader::new(stream);
    let mut line = String::new();
    monitor.read_line(&mut line).unwrap();
    assert_eq!(line.trim_end(), "+OK");
    // `second` is 5 per minute in PARITY.
    assert_eq!(svc.json(&one("parity", &[("second", "u")])).status, 200);
    let acquire = loop {
        line.clear();
        assert!(monitor.read_line(&mut line).unwrap() > 0, "MONITOR closed");
        if line.contains("] \"RL.ACQUIRE") {
            break line.clone();
        }
    };
    assert!(
        acquire.trim_end().ends_with(r#""5/60" "5" "1""#),
        "{acquire}"
    );
}

#[test]
fn all_or_nothing_a_denied_request_takes_nothing() {
    let redis = common::Server::start();
    let svc = Service::start(&redis_url(redis.port), &[("parity.yaml", PARITY)], &[]);
    // key3 (1/hour) and key2 (20/minute) together.
    let pair = |user: &str| {
        json!({"domain": "parity", "descriptors": [
            {"entries": [{"key": "key3", "value": user}]},
            {"entries": [{"key": "key2", "value": "common"}]}]})
        .to_string()
    };
    assert_eq!(svc.json(&pair("u")).status, 200);
    // Denied by key3: key2's bucket must keep its 19.
    for _ in 0..5 {
        assert_eq!(svc.json(&pair("u")).status, 429);
    }
    let body = svc.json(&one("parity", &[("key2", "common")])).json();
    assert_eq!(statuses(&body)[0]["limitRemaining"], json!(18));
}

#[test]
fn bad_requests_are_refused_and_write_nothing() {
    let redis = common::Server::start();
    let svc = Service::start(&redis_url(redis.port), &[("parity.yaml", PARITY)], &[]);
    let many: Vec<Value> = (0..5000)
        .map(|i| json!({"entries": [{"key": "key2", "value": i.to_string()}]}))
        .collect();
    let bodies = vec![
        json!({"domain": "", "descriptors": [{"entries": [{"key": "key2", "value": "a"}]}]})
            .to_string(),
        json!({"domain": "parity", "descriptors": []}).to_string(),
        json!({"domain": "parity", "descriptors": many}).to_string(),
        json!({"domain": "parity", "descriptors": [{"entries": [{"key": "", "value": "a"}]}]})
            .to_string(),
        "{\"domain\": \"parity\", ".to_string(),
        "not json".to_string(),
    ];
    for body in &bodies {
        let reply = svc.json(body);
        assert_eq!(
            reply.status,
            400,
            "{}: {}",
            &body[..body.len().min(80)],
            reply.body
        );
    }
    // A cost above every capacity (a hits_addend a client's header may set) is over the
    // limit, not refused: a refused call is let through by Envoy's default.
    let huge_cost = json!({"domain": "parity", "descriptors": [{"entries": [{"key": "key2", "value": "a"}], "hitsAddend": u64::MAX.to_string()}]}).to_string();
    assert_eq!(svc.json(&huge_cost).status, 429);
    let mut con = redis.conn();
    let size: i64 = redis::cmd("DBSIZE").query(&mut con).unwrap();
    assert_eq!(size, 0, "a refused request wrote a key");
    // Still answering.
    assert_eq!(svc.json(&one("parity", &[("key2", "a")])).status, 200);
}

/// Bad config files, one case each: (file text, words of the problem).
const BAD_CONFIGS: &[(&str, &str)] = &[
    ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: decade, requests_per_unit: 1}\n", "invalid rate limit unit 'decade'"),
    ("domain: \"\"\ndescriptors: []\n", "empty domain"),
    ("domain: d\ndescriptors:\n  - key: \"\"\n    value: v\n", "descriptor has empty key"),
    ("domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n", "duplicate descriptor composite key 'd.k_v'"),
    ("domain: d\ndescriptors:\n  - key: k\n    rate_limits: {unit: second, requests_per_unit: 1}\n", "unknown key 'rate_limits'"),
    ("domain: d\ndescriptors:\n  - key: k\n    descriptors:\n      - just-a-string\n", "list of type other than map"),
    ("domain: d\ndescriptors:\n  - key: k\n    7: seven\n", "key is not of type string"),
    ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, name: a, replaces: [{name: \"\"}]}\n", "empty replaces entry"),
    ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, name: a, replaces: [{name: a}]}\n", "replaces should not contain name of same descriptor"),
    ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}\n", "should not specify rate limit unit when unlimited"),
    ("domain: d\ndescriptors:\n  - key: k\n   value: misaligned\n", "error loading config file"),
];

#[test]
fn each_bad_config_is_refused_at_startup_naming_file_and_problem() {
    for (text, words) in BAD_CONFIGS {
        // The config is read before Redis is reached, so no Redis is needed to refuse it.
        let result = Service::try_start("127.0.0.1:1", &[("bad.yaml", text)], &[]);
        let Err(log) = result else {
            panic!("accepted: {text}");
        };
        assert!(log.starts_with("exited exit status: 1"), "{log}");
        assert!(
            log.contains("bad.yaml") && log.contains(words),
            "{words}: {log}"
        );
    }
    // Two files with one domain.
    let dup = Service::try_start(
        "127.0.0.1:1",
        &[("a.yaml", "domain: same\n"), ("b.yaml", "domain: same\n")],
        &[],
    );
    let Err(log) = dup else {
        panic!("duplicate domain accepted")
    };
    assert!(
        log.contains("b.yaml") && log.contains("duplicate domain 'same'"),
        "{log}"
    );
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn reload_applies_good_files_and_keeps_the_old_config_on_bad_ones() {
    let redis = common::Server::start();
    let v1 = "domain: r\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";
    let v2 = "domain: r\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 7}\n";
    let svc = Service::start(&redis_url(redis.port), &[("r.yaml", v1)], &[]);
    let limit_of = |svc: &Service| {
        svc.json(&one("r", &[("k", "x")])).json()["statuses"][0]["currentLimit"]["requestsPerUnit"]
            .clone()
    };
    assert_eq!(limit_of(&svc), json!(5));
    let file = Service::config_dir(svc.root.path()).join("r.yaml");
    // A file change is picked up by itself.
    std::fs::write(&file, v2).unwrap();
    wait_for("the reload of v2", || limit_of(&svc) == json!(7));
    // A bad file is refused: the old config stays, a metric and a log line say so.
    std::fs::write(&file, "domain: r\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n").unwrap();
    wait_for("the refused reload", || {
        svc.metric("ratelimit_service_config_load_error") >= 1
    });
    assert_eq!(limit_of(&svc), json!(7));
    assert!(
        svc.log().contains("config reload refused") && svc.log().contains("fortnight"),
        "{}",
        svc.log()
    );
    // SIGHUP reloads too.
    std::fs::write(&file, v1).unwrap();
    let before = svc.metric("ratelimit_service_config_load_success");
    svc.signal("HUP");
    wait_for("the SIGHUP reload", || {
        svc.metric("ratelimit_service_config_load_success") > before && limit_of(&svc) == json!(5)
    });
}

#[test]
fn sigterm_drains_and_exits_cleanly() {
    let redis = common::Server::start();
    let mut svc = Service::start(&redis_url(redis.port), &[("parity.yaml", PARITY)], &[]);
    assert_eq!(svc.json(&one("parity", &[("key2", "a")])).status, 200);
    svc.signal("TERM");
    let status = svc.wait_exit().expect("exit status");
    assert!(status.success(), "{status}");
}

const POLICY: &str =
    "domain: p\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 2}\n";

#[test]
fn with_redis_killed_each_on_error_policy_does_what_it_says() {
    // (RL_ON_ERROR, HTTP status of each of three calls after the kill, the decisions'
    // source, the status of a refund (a negative hits_addend) after the kill)
    let cases = [
        // A refund fails like a take: the caller learns its tokens did not go back.
        ("error", [503, 503, 503], "error", 503),
        ("open", [200, 200, 200], "open", 200),
        // A refund limits nothing: it answers OK and gives nothing back.
        ("closed", [429, 429, 429], "closed", 200),
        // Local: a full in-process bucket of 2 (RL_INSTANCES=1).
        ("local", [200, 200, 429], "local", 200),
    ];
    let refund = json!({"domain": "p", "descriptors": [{"entries": [{"key": "k", "value": "b"}],
                        "hitsAddend": "1", "isNegativeHits": true}]})
    .to_string();
    for (policy, expected, source, refund_status) in cases {
        let mut redis = common::Server::start();
        let svc = Service::start(
            &redis_url(redis.port),
            &[("p.yaml", POLICY)],
            &[("RL_ON_ERROR", policy), ("RL_INSTANCES", "1")],
        );
        assert_eq!(svc.json(&one("p", &[("k", "a")])).status, 200, "{policy}");
        redis.kill();
        let got: Vec<u16> = (0..3)
            .map(|_| svc.json(&one("p", &[("k", "b")])).status)
            .collect();
        assert_eq!(got, expected, "{policy}: {}", svc.log());
        assert_eq!(
            svc.json(&refund).status,
            refund_status,
            "{policy} refund: {}",
            svc.log()
        );
        assert!(
            svc.metric(&format!(
                "redis_rl_envoy_decisions_total{{source=\"{source}\"}}"
            )) >= 1,
            "{policy}: {}",
            svc.metrics()
        );
    }
}

#[test]
fn plain_redis_without_the_module_runs_the_lua_fallback() {
    let redis = PlainRedis::start();
    // It reads the bucket at its key: the keys layout, whatever the suite runs with.
    let svc = Service::start(
        &redis_url(redis.port),
        &[("p.yaml", POLICY)],
        &[("RL_BUCKET_STORAGE", "keys")],
    );
    assert_eq!(svc.json(&one("p", &[("k", "a")])).status, 200);
    assert_eq!(svc.json(&one("p", &[("k", "a")])).status, 200);
    assert_eq!(svc.json(&one("p", &[("k", "a")])).status, 429);
    assert!(svc.metric(r#"redis_rl_envoy_decisions_total{source="lua"}"#) >= 3);
    let client = redis::Client::open(format!("redis://127.0.0.1:{}/", redis.port)).unwrap();
    let mut con = client.get_connection().unwrap();
    let kind: String = redis::cmd("TYPE").arg("p_k_a").query(&mut con).unwrap();
    assert_eq!(kind, "string", "the Lua script keeps one string per bucket");
    let stored: Vec<u8> = redis::cmd("GET").arg("p_k_a").query(&mut con).unwrap();
    assert_eq!((stored.len(), &stored[..2]), (26, &b"rl"[..]), "{stored:?}");
    // RL_WITHOUT_MODULE=refuse on a server without the module is a misconfiguration: the
    // service stops at startup, naming it, rather than failing every call.
    let refused = Service::try_start(
        &redis_url(redis.port),
        &[("p.yaml", POLICY)],
        &[("RL_WITHOUT_MODULE", "refuse")],
    );
    let Err(log) = refused else {
        panic!("started with RL_WITHOUT_MODULE=refuse on a server without the module");
    };
    assert!(log.starts_with("exited exit status: 1"), "{log}");
    assert!(
        log.contains("misconfigured") && log.contains("RL.ACQUIRE"),
        "{log}"
    );
}

#[test]
fn on_a_cluster_slots_are_taken_in_turn_and_refunded_on_denial() {
    let cluster = common::cluster::Cluster::start();
    let config = "domain: c\ndescriptors:\n  - key: one\n    rate_limit: {unit: hour, requests_per_unit: 1}\n  - key: five\n    rate_limit: {unit: hour, requests_per_unit: 5}\n";
    let svc = Service::on_cluster(&cluster, &[("c.yaml", config)]);
    // Pick values so that `five`'s bucket sits in a lower slot than `one`'s: the service
    // takes slots in order, so `five` is taken first and must be refunded when `one` denies.
    let one_key = "c_one_u";
    let one_slot = cluster.keyslot(one_key.as_bytes());
    let five_value = (0..1000)
        .map(|i| format!("v{i}"))
        .find(|v| cluster.keyslot(format!("c_five_{v}").as_bytes()) < one_slot)
        .expect("a lower slot");
    let pair = json!({"domain": "c", "descriptors": [
        {"entries": [{"key": "one", "value": "u"}]},
        {"entries": [{"key": "five", "value": five_value}]}]})
    .to_string();
    assert_eq!(svc.json(&pair).status, 200, "{}", svc.log());
    for _ in 0..3 {
        assert_eq!(svc.json(&pair).status, 429);
    }
    // `five` lost only the one token of the allowed call: 4 remain, then none.
    for i in 0..4 {
        assert_eq!(
            svc.json(&one("c", &[("five", &five_value)])).status,
            200,
            "call {i}"
        );
    }
    assert_eq!(svc.json(&one("c", &[("five", &five_value)])).status, 429);
}

#[test]
fn grpc_answers_and_refuses_bad_input_with_invalid_argument() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

    let redis = common::Server::start();
    let svc = Service::start(&redis_url(redis.port), &[("p.yaml", POLICY)], &[]);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut client =
            RateLimitServiceClient::connect(format!("http://127.0.0.1:{}", svc.grpc_port))
                .await
                .unwrap();
        let request = |domain: &str, key: &str| RateLimitRequest {
            domain: domain.into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: key.into(),
                    value: "g".into(),
                }],
                ..Default::default()
            }],
            hits_addend: 0,
        };
        // 2 per hour over gRPC: OK, OK, OVER_LIMIT (codes 1 and 2).
        let codes: Vec<i32> = {
            let mut codes = Vec::new();
            for _ in 0..3 {
                let r = client.should_rate_limit(request("p", "k")).await.unwrap();
                codes.push(r.into_inner().overall_code);
            }
            codes
        };
        assert_eq!(codes, [1, 1, 2]);
        for bad in [
            request("", "k"),
            request("p", ""),
            RateLimitRequest {
                domain: "p".into(),
                ..Default::default()
            },
        ] {
            let status = client.should_rate_limit(bad).await.unwrap_err();
            assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        }
    });
}

/// The Go service's example config, in our own words: nested limits, a ban
/// (`requests_per_unit: 0`), `unlimited`, `shadow_mode`, and the newer `quota_mode` and
/// `metadata`.
const PEER_EXAMPLE: &str = "
---
domain: rl
descriptors:
  - key: source_cluster
    value: proxy
    descriptors:
      - key: destination_cluster
        value: mock
        rate_limit: {unit: minute, requests_per_unit: 1}
  - key: foo
    rate_limit: {unit: minute, requests_per_unit: 2}
    descriptors:
      - key: bar
        rate_limit: {unit: minute, requests_per_unit: 3}
      - key: bar
        value: banned
        rate_limit: {unit: minute, requests_per_unit: 0}
      - key: bay
        rate_limit: {unlimited: true}
      - key: baz
        value: shady
        shadow_mode: true
        rate_limit: {unit: minute, requests_per_unit: 1}
  - key: service
    value: service_1
    quota_mode: true
    metadata:
      name: service_1
      service_with_quota: {name: service_1}
    rate_limit: {unit: minute, requests_per_unit: 1}
";

#[test]
fn the_peer_example_loads_and_a_zero_limit_bans_without_redis() {
    let redis = common::Server::start();
    let svc = Service::start(
        &redis_url(redis.port),
        &[("example.yaml", PEER_EXAMPLE)],
        &[],
    );
    let banned = [("foo", "x"), ("bar", "banned")];
    for _ in 0..3 {
        let reply = svc.json(&one("rl", &banned));
        assert_eq!(reply.status, 429, "{}", reply.body);
        let status = &statuses(&reply.json())[0];
        assert_eq!(status["code"], "OVER_LIMIT");
        // requestsPerUnit 0, left out as a default too.
        assert_eq!(status["currentLimit"]["unit"], "MINUTE");
        assert!(
            status["currentLimit"].get("requestsPerUnit").is_none(),
            "{status}"
        );
        // limitRemaining 0 is the proto3 default, which protojson leaves out.
        assert!(status.get("limitRemaining").is_none(), "{status}");
        assert_eq!(status["durationUntilReset"], "60s");
    }
    assert_eq!(
        svc.metric(
            r#"ratelimit_service_rate_limit_over_limit{domain="rl",key1="foo",key2="bar_banned"}"#
        ),
        3,
        "{}",
        svc.metrics()
    );
    assert_eq!(
        svc.metric(
            r#"ratelimit_service_rate_limit_total_hits{domain="rl",key1="foo",key2="bar_banned"}"#
        ),
        3
    );
    // The ban denies the whole request, and all or nothing takes nothing else: `bar`'s own
    // bucket (3/minute) still holds 3, and reports it.
    let pair = json!({"domain": "rl", "descriptors": [
        {"entries": [{"key": "foo", "value": "x"}, {"key": "bar", "value": "banned"}]},
        {"entries": [{"key": "foo", "value": "x"}, {"key": "bar", "value": "y"}]}]})
    .to_string();
    let reply = svc.json(&pair);
    assert_eq!(reply.status, 429);
    let s = statuses(&reply.json());
    assert_eq!(s[1]["code"], "OK", "{s:?}");
    assert_eq!(s[1]["limitRemaining"], json!(3), "{s:?}");
    for _ in 0..3 {
        assert_eq!(
            svc.json(&one("rl", &[("foo", "x"), ("bar", "y")])).status,
            200
        );
    }
    assert_eq!(
        svc.json(&one("rl", &[("foo", "x"), ("bar", "y")])).status,
        429
    );
    // The rest of the example answers as configured.
    assert_eq!(
        svc.json(&one("rl", &[("foo", "x"), ("bay", "z")])).status,
        200
    );
    assert_eq!(
        svc.json(&one("rl", &[("service", "service_1")])).status,
        200
    );
    assert_eq!(
        svc.json(&one("rl", &[("service", "service_1")])).status,
        429
    );
    // Nothing was written for the ban.
    let mut con = redis.conn();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut con).unwrap();
    assert!(keys.iter().all(|k| !k.contains("banned")), "{keys:?}");
}

#[test]
fn merge_domain_config_merges_the_files_of_a_domain() {
    let redis = common::Server::start();
    let a = "domain: m\ndescriptors:\n  - key: k1\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
    let b = "domain: m\ndescriptors:\n  - key: k2\n    rate_limit: {unit: hour, requests_per_unit: 2}\n";
    let svc = Service::start(
        &redis_url(redis.port),
        &[("a.yaml", a), ("b.yaml", b)],
        &[("MERGE_DOMAIN_CONFIG", "true")],
    );
    let limit = |k: &str| {
        svc.json(&one("m", &[(k, "u")])).json()["statuses"][0]["currentLimit"]["requestsPerUnit"]
            .clone()
    };
    assert_eq!(limit("k1"), json!(1));
    assert_eq!(limit("k2"), json!(2));
    // Without it, the Go service's refusal.
    let Err(log) = Service::try_start("127.0.0.1:1", &[("a.yaml", a), ("b.yaml", b)], &[]) else {
        panic!("duplicate domain accepted without MERGE_DOMAIN_CONFIG");
    };
    assert!(log.contains("duplicate domain 'm'"), "{log}");
}

#[test]
fn a_wildcard_anywhere_in_a_value_limits() {
    let redis = common::Server::start();
    let config = "domain: w\ndescriptors:\n  - key: path\n    value: /api*v1\n    rate_limit: {unit: hour, requests_per_unit: 2}\n  - key: path\n    value: foo*bar*baz\n    share_threshold: true\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
    let svc = Service::start(&redis_url(redis.port), &[("w.yaml", config)], &[]);
    for _ in 0..2 {
        assert_eq!(
            svc.json(&one("w", &[("path", "/api/users/v1")])).status,
            200
        );
    }
    assert_eq!(
        svc.json(&one("w", &[("path", "/api/users/v1")])).status,
        429
    );
    // Each value its own bucket without share_threshold.
    assert_eq!(
        svc.json(&one("w", &[("path", "/api/orders/v1")])).status,
        200
    );
    // share_threshold: every match shares the pattern's bucket.
    assert_eq!(
        svc.json(&one("w", &[("path", "foo-1-bar-baz")])).status,
        200
    );
    assert_eq!(svc.json(&one("w", &[("path", "foobar-2-baz")])).status, 429);
    // No match: no limit.
    let body = svc.json(&one("w", &[("path", "/api/users/v2")])).json();
    assert!(statuses(&body)[0].get("currentLimit").is_none(), "{body}");
}

/// Values Envoy may send from a client's headers: long, and any characters.
fn awkward_values() -> Vec<String> {
    vec![
        "x".repeat(1100),
        "y".repeat(200_000),
        format!("{}_{{tag}}%5F\u{0}\r\n\u{7f}é漢字🙂", "z".repeat(1500)),
        "\u{0}\u{1}\t \"'\\".to_string(),
    ]
}

#[test]
fn values_of_any_length_and_characters_are_limited_over_json_and_grpc() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

    let redis = common::Server::start();
    let config = "domain: h\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 2}\n";
    let svc = Service::start(&redis_url(redis.port), &[("h.yaml", config)], &[]);
    for value in awkward_values() {
        let body = one("h", &[("user", &value)]);
        let got: Vec<u16> = (0..3).map(|_| svc.json(&body).status).collect();
        assert_eq!(got, [200, 200, 429], "a {}-byte value", value.len());
    }
    // Two long values that differ only in their last byte are two buckets.
    let (a, b) = ("q".repeat(5000) + "a", "q".repeat(5000) + "b");
    for v in [&a, &a] {
        assert_eq!(svc.json(&one("h", &[("user", v)])).status, 200);
    }
    assert_eq!(svc.json(&one("h", &[("user", &b)])).status, 200);
    // No key is longer than the plain limit and its marker and digest.
    let mut con = redis.conn();
    let keys: Vec<Vec<u8>> = redis::cmd("KEYS").arg("*").query(&mut con).unwrap();
    assert!(
        keys.iter().all(|k| k.len() <= 1024),
        "{:?}",
        keys.iter().map(Vec::len).collect::<Vec<_>>()
    );
    // The same through gRPC, with a 300 kB value.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut client =
            RateLimitServiceClient::connect(format!("http://127.0.0.1:{}", svc.grpc_port))
                .await
                .unwrap();
        let request = RateLimitRequest {
            domain: "h".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "user".into(),
                    value: "g\u{0}".repeat(150_000),
                }],
                ..Default::default()
            }],
            hits_addend: 0,
        };
        let mut codes = Vec::new();
        for _ in 0..3 {
            let r = client.should_rate_limit(request.clone()).await.unwrap();
            codes.push(r.into_inner().overall_code);
        }
        assert_eq!(codes, [1, 1, 2]);
    });
}

#[test]
fn a_denied_request_reports_each_bucket_as_it_is() {
    let redis = common::Server::start();
    let svc = Service::start(&redis_url(redis.port), &[("parity.yaml", PARITY)], &[]);
    // key3 (1/hour) and key2 (20/minute) together; the second call is denied by key3.
    let pair = json!({"domain": "parity", "descriptors": [
        {"entries": [{"key": "key3", "value": "u"}]},
        {"entries": [{"key": "key2", "value": "t"}]}]})
    .to_string();
    assert_eq!(svc.json(&pair).status, 200);
    let reply = svc.json(&pair);
    assert_eq!(reply.status, 429);
    let s = statuses(&reply.json());
    assert_eq!(s[0]["code"], "OVER_LIMIT");
    // key2 was not charged: it still holds 19 of 20, and says so, with its own reset.
    assert_eq!(s[1]["code"], "OK", "{s:?}");
    assert_eq!(s[1]["limitRemaining"], json!(19), "{s:?}");
    let reset: f64 = s[1]["durationUntilReset"]
        .as_str()
        .unwrap()
        .trim_end_matches('s')
        .parse()
        .unwrap();
    assert!(
        reset <= 3.0,
        "one token of 20/minute is back in 3 s: {reset}"
    );
    // Metrics as the Go service counts them: key2 within its limit both times, key3 over
    // once.
    let labels = |k: &str| format!(r#"{{domain="parity",key1="{k}",key2=""}}"#);
    assert_eq!(
        svc.metric(&format!(
            "ratelimit_service_rate_limit_within_limit{}",
            labels("key2")
        )),
        2
    );
    assert_eq!(
        svc.metric(&format!(
            "ratelimit_service_rate_limit_over_limit{}",
            labels("key3")
        )),
        1
    );
    assert_eq!(
        svc.metric(&format!(
            "ratelimit_service_rate_limit_within_limit{}",
            labels("key3")
        )),
        1
    );
}

#[test]
fn runtime_dotfiles_are_read_or_ignored_as_the_go_loader_does_and_reload_works() {
    // A Kubernetes ConfigMap volume: the files are symlinks into `..data`, itself a symlink
    // to a dated dot-directory that holds the same files.
    let layout = || {
        let root = tempfile::tempdir().unwrap();
        let config = root.path().join("config");
        let dated = config.join("..2026_12_02_00_00_00.0001");
        std::fs::create_dir_all(&dated).unwrap();
        std::fs::write(
            dated.join("k.yaml"),
            "domain: k\ndescriptors:\n  - key: u\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
        )
        .unwrap();
        std::os::unix::fs::symlink("..2026_12_02_00_00_00.0001", config.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/k.yaml", config.join("k.yaml")).unwrap();
        root
    };
    // Dotfiles read (the Go service's default): the dated copy is a second file of domain
    // `k`, refused.
    let Err(log) = Service::try_start_in(layout(), "127.0.0.1:1", &[]) else {
        panic!("the dated copy was not read");
    };
    assert!(log.contains("duplicate domain 'k'"), "{log}");
    // RUNTIME_IGNOREDOTFILES: only config/k.yaml.
    let redis = common::Server::start();
    let svc = Service::try_start_in(
        layout(),
        &redis_url(redis.port),
        &[("RUNTIME_IGNOREDOTFILES", "true")],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(svc.json(&one("k", &[("u", "a")])).status, 200);
    assert_eq!(svc.json(&one("k", &[("u", "a")])).status, 429);
    // A file in a subdirectory is a runtime file too, and is picked up on change.
    let sub = Service::config_dir(svc.root.path()).join("more");
    std::fs::create_dir_all(&sub).unwrap();
    std::fs::write(
        sub.join("n.conf"),
        "domain: n\ndescriptors:\n  - key: u\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
    )
    .unwrap();
    wait_for("the new domain", || {
        svc.json(&one("n", &[("u", "a")])).json()["statuses"][0]
            .get("currentLimit")
            .is_some()
    });
}

/// `RateLimitRequest` with bytes where the proto has strings, to send what Envoy sends for a
/// header that is not UTF-8.
#[derive(Clone, PartialEq, prost::Message)]
struct RawRequest {
    #[prost(bytes = "vec", tag = "1")]
    domain: Vec<u8>,
    #[prost(message, repeated, tag = "2")]
    descriptors: Vec<RawDescriptor>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RawDescriptor {
    #[prost(message, repeated, tag = "1")]
    entries: Vec<RawEntry>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RawEntry {
    #[prost(bytes = "vec", tag = "1")]
    key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

#[test]
fn a_value_that_is_not_utf8_is_limited_over_grpc() {
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
    let redis = common::Server::start();
    let config = "domain: h\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 2}\n";
    let svc = Service::start(&redis_url(redis.port), &[("h.yaml", config)], &[]);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let channel =
            tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{}", svc.grpc_port))
                .unwrap()
                .connect()
                .await
                .unwrap();
        let grpc = tonic::client::Grpc::new(channel);
        let call = |value: &[u8]| {
            let request = RawRequest {
                domain: b"h".to_vec(),
                descriptors: vec![RawDescriptor {
                    entries: vec![RawEntry {
                        key: b"user".to_vec(),
                        value: value.to_vec(),
                    }],
                }],
            };
            let mut grpc = grpc.clone();
            async move {
                grpc.ready().await.unwrap();
                let codec = tonic_prost::ProstCodec::<RawRequest, RateLimitResponse>::default();
                let path = tonic::codegen::http::uri::PathAndQuery::from_static(
                    "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
                );
                grpc.unary(tonic::Request::new(request), path, codec)
                    .await
                    .map(|r| r.into_inner().overall_code)
                    .map_err(|s| s.code())
            }
        };
        // Latin-1 bytes, as an HTTP/1 header may carry them: OK, OK, OVER_LIMIT.
        let mut got = Vec::new();
        for _ in 0..3 {
            got.push(call(b"caf\xe9").await);
        }
        assert_eq!(got, [Ok(1), Ok(1), Ok(2)]);
        // Another byte is another bucket.
        assert_eq!(call(b"caf\xe8").await, Ok(1));
    });
}

/// One gRPC `ShouldRateLimit` call in `domain`, one descriptor per entry list, as Envoy makes
/// it: the tests below repeat `/json` tests over gRPC, the path Envoy takes.
fn grpc_call(
    svc: &Service,
    domain: &str,
    descriptors: &[&[(&str, &str)]],
) -> envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

    let request = RateLimitRequest {
        domain: domain.into(),
        descriptors: descriptors
            .iter()
            .map(|entries| RateLimitDescriptor {
                entries: entries
                    .iter()
                    .map(|(key, value)| Entry {
                        key: (*key).into(),
                        value: (*value).into(),
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        hits_addend: 0,
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut client =
            RateLimitServiceClient::connect(format!("http://127.0.0.1:{}", svc.grpc_port))
                .await
                .unwrap();
        client
            .should_rate_limit(request)
            .await
            .unwrap()
            .into_inner()
    })
}

/// gRPC's `Code`: 1 OK, 2 OVER_LIMIT.
const GRPC_OK: i32 = 1;
const GRPC_OVER_LIMIT: i32 = 2;

#[test]
fn a_wildcard_anywhere_in_a_value_limits_over_grpc() {
    let redis = common::Server::start();
    let config = "domain: w\ndescriptors:\n  - key: path\n    value: /api*v1\n    rate_limit: {unit: hour, requests_per_unit: 2}\n  - key: path\n    value: foo*bar*baz\n    share_threshold: true\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
    let svc = Service::start(&redis_url(redis.port), &[("w.yaml", config)], &[]);
    let code = |value: &str| grpc_call(&svc, "w", &[&[("path", value)]]).overall_code;
    let got: Vec<i32> = (0..3).map(|_| code("/api/users/v1")).collect();
    assert_eq!(got, [GRPC_OK, GRPC_OK, GRPC_OVER_LIMIT]);
    // Each value its own bucket without share_threshold.
    assert_eq!(code("/api/orders/v1"), GRPC_OK);
    // share_threshold: every match shares the pattern's bucket.
    assert_eq!(code("foo-1-bar-baz"), GRPC_OK);
    assert_eq!(code("foobar-2-baz"), GRPC_OVER_LIMIT);
    // No match: no limit.
    let reply = grpc_call(&svc, "w", &[&[("path", "/api/users/v2")]]);
    assert_eq!(reply.overall_code, GRPC_OK);
    assert!(reply.statuses[0].current_limit.is_none(), "{reply:?}");
}

#[test]
fn a_denied_request_reports_each_bucket_as_it_is_over_grpc() {
    let redis = common::Server::start();
    let svc = Service::start(&redis_url(redis.port), &[("parity.yaml", PARITY)], &[]);
    // key3 (1/hour) and key2 (20/minute) together; the second call is denied by key3.
    let pair: [&[(&str, &str)]; 2] = [&[("key3", "u")], &[("key2", "t")]];
    assert_eq!(grpc_call(&svc, "parity", &pair).overall_code, GRPC_OK);
    let reply = grpc_call(&svc, "parity", &pair);
    assert_eq!(reply.overall_code, GRPC_OVER_LIMIT);
    let s = &reply.statuses;
    assert_eq!(s[0].code, GRPC_OVER_LIMIT, "{reply:?}");
    // key2 was not charged: it still holds 19 of 20, and says so, with its own reset.
    assert_eq!(s[1].code, GRPC_OK, "{reply:?}");
    assert_eq!(s[1].limit_remaining, 19, "{reply:?}");
    let reset = s[1].duration_until_reset.unwrap();
    assert!(
        (reset.seconds, reset.nanos) <= (3, 0),
        "one token of 20/minute is back in 3 s: {reset:?}"
    );
    // key3's own bucket is empty: 0 left, a full token (3600 s) to wait at most.
    assert_eq!(s[0].limit_remaining, 0, "{reply:?}");
    let reset = s[0].duration_until_reset.unwrap();
    assert!((1..=3600).contains(&reset.seconds), "{reset:?}");
}

#[test]
fn a_zero_limit_bans_over_grpc_without_redis() {
    let redis = common::Server::start();
    let svc = Service::start(
        &redis_url(redis.port),
        &[("example.yaml", PEER_EXAMPLE)],
        &[],
    );
    let banned: &[(&str, &str)] = &[("foo", "x"), ("bar", "banned")];
    for _ in 0..3 {
        let reply = grpc_call(&svc, "rl", &[banned]);
        assert_eq!(reply.overall_code, GRPC_OVER_LIMIT, "{reply:?}");
        let status = &reply.statuses[0];
        assert_eq!(status.code, GRPC_OVER_LIMIT);
        let limit = status.current_limit.clone().unwrap();
        assert_eq!(limit.requests_per_unit, 0);
        // RateLimit.Unit: 2 is MINUTE.
        assert_eq!(limit.unit, 2, "{limit:?}");
        assert_eq!(status.limit_remaining, 0);
        // No window to end: the whole period.
        assert_eq!(status.duration_until_reset.unwrap().seconds, 60);
    }
    assert_eq!(
        svc.metric(
            r#"ratelimit_service_rate_limit_over_limit{domain="rl",key1="foo",key2="bar_banned"}"#
        ),
        3,
        "{}",
        svc.metrics()
    );
    // A request holding the ban takes nothing from its other descriptor.
    let reply = grpc_call(&svc, "rl", &[banned, &[("foo", "x"), ("bar", "y")]]);
    assert_eq!(reply.overall_code, GRPC_OVER_LIMIT);
    assert_eq!(reply.statuses[1].limit_remaining, 3, "{reply:?}");
    // Nothing was written for the ban.
    let mut con = redis.conn();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut con).unwrap();
    assert!(keys.iter().all(|k| !k.contains("banned")), "{keys:?}");
}

#[test]
fn json_logs_carry_the_peers_field_names_and_the_outage_says_unavailable() {
    // LOG_FORMAT=json: each line is one JSON object with logrus's JSONFormatter names, as
    // envoyproxy/ratelimit writes them (`@message`, `@timestamp`, `level: warning`). With
    // Redis killed under RL_ON_ERROR=error, the outage line says the calls answer
    // UNAVAILABLE, which is what they get, not the client library's own policy.
    let mut redis = common::Server::start();
    let svc = Service::start(
        &redis_url(redis.port),
        &[("p.yaml", POLICY)],
        &[("LOG_FORMAT", "json"), ("RL_TIMEOUT_MS", "300")],
    );
    assert_eq!(svc.json(&one("p", &[("k", "a")])).status, 200);
    redis.kill();
    assert_eq!(svc.json(&one("p", &[("k", "a")])).status, 503);
    let log = svc.log();
    let lines: Vec<Value> = log
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(!lines.is_empty(), "{log}");
    for l in &lines {
        assert!(l["@message"].is_string(), "{l}");
        assert!(
            l["@timestamp"].as_str().is_some_and(|t| t.ends_with('Z')),
            "{l}"
        );
        assert!(
            ["trace", "debug", "info", "warning", "error"]
                .contains(&l["level"].as_str().unwrap_or("")),
            "{l}"
        );
    }
    let outage = lines
        .iter()
        .find(|l| {
            l["@message"]
                .as_str()
                .is_some_and(|m| m.contains("Redis cannot decide"))
        })
        .unwrap_or_else(|| panic!("no outage line: {log}"));
    assert_eq!(outage["level"], "warning", "{outage}");
    let message = outage["@message"].as_str().unwrap_or("");
    assert!(message.contains("UNAVAILABLE"), "{message}");
    assert!(!message.contains("on_error=Closed"), "{message}");
}

#[test]
fn only_a_real_change_to_a_file_the_runtime_reads_reloads_and_a_burst_is_one_reload() {
    let redis = common::Server::start();
    let v1 = "domain: r\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";
    let v2 = "domain: r\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 7}\n";
    // The peer's default, RUNTIME_WATCH_ROOT=true: the whole runtime root is watched, so a
    // file written anywhere under it is an event; dotfiles are not read.
    let svc = Service::start(
        &redis_url(redis.port),
        &[("r.yaml", v1)],
        &[
            ("RUNTIME_WATCH_ROOT", "true"),
            ("RUNTIME_IGNOREDOTFILES", "true"),
        ],
    );
    let reloads = || svc.metric("ratelimit_service_config_load_success");
    // A reload that read the swap file would fail (a second domain `r…` of other bytes).
    let failed = || svc.metric("ratelimit_service_config_load_error");
    let at_start = reloads();
    // Files the runtime does not read, written 40 times over a second: a log file under
    // RUNTIME_ROOT (its path does not start with `config.`) and an editor's swap file, a
    // dotfile, beside the rules; and the config file rewritten with the same bytes. No
    // reload.
    let log = svc.root.path().join("access.log");
    let file = Service::config_dir(svc.root.path()).join("r.yaml");
    let swap = Service::config_dir(svc.root.path()).join(".r.yaml.swp");
    for i in 0..40 {
        std::fs::write(&log, format!("line {i}\n")).unwrap();
        std::fs::write(&swap, format!("domain: r{i}\n")).unwrap();
        if i % 10 == 0 {
            std::fs::write(&file, v1).unwrap();
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    // Longer than the debounce and the one-second poll.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(reloads(), at_start, "{}", svc.log());
    assert_eq!(failed(), 0, "{}", svc.log());
    // A burst of writes ending in a real change: one reload.
    for text in [v2, v1, v2] {
        std::fs::write(&file, text).unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    wait_for("the reload of v2", || reloads() > at_start);
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(reloads(), at_start + 1, "{}", svc.log());
}

#[test]
fn reset_times_are_exact_at_a_rate_that_is_no_whole_number_of_seconds() {
    // 7 an hour is a token each 3600/7 = 514.29 s, reported rounded up: 515. An allowed
    // request's reset is when the bucket is whole again (one token after the first take,
    // the whole hour after the seventh); the refused eighth's is when it could pass, one
    // token, not the hour until full.
    let redis = common::Server::start();
    let rules =
        "domain: n\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 7}\n";
    let svc = Service::start(&redis_url(redis.port), &[("n.yaml", rules)], &[]);
    let reset_s = |r: &Reply| -> u64 {
        let text = statuses(&r.json())[0]["durationUntilReset"]
            .as_str()
            .unwrap_or_else(|| panic!("{}", r.body))
            .to_string();
        text.trim_end_matches('s')
            .parse()
            .unwrap_or_else(|_| panic!("{text}"))
    };
    let call = || svc.json(&one("n", &[("k", "a")]));
    let first = call();
    assert_eq!(first.status, 200);
    assert_eq!(reset_s(&first), 515, "{}", first.body);
    for _ in 0..5 {
        assert_eq!(call().status, 200);
    }
    let seventh = call();
    assert_eq!(seventh.status, 200);
    // 7 tokens of 514.2857 s, less the few ms since the first.
    assert!(
        (3599..=3600).contains(&reset_s(&seventh)),
        "{}",
        seventh.body
    );
    let denied = call();
    assert_eq!(denied.status, 429);
    assert!((514..=515).contains(&reset_s(&denied)), "{}", denied.body);
}
