//! Quota mode, post-paid charges and the response's dynamic metadata on a running service,
//! through `/json` and gRPC: the peer's rule (over when a plain descriptor is, or every
//! quota-mode one is), charges that always apply and leave a bucket in debt, 0-hit checks
//! refused while in debt, `post_paid` plain limits, `GLOBAL_QUOTA_MODE`, and
//! `RESPONSE_DYNAMIC_METADATA`. Behind Envoy: `tests/peer_scenarios.rs`.
//!
//! Time: limits are per hour (7 per hour: 1e9 / rate is not whole) or per minute, so refill
//! cannot change a count within a test; no test waits for a refill.

#![cfg(test)]

use rl_testkit as common;
mod support;

use serde_json::{json, Value};
use support::{PlainRedis, Service};

const QUOTA: &str = "
domain: q
descriptors:
  - key: service
    value: s1
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
    metadata: {backend: s1, tier: {name: gold}}
  - key: service
    value: s2
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2}
    metadata: {backend: s2}
  - key: tokens
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 7}
  - key: plain
    rate_limit: {unit: hour, requests_per_unit: 7}
  - key: paid
    rate_limit: {unit: hour, requests_per_unit: 7, post_paid: true}
";

fn start(env: &[(&str, &str)]) -> (common::Server, Service) {
    let redis = common::Server::start();
    let svc = Service::start(
        &format!("127.0.0.1:{}", redis.port),
        &[("q.yaml", QUOTA)],
        env,
    );
    (redis, svc)
}

/// A request of descriptors `(key, value, hits)`; `None` hits leaves the addend unset (1).
fn request(descriptors: &[(&str, &str, Option<u64>)]) -> String {
    let list: Vec<Value> = descriptors
        .iter()
        .map(|(k, v, hits)| {
            let mut d = json!({"entries": [{"key": k, "value": v}]});
            if let Some(h) = hits {
                d["hitsAddend"] = json!(h.to_string());
            }
            d
        })
        .collect();
    json!({"domain": "q", "descriptors": list}).to_string()
}

