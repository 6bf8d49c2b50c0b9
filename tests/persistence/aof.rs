//! AOF: replay with and without the RDB preamble, a rewrite, and new increments on a rewritten
//! base keep every bucket's exact state; the files hold one `RL.SETSTATE` per change, never
//! the clock-dependent call.

use std::path::Path;
use std::thread::sleep;
use std::time::{Duration, Instant};

use redis::Connection;

use crate::buckets::{assert_no_crash, populate, snapshot, KEYS};
use crate::common::aof::{parse_aof, uint_arg};
use crate::common::{acquire, pexpiretime, Server};
use crate::format::stored_state;

/// The files the AOF manifest names (Redis 7 keeps them under `appendonlydir/`): base first,
/// then the increments. History files, which may linger while being deleted, are skipped.
pub(crate) fn aof_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let aof_dir = dir.join("appendonlydir");
    let manifest =
        std::fs::read_to_string(aof_dir.join("appendonly.aof.manifest")).expect("AOF manifest");
    let mut files: Vec<(bool, String)> = manifest
        .lines()
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            let name = words.get(words.iter().position(|w| *w == "file")? + 1)?;
            let kind = words.get(words.iter().position(|w| *w == "type")? + 1)?;
            (*kind != "h").then(|| (*kind != "b", name.to_string()))
        })
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|(_, name)| {
            let bytes =
                std::fs::read(aof_dir.join(&name)).unwrap_or_else(|e| panic!("read {name}: {e}"));
            (name, bytes)
        })
        .collect()
}

/// How often `needle` occurs in `haystack`, ignoring ASCII case.
pub(crate) fn count(haystack: &[u8], needle: &str) -> usize {
    let haystack = haystack.to_ascii_lowercase();
    let needle = needle.to_ascii_lowercase().into_bytes();
    haystack
        .windows(needle.len())
        .filter(|w| *w == &needle[..])
        .count()
}

pub(crate) fn persistence_info(con: &mut Connection) -> String {
    redis::cmd("INFO")
        .arg("persistence")
        .query(con)
        .expect("INFO persistence")
}

/// Starts `BGREWRITEAOF` and waits until no rewrite is running or scheduled.
pub(crate) fn rewrite_aof(server: &Server, con: &mut Connection) {
    let _: String = redis::cmd("BGREWRITEAOF").query(con).expect("BGREWRITEAOF");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let info = persistence_info(con);
        if info.contains("aof_rewrite_in_progress:0") && info.contains("aof_rewrite_scheduled:0") {
            assert!(
                info.contains("aof_last_bgrewrite_status:ok"),
                "rewrite failed:\n{info}"
            );
            return;
        }
        assert!(
            Instant::now() < deadline,
            "AOF rewrite never finished; log:\n{}",
            server.log()
        );
        sleep(Duration::from_millis(10));
    }
}

/// Checks that `commands` (an AOF's) set each bucket of `KEYS` to the state `con` holds: the
/// last `RL.SETSTATE` of each key carries its `full_at_ns`, and its `full_at_frac` exactly when
/// that is not 0 (the 0.1.0 form otherwise). `client_forms` says whether the commands are
/// the ones clients sent, where `fixed-zero` came with an explicit fraction of 0. Where the
/// AOF has a `PEXPIREAT` for the key (a rewrite writes one), it is the key's expiry.
pub(crate) fn assert_aof_sets_states(
    con: &mut Connection,
    commands: &[Vec<Vec<u8>>],
    client_forms: bool,
) {
    for &(key, _) in KEYS {
        let name = String::from_utf8_lossy(key);
        let (full_at_ns, full_at_frac) = stored_state(con, key);
        let last = commands
            .iter()
            .rev()
            .find(|c| c[0].eq_ignore_ascii_case(b"RL.SETSTATE") && c[1] == key)
            .unwrap_or_else(|| panic!("no RL.SETSTATE for {name:?}"));
        let explicit_zero = client_forms && key == b"fixed-zero";
        let want_args = if full_at_frac != 0 || explicit_zero {
            4
        } else {
            3
        };
        assert_eq!(last.len(), want_args, "{name:?}: {last:?}");
        assert_eq!(uint_arg(&last[2]), full_at_ns, "{name:?}: full_at_ns");
        if want_args == 4 {
            assert_eq!(uint_arg(&last[3]), full_at_frac, "{name:?}: full_at_frac");
        }
        if let Some(expire) = commands
            .iter()
            .rev()
            .find(|c| c[0].eq_ignore_ascii_case(b"PEXPIREAT") && c[1] == key)
        {
            assert_eq!(
                uint_arg(&expire[2]) as i64,
                pexpiretime(con, key),
                "{name:?}: PEXPIREAT"
            );
        }
    }
}

