//! RL.SETSTATE, the command that carries a bucket's exact state to replicas and the AOF:
//! every bad argument with its exact error. Its accepted edges are in errors.rs, beside the
//! tables they prove; a client's call travelling verbatim to a replica is in replication.rs,
//! and the permission it needs in acl.rs.

#![cfg(test)]

mod common;

use common::assert_rejected_on_empty_server;
use common::tables::BAD_SETSTATE;

#[test]
fn setstate_rejects_each_bad_argument_with_its_exact_error() {
    assert_rejected_on_empty_server("RL.SETSTATE", BAD_SETSTATE);
}
