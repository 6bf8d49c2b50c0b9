//! Concurrency limits and reservations behind a real Envoy 1.40: the start call of a request
//! carries its `x-request-id` as a `request_id` entry and takes a lease or reserves an
//! estimate; the `apply_on_stream_done` call carries it as `request_done` and releases the
//! lease or settles the reservation with the usage the upstream reported in a trailer.
//!
//! The upstream streams its answer in chunks (`x-chunks` of them, 100 ms apart) and ends it
//! with the trailer `x-tokens-used: <x-usage>`, the tokens known only when an answer ends.

#![cfg(test)]

use rl_testkit as common;
mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread::sleep;
use std::time::{Duration, Instant};

use support::{header_value, read_request_head, Envoy, Service};

const LIMITS: &str = "
domain: edge
descriptors:
  # Tokens per minute, reserved at the start (1,000 unless Envoy sends an estimate) and
  # settled with the usage at the end.
  - key: tenant
    rate_limit:
      unit: minute
      requests_per_unit: 10000
      reserve: {estimate: 1000, ttl: 1m}
  # The same quota charged only after each answer.
  - key: paid_tenant
    rate_limit: {unit: minute, requests_per_unit: 10000, post_paid: true}
  # At most 3 streams in flight per tenant.
  - key: slot_tenant
    concurrency: {limit: 3, ttl: 30s}
";

/// The start call's and the end call's actions for `key` (from `x-tenant`), tied by
/// `x-request-id`; the end carries `hits` (a formatter: the usage) when given.
fn tied(key: &str, hits: Option<&str>) -> String {
    let tenant = format!("{{request_headers: {{header_name: x-tenant, descriptor_key: {key}}}}}");
    format!(
        "                    - actions: [{tenant}, {{request_headers: {{header_name: x-request-id, descriptor_key: request_id}}}}]\n\
         \x20                   - actions: [{tenant}, {{request_headers: {{header_name: x-request-id, descriptor_key: request_done}}}}]\n\
         {hits}\
         \x20                     apply_on_stream_done: true\n",
        hits = hits
            .map(|h| format!("                      hits_addend: {{format: \"{h}\"}}\n"))
            .unwrap_or_default()
    )
}

fn per_route(path: &str, limits: &str) -> String {
    format!(
        "              - match: {{prefix: \"{path}\"}}\n                route: {{cluster: upstream, timeout: 0s}}\n                typed_per_filter_config:\n                  envoy.filters.http.ratelimit:\n                    \"@type\": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute\n                    rate_limits:\n{limits}"
    )
}

fn routes() -> String {
    let paid = "{request_headers: {header_name: x-tenant, descriptor_key: paid_tenant}}";
    let post_paid = format!(
        "                    - actions: [{paid}]\n                      hits_addend: {{number: 0}}\n                    - actions: [{paid}]\n                      hits_addend: {{format: \"{USAGE}\"}}\n                      apply_on_stream_done: true\n"
    );
    [
        per_route("/llm", &tied("tenant", Some(USAGE))),
        per_route("/paid", &post_paid),
        per_route("/slot", &tied("slot_tenant", None)),
    ]
    .concat()
}

/// The usage as the end call's cost: Envoy formats `hits_addend` with the request's headers
/// and the stream's info only (not the response's headers or trailers), so the Lua filter
/// below copies the trailer into the stream's dynamic metadata.
const USAGE: &str = "%DYNAMIC_METADATA(usage:tokens)%";

/// Reads the answer's chunks as they pass (the stream is not buffered), then its trailer
/// `x-tokens-used`, into the dynamic metadata `usage.tokens`.
const LUA_USAGE: &str = r#"          - name: envoy.filters.http.lua
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua
              default_source_code:
                inline_string: |
                  function envoy_on_response(handle)
                    for _ in handle:bodyChunks() do end
                    local trailers = handle:trailers()
                    local used = trailers and trailers:get("x-tokens-used")
                    if used ~= nil then
                      handle:streamInfo():dynamicMetadata():set("usage", "tokens", tonumber(used))
                    end
                  end
"#;

/// Streams in flight at the upstream, and the most seen at once.
#[derive(Default)]
struct Upstream {
    in_flight: AtomicU64,
    most: AtomicU64,
}

fn upstream(state: Arc<Upstream>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind upstream");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let state = state.clone();
            std::thread::spawn(move || serve(stream, &state));
        }
    });
    port
}

