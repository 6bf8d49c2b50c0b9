//! envoyproxy/ratelimit's integration scenarios, written again for this service, behind a
//! real Envoy 1.40: simple get, trigger the limit, shadow mode, replaces, value in the stats
//! key when unspecified, quota, token quota and multi-service token quota; then an LLM's
//! tokens per minute, and stream-done charges on plain (under each `POST_PAID_CHARGES`),
//! `post_paid` and `GLOBAL_QUOTA_MODE` limits. Each test states
//! the peer script's expected outcome and checks it here; where a token bucket times a
//! refill differently from the peer's fixed window, the comment says so (and
//! docs/envoy.md's migration table lists it).
//!
//! The stack: Redis with the module, the service (`RESPONSE_DYNAMIC_METADATA=true`), and
//! Envoy with the `ratelimit` filter, a Lua filter that routes by the service's dynamic
//! metadata (the multi-service scenario), and upstreams that report the tokens each answer
//! used in `x-tokens-used`, which Envoy's `apply_on_stream_done` actions charge.
//!
//! Time: limits are per minute, as the peer's; a test only waits for a refill where the
//! peer's script does, and then it polls within a deadline rather than asserting a
//! duration. A charge on stream done is sent by Envoy after the answer, so a test waits for
//! the service to have counted it before the next request.

#![cfg(test)]

use rl_testkit as common;
mod support;

use std::io::{BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use support::{header_value, read_request_head, Envoy, Service};

const LIMITS: &str = "
domain: edge
descriptors:
  # simple get, trigger the limit, shadow mode: (foo: any) then a second key.
  - key: foo
    descriptors:
      - key: baz
        value: not-so-shady
        rate_limit: {unit: minute, requests_per_unit: 3}
      - key: baz
        value: shady
        shadow_mode: true
        rate_limit: {unit: minute, requests_per_unit: 3}
  # value in the stats key when unspecified.
  - key: unspec
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  # quota: both services in quota mode, charged 1 each on the request path.
  - key: quota_service
    value: service_1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: quota_service
    value: service_2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  # token quota: checked with 0 hits on the request path; service_2's quota is charged
  # what the answer used on stream done. service_1 is a plain limit a 0-hit check never
  # exhausts, so service_2's quota alone decides.
  - key: token_service
    value: service_1
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: token_service
    value: service_2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  # multi-service token quota: the service with quota left names the backend.
  - key: multi_service
    value: service_1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
    metadata: {backend: service_1}
  - key: multi_service
    value: service_2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
    metadata: {backend: service_2}
  # An LLM's tokens per minute: 10, charged what each answer used.
  - key: llm_user
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 10}
  # The same charges on a plain limit, and on a post-paid plain limit.
  - key: plain_user
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: paid_user
    rate_limit: {unit: minute, requests_per_unit: 10, post_paid: true}
";

/// quota.sh's and multiservice-tokenquota.sh's limits with a 10 s period in place of the
/// peer's minute (`unit_multiplier: 10` seconds), so that the scripts' last step, after
/// their `sleep 60`, runs after a 10 s wait. The counts within a period are the peer's.
const QUOTAS_PER_10_S: &str = "
domain: edge
descriptors:
  - key: quota_service
    value: service_1
    quota_mode: true
    rate_limit: {unit: second, unit_multiplier: 10, requests_per_unit: 1}
  - key: quota_service
    value: service_2
    quota_mode: true
    rate_limit: {unit: second, unit_multiplier: 10, requests_per_unit: 2}
  - key: multi_service
    value: service_1
    quota_mode: true
    rate_limit: {unit: second, unit_multiplier: 10, requests_per_unit: 1}
    metadata: {backend: service_1}
  - key: multi_service
    value: service_2
    quota_mode: true
    rate_limit: {unit: second, unit_multiplier: 10, requests_per_unit: 2}
    metadata: {backend: service_2}
";

/// The 10 s period of `QUOTAS_PER_10_S`.
const QUOTA_PERIOD: Duration = Duration::from_secs(10);

