//! What 0.1.0 wrote still loads as the same buckets: the checked-in v1 `DUMP` payload, RDB
//! file and AOF directory (`tests/fixtures/`, never regenerated), each read by today's module,
//! saved again in today's encoding, and read back.

use std::path::PathBuf;

use redis::Connection;

use crate::aof::rewrite_aof;
use crate::buckets::assert_no_crash;
use crate::common;
use crate::common::aof::parse_aof;
use crate::common::rdb::rdb_len;
use crate::common::{acquire, dump, pexpiretime, Server};
use crate::format::{expire_at_ms, set_state, stored_state, ModuleDump, ENCVER_MASK, ENCVER_NOW};

/// The fixture's state: 2100-01-01T00:00:00Z plus 123 ns, so it never expires in a test and
/// its expiry (`ceil(full_at / 1e6)` ms) is not the truncated value.
pub(crate) const FIXTURE_FULL_AT_NS: u64 = 4_102_444_800_000_000_123;
/// A `DUMP` of a bucket written by `RL.SETSTATE k 4102444800000000123`, encoding version 1
/// (Redis 7.0, RDB version 10). Never regenerate it: it proves old payloads still load.
pub(crate) const FIXTURE_V1: &[u8] = include_bytes!("../fixtures/v1-bucket.dump");
/// An RDB file that Redis 7.0.15 saved with 0.1.0's module (encoding version 1, RDB version
/// 10), and the AOF directory (manifest, base written by 0.1.0's AOF rewrite, increment of
/// what 0.1.0 propagated) of the same server. `tests/fixtures/README.md` says how they were
/// made; never regenerate them.
pub(crate) const FIXTURE_V1_RDB: &[u8] = include_bytes!("../fixtures/v1-buckets.rdb");
pub(crate) const FIXTURE_V1_AOF_DIR: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/v1-aof");
/// The buckets in the RDB fixture, and their `full_at_ns`: three set by `RL.SETSTATE`, and
/// `acquired` moved on by one token at 0.000001/s by 0.1.0's `RL.ACQUIRE`.
pub(crate) const FIXTURE_V1_RDB_BUCKETS: &[(&[u8], u64)] = &[
    (b"a", 4_102_444_800_000_000_123),
    (b"acquired", 4_103_444_800_000_000_123),
    (b"b", 4_102_444_800_000_000_000),
    (b"\xff\xfe\x00bin", 9_223_372_036_854_775_807),
];
/// The buckets the AOF fixture replays to: those of the RDB fixture (its base) and `c`, set
/// in the increment by `RL.SETSTATE` and then moved on by two tokens by `RL.ACQUIRE`.
pub(crate) const FIXTURE_V1_AOF_BUCKETS: &[(&[u8], u64)] = &[
    (b"a", 4_102_444_800_000_000_123),
    (b"acquired", 4_103_444_800_000_000_123),
    (b"b", 4_102_444_800_000_000_000),
    (b"c", 4_104_444_800_000_000_456),
    (b"\xff\xfe\x00bin", 9_223_372_036_854_775_807),
];

