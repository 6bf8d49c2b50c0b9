//! RL.REFUND against a real server: tokens given back, capped at capacity, a full bucket
//! deleted, a missing key left missing, and every bad argument with its exact error.
//!
//! Time: rates are 0.001 token/s, so refill cannot change a reply during a test; the expiry
//! is compared as an exact relation (moved by exactly the refunded time), never a duration.

#![cfg(test)]

mod common;

use common::rl::{acquire, peek, refund};
use common::tables::limit_rows;
use common::{assert_rejected_on_empty_server, dbsize, exists, pexpiretime, snapshot, Server};

#[test]
fn refund_gives_tokens_back_capped_at_capacity() {
    let server = Server::start();
    let mut con = server.conn();
    assert_eq!(
        acquire(&mut con, &["k", "0.001", "5", "3"]),
        [1, 2, 0, 3_000_000]
    );
    let expire_at = pexpiretime(&mut con, b"k");

    // One token back: one token's refill (1000 s) earlier, exactly.
    let [remaining, reset] = refund(&mut con, &["k", "0.001", "5"])[..] else {
        unreachable!()
    };
    assert_eq!(remaining, 3);
    assert!(reset > 1_000_000 && reset <= 2_000_000, "reset {reset}");
    assert_eq!(pexpiretime(&mut con, b"k"), expire_at - 1_000_000);
    // Fractions too.
    assert_eq!(refund(&mut con, &["k", "0.001", "5", "1.5"])[0], 4);
    assert_eq!(pexpiretime(&mut con, b"k"), expire_at - 2_500_000);
    // Not full yet (half a token short): the key stays, the other half of "deletes exactly
    // when full".
    assert!(
        exists(&mut con, b"k"),
        "a bucket short of full must not be deleted"
    );

    // Cost 0 changes nothing.
    let before = snapshot(&mut con);
    assert_eq!(refund(&mut con, &["k", "0.001", "5", "0"])[0], 4);
    assert_eq!(snapshot(&mut con), before);

    // More than was taken: capped at capacity, and a full bucket is a missing key.
    assert_eq!(refund(&mut con, &["k", "0.001", "5", "100"]), [5, 0]);
    assert!(!exists(&mut con, b"k"), "a full bucket must be deleted");
    assert_eq!(peek(&mut con, &["k", "0.001", "5"]), [1, 5, 0, 0]);

    // A thousandth of a token short of full keeps the key; back to full deletes it.
    acquire(&mut con, &["e", "0.001", "5", "2"]);
    assert_eq!(refund(&mut con, &["e", "0.001", "5", "1.999"])[0], 4);
    assert!(exists(&mut con, b"e"), "deleted while still short of full");
    assert_eq!(refund(&mut con, &["e", "0.001", "5", "1"]), [5, 0]);
    assert!(!exists(&mut con, b"e"));
    acquire(&mut con, &["f", "0.001", "5", "2"]);
    assert_eq!(refund(&mut con, &["f", "0.001", "5", "2"]), [5, 0]);
    assert!(!exists(&mut con, b"f"));
}

#[test]
fn refund_of_a_missing_key_creates_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    for cost in ["1", "0", "100"] {
        assert_eq!(
            refund(&mut con, &["m", "0.001", "5", cost]),
            [5, 0],
            "cost {cost}"
        );
    }
    assert_eq!(refund(&mut con, &["m", "0.001", "5"]), [5, 0]);
    assert_eq!(dbsize(&mut con), 0);
}

#[test]
fn refund_rejects_each_bad_argument_with_its_exact_error() {
    assert_rejected_on_empty_server("RL.REFUND", &limit_rows("RL.REFUND"));
}