fn serve(stream: TcpStream, state: &Upstream) {
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    while let Some(head) = read_request_head(&mut reader) {
        let usage = header_value(&head, "x-usage").unwrap_or("1");
        let chunks: u64 = header_value(&head, "x-chunks").map_or(1, |v| v.parse().unwrap_or(1));
        let now = state.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        state.most.fetch_max(now, Ordering::SeqCst);
        let mut ok = writer
            .write_all(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: x-tokens-used\r\n\r\n",
            )
            .is_ok();
        for _ in 0..chunks {
            if !ok {
                break;
            }
            ok = writer.write_all(b"5\r\ntoken\r\n").is_ok() && writer.flush().is_ok();
            sleep(Duration::from_millis(100));
        }
        state.in_flight.fetch_sub(1, Ordering::SeqCst);
        let trailer = format!("0\r\nx-tokens-used: {usage}\r\n\r\n");
        if !ok || writer.write_all(trailer.as_bytes()).is_err() {
            return;
        }
    }
}

struct Stack {
    redis: common::Server,
    service: Service,
    envoy: Envoy,
    upstream: Arc<Upstream>,
}

fn stack() -> Stack {
    let redis = common::Server::start();
    let service = Service::start(
        &format!("127.0.0.1:{}", redis.port),
        &[("edge.yaml", LIMITS)],
        &[("RL_TIMEOUT_MS", "10000"), ("LOG_LEVEL", "debug")],
    );
    let state = Arc::new(Upstream::default());
    // The upstream speaks HTTP/1.1 with trailers, which Envoy reads only when told to.
    let config = include_str!("envoy-template.yaml")
        .replace("@ROUTES@", routes().trim_end_matches('\n'))
        .replace(
            "  - name: upstream\n    type: STATIC\n    connect_timeout: 2s\n",
            "  - name: upstream\n    type: STATIC\n    connect_timeout: 2s\n    typed_extension_protocol_options:\n      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:\n        \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions\n        explicit_http_config: {http_protocol_options: {enable_trailers: true}}\n    circuit_breakers:\n      thresholds: [{max_connections: 10000, max_pending_requests: 10000, max_requests: 10000}]\n",
        )
        .replace(
            "          - name: envoy.filters.http.router\n",
            &format!("{LUA_USAGE}          - name: envoy.filters.http.router\n"),
        )
        .replace("{upstream}", &upstream(state.clone()).to_string())
        .replace("{grpc}", &service.grpc_port.to_string());
    let envoy = Envoy::start(&config);
    Stack {
        redis,
        service,
        envoy,
        upstream: state,
    }
}

/// A streamed GET: the status, then (unless `abort_after_headers`) the body read to its end.
fn stream_get(port: u16, path: &str, headers: &[(&str, &str)], abort_after_headers: bool) -> u16 {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect envoy");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    for (k, v) in headers {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).expect("send");
    let mut reader = BufReader::new(stream);
    let mut status_line = String::new();
    reader.read_line(&mut status_line).expect("status line");
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    if abort_after_headers {
        // Dropping the connection mid-stream: Envoy resets the stream.
        return status;
    }
    let mut rest = Vec::new();
    let _ = reader.read_to_end(&mut rest);
    status
}

/// Polls `check` every 50 ms until it holds or `within` passes.
fn eventually(within: Duration, mut check: impl FnMut() -> bool) -> bool {
    let started = Instant::now();
    while started.elapsed() < within {
        if check() {
            return true;
        }
        sleep(Duration::from_millis(50));
    }
    check()
}