#[test]
fn v1_fixture_restores_to_its_state() {
    // The fixture is what it claims: a checksummed rl-bucket value of encoding version 1.
    let fixture = ModuleDump::parse(FIXTURE_V1);
    assert_eq!(fixture.encoding_version(), 1);
    assert_eq!(fixture.full_at_ns(), FIXTURE_FULL_AT_NS);
    let expire_at_ms = FIXTURE_FULL_AT_NS.div_ceil(1_000_000);
    assert_eq!(expire_at_ms, 4_102_444_800_001);

    let server = Server::start();
    let mut con = server.conn();
    let ok: String = redis::cmd("RESTORE")
        .arg("old")
        .arg(expire_at_ms)
        .arg(FIXTURE_V1)
        .arg("ABSTTL")
        .query(&mut con)
        .expect("RESTORE the fixture");
    assert_eq!(ok, "OK");
    let key_type: String = redis::cmd("TYPE").arg("old").query(&mut con).expect("TYPE");
    assert_eq!(key_type, "rl-bucket");
    assert_eq!(pexpiretime(&mut con, b"old"), expire_at_ms as i64);
    // Re-saved in today's encoding, it equals a bucket set to the same state today. (This
    // holds after a format change too; comparing to the fixture's bytes would not.)
    let ok: String = redis::cmd("RL.SETSTATE")
        .arg("new")
        .arg(FIXTURE_FULL_AT_NS)
        .query(&mut con)
        .expect("RL.SETSTATE");
    assert_eq!(ok, "OK");
    assert_eq!(dump(&mut con, b"old"), dump(&mut con, b"new"));
    assert_eq!(stored_state(&mut con, b"old"), (FIXTURE_FULL_AT_NS, 0));
    assert_eq!(pexpiretime(&mut con, b"new"), expire_at_ms as i64);

    // It behaves as that state says. With cost 0 nothing changes, and the time to full is
    // full_at - now, for a `now` between two TIME readings around the call.
    let time_us = |con: &mut Connection| -> u64 {
        let (s, us): (u64, u64) = redis::cmd("TIME").query(con).expect("TIME");
        s * 1_000_000 + us
    };
    let before_us = time_us(&mut con);
    let [allowed, _, retry_after_ms, reset_after_ms] =
        acquire(&mut con, b"old", "1", "3153600000", Some("0"));
    let after_us = time_us(&mut con);
    assert_eq!((allowed, retry_after_ms), (1, 0));
    // The server's clock may be millisecond-grained, so `now` is at least `before` floored
    // to a millisecond.
    let earliest_ns = before_us / 1_000 * 1_000_000;
    let latest_ns = after_us * 1_000;
    let reset_ms = |now_ns: u64| (FIXTURE_FULL_AT_NS - now_ns).div_ceil(1_000_000) as i64;
    assert!(
        (reset_ms(latest_ns)..=reset_ms(earliest_ns)).contains(&reset_after_ms),
        "reset_after_ms {reset_after_ms} not in [{}, {}]",
        reset_ms(latest_ns),
        reset_ms(earliest_ns)
    );
    assert_eq!(
        dump(&mut con, b"old"),
        dump(&mut con, b"new"),
        "cost 0 changes nothing"
    );
    // Taking one token at 1 token/s moves full_at exactly 1 s later, whatever the time,
    // because full_at is already in the future.
    let [allowed, _, retry_after_ms, _] = acquire(&mut con, b"old", "1", "3153600000", Some("1"));
    assert_eq!((allowed, retry_after_ms), (1, 0));
    let (taken, taken_frac) = stored_state(&mut con, b"old");
    assert_eq!((taken, taken_frac), (FIXTURE_FULL_AT_NS + 1_000_000_000, 0));
    assert_eq!(
        pexpiretime(&mut con, b"old"),
        taken.div_ceil(1_000_000) as i64
    );
    assert_no_crash(&server);
}

/// Checks that the server holds exactly `buckets`, each a whole-nanosecond state with its
/// expiry, and byte for byte the bucket `RL.SETSTATE` writes today for the same instant.
fn assert_holds_v1_buckets(con: &mut Connection, buckets: &[(&[u8], u64)]) {
    let keys: Vec<Vec<u8>> = buckets.iter().map(|(k, _)| k.to_vec()).collect();
    assert_eq!(common::all_keys(con), keys);
    for &(key, full_at_ns) in buckets {
        let name = String::from_utf8_lossy(key);
        let key_type: String = redis::cmd("TYPE").arg(key).query(con).expect("TYPE");
        assert_eq!(key_type, "rl-bucket", "{name:?}");
        assert_eq!(stored_state(con, key), (full_at_ns, 0), "{name:?}");
        assert_eq!(
            pexpiretime(con, key),
            expire_at_ms((full_at_ns, 0)),
            "{name:?}"
        );
        let today = [b"today:", key].concat();
        set_state(con, &today, full_at_ns, None);
        assert_eq!(dump(con, key), dump(con, &today), "{name:?}");
        assert_eq!(pexpiretime(con, &today), pexpiretime(con, key), "{name:?}");
        let _: i64 = redis::cmd("DEL").arg(&today).query(con).expect("DEL");
    }
}

