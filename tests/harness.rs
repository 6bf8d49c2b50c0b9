//! The test harness itself (tests/common), against real servers: what makes the other tests
//! trustworthy on a busy machine.

#![cfg(test)]

mod common;

use common::info::{info, info_field};
use common::Server;

#[test]
fn a_port_answered_by_another_server_is_not_taken_for_ours() {
    // A stranger holds the port; ours cannot bind it, yet the stranger answers PING there.
    // Starting on that port must fail instead of handing the test the stranger.
    let stranger = Server::start();
    match Server::try_start_on_port(stranger.port) {
        Ok(server) => panic!(
            "a server 'started' on port {}, which another server holds (pid {:?})",
            server.port,
            server.pid()
        ),
        Err(e) => assert!(
            e.contains("not by our server") || e.contains("exited"),
            "unexpected failure: {e}"
        ),
    }
    stranger.assert_alive();
}

#[test]
fn a_started_server_is_our_own_process() {
    let server = Server::start();
    let text = info(&mut server.conn(), "server");
    let pid = info_field(&text, "process_id").and_then(|p| p.parse::<u32>().ok());
    assert_eq!(pid, server.pid());
}
