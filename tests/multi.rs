//! RL.ACQUIRE.MULTI at its size limit, against a real server: the documented cap on buckets
//! per call (at the cap allowed, one more refused with an error naming the cap, nothing
//! written), keys named many times in one call seeing their own takes, and the server time of
//! a call at the cap.
//!
//! The cap is read from the server, not copied here: a call far above any sane cap answers an
//! error that names it, and `COMMAND DOCS` must state the same number. The test then holds the
//! server to it in both directions.
//!
//! Time: rates are 0.001 token/s, so refill cannot change a reply during a test. The one
//! timing assert is a generous bound on the server's own time (`INFO commandstats`) for a
//! call at the cap, the best of three calls so a preempted one does not count; the measured
//! figure is in bench/results.md.

mod common;

use common::info::info;
use common::{dbsize, dump, error_text, Server};
use redis::{Connection, Value};

/// Server time a call at the cap must stay under (debug build, loaded machine). The release
/// build measures about 1 ms for 1,000 new buckets; a quadratic or blocking path at 100,000
/// took seconds.
const CAP_CALL_BOUND_US: f64 = 100_000.0;

/// `key 0.001 capacity 1` for each key, as one RL.ACQUIRE.MULTI.
fn multi_cmd(keys: &[String], capacity: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("RL.ACQUIRE.MULTI");
    for key in keys {
        cmd.arg(key).arg("0.001").arg(capacity).arg("1");
    }
    cmd
}

/// The reply of an RL.ACQUIRE.MULTI: allowed, refused index, retry, per-bucket replies.
fn multi(con: &mut Connection, cmd: &redis::Cmd) -> (i64, i64, i64, Vec<[i64; 4]>) {
    cmd.query(con).expect("RL.ACQUIRE.MULTI reply")
}

/// `n` distinct keys sharing one hash tag, as a cluster would need.
fn keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{{{prefix}}}:{i}")).collect()
}

/// The cap as the server states it: the number in "at most N buckets" of the error for a call
/// far above any reasonable cap.
fn stated_cap(con: &mut Connection) -> usize {
    let text = error_text(con, &multi_cmd(&keys("probe", 100_000), "10"));
    let cap = text
        .strip_prefix("ERR RL.ACQUIRE.MULTI takes at most ")
        .and_then(|rest| rest.split_once(" buckets"))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("100,000 buckets did not get the cap error: {text}"));
    assert_eq!(dbsize(con), 0, "the refused call wrote");
    cap
}