/// 50 concurrent streams of `path` for tenant `tenant`, each using `usage(i)` tokens and
/// lasting 1 s: which passed, and how long the burst took from first start to last answer.
fn burst(s: &Stack, path: &str, tenant: &str, usage: fn(u64) -> u64) -> (Vec<u64>, Duration) {
    let barrier = Arc::new(Barrier::new(50));
    let passed = Arc::new(Mutex::new(Vec::new()));
    let port = s.envoy.port;
    let started = Instant::now();
    let threads: Vec<_> = (0..50u64)
        .map(|i| {
            let (barrier, passed) = (barrier.clone(), passed.clone());
            let (path, tenant) = (path.to_string(), tenant.to_string());
            std::thread::spawn(move || {
                barrier.wait();
                let used = usage(i).to_string();
                let status = stream_get(
                    port,
                    &path,
                    &[
                        ("x-tenant", &tenant),
                        ("x-usage", &used),
                        ("x-chunks", "10"),
                    ],
                    false,
                );
                assert!(status == 200 || status == 429, "status {status}");
                if status == 200 {
                    passed.lock().expect("lock").push(usage(i));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("stream thread");
    }
    let passed = passed.lock().expect("lock").clone();
    (passed, started.elapsed())
}

/// About 1,000 tokens each: 950 to 1,049, whatever the estimate said.
fn about_a_thousand(i: u64) -> u64 {
    950 + (i * 37) % 100
}

#[test]
fn reservations_hold_a_token_quota_that_post_paid_charges_overrun() {
    let s = stack();
    let (passed, took) = burst(&s, "/llm", "acme", about_a_thousand);
    // Each start reserved the 1,000-token estimate: 10 fit the 10,000 quota; tokens
    // refilled during the burst (10,000 a minute) and over-estimates settled early may let
    // a few more start.
    let used: u64 = passed.iter().sum();
    let refilled = took.as_secs_f64() * 10_000.0 / 60.0;
    let error: u64 = passed.iter().map(|u| u.saturating_sub(1000)).sum();
    #[allow(clippy::cast_precision_loss)]
    let bound = 10_000.0 + refilled + error as f64;
    assert!(
        passed.len() >= 10 && (used as f64) <= bound,
        "{} passed using {used} tokens; bound {bound} (burst took {took:?})",
        passed.len()
    );
    assert!(passed.len() < 15, "{} of 50 passed", passed.len());
    // Every reservation was settled by its end call: the bucket holds no open one. A bucket
    // reserved on keeps its type once its reservations are settled, so it is held against
    // one of the same limit whose one reservation was settled: each open record would add
    // bytes to its DUMP (a bucket full again is gone, with nothing open).
    let mut redis = s.redis.conn();
    let _: redis::Value = redis::cmd("RL.RESERVE")
        .arg("settled_reference")
        .arg("10000/60")
        .arg(10000)
        .arg(1000)
        .arg(60_000)
        .arg("ID")
        .arg("r")
        .query(&mut redis)
        .expect("RL.RESERVE");
    let _: redis::Value = redis::cmd("RL.SETTLE")
        .arg("settled_reference")
        .arg("10000/60")
        .arg(10000)
        .arg("r")
        .arg(1000)
        .query(&mut redis)
        .expect("RL.SETTLE");
    let reference: Vec<u8> = redis::cmd("DUMP")
        .arg("settled_reference")
        .query(&mut redis)
        .expect("DUMP");
    let settled = eventually(Duration::from_secs(10), || {
        let dump: Option<Vec<u8>> = redis::cmd("DUMP")
            .arg("edge_tenant_acme")
            .query(&mut redis)
            .expect("DUMP");
        dump.is_none_or(|dump| dump.len() == reference.len())
    });
    assert!(settled, "reservations left open: {}", s.service.log());
    let log = s.service.log();
    assert!(log.contains("end of edge_tenant_acme"), "{log}");

    // The same quota charged only after each answer lets every concurrent stream through.
    let (paid, _) = burst(&s, "/paid", "acme", about_a_thousand);
    assert_eq!(paid.len(), 50, "post-paid passed {} of 50", paid.len());
    // And leaves the quota some 40,000 tokens in debt once the charges land.
    let in_debt = eventually(Duration::from_secs(10), || {
        let peek: Vec<i64> = redis::cmd("RL.PEEK")
            .arg("edge_paid%5Ftenant_acme")
            .arg("10000/60")
            .arg(10000)
            .query(&mut redis)
            .expect("RL.PEEK");
        peek.get(1).is_some_and(|balance| *balance < -35_000)
    });
    assert!(in_debt, "the post-paid charges did not land");
}

#[test]
fn at_most_three_streams_in_flight_and_an_aborted_stream_gives_its_slot_back() {
    let s = stack();
    let port = s.envoy.port;
    // Ten concurrent streams of 1.5 s for one tenant: three pass, and the upstream never
    // sees more than three at once.
    let barrier = Arc::new(Barrier::new(10));
    let threads: Vec<_> = (0..10)
        .map(|_| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                stream_get(
                    port,
                    "/slot",
                    &[("x-tenant", "acme"), ("x-chunks", "15")],
                    false,
                )
            })
        })
        .collect();
    let statuses: Vec<u16> = threads
        .into_iter()
        .map(|t| t.join().expect("thread"))
        .collect();
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        3,
        "{statuses:?}"
    );
    assert_eq!(statuses.iter().filter(|s| **s == 429).count(), 7);
    assert_eq!(s.upstream.most.load(Ordering::SeqCst), 3);
    // Their ends released every slot (Envoy sends the end call after the answer, so wait for
    // it): three pass again at once, another tenant is apart.
    let mut redis = s.redis.conn();
    let held = |redis: &mut redis::Connection| -> i64 {
        let reply: Vec<i64> = redis::cmd("RL.LEASES")
            .arg("edge_slot%5Ftenant_acme%L")
            .arg(3)
            .query(redis)
            .expect("RL.LEASES");
        reply.first().copied().unwrap_or(-1)
    };
    assert!(
        eventually(Duration::from_secs(5), || held(&mut redis) == 0),
        "{}",
        s.service.log()
    );
    let holders: Vec<_> = (0..3)
        .map(|_| {
            std::thread::spawn(move || {
                stream_get(
                    port,
                    "/slot",
                    &[("x-tenant", "acme"), ("x-chunks", "30")],
                    false,
                )
            })
        })
        .collect();
    assert!(eventually(Duration::from_secs(5), || s
        .upstream
        .in_flight
        .load(Ordering::SeqCst)
        == 3));
    assert_eq!(held(&mut redis), 3);
    assert_eq!(
        stream_get(port, "/slot", &[("x-tenant", "acme")], false),
        429,
        "a fourth stream while three are in flight"
    );
    assert_eq!(
        stream_get(port, "/slot", &[("x-tenant", "other")], false),
        200
    );
    for h in holders {
        assert_eq!(h.join().expect("thread"), 200);
    }
    // A client that aborts mid-stream: its slot comes back when Envoy ends the stream,
    // long before the lease's 30 s ttl.
    for _ in 0..3 {
        assert_eq!(
            stream_get(
                port,
                "/slot",
                &[("x-tenant", "quitter"), ("x-chunks", "600")],
                true
            ),
            200
        );
    }
    let aborted = Instant::now();
    let freed = eventually(Duration::from_secs(10), || {
        stream_get(port, "/slot", &[("x-tenant", "quitter")], false) == 200
    });
    assert!(
        freed && aborted.elapsed() < Duration::from_secs(15),
        "an aborted stream kept its slot: {}",
        s.envoy.log()
    );
}

