//! The module's pure lease and reservation steps agree with the shared vectors,
//! `clients/vectors/lease.json` and `clients/vectors/reserve.json`: every step of every case,
//! from a missing key, with the key's value carried over as the module stores it (a bucket
//! deleted by a refund or a settle takes its records with it).
//!
//! The vectors come from exact models (clients/vectors/lease_generate.py) that the Lua
//! fallback is held to as well, so the module and the fallback answer alike.

#![cfg(test)]

use rl_bucket::{
    acquire, charge, lease, leases_in_use, refund, release, renew, reserve, settle_reservation,
    Change, Cost, LeaseId, LeaseOutcome, LeaseSet, Limit, Reservation, State,
};
use serde_json::{json, Value};

fn vectors(name: &str) -> Vec<Value> {
    let path = format!(
        "{}/../../clients/vectors/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).expect("read the vectors");
    let doc: Value = serde_json::from_str(&text).expect("vectors are JSON");
    assert_eq!(doc["format"], 1, "unknown vector format");
    doc["cases"].as_array().expect("cases").clone()
}

fn id(step: &Value) -> LeaseId {
    LeaseId::new(step["id"].as_str().expect("id").as_bytes()).expect("a valid id")
}

fn text(value: &Value) -> &[u8] {
    value.as_str().expect("a decimal string").as_bytes()
}

fn shown(id: LeaseId) -> String {
    String::from_utf8(id.as_bytes().to_vec()).expect("the vectors' ids are text")
}

#[test]
fn every_lease_step_matches() {
    let mut checked = 0;
    for case in vectors("lease.json") {
        let name = case["name"].as_str().expect("name");
        let mut set = LeaseSet::new();
        for (i, step) in case["steps"].as_array().expect("steps").iter().enumerate() {
            let now = step["now_us"].as_u64().expect("now_us");
            let (got, change) = match step["op"].as_str().expect("op") {
                "lease" => {
                    let limit = step["limit"].as_u64().expect("limit");
                    let ttl = step["ttl_ms"].as_u64().expect("ttl_ms");
                    let (reply, change) = lease(Some(&set), limit, now, ttl, id(step));
                    let held = reply.outcome != LeaseOutcome::Denied;
                    let shown_id = if held { shown(id(step)) } else { String::new() };
                    (
                        json!([u8::from(held), shown_id, reply.in_use, reply.wait_ms()]),
                        change,
                    )
                }
                "release" => {
                    let (held, change) = release(Some(&set), now, id(step));
                    (json!(u8::from(held)), change)
                }
                "renew" => {
                    let ttl = step["ttl_ms"].as_u64().expect("ttl_ms");
                    let (held, change) = renew(Some(&set), now, id(step), ttl);
                    (json!(u8::from(held)), change)
                }
                "leases" => {
                    let limit = step["limit"].as_u64().expect("limit");
                    let (in_use, wait_us) = leases_in_use(Some(&set), limit, now);
                    (json!([in_use, wait_us.div_ceil(1000)]), None)
                }
                other => panic!("{name}: unknown op {other}"),
            };
            if let Some(change) = change {
                set.apply(&change).expect("a change within the caps");
            }
            assert_eq!(got, step["expect"], "{name}, step {i}: {step}");
            checked += 1;
        }
    }
    assert!(checked >= 40, "only {checked} lease steps");
}

#[test]
fn every_reservation_step_matches() {
    let mut checked = 0;
    for case in vectors("reserve.json") {
        let name = case["name"].as_str().expect("name");
        let limit = Limit::parse(text(&case["rate"]), text(&case["capacity"])).expect("limit");
        let mut state: Option<State> = None;
        let mut records: Vec<Reservation> = Vec::new();
        for (i, step) in case["steps"].as_array().expect("steps").iter().enumerate() {
            let now = step["now_us"].as_u64().expect("now_us");
            let apply = |change: Change, state: &mut Option<State>| match change {
                Change::Keep => {}
                Change::Set(s) => *state = Some(s),
                Change::Delete => *state = None,
            };
            let got = match step["op"].as_str().expect("op") {
                "reserve" => {
                    let estimate = Cost::parse(text(&step["estimate"])).expect("estimate");
                    let ttl = step["ttl_ms"].as_u64().expect("ttl_ms");
                    let got = reserve(&limit, state, &records, now, estimate, ttl, id(step))
                        .expect("a reserve within the caps");
                    if let Some((s, r)) = got.write {
                        state = Some(s);
                        records = r.into_vec();
                    }
                    let d = got.decision;
                    let shown_id = if d.allowed() {
                        shown(id(step))
                    } else {
                        String::new()
                    };
                    json!([
                        u8::from(d.allowed()),
                        shown_id,
                        d.remaining,
                        d.retry_after_ms()
                    ])
                }
                "settle" => {
                    let actual = Cost::parse(text(&step["actual"])).expect("actual");
                    match settle_reservation(&limit, state, &records, now, id(step), actual) {
                        Ok((charged, change, left)) => {
                            apply(change, &mut state);
                            // A bucket deleted (full again) takes its records with it.
                            records = if state.is_some() {
                                left.into_vec()
                            } else {
                                Vec::new()
                            };
                            json!([
                                charged.balance,
                                charged.retry_after_ms(),
                                charged.reset_after_ms()
                            ])
                        }
                        Err(_) => json!({"error": format!(
                            "ERR id {} is not an open reservation of this key (settled, expired or never made)",
                            shown(id(step)))}),
                    }
                }
                "acquire" => {
                    let cost = Cost::parse(text(&step["cost"])).expect("cost");
                    let (d, new_state) = acquire(&limit, state, now, cost);
                    if new_state.is_some() {
                        state = new_state;
                    }
                    json!([
                        u8::from(d.allowed()),
                        d.remaining,
                        d.retry_after_ms(),
                        d.reset_after_ms()
                    ])
                }
                "charge" => {
                    let cost = Cost::parse(text(&step["cost"])).expect("cost");
                    let (c, new_state) = charge(&limit, state, now, cost).expect("within bound");
                    if new_state.is_some() {
                        state = new_state;
                    }
                    json!([1, c.balance, c.retry_after_ms(), c.reset_after_ms()])
                }
                "refund" => {
                    let cost = Cost::parse(text(&step["cost"])).expect("cost");
                    let (d, change) = refund(&limit, state, now, cost);
                    apply(change, &mut state);
                    if state.is_none() {
                        records.clear();
                    }
                    json!([d.remaining, d.reset_after_ms()])
                }
                other => panic!("{name}: unknown op {other}"),
            };
            assert_eq!(got, step["expect"], "{name}, step {i}: {step}");
            checked += 1;
        }
    }
    assert!(checked >= 40, "only {checked} reservation steps");
}
