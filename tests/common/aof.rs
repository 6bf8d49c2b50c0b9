//! Reading AOF files as commands: the RESP framing Redis writes, for the persistence and
//! replication tests that check what an AOF holds; and rewriting one, waited for.

use std::thread::sleep;
use std::time::{Duration, Instant};

use redis::Connection;

/// Server arguments for a plain AOF (no RDB preamble, so [`parse_aof`] reads it) written
/// before every reply (`always`), so a restart that kills the server loses no write: with
/// `everysec` a write can wait while a background fsync is under way.
pub const PLAIN_AOF_ALWAYS: [&str; 6] = [
    "--appendonly",
    "yes",
    "--aof-use-rdb-preamble",
    "no",
    "--appendfsync",
    "always",
];

/// Splits an AOF (plain RESP, no RDB preamble) into commands, each a list of arguments.
pub fn parse_aof(bytes: &[u8]) -> Vec<Vec<Vec<u8>>> {
    fn line<'a>(bytes: &'a [u8], pos: &mut usize) -> &'a [u8] {
        let start = *pos;
        let len = bytes[start..]
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("CRLF in AOF");
        *pos = start + len + 2;
        &bytes[start..start + len]
    }
    fn number(header: &[u8], prefix: u8) -> usize {
        assert_eq!(
            header.first(),
            Some(&prefix),
            "AOF framing: {:?}",
            String::from_utf8_lossy(header)
        );
        std::str::from_utf8(&header[1..])
            .expect("ASCII length")
            .parse()
            .expect("length")
    }
    let mut commands = Vec::new();
    let mut pos = 0;
    while pos < bytes.len() {
        let argc = number(line(bytes, &mut pos), b'*');
        let mut args = Vec::with_capacity(argc);
        for _ in 0..argc {
            let len = number(line(bytes, &mut pos), b'$');
            args.push(bytes[pos..pos + len].to_vec());
            pos += len + 2;
        }
        commands.push(args);
    }
    commands
}

/// An argument of an AOF command as an unsigned integer.
pub fn uint_arg(arg: &[u8]) -> u64 {
    std::str::from_utf8(arg)
        .expect("ASCII")
        .parse()
        .unwrap_or_else(|e| panic!("{:?}: {e}", String::from_utf8_lossy(arg)))
}

/// `BGREWRITEAOF`, then waits (up to 15 s) until no rewrite runs and none is scheduled.
pub fn rewrite_aof(con: &mut Connection) {
    let _: String = redis::cmd("BGREWRITEAOF").query(con).expect("BGREWRITEAOF");
    let deadline = Instant::now() + Duration::from_secs(15);
    while !super::info::info(con, "persistence").contains("aof_rewrite_in_progress:0")
        || super::info::info(con, "persistence").contains("aof_rewrite_scheduled:1")
    {
        assert!(Instant::now() < deadline, "rewrite never finished");
        sleep(Duration::from_millis(10));
    }
}