fn codes(body: &Value) -> Vec<String> {
    body["statuses"]
        .as_array()
        .map(|s| {
            s.iter()
                .map(|s| s["code"].as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn over_only_when_every_quota_is_over_and_charges_always_apply() {
    let (_redis, svc) = start(&[]);
    let both = request(&[("service", "s1", None), ("service", "s2", None)]);
    // The peer's quota.sh: 1 and 2 per hour, both charged 1 each time.
    let first = svc.json(&both);
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(codes(&first.json()), ["OK", "OK"]);
    // s1 is over its quota (1 in debt), s2 has room: allowed, and s1's status says so.
    let second = svc.json(&both);
    assert_eq!(second.status, 200, "{}", second.body);
    let body = second.json();
    assert_eq!(body["overallCode"], "OK");
    assert_eq!(codes(&body), ["OVER_LIMIT", "OK"]);
    // Both over: refused.
    let third = svc.json(&both);
    assert_eq!(third.status, 429, "{}", third.body);
    assert_eq!(codes(&third.json()), ["OVER_LIMIT", "OVER_LIMIT"]);
    // The refused request was charged too (the peer's counters always count): s2 is now
    // 1 in debt, so a 0-hit check of s2 alone is refused.
    assert_eq!(
        svc.json(&request(&[("service", "s2", Some(0))])).status,
        429
    );
    assert_eq!(
        svc.metric(
            r#"ratelimit_service_rate_limit_total_hits{domain="q",key1="service_s2",key2=""}"#
        ),
        3
    );
    assert_eq!(
        svc.metric(
            r#"ratelimit_service_rate_limit_over_limit{domain="q",key1="service_s2",key2=""}"#
        ),
        1
    );
}

#[test]
fn a_charge_past_what_is_left_applies_and_checks_are_refused_while_in_debt() {
    let (redis, svc) = start(&[]);
    // 7 tokens per hour. A 0-hit check of a full quota passes and takes nothing.
    assert_eq!(svc.json(&request(&[("tokens", "u", Some(0))])).status, 200);
    // An answer used 5: charged after the fact, 2 left.
    let r = svc.json(&request(&[("tokens", "u", Some(5))]));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["statuses"][0]["limitRemaining"], json!(2));
    // The next answer used 4: more than the 2 left, and still charged (the peer's counter
    // would count it too): 2 in debt. The reply says over, which Envoy ignores on stream
    // done.
    let r = svc.json(&request(&[("tokens", "u", Some(4))]));
    assert_eq!(r.status, 429, "{}", r.body);
    // While in debt, the request path's 0-hit check is refused.
    let r = svc.json(&request(&[("tokens", "u", Some(0))]));
    assert_eq!(r.status, 429, "{}", r.body);
    // What Redis holds: 7 - 5 - 4 = -2, whole tokens, debt repaid in 2 × 3600/7 s.
    let mut con = redis.conn();
    // The bucket where the suite keeps it: its key, or its field of a table.
    let mut peek = match std::env::var("RL_BUCKET_STORAGE").as_deref() {
        Ok("tables") => {
            let shard = redis_rl_client::shard_of("q_tokens_u", 256);
            let mut cmd = redis::cmd("RL.HPEEK");
            cmd.arg(format!("buckets:{{{shard}}}"));
            cmd
        }
        _ => redis::cmd("RL.PEEK"),
    };
    let peek: Vec<i64> = peek
        .arg("q_tokens_u")
        .arg("7/3600")
        .arg("7")
        .arg("0")
        .query(&mut con)
        .unwrap();
    assert_eq!(peek[0], 0, "{peek:?}");
    // Repaid after exactly 2 tokens' time at 7 per hour: 7200/7 s = 1028571.43 ms, less
    // the few ms this test took.
    assert!(
        (1_020_000..=1_028_572).contains(&peek[2]),
        "retry_after_ms {peek:?}"
    );
}

#[test]
fn a_plain_limit_applies_a_charge_past_what_is_left_by_default() {
    // POST_PAID_CHARGES=auto. A cost of 1 on a limit never asked with 0 hits is Envoy's
    // default hits at request time, all or nothing: 7 pass, the 8th and later are refused
    // and take nothing, so a 0-hit check then finds the bucket at 0, not in debt.
    let (_redis, svc) = start(&[]);
    for _ in 0..7 {
        assert_eq!(svc.json(&request(&[("plain", "v", None)])).status, 200);
    }
    for _ in 0..5 {
        assert_eq!(svc.json(&request(&[("plain", "v", None)])).status, 429);
    }
    let r = svc.json(&request(&[("plain", "v", Some(0))]));
    assert_eq!(r.status, 200, "{}", r.body);
    // A cost above 1 may be a stream-done charge, so it applies in full (1 in debt) and
    // the 0-hit check is refused until repaid.
    assert_eq!(svc.json(&request(&[("plain", "u", Some(8))])).status, 429);
    assert_eq!(svc.json(&request(&[("plain", "u", Some(0))])).status, 429);
    assert_eq!(svc.json(&request(&[("plain", "u", None)])).status, 429);
    // The limit has now been asked with 0 hits: it is checked at request time and charged
    // on stream done, so a cost of 1 is a charge too, applied past what is left (the
    // check passes at 0 and the charge would otherwise be lost).
    for _ in 0..7 {
        assert_eq!(svc.json(&request(&[("plain", "w", None)])).status, 200);
    }
    assert_eq!(svc.json(&request(&[("plain", "w", Some(0))])).status, 200);
    assert_eq!(svc.json(&request(&[("plain", "w", None)])).status, 429);
    let r = svc.json(&request(&[("plain", "w", Some(0))]));
    assert_eq!(r.status, 429, "in debt: {}", r.body);
}

#[test]
fn plain_limits_refuse_a_charge_past_what_is_left_and_post_paid_ones_apply_it() {
    let (_redis, svc) = start(&[("POST_PAID_CHARGES", "never")]);
    // POST_PAID_CHARGES=never, a plain limit: a charge of 8 on 7 is refused and takes nothing. The refused hits
    // are counted (never dropped without a trace): all 8 in total_hits, none within, and
    // the one past the capacity over the limit, as the Go service splits them.
    assert_eq!(svc.json(&request(&[("plain", "u", Some(8))])).status, 429);
    let metric = |name: &str| {
        svc.metric(&format!(
            r#"ratelimit_service_rate_limit_{name}{{domain="q",key1="plain",key2=""}}"#
        ))
    };
    assert_eq!(
        (
            metric("total_hits"),
            metric("within_limit"),
            metric("over_limit")
        ),
        (8, 0, 1)
    );
    let r = svc.json(&request(&[("plain", "u", Some(0))]));
    assert_eq!(r.json()["statuses"][0]["limitRemaining"], json!(7));
    // post_paid: the same charge applies, 1 in debt, and the request path is refused.
    assert_eq!(svc.json(&request(&[("paid", "u", Some(8))])).status, 429);
    assert_eq!(svc.json(&request(&[("paid", "u", Some(0))])).status, 429);
    assert_eq!(svc.json(&request(&[("paid", "u", None)])).status, 429);
    // A post-paid limit is a plain one for the rule: over refuses even when a quota has
    // room.
    let r = svc.json(&request(&[
        ("paid", "u", Some(0)),
        ("service", "s2", Some(0)),
    ]));
    assert_eq!(r.status, 429, "{}", r.body);
}

#[test]
fn every_quota_over_leaves_plain_buckets_untouched() {
    let (_redis, svc) = start(&[]);
    // s1 spent (1 per hour), then s1 with plain: every quota over, refused, and the plain
    // bucket keeps its 7.
    assert_eq!(svc.json(&request(&[("service", "s1", None)])).status, 200);
    for _ in 0..3 {
        let r = svc.json(&request(&[
            ("service", "s1", Some(0)),
            ("plain", "k", None),
        ]));
        assert_eq!(r.status, 200, "exactly spent is not over: {}", r.body);
    }
    assert_eq!(svc.json(&request(&[("service", "s1", None)])).status, 429);
    for _ in 0..3 {
        let r = svc.json(&request(&[
            ("service", "s1", Some(0)),
            ("plain", "k", None),
        ]));
        assert_eq!(r.status, 429, "{}", r.body);
    }
    let r = svc.json(&request(&[("plain", "k", Some(0))]));
    assert_eq!(
        r.json()["statuses"][0]["limitRemaining"],
        json!(4),
        "the three allowed took 3, the three refused none"
    );
}

#[test]
fn global_quota_mode_puts_every_limit_in_quota_mode() {
    let (_redis, svc) = start(&[("GLOBAL_QUOTA_MODE", "true")]);
    // `plain` is in quota mode now: 8 on 7 applies (1 in debt) and the 0-hit check is
    // refused; with s2 beside it, s2's room lets the request through.
    assert_eq!(svc.json(&request(&[("plain", "u", Some(8))])).status, 429);
    assert_eq!(svc.json(&request(&[("plain", "u", Some(0))])).status, 429);
    let r = svc.json(&request(&[
        ("plain", "u", Some(0)),
        ("service", "s2", Some(0)),
    ]));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(codes(&r.json()), ["OVER_LIMIT", "OK"]);
}

#[test]
fn dynamic_metadata_names_violations_and_the_first_service_with_quota() {
    let (_redis, svc) = start(&[("RESPONSE_DYNAMIC_METADATA", "true")]);
    let both = request(&[
        ("service", "s1", Some(0)),
        ("service", "s2", Some(0)),
        ("plain", "p", Some(0)),
    ]);
    let body = svc.json(&both).json();
    assert_eq!(
        body["dynamicMetadata"],
        json!({
            "domain": "q",
            "descriptors": [
                {"entries": ["service=s1"]},
                {"entries": ["service=s2"]},
                {"entries": ["plain=p"]},
            ],
            "quotaModeEnabled": true,
            "quotaModeViolations": [],
            "backend": "s1",
            "tier": {"name": "gold"},
        })
    );
    // s1 charged 2: in debt; s2 now names the backend, and s1 is a violation.
    assert_eq!(
        svc.json(&request(&[("service", "s1", Some(2))])).status,
        429
    );
    let body = svc.json(&both).json();
    assert_eq!(body["overallCode"], "OK");
    assert_eq!(body["dynamicMetadata"]["quotaModeViolations"], json!([0]));
    assert_eq!(body["dynamicMetadata"]["backend"], "s2");
    assert!(body["dynamicMetadata"].get("tier").is_none(), "{body}");
    // Without RESPONSE_DYNAMIC_METADATA there is none.
    let (_redis2, plain) = start(&[]);
    assert!(plain.json(&both).json().get("dynamicMetadata").is_none());
}

#[test]
fn grpc_carries_the_dynamic_metadata_and_the_quota_rule() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use envoy_types::pb::google::protobuf::{value::Kind, UInt64Value};

    let (_redis, svc) = start(&[("RESPONSE_DYNAMIC_METADATA", "true")]);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut client =
            RateLimitServiceClient::connect(format!("http://127.0.0.1:{}", svc.grpc_port))
                .await
                .unwrap();
        let descriptor = |value: &str, hits: u64| RateLimitDescriptor {
            entries: vec![Entry {
                key: "service".into(),
                value: value.into(),
            }],
            hits_addend: Some(UInt64Value { value: hits }),
            ..Default::default()
        };
        let request = |hits: u64| RateLimitRequest {
            domain: "q".into(),
            descriptors: vec![descriptor("s1", hits), descriptor("s2", hits)],
            hits_addend: 0,
        };
        // Each call charges both 1: OK, OK (s1 over, s2 exactly spent), OVER_LIMIT.
        let mut overall = Vec::new();
        let mut backends = Vec::new();
        for _ in 0..3 {
            let r = client
                .should_rate_limit(request(1))
                .await
                .unwrap()
                .into_inner();
            overall.push(r.overall_code);
            let md = r.dynamic_metadata.expect("dynamic metadata");
            backends.push(
                match md.fields.get("backend").and_then(|v| v.kind.clone()) {
                    Some(Kind::StringValue(s)) => s,
                    _ => String::new(),
                },
            );
        }
        assert_eq!(overall, [1, 1, 2]);
        assert_eq!(backends, ["s1", "s2", ""]);
        // A post-paid plain limit over gRPC: 8 on 7 applies (1 in debt), and the 0-hit
        // check after it is refused; a plain limit under the default POST_PAID_CHARGES=auto
        // does the same (a cost above 1 may be a stream-done charge).
        let one = |key: &str, hits: u64| RateLimitRequest {
            domain: "q".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: key.into(),
                    value: "g".into(),
                }],
                hits_addend: Some(UInt64Value { value: hits }),
                ..Default::default()
            }],
            hits_addend: 0,
        };
        let mut codes = Vec::new();
        for (key, hits) in [("paid", 8), ("paid", 0), ("plain", 8), ("plain", 0)] {
            let r = client.should_rate_limit(one(key, hits)).await.unwrap();
            codes.push(r.into_inner().overall_code);
        }
        assert_eq!(codes, [2, 2, 2, 2]);
    });
}

