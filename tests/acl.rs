//! Access control: ACL key patterns and command rules apply to the module's commands like to
//! any write command. An application user confined to `~user:*` can limit `user:*` buckets and
//! nothing else, and a user without `rl.setstate` cannot reset a bucket.
//!
//! The recommended application user names the commands it needs, or removes RL.SETSTATE by
//! name:
//!
//! ```text
//! ACL SETUSER app on >secret ~rl:* +rl.acquire +ping
//! ACL SETUSER app on >secret ~app:* +@all -rl.setstate
//! ```
//!
//! By name, because module commands belong to no ACL category on Redis 7.0: `-@write` does
//! not remove RL.SETSTATE, and `+@write` does not grant RL.ACQUIRE. (Where the server supports
//! module categories, Redis 7.4+ and Valkey, the rate-limit commands also join `@ratelimit`,
//! which leaves RL.SETSTATE and the other internal commands out; the last test here covers
//! that, leases and reservations included.)
//!
//! Time: the rate is 0.000001 token/s, so no bucket gains a token during a test.

#![cfg(test)]

mod common;

use common::info::{info, info_field};
use common::rl;
use common::{acquire, acquire_cmd, dump, error_text, exists, Server};
use redis::Connection;

/// Too slow to refill a token during a test.
const RATE: &str = "0.000001";

/// Runs `ACL SETUSER name rules…` on an admin connection.
fn set_user(admin: &mut Connection, name: &str, rules: &[&str]) {
    let reply: String = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(name)
        .arg(rules)
        .query(admin)
        .unwrap_or_else(|e| panic!("ACL SETUSER {name} {rules:?}: {e}"));
    assert_eq!(reply, "OK");
}

/// A new connection authenticated as `name` with password `pw`.
fn conn_as(server: &Server, name: &str) -> Connection {
    let mut con = server.conn();
    let reply: String = redis::cmd("AUTH")
        .arg(name)
        .arg("pw")
        .query(&mut con)
        .unwrap_or_else(|e| panic!("AUTH {name}: {e}"));
    assert_eq!(reply, "OK");
    con
}

/// `RL.SETSTATE key full_at_ns` as a command.
fn set_state_cmd(key: &str, full_at_ns: i64) -> redis::Cmd {
    let mut cmd = redis::cmd("RL.SETSTATE");
    cmd.arg(key).arg(full_at_ns);
    cmd
}

/// Asserts that `cmd` is refused with NOPERM. The text after the code differs between
/// servers (Redis: "this user has no permissions …", Valkey: "User app has no permissions …",
/// "No permissions to access a key"), so only the code is checked.
fn assert_noperm(con: &mut Connection, cmd: &redis::Cmd, what: &str) {
    let text = error_text(con, cmd);
    assert!(text.starts_with("NOPERM "), "{what}: {text}");
}

#[test]
fn key_patterns_confine_rl_acquire() {
    let server = Server::start();
    let mut admin = server.conn();
    set_user(&mut admin, "app", &["on", ">pw", "~user:*", "+@all"]);
    let mut app = conn_as(&server, "app");

    assert_eq!(acquire(&mut app, b"user:1", RATE, "10", None)[..2], [1, 9]);

    // Outside the pattern: refused before the module runs, whatever the call would do.
    for cost in [None, Some("0"), Some("11")] {
        assert_noperm(
            &mut app,
            &acquire_cmd(b"admin:1", RATE, "10", cost),
            &format!("RL.ACQUIRE admin:1 cost {cost:?}"),
        );
    }
    assert!(
        !exists(&mut admin, b"admin:1"),
        "a refused call created a key"
    );

    // A bucket someone else made is untouched too.
    assert_eq!(
        acquire(&mut admin, b"admin:2", RATE, "10", None)[..2],
        [1, 9]
    );
    let before = dump(&mut admin, b"admin:2");
    assert_noperm(
        &mut app,
        &acquire_cmd(b"admin:2", RATE, "10", None),
        "RL.ACQUIRE admin:2",
    );
    assert_eq!(dump(&mut admin, b"admin:2"), before);
    server.assert_alive();
}