#[test]
fn multi_allows_exactly_the_documented_number_of_buckets() {
    let server = Server::start();
    let mut con = server.conn();
    let cap = stated_cap(&mut con);
    assert!(
        (100..=100_000).contains(&cap),
        "a cap of {cap} buckets is outside any sensible range"
    );

    // COMMAND DOCS states the same cap in its complexity (Redis 7.0+ has COMMAND DOCS).
    let docs: Value = redis::cmd("COMMAND")
        .arg("DOCS")
        .arg("RL.ACQUIRE.MULTI")
        .query(&mut con)
        .expect("COMMAND DOCS");
    let docs = format!("{docs:?}");
    assert!(
        docs.contains("O(N log N)") && docs.contains(&format!("at most {cap} per call")),
        "COMMAND DOCS does not state the complexity and the cap of {cap}: {docs}"
    );

    // Some buckets exist before the refused calls: none of them may change.
    let existing = keys("t", 3);
    let (allowed, ..) = multi(&mut con, &multi_cmd(&existing, "10"));
    assert_eq!(allowed, 1);
    let before: Vec<Option<Vec<u8>>> = existing
        .iter()
        .map(|k| dump(&mut con, k.as_bytes()))
        .collect();

    // One more than the cap, the existing buckets first: refused whole, whatever the
    // arguments, before any is parsed (a bad rate in the last group gets the cap error too).
    let mut over = existing.clone();
    over.extend(keys("t", cap + 1).into_iter().skip(existing.len()));
    assert_eq!(over.len(), cap + 1);
    let want = format!(
        "ERR RL.ACQUIRE.MULTI takes at most {cap} buckets (key rate capacity cost groups) per call"
    );
    assert_eq!(error_text(&mut con, &multi_cmd(&over, "10")), want);
    let mut bad_rate = multi_cmd(&over, "10");
    bad_rate.arg("{t}:bad").arg("x").arg("10").arg("1");
    assert_eq!(error_text(&mut con, &bad_rate), want);
    assert_eq!(
        dbsize(&mut con),
        existing.len() as i64,
        "a refused call created keys"
    );
    let after: Vec<Option<Vec<u8>>> = existing
        .iter()
        .map(|k| dump(&mut con, k.as_bytes()))
        .collect();
    assert_eq!(after, before, "a refused call changed an existing bucket");

    // Exactly the cap: allowed, every bucket taken once. The existing ones had one token taken
    // already, so each reply's `remaining` is the capacity minus the takes of that key.
    let at_cap = &over[..cap];
    let (allowed, refused_index, retry_after_ms, buckets) =
        multi(&mut con, &multi_cmd(at_cap, "10"));
    assert_eq!((allowed, refused_index, retry_after_ms), (1, -1, 0));
    assert_eq!(buckets.len(), cap);
    for (i, bucket) in buckets.iter().enumerate() {
        let takes = if i < existing.len() { 2 } else { 1 };
        assert_eq!(bucket[..3], [1, 10 - takes, 0], "bucket {i}: {bucket:?}");
    }
    assert_eq!(dbsize(&mut con), cap as i64);
    server.assert_alive();
}

#[test]
fn multi_at_the_cap_sees_its_own_takes_of_keys_named_many_times() {
    let server = Server::start();
    let mut con = server.conn();
    let cap = stated_cap(&mut con);
    // `cap` groups over 7 keys, named in a scattered order (i * 3 mod 7), so that equal names
    // are never adjacent in the arguments. Each key's capacity is exactly how often it is
    // named: the call is allowed and every key ends empty.
    const KEYS: usize = 7;
    let key_of = |i: usize| format!("{{d}}:{}", (i * 3) % KEYS);
    let named = |k: usize| (0..cap).filter(|&i| (i * 3) % KEYS == k).count();
    let mut cmd = redis::cmd("RL.ACQUIRE.MULTI");
    for i in 0..cap {
        let capacity = named((i * 3) % KEYS).to_string();
        cmd.arg(key_of(i)).arg("0.001").arg(capacity).arg("1");
    }
    let (allowed, refused_index, _, buckets) = multi(&mut con, &cmd);
    assert_eq!((allowed, refused_index), (1, -1));
    // The n-th naming of a key (from 1) leaves its capacity minus n.
    let mut seen = [0i64; KEYS];
    for (i, bucket) in buckets.iter().enumerate() {
        let k = (i * 3) % KEYS;
        seen[k] += 1;
        let want_remaining = named(k) as i64 - seen[k];
        assert_eq!(bucket[..3], [1, want_remaining, 0], "group {i}: {bucket:?}");
    }
    assert_eq!(dbsize(&mut con), KEYS as i64);

    // The same shape on new keys, but key 0 gets one token less than it is named: every
    // group is allowed on its own until key 0's last naming, which finds its own earlier takes
    // have emptied it. The call is refused there, and nothing is written.
    let short_key = 0;
    let mut cmd = redis::cmd("RL.ACQUIRE.MULTI");
    for i in 0..cap {
        let k = (i * 3) % KEYS;
        let capacity = named(k) - usize::from(k == short_key);
        cmd.arg(format!("{{e}}:{k}"))
            .arg("0.001")
            .arg(capacity.to_string())
            .arg("1");
    }
    let (allowed, refused_index, retry_after_ms, buckets) = multi(&mut con, &cmd);
    let last_naming = (0..cap)
        .rev()
        .find(|&i| (i * 3) % KEYS == short_key)
        .expect("key 0 is named");
    assert_eq!((allowed, refused_index), (0, last_naming as i64));
    assert_eq!(
        buckets[last_naming][..2],
        [0, 0],
        "{:?}",
        buckets[last_naming]
    );
    assert!(retry_after_ms > 0, "a wait for a refill, not impossible");
    assert_eq!(dbsize(&mut con), KEYS as i64, "a refused call created keys");
}

