//! `MEMORY USAGE`: a state with a fraction of a nanosecond costs 16 bytes more, through
//! `RESTORE`, `COPY` and a reload, and gives them back when overwritten by a whole one.

use redis::Connection;

use crate::buckets::{assert_no_crash, FIXED_FRAC};
use crate::common::{acquire, dump, pexpiretime, Server};
use crate::fixtures::FIXTURE_FULL_AT_NS;
use crate::format::set_state;

/// `MEMORY USAGE key`.
fn memory_usage(con: &mut Connection, key: &[u8]) -> i64 {
    redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(key)
        .query(con)
        .expect("MEMORY USAGE")
}

#[test]
fn memory_usage_counts_a_fraction_as_16_bytes_through_every_copy() {
    let server = Server::start();
    let mut con = server.conn();
    // Keys of one length, so only the values differ.
    set_state(&mut con, b"whole", FIXTURE_FULL_AT_NS, None);
    set_state(&mut con, b"fract", FIXTURE_FULL_AT_NS, Some(FIXED_FRAC));
    assert_eq!(acquire(&mut con, b"third", "3", "3000", Some("1000"))[0], 1);
    assert_eq!(
        acquire(&mut con, b"tens_", "10", "10000", Some("5000"))[0],
        1
    );
    let whole = memory_usage(&mut con, b"whole");
    assert_eq!(memory_usage(&mut con, b"fract"), whole + 16, "a fraction");
    assert_eq!(
        memory_usage(&mut con, b"third"),
        whole + 16,
        "RL.ACQUIRE at 3/s"
    );
    assert_eq!(
        memory_usage(&mut con, b"tens_"),
        whole,
        "RL.ACQUIRE at 10/s"
    );
    // Copies and reloads hold the same kind of value.
    let payload = dump(&mut con, b"fract").expect("bucket");
    // With the source's expiry: Valkey 9 counts a key's expiry in its MEMORY USAGE.
    let ok: String = redis::cmd("RESTORE")
        .arg("rest_")
        .arg(pexpiretime(&mut con, b"fract"))
        .arg(&payload)
        .arg("ABSTTL")
        .query(&mut con)
        .expect("RESTORE");
    assert_eq!(ok, "OK");
    let copied: i64 = redis::cmd("COPY")
        .arg("fract")
        .arg("copy_")
        .query(&mut con)
        .expect("COPY");
    assert_eq!(copied, 1);
    assert_eq!(memory_usage(&mut con, b"rest_"), whole + 16, "RESTORE");
    assert_eq!(memory_usage(&mut con, b"copy_"), whole + 16, "COPY");
    let _: () = redis::cmd("DEBUG")
        .arg("RELOAD")
        .query(&mut con)
        .expect("DEBUG RELOAD");
    assert_eq!(memory_usage(&mut con, b"whole"), whole, "whole, reloaded");
    assert_eq!(
        memory_usage(&mut con, b"fract"),
        whole + 16,
        "fraction, reloaded"
    );
    // Overwriting with a whole state gives the 16 bytes back.
    set_state(&mut con, b"fract", FIXTURE_FULL_AT_NS, Some(0));
    assert_eq!(memory_usage(&mut con, b"fract"), whole);
    assert_no_crash(&server);
}