#[test]
fn read_only_key_access_cannot_acquire() {
    // RL.ACQUIRE declares its key read-write: a key pattern that grants reads only is not
    // enough, even for a cost-0 call that writes nothing.
    let server = Server::start();
    let mut admin = server.conn();
    set_user(&mut admin, "reader", &["on", ">pw", "%R~*", "+@all"]);
    let mut reader = conn_as(&server, "reader");
    for cost in [None, Some("0")] {
        assert_noperm(
            &mut reader,
            &acquire_cmd(b"user:1", RATE, "10", cost),
            &format!("RL.ACQUIRE cost {cost:?} with read-only key access"),
        );
    }
    assert!(!exists(&mut admin, b"user:1"));
}

#[test]
fn setstate_needs_its_own_permission() {
    let server = Server::start();
    let mut admin = server.conn();

    // With +@all, an application could reset its own bucket to full: why apps should not
    // have RL.SETSTATE.
    set_user(&mut admin, "app", &["on", ">pw", "~user:*", "+@all"]);
    let mut app = conn_as(&server, "app");
    assert_eq!(
        acquire(&mut app, b"user:1", RATE, "10", Some("10"))[..2],
        [1, 0]
    );
    let reset: String = set_state_cmd("user:1", 1)
        .query(&mut app)
        .expect("RL.SETSTATE");
    assert_eq!(reset, "OK");
    // full_at in 1970: a full bucket whose key is already expired.
    assert!(!exists(&mut admin, b"user:1"));

    // The recommended rule: everything else, but not RL.SETSTATE.
    set_user(&mut admin, "app", &["-rl.setstate"]);
    assert_eq!(
        acquire(&mut app, b"user:1", RATE, "10", Some("10"))[..2],
        [1, 0]
    );
    let before = dump(&mut admin, b"user:1");
    assert_noperm(
        &mut app,
        &set_state_cmd("user:1", 1),
        "RL.SETSTATE after -rl.setstate",
    );
    assert_eq!(dump(&mut admin, b"user:1"), before, "the bucket was reset");
    assert_eq!(acquire(&mut app, b"user:1", RATE, "10", None)[..2], [0, 0]);

    // Least privilege: a user granted only what a limiter needs.
    set_user(
        &mut admin,
        "limiter",
        &["on", ">pw", "~rl:*", "+rl.acquire", "+ping"],
    );
    let mut limiter = conn_as(&server, "limiter");
    assert_eq!(
        acquire(&mut limiter, b"rl:1", RATE, "10", None)[..2],
        [1, 9]
    );
    let pong: String = redis::cmd("PING").query(&mut limiter).expect("PING");
    assert_eq!(pong, "PONG");
    assert_noperm(
        &mut limiter,
        &set_state_cmd("rl:1", 1),
        "RL.SETSTATE without +rl.setstate",
    );
    assert_noperm(
        &mut limiter,
        &set_state_cmd("rl:2", 1),
        "RL.SETSTATE on a new key",
    );
    assert!(!exists(&mut admin, b"rl:2"));
    assert_eq!(
        acquire(&mut admin, b"rl:1", RATE, "10", Some("0"))[..2],
        [1, 9]
    );
}