/// replaces.sh's limits, on their own: `requests_per_unit: 0` (the peer's ban).
const REPLACES: &str = "
domain: edge
descriptors:
  - key: foo
    descriptors:
      - key: bar
        value: banned
        rate_limit: {unit: minute, requests_per_unit: 0, name: banned_limit}
      - key: bar
        value: bkthomps
        rate_limit: {unit: minute, requests_per_unit: 1, name: bkthomps}
  - key: source_cluster
    value: proxy
    descriptors:
      - key: destination_cluster
        value: override
        rate_limit: {unit: minute, requests_per_unit: 2, replaces: [{name: banned_limit}]}
      - key: destination_cluster
        value: bkthomps
        rate_limit: {unit: minute, requests_per_unit: 2, replaces: [{name: bkthomps}]}
      - key: destination_cluster
        value: fake
        rate_limit: {unit: minute, requests_per_unit: 2, name: fake_name}
  - key: category
    value: account
    rate_limit:
      unit: minute
      requests_per_unit: 4
      replaces: [{name: bkthomps}, {name: fake_name}]
";

/// Envoy's request-header action for header `h` as descriptor key `h`.
fn header(h: &str) -> String {
    format!("{{request_headers: {{header_name: {h}, descriptor_key: {h}}}}}")
}

/// Envoy's generic-key action: descriptor `key` = `value`.
fn generic(key: &str, value: &str) -> String {
    format!("{{generic_key: {{descriptor_key: {key}, descriptor_value: {value}}}}}")
}

/// The per-route config of Envoy's filter: request-path actions with `hits_addend`, and a
/// stream-done action (`on_done`) that charges what the answer used (`x-tokens-used`).
fn per_route(request_path: &[(&str, &str, u64)], on_done: Option<String>) -> String {
    let mut limits = String::new();
    for (key, value, hits) in request_path {
        limits.push_str(&format!(
            "                    - actions: [{{generic_key: {{descriptor_key: {key}, descriptor_value: {value}}}}}]\n                      hits_addend: {{number: {hits}}}\n"
        ));
    }
    if let Some(action) = on_done {
        limits.push_str(&format!(
            "                    - actions: [{action}]\n                      hits_addend: {{format: \"%RESP(x-tokens-used)%\"}}\n                      apply_on_stream_done: true\n"
        ));
    }
    format!(
        "                typed_per_filter_config:\n                  envoy.filters.http.ratelimit:\n                    \"@type\": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute\n                    rate_limits:\n{limits}"
    )
}