#[test]
fn with_redis_down_each_policy_decides_a_quota_as_it_decides_a_take() {
    // (RL_ON_ERROR, the status of a quota-only request with Redis killed)
    let cases = [
        // The call fails: 503 over /json.
        ("error", 503),
        // Let through, nothing charged.
        ("open", 200),
        // Refused: a charge the policy did not apply still refuses, as a take does.
        ("closed", 429),
        // The local bucket: 8 on 7 (RL_INSTANCES=1) leaves it in debt, refused.
        ("local", 429),
    ];
    for (policy, status) in cases {
        let (mut redis, svc) = start(&[("RL_ON_ERROR", policy), ("RL_TIMEOUT_MS", "2000")]);
        // The first call reaches Redis, so the service knows the module before the outage.
        assert_eq!(svc.json(&request(&[("tokens", "u", Some(0))])).status, 200);
        redis.kill();
        let r = svc.json(&request(&[("tokens", "u", Some(8))]));
        assert_eq!(r.status, status, "{policy}: {}", r.body);
    }
}

#[test]
fn on_a_plain_redis_the_lua_script_charges_the_same() {
    let redis = PlainRedis::start();
    let svc = Service::start(
        &format!("127.0.0.1:{}", redis.port),
        &[("q.yaml", QUOTA)],
        &[],
    );
    let both = request(&[("service", "s1", None), ("service", "s2", None)]);
    let statuses: Vec<u16> = (0..3).map(|_| svc.json(&both).status).collect();
    assert_eq!(statuses, [200, 200, 429], "{}", svc.log());
    assert_eq!(svc.json(&request(&[("tokens", "u", Some(9))])).status, 429);
    assert_eq!(svc.json(&request(&[("tokens", "u", Some(0))])).status, 429);
    assert!(
        svc.metric(r#"redis_rl_envoy_decisions_total{source="lua"}"#) > 0,
        "{}",
        svc.metrics()
    );
}