/// A descriptor's entries and its own `hits_addend`.
type Described<'a> = (&'a [(&'a str, &'a str)], Option<u64>);

/// One request of `descriptors` as the `/json` body.
fn request(descriptors: &[Described<'_>]) -> String {
    let descriptors: Vec<serde_json::Value> = descriptors
        .iter()
        .map(|(entries, hits)| {
            let entries: Vec<serde_json::Value> = entries
                .iter()
                .map(|(k, v)| serde_json::json!({"key": k, "value": v}))
                .collect();
            match hits {
                Some(h) => serde_json::json!({"entries": entries, "hitsAddend": h.to_string()}),
                None => serde_json::json!({"entries": entries}),
            }
        })
        .collect();
    serde_json::json!({"domain": "edge", "descriptors": descriptors}).to_string()
}

const SERVICE_LIMITS: &str = "
domain: edge
descriptors:
  - key: tenant
    rate_limit:
      unit: hour
      requests_per_unit: 1000
      reserve: {estimate: 300}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: slot_tenant
    concurrency: {limit: 2, ttl: 1m}
  - key: watched_tenant
    shadow_mode: true
    concurrency: {limit: 1}
";

#[test]
fn a_start_is_all_or_nothing_and_a_retry_or_a_second_end_applies_nothing_twice() {
    let redis = common::Server::start();
    let svc = Service::start(
        &format!("127.0.0.1:{}", redis.port),
        &[("edge.yaml", SERVICE_LIMITS)],
        &[],
    );
    let remaining = |body: &str| -> u64 {
        let reply = svc.json(body);
        reply.json()["statuses"][0]["limitRemaining"]
            .as_u64()
            .unwrap_or(0)
    };
    let start = |id: &str, user: &str| {
        request(&[
            (&[("tenant", "t"), ("request_id", id)], None),
            (&[("slot_tenant", "t"), ("request_id", id)], None),
            (&[("user", user)], None),
        ])
    };
    // r1 reserves the default estimate and takes a slot; its retry takes nothing more.
    assert_eq!(svc.json(&start("r1", "u1")).status, 200, "{}", svc.log());
    assert_eq!(remaining(&start("r1", "u2")), 700);
    // r2 is refused by `user` (u1's one token is gone): its reservation and its lease are
    // given back, so the quota still holds 700 and one slot is free.
    assert_eq!(svc.json(&start("r2", "u1")).status, 429);
    let r3 = request(&[(&[("tenant", "t"), ("request_id", "r3")], Some(200))]);
    assert_eq!(remaining(&r3), 500, "r3 reserves the 200 Envoy sent");
    let slot = |id: &str| request(&[(&[("slot_tenant", "t"), ("request_id", id)], None)]);
    assert_eq!(svc.json(&slot("r4")).status, 200, "the slot r2 gave back");
    assert_eq!(svc.json(&slot("r5")).status, 429, "r1 and r4 hold both");
    // r1 ends having used 100: 200 of its estimate come back, once however often the end
    // call comes; its slot frees.
    let end = request(&[
        (&[("tenant", "t"), ("request_done", "r1")], Some(100)),
        (&[("slot_tenant", "t"), ("request_done", "r1")], None),
    ]);
    for _ in 0..3 {
        assert_eq!(svc.json(&end).status, 200, "{}", svc.log());
    }
    assert_eq!(svc.json(&slot("r5")).status, 200);
    // r3 used 450, more than its 200: charged the rest. 1000 - 100 - 450 = 450 left, less
    // the 300 a new start reserves.
    let end3 = request(&[(&[("tenant", "t"), ("request_done", "r3")], Some(450))]);
    assert_eq!(svc.json(&end3).status, 200);
    let r6 = request(&[(&[("tenant", "t"), ("request_id", "r6")], None)]);
    assert_eq!(remaining(&r6), 150);
    // A shadow-mode limit counts a refusal and lets the request through.
    let watched = |id: &str| request(&[(&[("watched_tenant", "t"), ("request_id", id)], None)]);
    assert_eq!(svc.json(&watched("w1")).status, 200);
    assert_eq!(svc.json(&watched("w2")).status, 200);
    assert!(
        svc.metrics()
            .contains("ratelimit_service_rate_limit_shadow_mode{domain=\"edge\",key1=\"watched_tenant\",key2=\"\"} 1"),
        "{}",
        svc.metrics()
    );
    // Without a request id entry the descriptor is a plain rate limit on the same bucket.
    assert_eq!(
        svc.json(&request(&[(&[("tenant", "t")], Some(150))]))
            .status,
        200
    );
    assert_eq!(
        svc.json(&request(&[(&[("tenant", "t")], Some(1))])).status,
        429
    );
}

#[test]
fn leases_and_reservations_work_on_a_cluster() {
    let cluster = common::cluster::Cluster::start();
    let svc = Service::on_cluster(&cluster, &[("edge.yaml", SERVICE_LIMITS)]);
    // Tenants whose keys sit on different slots: each has its own two slots.
    for tenant in ["a", "b", "c"] {
        let slot =
            |phase: &str, id: &str| request(&[(&[("slot_tenant", tenant), (phase, id)], None)]);
        assert_eq!(
            svc.json(&slot("request_id", "1")).status,
            200,
            "{}",
            svc.log()
        );
        assert_eq!(svc.json(&slot("request_id", "2")).status, 200);
        assert_eq!(svc.json(&slot("request_id", "3")).status, 429);
        assert_eq!(svc.json(&slot("request_done", "1")).status, 200);
        assert_eq!(svc.json(&slot("request_id", "3")).status, 200);
        let reserve = request(&[(&[("tenant", tenant), ("request_id", "9")], Some(900))]);
        assert_eq!(svc.json(&reserve).status, 200);
        let more = request(&[(&[("tenant", tenant), ("request_id", "10")], Some(200))]);
        assert_eq!(svc.json(&more).status, 429);
        let settle = request(&[(&[("tenant", tenant), ("request_done", "9")], Some(100))]);
        assert_eq!(svc.json(&settle).status, 200);
        assert_eq!(svc.json(&more).status, 200, "the over-estimate came back");
    }
    let slots: std::collections::HashSet<u16> = ["a", "b", "c"]
        .iter()
        .map(|t| cluster.keyslot(format!("edge_slot%5Ftenant_{t}%L").as_bytes()))
        .collect();
    assert!(slots.len() > 1, "the tenants' leases share a slot");
}