fn routes() -> String {
    let mut r = String::new();
    // The peer's /twoheader, /fourheader, /fiveheader and /unspec: request-header actions.
    let twoheader = format!(
        "                  - actions: [{foo}, {bar}]\n                  - actions: [{foo}, {baz}]\n",
        foo = header("foo"),
        bar = header("bar"),
        baz = header("baz")
    );
    let cluster_pair = format!(
        "                  - actions: [{}, {}]\n",
        header("source_cluster"),
        header("destination_cluster")
    );
    let category = format!("                  - actions: [{}]\n", header("category"));
    for (path, limits) in [
        ("/twoheader", twoheader.clone()),
        ("/fourheader", format!("{twoheader}{cluster_pair}")),
        (
            "/fiveheader",
            format!("{twoheader}{cluster_pair}{category}"),
        ),
        (
            "/unspec",
            format!("                  - actions: [{}]\n", header("unspec")),
        ),
    ] {
        r.push_str(&format!(
            "              - match: {{prefix: \"{path}\"}}\n                route:\n                  cluster: upstream\n                  rate_limits:\n{limits}"
        ));
    }
    // Quota: both services charged 1 on the request path.
    r.push_str(
        "              - match: {prefix: \"/quota\"}\n                route: {cluster: upstream}\n",
    );
    r.push_str(&per_route(
        &[
            ("quota_service", "service_1", 1),
            ("quota_service", "service_2", 1),
        ],
        None,
    ));
    // Token quota: 0-hit checks, then service_2 charged what the answer used.
    r.push_str(
        "              - match: {prefix: \"/tokenquota\"}\n                route: {cluster: upstream}\n",
    );
    r.push_str(&per_route(
        &[
            ("token_service", "service_1", 0),
            ("token_service", "service_2", 0),
        ],
        Some(generic("token_service", "service_2")),
    ));
    // An LLM user's tokens per minute.
    r.push_str(
        "              - match: {prefix: \"/llm\"}\n                route: {cluster: upstream}\n",
    );
    r.push_str(&per_route(
        &[("llm_user", "alice", 0)],
        Some(generic("llm_user", "alice")),
    ));
    for key in ["plain_user", "paid_user"] {
        r.push_str(&format!(
            "              - match: {{prefix: \"/{key}\"}}\n                route: {{cluster: upstream}}\n"
        ));
        r.push_str(&per_route(
            &[(key, "alice", 0)],
            Some(generic(key, "alice")),
        ));
    }
    // Multi-service: the Lua filter sets x-backend from the dynamic metadata and clears
    // the route cache, so the backend's route forwards it. Envoy takes the stream-done
    // actions from the route the filter saw, so that route's charge the backend x-backend
    // names.
    for (n, cluster) in [(1, "service1"), (2, "service2")] {
        r.push_str(&format!(
            "              - match: {{prefix: \"/multiservice-tokenquota\", headers: [{{name: x-backend, string_match: {{exact: service_{n}}}}}]}}\n                route: {{cluster: {cluster}}}\n"
        ));
    }
    r.push_str("              - match: {prefix: \"/multiservice-tokenquota\"}\n                route: {cluster: upstream}\n");
    r.push_str(&per_route(
        &[
            ("multi_service", "service_1", 0),
            ("multi_service", "service_2", 0),
        ],
        Some("{request_headers: {header_name: x-backend, descriptor_key: multi_service}}".into()),
    ));
    r.push_str(
        "              - match: {prefix: \"/\"}\n                route: {cluster: upstream}\n",
    );
    r
}

/// Before the ratelimit filter: drop a client's own `x-backend` and route again, so a
/// client cannot pick a backend route (which has no rate limits) itself.
const LUA_STRIP: &str = r#"          - name: strip-backend
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua
              default_source_code:
                inline_string: |
                  function envoy_on_request(handle)
                    if handle:headers():get("x-backend") ~= nil then
                      handle:headers():remove("x-backend")
                      handle:clearRouteCache()
                    end
                  end
"#;

/// After the ratelimit filter: name the backend the service chose (its dynamic metadata's
/// `backend`) and route again.
const LUA: &str = r#"          - name: envoy.filters.http.lua
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua
              default_source_code:
                inline_string: |
                  function envoy_on_request(handle)
                    handle:headers():remove("x-backend")
                    local md = handle:streamInfo():dynamicMetadata():get("envoy.filters.http.ratelimit")
                    if md ~= nil and md["backend"] ~= nil then
                      handle:headers():add("x-backend", md["backend"])
                      handle:clearRouteCache()
                    end
                  end
"#;

/// An upstream that answers `Hello World from <name>` with `x-tokens-used` set to the
/// request's `x-tokens` (1 when absent): the usage an LLM backend reports.
fn token_upstream(name: &'static str) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind upstream");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || serve(stream, name));
        }
    });
    port
}

