//! Valkey 9's atomic slot migration (`CLUSTER MIGRATESLOTS`) of a table, on a real six-node
//! cluster: the source sends the slot as an AOF-format snapshot (the table type's
//! `aof_rewrite`, so `RL.HSETSTATE` by tag), and the target then holds the table
//! `DUMP`- and `PEXPIRETIME`-identical, and answers for its fields exactly as the source did.
//!
//! Servers without the feature (Redis, Valkey before 9) skip the test with a printed reason:
//! `CLUSTER MIGRATESLOTS` is unknown there.
//!
//! Time: the buckets refill one token in 1024 s and the migrated table is only read, so no
//! bucket changes during the test. Waits poll up to a deadline; nothing asserts a duration.

#![cfg(test)]

mod common;

use std::thread::sleep;
use std::time::{Duration, Instant};

use common::cluster::Cluster;
use common::{dump, pexpiretime, Server};
use redis::{Connection, Value};

/// One table in one slot, with buckets of both kinds (whole-ns and with a fraction).
const TABLE: &str = "{rl:tasm}:table";
const FIELDS: usize = 600;

fn skip_reason() -> Option<String> {
    let server = Server::start();
    let mut con = server.conn();
    let info: Vec<Value> = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("CLUSTER|MIGRATESLOTS")
        .query(&mut con)
        .expect("COMMAND INFO");
    matches!(info.first(), None | Some(Value::Nil)).then(|| {
        format!(
            "skipped: {} has no CLUSTER MIGRATESLOTS; atomic slot migration is Valkey 9+",
            common::server_binary()
        )
    })
}

/// `RL.HPEEK` of every field, as a client would read them.
fn peek_all(con: &mut Connection) -> Vec<Vec<i64>> {
    let mut pipe = redis::pipe();
    for f in 0..FIELDS {
        let rate = if f % 2 == 0 { "0.0009765625" } else { "0.0003" };
        pipe.cmd("RL.HPEEK")
            .arg(TABLE)
            .arg(format!("field:{f}"))
            .arg(rate)
            .arg("100");
    }
    pipe.query(con).expect("RL.HPEEK")
}

#[test]
fn a_migrated_table_arrives_byte_for_byte() {
    if let Some(reason) = skip_reason() {
        println!("{reason}");
        return;
    }
    let cluster = Cluster::start();
    let slot = cluster.keyslot(TABLE.as_bytes());
    let source = cluster.topology().owner(slot);
    let target = cluster
        .topology()
        .masters()
        .iter()
        .map(|m| m.port)
        .find(|&m| m != source)
        .expect("another master");
    let target_id = cluster.node_id(target);
    let mut on_source = cluster.conn(source);
    let mut on_target = cluster.conn(target);

    // Whole-ns buckets (1/1024 per s) and buckets with a fraction (0.0003 per s).
    let mut pipe = redis::pipe();
    for f in 0..FIELDS {
        let rate = if f % 2 == 0 { "0.0009765625" } else { "0.0003" };
        pipe.cmd("RL.HACQUIRE")
            .arg(TABLE)
            .arg(format!("field:{f}"))
            .arg(rate)
            .arg("100")
            .arg(1 + f % 7)
            .ignore();
    }
    let _: () = pipe.query(&mut on_source).expect("fill the table");
    let payload = dump(&mut on_source, TABLE.as_bytes()).expect("the table exists");
    let expire_at = pexpiretime(&mut on_source, TABLE.as_bytes());
    let replies = peek_all(&mut on_source);

    let slot_arg = slot.to_string();
    let _: String = redis::cmd("CLUSTER")
        .arg("MIGRATESLOTS")
        .arg("SLOTSRANGE")
        .arg(&slot_arg)
        .arg(&slot_arg)
        .arg("NODE")
        .arg(&target_id)
        .query(&mut on_source)
        .expect("CLUSTER MIGRATESLOTS");
    // The slot has moved once the target serves the table and the source redirects.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let served: redis::RedisResult<i64> =
            redis::cmd("RL.HLEN").arg(TABLE).query(&mut on_target);
        let redirected = redis::cmd("RL.HLEN")
            .arg(TABLE)
            .query::<i64>(&mut on_source)
            .is_err_and(|e| e.to_string().to_ascii_uppercase().contains("MOVED"));
        if served.as_ref().is_ok_and(|&n| n > 0) && redirected {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the slot never moved: target {served:?}"
        );
        sleep(Duration::from_millis(50));
    }
    assert_eq!(dump(&mut on_target, TABLE.as_bytes()), Some(payload));
    assert_eq!(pexpiretime(&mut on_target, TABLE.as_bytes()), expire_at);
    // Every field answers as before (the buckets cannot have refilled a token meanwhile, so
    // `remaining` is equal; the waits only shrink).
    let after = peek_all(&mut on_target);
    for (f, (before, after)) in replies.iter().zip(&after).enumerate() {
        assert_eq!(before[..2], after[..2], "field:{f}");
        assert!(
            after[3] <= before[3],
            "field:{f}: {before:?} then {after:?}"
        );
    }
}