/// `usec_per_call` of RL.ACQUIRE.MULTI in `INFO commandstats`.
fn usec_per_call(con: &mut Connection) -> f64 {
    let text = info(con, "commandstats");
    let line = text
        .lines()
        .find(|l| {
            l.to_ascii_lowercase()
                .starts_with("cmdstat_rl.acquire.multi:")
        })
        .unwrap_or_else(|| panic!("no RL.ACQUIRE.MULTI in INFO commandstats:\n{text}"));
    line.split([':', ','])
        .find_map(|kv| kv.strip_prefix("usec_per_call="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no usec_per_call in {line}"))
}

#[test]
fn multi_at_the_cap_takes_little_server_time() {
    let server = Server::start();
    let mut con = server.conn();
    let cap = stated_cap(&mut con);
    // New buckets each time: the most work a call can do (a create and a write per bucket).
    let best_us = (0..3)
        .map(|round| {
            let _: () = redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query(&mut con)
                .expect("CONFIG RESETSTAT");
            let (allowed, ..) = multi(&mut con, &multi_cmd(&keys(&format!("r{round}"), cap), "5"));
            assert_eq!(allowed, 1);
            usec_per_call(&mut con)
        })
        .fold(f64::INFINITY, f64::min);
    assert!(
        best_us < CAP_CALL_BOUND_US,
        "an RL.ACQUIRE.MULTI of {cap} new buckets took {best_us} µs of server time"
    );
    // Sanity: the call did its work (3 rounds of cap new keys).
    assert_eq!(dbsize(&mut con), 3 * cap as i64);
}

/// Every string in a reply, in order (COMMAND DOCS is nested arrays or maps of strings).
fn strings(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::BulkString(bytes) => out.push(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(s) => out.push(s.clone()),
        Value::Array(items) | Value::Set(items) => items.iter().for_each(|v| strings(v, out)),
        Value::Map(pairs) => pairs.iter().for_each(|(k, v)| {
            strings(k, out);
            strings(v, out);
        }),
        _ => {}
    }
}

#[test]
fn every_command_states_its_complexity_and_version() {
    let server = Server::start();
    let mut con = server.conn();
    // The one command whose work grows with its arguments says how; the others are O(1).
    // `since` is the release that added the command: RL.GCRA came in 0.2.0.
    let want = [
        ("RL.ACQUIRE", "O(1)", "0.1.0"),
        ("RL.PEEK", "O(1)", "0.1.0"),
        ("RL.THROTTLE", "O(1)", "0.1.0"),
        ("RL.GCRA", "O(1)", "0.2.0"),
        ("RL.REFUND", "O(1)", "0.1.0"),
        ("RL.SETSTATE", "O(1)", "0.1.0"),
        ("RL.ACQUIRE.MULTI", "O(N log N) ", "0.1.0"),
    ];
    for (name, prefix, since) in want {
        let docs: Value = redis::cmd("COMMAND")
            .arg("DOCS")
            .arg(name)
            .query(&mut con)
            .expect("COMMAND DOCS");
        let mut words = Vec::new();
        strings(&docs, &mut words);
        let field = |field: &str| {
            words
                .iter()
                .position(|w| w == field)
                .and_then(|i| words.get(i + 1))
                .unwrap_or_else(|| panic!("COMMAND DOCS {name} has no {field}: {words:?}"))
        };
        let complexity = field("complexity");
        assert!(complexity.starts_with(prefix), "{name}: {complexity}");
        assert_eq!(field("since"), since, "{name}: {words:?}");
    }
}