/// Populates under AOF, then restarts (a) from the AOF as written, (b) after a rewrite, and
/// (c) from the rewritten base plus new increments; the state is identical each time.
fn aof_keeps_exact_state(preamble: &str) {
    // `always`: each reply follows its AOF write and fsync, so a kill right after a reply
    // loses nothing (`everysec` may postpone a write while a background fsync runs).
    let args = [
        "--appendonly",
        "yes",
        "--aof-use-rdb-preamble",
        preamble,
        "--appendfsync",
        "always",
    ];
    let mut server = Server::start_with(&args);
    let mut con = server.conn();
    let writes = populate(&mut con);
    let before = snapshot(&mut con);

    // The increment holds one RL.SETSTATE per change, and never the clock-dependent call.
    let check_increment = |server: &Server, want: usize| {
        let files = aof_files(server.dir.path());
        let (name, incr) = files.last().expect("an increment file");
        assert!(
            name.ends_with(".incr.aof"),
            "files {:?}",
            files.iter().map(|f| &f.0).collect::<Vec<_>>()
        );
        assert_eq!(
            count(incr, "RL.SETSTATE"),
            want,
            "{name}:\n{}",
            String::from_utf8_lossy(incr)
        );
        for (name, bytes) in &files {
            assert_eq!(count(bytes, "RL.ACQUIRE"), 0, "{name} holds RL.ACQUIRE");
        }
    };
    check_increment(&server, writes);
    let files = aof_files(server.dir.path());
    let increment = parse_aof(&files.last().expect("an increment").1);
    assert_aof_sets_states(&mut con, &increment, true);

    // (a) Replay the AOF as written. Loading it must not append to it.
    server.restart_with(&args);
    let mut con = server.conn();
    assert_eq!(snapshot(&mut con), before, "after replaying the AOF");
    check_increment(&server, writes);

    // (b) Rewrite: the base holds one RL.SETSTATE (and one PEXPIREAT) per bucket.
    rewrite_aof(&server, &mut con);
    let files = aof_files(server.dir.path());
    let (base_name, base) = &files[0];
    if preamble == "no" {
        assert!(base_name.ends_with(".base.aof"), "base {base_name}");
        assert_eq!(
            count(base, "RL.SETSTATE"),
            KEYS.len(),
            "{}",
            String::from_utf8_lossy(base)
        );
        assert_eq!(
            count(base, "PEXPIREAT"),
            KEYS.len(),
            "{}",
            String::from_utf8_lossy(base)
        );
        assert_aof_sets_states(&mut con, &parse_aof(base), false);
    } else {
        assert!(
            // Valkey 9 writes its own RDB magic.
            base_name.ends_with(".base.rdb")
                && (base.starts_with(b"REDIS") || base.starts_with(b"VALKEY")),
            "base {base_name}"
        );
    }
    check_increment(&server, 0);
    assert_eq!(
        snapshot(&mut con),
        before,
        "after the rewrite, before restarting"
    );
    server.restart_with(&args);
    let mut con = server.conn();
    assert_eq!(
        snapshot(&mut con),
        before,
        "after restarting from the rewritten AOF"
    );

    // (c) New changes on top of the rewritten base.
    assert_eq!(
        acquire(&mut con, b"plain", "0.0003", "10", Some("2.5"))[0],
        1
    );
    assert_eq!(
        acquire(&mut con, b"plain", "0.0003", "10", Some("10"))[0],
        0
    );
    let after = snapshot(&mut con);
    assert_ne!(after, before);
    check_increment(&server, 1);
    server.restart_with(&args);
    let mut con = server.conn();
    assert_eq!(
        snapshot(&mut con),
        after,
        "after replaying base and increment"
    );
    assert_no_crash(&server);
}

#[test]
fn aof_with_rdb_preamble_keeps_exact_state() {
    aof_keeps_exact_state("yes");
}

#[test]
fn aof_without_rdb_preamble_keeps_exact_state() {
    aof_keeps_exact_state("no");
}