#[test]
fn v1_rdb_fixture_loads_to_the_same_buckets() {
    // The fixture is what it claims: an RDB of version 10 whose four module values all carry
    // the rl-bucket type id with encoding version 1 (after each key, as rdbSaveLen).
    assert!(FIXTURE_V1_RDB.starts_with(b"REDIS0010"));
    let mut server = Server::start();
    let mut con = server.conn();
    set_state(&mut con, b"probe", FIXTURE_FULL_AT_NS, None);
    let module_id = ModuleDump::parse(&dump(&mut con, b"probe").expect("bucket")).module_id;
    let values_of = |encver: u64| {
        let id = rdb_len((module_id & !ENCVER_MASK) | encver);
        FIXTURE_V1_RDB
            .windows(id.len())
            .filter(|w| *w == &id[..])
            .count()
    };
    assert_eq!(values_of(1), FIXTURE_V1_RDB_BUCKETS.len());
    assert_eq!(values_of(ENCVER_NOW), 0);

    server.kill();
    std::fs::write(server.dir.path().join("dump.rdb"), FIXTURE_V1_RDB).expect("write dump.rdb");
    server.restart_with(&[]);
    let mut con = server.conn();
    assert_holds_v1_buckets(&mut con, FIXTURE_V1_RDB_BUCKETS);
    // Saved again, now in encoding version 2, it loads to the same buckets.
    let before = FIXTURE_V1_RDB_BUCKETS
        .iter()
        .map(|&(key, _)| (dump(&mut con, key), pexpiretime(&mut con, key)))
        .collect::<Vec<_>>();
    let _: () = redis::cmd("SAVE").query(&mut con).expect("SAVE");
    let saved = std::fs::read(server.dir.path().join("dump.rdb")).expect("read dump.rdb");
    assert_ne!(saved, FIXTURE_V1_RDB, "SAVE rewrote the file");
    server.restart_with(&[]);
    let mut con = server.conn();
    let after = FIXTURE_V1_RDB_BUCKETS
        .iter()
        .map(|&(key, _)| (dump(&mut con, key), pexpiretime(&mut con, key)))
        .collect::<Vec<_>>();
    assert_eq!(after, before);
    // And they work: a cost 0 call on the latest one, which owes centuries, is denied.
    let [allowed, ..] = acquire(&mut con, b"a", "1", "10", Some("0"));
    assert_eq!(
        allowed, 0,
        "a bucket full only in 2100 owes more than it holds"
    );
    assert_no_crash(&server);
}

#[test]
fn v1_aof_fixture_replays_to_the_same_buckets() {
    // The fixture holds 0.1.0's forms only: RL.SETSTATE key full_at_ns, and the PEXPIREAT
    // that follows each bucket in a rewrite.
    let mut files: Vec<PathBuf> = std::fs::read_dir(FIXTURE_V1_AOF_DIR)
        .expect("the AOF fixture directory")
        .map(|entry| entry.expect("entry").path())
        .collect();
    files.sort();
    let mut set_states = 0;
    for file in files
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "aof"))
    {
        for command in parse_aof(&std::fs::read(file).expect("read")) {
            let name = String::from_utf8_lossy(&command[0]).to_ascii_uppercase();
            match name.as_str() {
                "SELECT" | "PEXPIREAT" => {}
                "RL.SETSTATE" => {
                    assert_eq!(command.len(), 3, "{file:?}: {command:?}");
                    set_states += 1;
                }
                other => panic!("{file:?} holds {other}"),
            }
        }
    }
    assert_eq!(set_states, FIXTURE_V1_AOF_BUCKETS.len() + 1, "two for c");

    let args = ["--appendonly", "yes", "--aof-use-rdb-preamble", "no"];
    let mut server = Server::start_with(&args);
    server.kill();
    let aof_dir = server.dir.path().join("appendonlydir");
    let _ = std::fs::remove_dir_all(&aof_dir);
    std::fs::create_dir(&aof_dir).expect("create appendonlydir");
    for file in &files {
        let name = file.file_name().expect("file name");
        std::fs::copy(file, aof_dir.join(name)).expect("copy a fixture file");
    }
    server.restart_with(&args);
    let mut con = server.conn();
    assert_holds_v1_buckets(&mut con, FIXTURE_V1_AOF_BUCKETS);
    // Rewritten by today's module, the AOF replays to the same buckets again.
    let before = FIXTURE_V1_AOF_BUCKETS
        .iter()
        .map(|&(key, _)| (dump(&mut con, key), pexpiretime(&mut con, key)))
        .collect::<Vec<_>>();
    rewrite_aof(&server, &mut con);
    server.restart_with(&args);
    let mut con = server.conn();
    let after = FIXTURE_V1_AOF_BUCKETS
        .iter()
        .map(|&(key, _)| (dump(&mut con, key), pexpiretime(&mut con, key)))
        .collect::<Vec<_>>();
    assert_eq!(after, before);
    assert_no_crash(&server);
}
