//! Many clients on one bucket at once: 50 connections, each on its own thread, released
//! together by a barrier, take from one hot key. The server runs each call as one atomic
//! step, so the bucket gives out exactly its capacity, never a token more, and every allowed
//! call sees its own remaining count. The classic Lua script (bench/token_bucket.lua) is just
//! as atomic under the same load; a test documents that parity.
//!
//! Time: the rate is 0.000001 token/s, so a refill of one token takes over eleven days and
//! cannot change a count during a test. The script gets one `now_ms`, read once from the
//! server's TIME, for every call. Nothing here asserts a duration.

#![cfg(test)]

mod common;

use std::sync::Barrier;

use common::lua::{load_script, lua_acquire};
use common::{acquire, exists, server_time_ms, Server};
use redis::Connection;

/// Client connections, one thread each.
const CLIENTS: usize = 50;
/// Calls each client makes: 5000 in all, five times the capacity.
const CALLS_PER_CLIENT: usize = 100;
/// Tokens in the bucket.
const CAPACITY: i64 = 1000;
/// Too slow to refill a token during a test.
const RATE: &str = "0.000001";

/// Opens `CLIENTS` connections, then runs `CALLS_PER_CLIENT` calls of `call` on each, all
/// threads starting together. Returns every `[allowed, remaining]` reply.
fn hammer<F>(server: &Server, call: F) -> Vec<[i64; 2]>
where
    F: Fn(&mut Connection) -> [i64; 2] + Sync,
{
    // Connect first, so the barrier releases clients that are all ready to send.
    let connections: Vec<Connection> = (0..CLIENTS).map(|_| server.conn()).collect();
    let barrier = Barrier::new(CLIENTS);
    std::thread::scope(|scope| {
        let threads: Vec<_> = connections
            .into_iter()
            .map(|mut con| {
                let (barrier, call) = (&barrier, &call);
                scope.spawn(move || {
                    barrier.wait();
                    (0..CALLS_PER_CLIENT)
                        .map(|_| call(&mut con))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|t| t.join().expect("client thread"))
            .collect()
    })
}

/// Asserts that exactly `CAPACITY` calls were allowed, each leaving a different remaining
/// count (999 down to 0: no two calls saw the same state), and every other call was denied
/// with 0 remaining.
fn assert_exactly_capacity(replies: &[[i64; 2]], what: &str) {
    assert_eq!(replies.len(), CLIENTS * CALLS_PER_CLIENT);
    let mut remaining: Vec<i64> = replies.iter().filter(|r| r[0] == 1).map(|r| r[1]).collect();
    let denied: Vec<&[i64; 2]> = replies.iter().filter(|r| r[0] != 1).collect();
    assert_eq!(
        remaining.len() as i64,
        CAPACITY,
        "{what}: allowed calls (of {})",
        replies.len()
    );
    assert_eq!(denied.len(), replies.len() - CAPACITY as usize);
    assert!(
        denied.iter().all(|r| **r == [0, 0]),
        "{what}: a denial with tokens left: {:?}",
        denied.iter().find(|r| ***r != [0, 0])
    );
    remaining.sort_unstable();
    assert_eq!(
        remaining,
        (0..CAPACITY).collect::<Vec<_>>(),
        "{what}: two allowed calls saw the same bucket"
    );
}

#[test]
fn concurrent_clients_take_exactly_capacity() {
    let server = Server::start();
    let capacity = CAPACITY.to_string();
    let replies = hammer(&server, |con| {
        let reply = acquire(con, b"hot", RATE, &capacity, None);
        [reply[0], reply[1]]
    });
    assert_exactly_capacity(&replies, "RL.ACQUIRE");

    // The bucket is empty and still there; a cost-0 read says so without writing.
    let mut con = server.conn();
    let after = acquire(&mut con, b"hot", RATE, &capacity, Some("0"));
    assert_eq!(
        after[..3],
        [1, 0, 0],
        "cost 0 on the drained bucket: {after:?}"
    );
    assert!(after[3] > 0, "a drained bucket is not full: {after:?}");
    server.assert_alive();
}

#[test]
fn lua_baseline_also_takes_exactly_capacity_under_concurrency() {
    let server = Server::start();
    let mut con = server.conn();
    let sha = load_script(&mut con);
    // One instant for every call: the script trusts the client's clock, and with this rate
    // the clock could not add a token anyway.
    let now_ms = server_time_ms(&mut con);
    let capacity = CAPACITY.to_string();

    let replies = hammer(&server, |con| {
        lua_acquire(con, &sha, "hot", RATE, &capacity, now_ms, None)
    });
    assert_exactly_capacity(&replies, "the Lua script");

    let tokens: Option<String> = redis::cmd("HGET")
        .arg("hot")
        .arg("tokens")
        .query(&mut con)
        .expect("HGET");
    assert_eq!(tokens.as_deref(), Some("0"));
    assert!(exists(&mut con, b"hot"));
}