fn serve(stream: TcpStream, name: &str) {
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    while let Some(head) = read_request_head(&mut reader) {
        let tokens = header_value(&head, "x-tokens").unwrap_or("1");
        let body = format!("Hello World from {name}");
        let reply = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nContent-Type: text/plain\r\nx-tokens-used: {tokens}\r\n\r\n{body}",
            body.len()
        );
        if writer.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

struct Stack {
    _redis: common::Server,
    service: Service,
    envoy: Envoy,
}

fn stack() -> Stack {
    stack_with(LIMITS)
}

fn stack_with(limits: &str) -> Stack {
    stack_with_env(limits, &[])
}

fn stack_with_env(limits: &str, env: &[(&str, &str)]) -> Stack {
    let redis = common::Server::start();
    let service = Service::start(
        &format!("127.0.0.1:{}", redis.port),
        &[("edge.yaml", limits)],
        &[
            &[
                ("RL_TIMEOUT_MS", "10000"),
                ("LOG_LEVEL", "debug"),
                ("RESPONSE_DYNAMIC_METADATA", "true"),
            ],
            env,
        ]
        .concat(),
    );
    let extra_clusters = ["service1", "service2"]
        .iter()
        .zip([token_upstream("Service 1"), token_upstream("Service 2")])
        .map(|(name, port)| {
            format!(
                "  - name: {name}\n    type: STATIC\n    connect_timeout: 2s\n    load_assignment:\n      cluster_name: {name}\n      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}}}}}]}}]\n"
            )
        })
        .collect::<String>();
    let config = include_str!("envoy-template.yaml")
        .replace("@ROUTES@", routes().trim_end_matches('\n'))
        .replace(
            "          - name: envoy.filters.http.router\n",
            &format!("{LUA}          - name: envoy.filters.http.router\n"),
        )
        .replace(
            "          - name: envoy.filters.http.ratelimit\n",
            &format!("{LUA_STRIP}          - name: envoy.filters.http.ratelimit\n"),
        )
        .replace("  clusters:\n", &format!("  clusters:\n{extra_clusters}"))
        .replace("{upstream}", &token_upstream("the upstream").to_string())
        .replace("{grpc}", &service.grpc_port.to_string());
    let envoy = Envoy::start(&config);
    Stack {
        _redis: redis,
        service,
        envoy,
    }
}

impl Stack {
    fn get(&self, path: &str, headers: &[(&str, &str)]) -> support::Reply {
        self.envoy.get(path, headers)
    }

    fn statuses(&self, path: &str, headers: &[(&str, &str)], n: usize) -> Vec<u16> {
        (0..n).map(|_| self.get(path, headers).status).collect()
    }

    /// The service's `total_hits` of a stats key.
    fn hits(&self, key1: &str) -> u64 {
        self.service.metric(&format!(
            r#"ratelimit_service_rate_limit_total_hits{{domain="edge",key1="{key1}",key2=""}}"#
        ))
    }

    /// Waits until the stream-done charge Envoy sends after an answer has been counted:
    /// `key1`'s hits reach `hits`.
    fn wait_hits(&self, key1: &str, hits: u64) {
        let started = Instant::now();
        while self.hits(key1) < hits {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "{key1} never reached {hits} hits: {}\n{}",
                self.service.metrics(),
                self.service.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Polls `path` until it passes; the peer's script sleeps 60 s instead.
    fn wait_allowed(&self, path: &str, deadline: Duration) -> support::Reply {
        let started = Instant::now();
        loop {
            let r = self.get(path, &[]);
            if r.status == 200 {
                return r;
            }
            assert!(started.elapsed() < deadline, "{path} still {}", r.status);
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

#[test]
fn peer_simple_get_trigger_shadow_and_stats_key() {
    let s = stack();
    // simple-get.sh: one request with foo and baz: shady passes.
    assert_eq!(
        s.get("/twoheader", &[("foo", "test"), ("baz", "shady")])
            .status,
        200,
        "{}",
        s.service.log()
    );
    // trigger-ratelimit.sh: (foo: any, baz: not-so-shady), 3 per minute: three pass, the
    // fourth and fifth get 429 Too Many Requests.
    let h = [("foo", "pelle"), ("baz", "not-so-shady")];
    assert_eq!(s.statuses("/twoheader", &h, 5), [200, 200, 200, 429, 429]);
    // trigger-shadow-mode-key.sh: (foo, baz: shady) is shadow mode: six requests past a
    // limit of 3 all pass, and Envoy still gets the limit's headers.
    let h = [("foo", "pelle"), ("baz", "shady")];
    assert_eq!(s.statuses("/twoheader", &h, 5), [200; 5]);
    let r = s.get("/twoheader", &h);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-ratelimit-remaining"), Some("0"), "{r:?}");
    assert_eq!(
        s.service.metric(
            r#"ratelimit_service_rate_limit_shadow_mode{domain="edge",key1="foo",key2="baz_shady"}"#
        ),
        3,
        "{}",
        s.service.metrics()
    );
    // value-included-in-stats-key-when-unspecified.sh: (unspec: any), 2 per minute with
    // detailed_metric: two pass, the third is refused, and its over-limit count is under
    // the request's value.
    let h = [("unspec", "unspecified_value")];
    assert_eq!(s.statuses("/unspec", &h, 3), [200, 200, 429]);
    assert_eq!(
        s.service.metric(
            r#"ratelimit_service_rate_limit_over_limit{domain="edge",key1="unspec_unspecified_value",key2=""}"#
        ),
        1,
        "{}",
        s.service.metrics()
    );
}

#[test]
fn peer_replaces() {
    let s = stack_with(REPLACES);
    let ok = |path: &str, h: &[(&str, &str)]| {
        let r = s.get(path, h);
        assert_eq!(r.status, 200, "{path} {h:?}: {}", s.service.log());
    };
    let limited = |path: &str, h: &[(&str, &str)]| {
        let r = s.get(path, h);
        assert_eq!(r.status, 429, "{path} {h:?}: {}", s.service.log());
    };
    // replaces raises a limit: (foo, bar: banned) allows nothing; (source proxy,
    // destination override), 2 per minute, replaces it.
    let banned = [("foo", "bkthomps"), ("bar", "banned")];
    limited("/twoheader", &banned);
    let mock = [
        ("foo", "bkthomps"),
        ("bar", "banned"),
        ("source_cluster", "proxy"),
        ("destination_cluster", "mock"),
    ];
    limited("/fourheader", &mock);
    let over = [
        ("foo", "bkthomps"),
        ("bar", "banned"),
        ("source_cluster", "proxy"),
        ("destination_cluster", "override"),
    ];
    ok("/fourheader", &over);
    ok("/fourheader", &over);
    limited("/fourheader", &over);
    // replaces leaves the replaced limit alone where it is not replaced.
    let bk = |dest: &'static str| {
        [
            ("foo", "my_foo"),
            ("bar", "bkthomps"),
            ("source_cluster", "proxy"),
            ("destination_cluster", dest),
        ]
    };
    ok("/fourheader", &bk("bkthomps"));
    ok("/fourheader", &bk("bkthomps"));
    limited("/fourheader", &bk("bkthomps"));
    ok("/fourheader", &bk("not_bkthomps"));
    limited("/fourheader", &bk("not_bkthomps"));
    limited("/fourheader", &bk("bkthomps"));
    // One limit replaces two: (category: account), 4 per minute, replaces bkthomps and
    // fake_name.
    let five = [
        ("foo", "my_foo"),
        ("bar", "bkthomps"),
        ("source_cluster", "proxy"),
        ("destination_cluster", "fake"),
        ("category", "account"),
    ];
    for _ in 0..4 {
        ok("/fiveheader", &five);
    }
    limited("/fiveheader", &five);
    ok("/twoheader", &[("foo", "foo_2"), ("bar", "bkthomps")]);
    limited("/twoheader", &[("foo", "foo_2"), ("bar", "bkthomps")]);
    let fake = [
        ("foo", "foo_3"),
        ("bar", "bar_3"),
        ("source_cluster", "proxy"),
        ("destination_cluster", "fake"),
    ];
    ok("/fourheader", &fake);
    ok("/fourheader", &fake);
    limited("/fourheader", &fake);
    limited("/fiveheader", &five);
}

#[test]
fn peer_quota_the_third_request_is_refused() {
    // quota.sh: service_1 (1 per minute) and service_2 (2 per minute), both in quota mode,
    // each charged 1 per request: the first passes (both within), the second passes
    // (service_2 still within), the third is refused (both over); after the period it
    // passes again. Here the period is 10 s (`QUOTAS_PER_10_S`), and the three requests
    // are made well within the 5 s service_2 takes to earn a token back.
    let s = stack_with(QUOTAS_PER_10_S);
    let started = Instant::now();
    assert_eq!(
        s.statuses("/quota", &[], 3),
        [200, 200, 429],
        "{}",
        s.service.log()
    );
    assert!(
        started.elapsed() < QUOTA_PERIOD / 2,
        "{:?}",
        started.elapsed()
    );
    // The peer sleeps its window (60 s) and expects a pass. Quota hits apply even on a
    // refused request (as the peer's counters count them), so after the third request
    // service_1 is 2 in debt and service_2 1: service_2 has a token for the next request
    // after a whole period (2 tokens at 2 per period), when it passes. A request made
    // sooner would be refused and charged too, so the test waits once instead of polling.
    std::thread::sleep(QUOTA_PERIOD + Duration::from_millis(500));
    assert_eq!(s.get("/quota", &[]).status, 200, "{}", s.service.log());
}

#[test]
fn peer_token_quota_the_fourth_request_is_refused_and_the_quota_refills() {
    // token-quota.sh: 0-hit checks on the request path, and service_2 (2 per minute)
    // charged 1 on stream done. The charges always apply, so the third request's charge
    // puts the quota 1 in debt, and the fourth is refused. (The Go service lets 8 of 8
    // through here if a charge larger than what is left were refused, as ours did.)
    let s = stack();
    let key = "token_service_service_2";
    for (i, expected_hits) in [(1, 1), (2, 2), (3, 3)] {
        let r = s.get("/tokenquota", &[("request-no", &i.to_string())]);
        assert_eq!(r.status, 200, "request {i}: {}", s.service.log());
        s.wait_hits(key, expected_hits);
    }
    assert_eq!(s.get("/tokenquota", &[]).status, 429, "{}", s.service.log());
    // The peer waits for its window to end (60 s). A bucket of 2 per minute repays the
    // debt of 1 in 30 s and then passes again, whatever the time in the minute.
    s.wait_allowed("/tokenquota", Duration::from_secs(45));
}

#[test]
fn peer_multiservice_token_quota_routes_to_the_service_with_quota() {
    // multiservice-tokenquota.sh: service_1 (1 per minute) and service_2 (2 per minute) in
    // quota mode; the service's dynamic metadata names the first with quota left, and the
    // backend that answered is charged 1 on stream done. Two requests reach Service 1
    // (the second while it is exactly spent), three Service 2, the sixth is refused; after
    // the period (the peer sleeps 60 s; here 10 s, `QUOTAS_PER_10_S`) the seventh goes to
    // Service 1 again.
    let s = stack_with(QUOTAS_PER_10_S);
    let started = Instant::now();
    let expected = [
        "Service 1",
        "Service 1",
        "Service 2",
        "Service 2",
        "Service 2",
    ];
    let mut charged = [0u64, 0u64];
    for (i, backend) in expected.iter().enumerate() {
        let r = s.get("/multiservice-tokenquota", &[]);
        assert_eq!(r.status, 200, "request {}: {}", i + 1, s.service.log());
        assert_eq!(
            r.body,
            format!("Hello World from {backend}"),
            "request {}",
            i + 1
        );
        let n = usize::from(*backend == "Service 2");
        charged[n] += 1;
        // The request path's 0-hit checks count no hits; the stream-done charge counts 1.
        s.wait_hits(&format!("multi_service_service_{}", n + 1), charged[n]);
    }
    let r = s.get("/multiservice-tokenquota", &[]);
    assert_eq!(r.status, 429, "{r:?}");
    // A client naming a backend itself is limited all the same.
    let r = s.get("/multiservice-tokenquota", &[("x-backend", "service_2")]);
    assert_eq!(r.status, 429, "{r:?}");
    // Both quotas are 1 in debt. The steps above took less than the 5 s in which service_2
    // earns a token back, or the sixth could have passed.
    assert!(
        started.elapsed() < QUOTA_PERIOD / 2,
        "{:?}",
        started.elapsed()
    );
    // A whole period later service_1 has repaid its debt (its balance is 0 or more: a
    // 0-hit check is within) and service_2 too, and service_1 comes first in the request,
    // so its metadata names the backend, as in the peer's fixed window, where both
    // counters start again at 0.
    std::thread::sleep(QUOTA_PERIOD);
    let r = s.get("/multiservice-tokenquota", &[]);
    assert_eq!(r.status, 200, "request 7: {}", s.service.log());
    assert_eq!(r.body, "Hello World from Service 1", "request 7");
}

#[test]
fn llm_tokens_per_minute_go_into_debt_and_refuse_until_repaid() {
    // 10 tokens per minute; each answer reports what it used. 4 + 4 leave 2; the third
    // answer (4 more) is let through, as a check cannot know the answer's size, and puts
    // the user 2 in debt; the next request is refused until the debt is repaid.
    let s = stack();
    let key = "llm_user";
    for (used, total) in [(4, 4), (4, 8), (4, 12)] {
        let r = s.get("/llm", &[("x-tokens", &used.to_string())]);
        assert_eq!(r.status, 200, "{}", s.service.log());
        s.wait_hits(key, total);
    }
    let r = s.get("/llm", &[("x-tokens", "1")]);
    assert_eq!(r.status, 429, "{r:?}");
}

/// Three answers of 4 tokens on `path` (10 per minute), each charge counted before the
/// next request; then the status of a fourth request.
fn three_answers_then(s: &Stack, path: &str, key: &str) -> u16 {
    for total in [4, 8, 12] {
        let r = s.get(path, &[("x-tokens", "4")]);
        assert_eq!(r.status, 200, "{path}: {}", s.service.log());
        s.wait_hits(key, total);
    }
    s.get(path, &[("x-tokens", "1")]).status
}

#[test]
fn stream_done_charges_on_plain_post_paid_and_global_quota_limits() {
    let s = stack();
    // A plain limit under the default POST_PAID_CHARGES=auto: a charge of more than 1 is
    // applied whatever is left, as the Go service's counter adds it, so the third charge
    // (4 on the 2 left) puts the user 2 in debt and the fourth request is refused.
    assert_eq!(three_answers_then(&s, "/plain_user", "plain_user"), 429);
    // post_paid: the same on any POST_PAID_CHARGES.
    assert_eq!(three_answers_then(&s, "/paid_user", "paid_user"), 429);
    // POST_PAID_CHARGES=never: a plain limit refuses the third charge and takes nothing,
    // so the fourth request passes on the 2 left. The refused hits are counted, not
    // dropped; post_paid still applies. The fourth answer's own charge of 1 arrives after
    // its status, so the counts are read once all 13 hits are in: 4 + 4 + 1 within; of
    // the refused 4, the 2 past the limit are over it (the Go service's base_limiter
    // counts the other 2 as near it).
    let never = stack_with_env(LIMITS, &[("POST_PAID_CHARGES", "never")]);
    assert_eq!(three_answers_then(&never, "/plain_user", "plain_user"), 200);
    never.wait_hits("plain_user", 13);
    let count = |name: &str| {
        never.service.metric(&format!(
            r#"ratelimit_service_rate_limit_{name}{{domain="edge",key1="plain_user",key2=""}}"#
        ))
    };
    assert_eq!(count("within_limit"), 9);
    assert_eq!(count("over_limit"), 2);
    assert_eq!(three_answers_then(&never, "/paid_user", "paid_user"), 429);
    // GLOBAL_QUOTA_MODE: the plain limit is in quota mode, post-paid whatever
    // POST_PAID_CHARGES says.
    let global = stack_with_env(
        LIMITS,
        &[
            ("GLOBAL_QUOTA_MODE", "true"),
            ("POST_PAID_CHARGES", "never"),
        ],
    );
    assert_eq!(
        three_answers_then(&global, "/plain_user", "plain_user"),
        429
    );
}
