//! The module's pure bucket agrees with the shared vectors, `clients/vectors/bucket.json`: every
//! step of every case, from a missing key, with the state carried over as the module stores it.
//!
//! The vectors come from an exact-rational model (clients/vectors/generate.py) that every
//! client library's in-process bucket is held to as well, so all implementations answer alike.

#![cfg(test)]

use rl_bucket::{acquire, charge, peek, refund, Change, Cost, Limit, State};
use serde_json::Value;

fn vectors() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../clients/vectors/bucket.json"
    );
    let text = std::fs::read_to_string(path).expect("read clients/vectors/bucket.json");
    let doc: Value = serde_json::from_str(&text).expect("vectors are JSON");
    assert_eq!(doc["format"], 1, "unknown vector format");
    doc
}

/// A vector's number: a decimal string (and `rate` may be `N/S`), read exactly as the module
/// reads its arguments.
fn text(value: &Value) -> &[u8] {
    value.as_str().expect("a decimal string").as_bytes()
}

#[test]
fn every_step_of_every_case_matches() {
    let doc = vectors();
    let cases = doc["cases"].as_array().expect("cases");
    assert!(!cases.is_empty());
    let mut steps_checked = 0;
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let limit = Limit::parse(text(&case["rate"]), text(&case["capacity"]))
            .unwrap_or_else(|e| panic!("{name}: limit rejected: {e:?}"));
        let mut state: Option<State> = None;
        for (i, step) in case["steps"].as_array().expect("steps").iter().enumerate() {
            let now_us = step["now_us"].as_u64().expect("now_us");
            let cost = Cost::parse(text(&step["cost"])).expect("cost");
            let expect: Vec<i64> = step["expect"]
                .as_array()
                .expect("expect")
                .iter()
                .map(|x| x.as_i64().expect("integer"))
                .collect();
            let got = match step["op"].as_str().expect("op") {
                "acquire" => {
                    let (d, new_state) = acquire(&limit, state, now_us, cost);
                    if new_state.is_some() {
                        state = new_state;
                    }
                    reply(&d)
                }
                // A peek reports the signed balance, negative while in debt.
                "peek" => {
                    let d = peek(&limit, state, now_us, cost);
                    vec![
                        i64::from(d.allowed()),
                        d.balance,
                        d.retry_after_ms(),
                        d.reset_after_ms(),
                    ]
                }
                "charge" => match charge(&limit, state, now_us, cost) {
                    Ok((charged, new_state)) => {
                        if new_state.is_some() {
                            state = new_state;
                        }
                        vec![
                            1,
                            charged.balance,
                            charged.retry_after_ms(),
                            charged.reset_after_ms(),
                        ]
                    }
                    // The vectors write a refused charge as an empty reply.
                    Err(_) => vec![],
                },
                "refund" => {
                    let (d, change) = refund(&limit, state, now_us, cost);
                    match change {
                        Change::Keep => {}
                        Change::Set(s) => state = Some(s),
                        Change::Delete => state = None,
                    }
                    vec![d.remaining as i64, d.reset_after_ms()]
                }
                other => panic!("{name}: unknown op {other}"),
            };
            assert_eq!(got, expect, "{name}, step {i}: {step}");
            steps_checked += 1;
        }
    }
    // The file holds 145 steps today; a truncated file must not pass quietly.
    assert!(steps_checked >= 100, "only {steps_checked} steps");
}

fn reply(d: &rl_bucket::Decision) -> Vec<i64> {
    vec![
        i64::from(d.allowed()),
        d.remaining as i64,
        d.retry_after_ms(),
        d.reset_after_ms(),
    ]
}
