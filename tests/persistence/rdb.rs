//! RDB: `DEBUG RELOAD`, and `SAVE` then a restart, keep every bucket's exact state.

use crate::buckets::{assert_no_crash, populate, snapshot};
use crate::common::Server;

#[test]
fn debug_reload_keeps_exact_state() {
    let server = Server::start();
    let mut con = server.conn();
    populate(&mut con);
    let before = snapshot(&mut con);
    let _: () = redis::cmd("DEBUG")
        .arg("RELOAD")
        .query(&mut con)
        .expect("DEBUG RELOAD");
    assert_eq!(snapshot(&mut con), before);
    assert_no_crash(&server);
}

#[test]
fn save_and_restart_keeps_exact_state() {
    let mut server = Server::start();
    let mut con = server.conn();
    populate(&mut con);
    let before = snapshot(&mut con);
    let _: () = redis::cmd("SAVE").query(&mut con).expect("SAVE");
    assert!(
        server.dir.path().join("dump.rdb").exists(),
        "SAVE wrote dump.rdb"
    );
    server.restart_with(&[]);
    let mut con = server.conn();
    assert_eq!(snapshot(&mut con), before);
    assert_no_crash(&server);
}