#[test]
fn ratelimit_acl_category_where_the_server_supports_it() {
    let server = Server::start();
    let mut admin = server.conn();
    let categories: Vec<String> = redis::cmd("ACL")
        .arg("CAT")
        .query(&mut admin)
        .expect("ACL CAT");
    let has_category = categories.iter().any(|c| c == "ratelimit");

    // Redis 7.4+ and Valkey 9 have module ACL categories; Redis 7.0 does not.
    let server_info = info(&mut admin, "server");
    let version = |field: &str| -> Option<(u32, u32)> {
        let v = info_field(&server_info, field)?;
        let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
        Some((parts.next()?, parts.next().unwrap_or(0)))
    };
    let must_have = match version("valkey_version") {
        Some(valkey) => valkey >= (9, 0),
        None => version("redis_version").is_some_and(|redis| redis >= (7, 4)),
    };
    assert!(
        has_category || !must_have,
        "no ratelimit category on a server that supports module categories:\n{server_info}"
    );

    if !has_category {
        // The module still loaded, and the category is simply unknown.
        let list: redis::Value = redis::cmd("MODULE")
            .arg("LIST")
            .query(&mut admin)
            .expect("MODULE LIST");
        assert!(format!("{list:?}").contains("rl"), "{list:?}");
        let err = error_text(
            &mut admin,
            redis::cmd("ACL")
                .arg("SETUSER")
                .arg("app")
                .arg("on")
                .arg("nopass")
                .arg("+@ratelimit"),
        );
        assert!(err.starts_with("ERR "), "{err}");
        return;
    }

    let mut members: Vec<String> = redis::cmd("ACL")
        .arg("CAT")
        .arg("ratelimit")
        .query(&mut admin)
        .expect("ACL CAT ratelimit");
    members.iter_mut().for_each(|m| m.make_ascii_lowercase());
    // ACL CAT <category> skips every module command on Redis 7.4 and Valkey 8.0 (fixed in
    // Redis 8.0 and Valkey 8.1); COMMAND INFO still shows each command's categories there,
    // and the ACL checks below use them.
    let lists_module_commands = match version("valkey_version") {
        Some(valkey) => valkey >= (8, 1),
        None => version("redis_version").is_some_and(|redis| redis >= (8, 0)),
    };
    for name in [
        "rl.acquire",
        "rl.peek",
        "rl.acquire.multi",
        "rl.throttle",
        "rl.refund",
        "rl.charge",
        "rl.hcharge",
        "rl.lease",
        "rl.release",
        "rl.renew",
        "rl.leases",
        "rl.reserve",
        "rl.settle",
        "rl.hreserve",
        "rl.hsettle",
    ] {
        assert!(
            members.contains(&name.to_string()) || !lists_module_commands,
            "{name} not in {members:?}"
        );
        assert!(
            command_info(&mut admin, name).contains("@ratelimit"),
            "{name}: no @ratelimit in its COMMAND INFO"
        );
    }
    // The internal commands, which set a state outright, stay out of it: +@ratelimit never
    // lets an application reset a limit, forge a lease or a reservation.
    for name in [
        "rl.setstate",
        "rl.hsetstate",
        "rl.leasesetstate",
        "rl.resvstate",
        "rl.hresvstate",
    ] {
        assert!(
            !members.contains(&name.to_string()),
            "{name} in {members:?}"
        );
        let info = command_info(&mut admin, name);
        assert!(info.contains("\"RL."), "{name} unknown: {info}");
        assert!(!info.contains("@ratelimit"), "{name}: {info}");
    }

    let ok: String = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("app")
        .arg(&["on", "nopass", "+@ratelimit", "~*"][..])
        .query(&mut admin)
        .expect("ACL SETUSER");
    assert_eq!(ok, "OK");
    let mut app = server.conn();
    let ok: String = redis::cmd("AUTH")
        .arg("app")
        .arg("any")
        .query(&mut app)
        .expect("AUTH");
    assert_eq!(ok, "OK");
    assert_eq!(
        rl::acquire(&mut app, &["k", "0.001", "3"]),
        [1, 2, 0, 1_000_000]
    );
    assert_eq!(rl::peek(&mut app, &["k", "0.001", "3"])[..2], [1, 2]);
    assert_eq!(
        rl::charge(&mut app, &["k", "0.001", "3", "3"])[..2],
        [1, -1]
    );
    let err = error_text(&mut app, redis::cmd("SET").arg("k2").arg("v"));
    assert!(err.starts_with("NOPERM "), "{err}");
    assert!(!exists(&mut admin, b"k2"));
    // A reservation is taken and settled under +@ratelimit; its state is not written.
    let reserved: (i64, Vec<u8>, i64, i64) = redis::cmd("RL.RESERVE")
        .arg(&["r", "0.001", "3", "1", "60000", "ID", "a"][..])
        .query(&mut app)
        .expect("RL.RESERVE under +@ratelimit");
    assert_eq!(reserved, (1, b"a".to_vec(), 2, 0));
    let settled: Vec<i64> = redis::cmd("RL.SETTLE")
        .arg(&["r", "0.001", "3", "a", "1"][..])
        .query(&mut app)
        .expect("RL.SETTLE under +@ratelimit");
    assert_eq!(settled[0], 2);
    let err = error_text(
        &mut app,
        redis::cmd("RL.RESVSTATE").arg(&["r", "0", "0"][..]),
    );
    assert!(err.starts_with("NOPERM "), "{err}");
}

/// `COMMAND INFO name`, as debug text.
fn command_info(con: &mut Connection, name: &str) -> String {
    let info: redis::Value = redis::cmd("COMMAND")
        .arg("INFO")
        .arg(name)
        .query(con)
        .expect("COMMAND INFO");
    format!("{info:?}")
}
