//! The module's commands as functions: the arguments after the name as text, the reply as
//! integers (an error reply fails the test, naming the call).

use redis::Connection;

use super::ints;

/// `RL.ACQUIRE args…`.
pub fn acquire(con: &mut Connection, args: &[&str]) -> Vec<i64> {
    ints(con, "RL.ACQUIRE", args)
}

/// `RL.PEEK args…`.
pub fn peek(con: &mut Connection, args: &[&str]) -> Vec<i64> {
    ints(con, "RL.PEEK", args)
}

/// `RL.THROTTLE args…`.
pub fn throttle(con: &mut Connection, args: &[&str]) -> Vec<i64> {
    ints(con, "RL.THROTTLE", args)
}

/// `RL.REFUND args…`.
pub fn refund(con: &mut Connection, args: &[&str]) -> Vec<i64> {
    ints(con, "RL.REFUND", args)
}

/// `RL.CHARGE args…`.
pub fn charge(con: &mut Connection, args: &[&str]) -> Vec<i64> {
    ints(con, "RL.CHARGE", args)
}

/// `RL.HCHARGE args…`.
pub fn hcharge(con: &mut Connection, args: &[&str]) -> Vec<i64> {
    ints(con, "RL.HCHARGE", args)
}

/// `RL.HPEEK args…`.
pub fn hpeek(con: &mut Connection, args: &[&str]) -> Vec<i64> {
    ints(con, "RL.HPEEK", args)
}

/// `RL.HACQUIRE args…`.
pub fn hacquire(con: &mut Connection, args: &[&str]) -> Vec<i64> {
    ints(con, "RL.HACQUIRE", args)
}

/// `RL.GCRA args…`.
pub fn gcra(con: &mut Connection, args: &[&str]) -> Vec<i64> {
    ints(con, "RL.GCRA", args)
}

/// `RL.ACQUIRE.MULTI`'s reply.
#[derive(Debug, PartialEq)]
pub struct Multi {
    pub allowed: i64,
    pub refused_index: i64,
    pub retry_after_ms: i64,
    pub buckets: Vec<Vec<i64>>,
}

/// `RL.ACQUIRE.MULTI args…`.
pub fn multi(con: &mut Connection, args: &[&str]) -> Multi {
    let (allowed, refused_index, retry_after_ms, buckets): (i64, i64, i64, Vec<Vec<i64>>) =
        redis::cmd("RL.ACQUIRE.MULTI")
            .arg(args)
            .query(con)
            .unwrap_or_else(|e| panic!("RL.ACQUIRE.MULTI {args:?}: {e}"));
    for bucket in &buckets {
        assert_eq!(bucket.len(), 4, "each bucket's reply is 4 integers");
    }
    Multi {
        allowed,
        refused_index,
        retry_after_ms,
        buckets,
    }
}
