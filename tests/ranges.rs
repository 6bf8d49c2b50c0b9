//! The module's ranges are `clients/vectors/ranges.json`'s, the one statement of them that the
//! client libraries load (Python, Node) or test against (Rust).
//!
//! Every boundary case of the file goes to a real server through each command that takes
//! `rate capacity cost` (RL.ACQUIRE, RL.PEEK, RL.REFUND, RL.ACQUIRE.MULTI). A refused case must
//! get `ERR ` and the file's text for its argument, and write nothing; an accepted one must
//! answer. So a range or a text changed in `src/` without the file (or the other way) fails
//! here, and the libraries, which read the file, cannot drift from the module.
//!
//! Time: nothing here depends on it; only whether a call is refused is compared.

#![cfg(test)]

mod common;

use common::{command, error_text, exists, Server};
use redis::Value;
use serde_json::Value as Json;

fn ranges() -> Json {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/clients/vectors/ranges.json");
    let text = std::fs::read_to_string(path).expect("read clients/vectors/ranges.json");
    serde_json::from_str(&text).expect("ranges.json is JSON")
}

fn text<'a>(value: &'a Json, what: &str) -> &'a str {
    value
        .as_str()
        .unwrap_or_else(|| panic!("{what} is not a string"))
}

#[test]
fn every_boundary_case_gets_the_shared_answer_from_every_command() {
    let doc = ranges();
    let cases = doc["cases"].as_array().expect("cases");
    // A truncated file must not pass quietly.
    assert!(cases.len() >= 20, "only {} cases", cases.len());
    let server = Server::start();
    let mut con = server.conn();
    let mut refused = 0;
    for (i, case) in cases.iter().enumerate() {
        let name = text(&case["name"], "name");
        let rate = text(&case["rate"], "rate").as_bytes();
        let capacity = text(&case["capacity"], "capacity").as_bytes();
        let cost = text(&case["cost"], "cost").as_bytes();
        let want = match &case["error"] {
            Json::Null => None,
            argument => {
                let argument = text(argument, "error");
                Some(format!("ERR {}", text(&doc[argument]["error"], argument)))
            }
        };
        for name_of_command in ["RL.ACQUIRE", "RL.PEEK", "RL.REFUND", "RL.ACQUIRE.MULTI"] {
            let key = format!("case{i}:{name_of_command}");
            let cmd = command(name_of_command, &[key.as_bytes(), rate, capacity, cost]);
            match &want {
                Some(want) => {
                    assert_eq!(
                        &error_text(&mut con, &cmd),
                        want,
                        "{name_of_command}, {name}: {case}"
                    );
                    assert!(
                        !exists(&mut con, key.as_bytes()),
                        "{name_of_command}, {name}: a refused call wrote {key}"
                    );
                    refused += 1;
                }
                None => {
                    let reply = cmd.query::<Value>(&mut con);
                    assert!(reply.is_ok(), "{name_of_command}, {name}: {reply:?}");
                }
            }
        }
    }
    assert!(refused > 0);
    let pong: String = redis::cmd("PING").query(&mut con).expect("PING");
    assert_eq!(pong, "PONG");
}

#[test]
fn the_test_tables_texts_are_the_files() {
    // tests/common/texts.rs names these for every command family's tables: one statement.
    let doc = ranges();
    for (argument, text) in [
        ("rate", common::texts::RATE),
        ("capacity", common::texts::CAPACITY),
        ("refill", common::texts::REFILL),
        ("cost", common::texts::COST),
    ] {
        assert_eq!(
            text.strip_prefix("ERR "),
            doc[argument]["error"].as_str(),
            "{argument}"
        );
    }
}

#[test]
fn the_files_texts_are_the_modules_replies_for_each_argument() {
    // The four texts, each provoked by a value far out of range, so the check holds whatever
    // the boundary cases cover.
    let doc = ranges();
    let server = Server::start();
    let mut con = server.conn();
    let rows: [(&[&[u8]], &str); 4] = [
        (&[b"k", b"1e10", b"1", b"1"], "rate"),
        (&[b"k", b"1", b"1e16", b"1"], "capacity"),
        (&[b"k", b"0.000001", b"1000000", b"1"], "refill"),
        (&[b"k", b"1", b"1", b"-5"], "cost"),
    ];
    for (args, argument) in rows {
        let want = format!("ERR {}", text(&doc[argument]["error"], argument));
        assert_eq!(
            error_text(&mut con, &command("RL.ACQUIRE", args)),
            want,
            "{argument}"
        );
    }
}
